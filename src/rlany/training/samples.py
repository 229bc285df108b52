"""What the trainer learns from: samples taken from the records, then token ids.

A sample is (chat messages -> response tokens, advantage): for `train-policy` each kept
scored step (prompt_messages -> response, the step's advantage), for `train-rm` each kept
judge sample (judge_messages -> the judge's output, its consistency advantage), for `sft`
each step of a successful trajectory (weight 1). The prompt is rendered with the
tokenizer's chat template (`rlany.chat.render`, as at generation); the response is the
**sampled token ids** of the record (older records without ids fall back to tokenizing the
text; both are counted). EOS closes a response only where generation ended (policy: not
`truncated`; judge: finish_reason not "length") and the sampled ids do not already end with
it. A sample longer than `max_len` is dropped whole. A record is trained on once: an input
that repeats a trajectory id, or a scored record that repeats a step, is refused
(`once`), naming both lines.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

from rlany.errors import RlanyError
from rlany.files.records import Scored, Trajectory

R = TypeVar("R", Scored, Trajectory)


@dataclass
class Sample:
    prompt_ids: list[int]
    response_ids: list[int]
    advantage: float
    old_logprobs: list[float] | None = None  # the engine's log-prob of each response id
    from_ids: bool = False  # the response is the sampled ids (not a re-tokenized text)
    # verdict objectives (`rlany.training.verdict`): no response; the prompt ends at the branch
    target: float | None = None  # R_it, what the verdict must agree with
    choice_ids: list[int] | None = None  # the choices' branch tokens
    choice_values: list[float] | None = None  # their verdict scores

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


class RawSample(NamedTuple):
    messages: list[dict]
    response: str
    advantage: float
    ended: bool  # generation ended (EOS or a stop): an EOS closes the response
    token_ids: list[int] | None = None  # the sampled response ids, where recorded
    logprobs: list[float] | None = None  # the engine's log-probs of token_ids


def once(records: Iterable[tuple[str, R]]) -> Iterator[tuple[str, R]]:
    """The records of a trainer's input, each trajectory once: an id seen before (a line
    repeated, two files concatenated) would be trained on twice, so it is refused, naming
    the line before; so is a scored record that holds one step index twice."""
    first: dict[str, str] = {}
    for where, record in records:
        if record.traj_id in first:
            raise RlanyError(f"duplicate trajectory '{record.traj_id}', first at "
                             f"{first[record.traj_id]}: it would be trained on twice",
                             where=where, hint="give each trajectory once")
        first[record.traj_id] = where
        if isinstance(record, Scored):
            steps = [s.step for s in record.steps]
            again = next((t for k, t in enumerate(steps) if t in steps[:k]), None)
            if again is not None:
                raise RlanyError(f"trajectory '{record.traj_id}' holds step {again} twice: it "
                                 "would be trained on twice", where=where)
        yield where, record


def policy_samples(scored: Iterable[Scored]) -> Iterator[RawSample]:
    for traj in scored:
        for step in traj.steps:
            if step.keep:
                yield RawSample(step.prompt_messages, step.response, step.advantage,
                                not step.truncated, step.token_ids, step.logprobs)


def rm_samples(scored: Iterable[Scored]) -> Iterator[RawSample]:
    """Judge samples; an output cut at max_tokens (finish_reason "length") gets no EOS.
    Records from before finish_reason was kept (None) count as ended, as they were."""
    for traj in scored:
        for step in traj.steps:
            for sample in step.judge:
                if sample.keep and step.judge_messages:
                    yield RawSample(step.judge_messages, sample.text, sample.advantage,
                                    sample.finish_reason != "length", sample.token_ids)


def sft_samples(trajectories: Iterable[Trajectory], all_outcomes: bool = False
                ) -> Iterator[RawSample]:
    """Warm-start samples: every step of each successful trajectory (every trajectory with
    `all_outcomes`, but an errored one) with a prompt, weight 1."""
    for traj in trajectories:
        if traj.outcome != 1 and not all_outcomes or traj.finish == "error":
            continue  # an errored episode, even with all outcomes: the env failed, not it
        for step in traj.steps:
            # an empty response (the expert had no plan from there) would teach stopping
            if step.prompt_messages and step.response and "error" not in step.info:
                yield RawSample(step.prompt_messages, step.response, 1.0,
                                step.finish_reason != "length", step.token_ids)


def engine_logprobs(token_ids, logprobs) -> list[float] | None:
    """The engine's log-prob of each sampled id, where it gave one for every id (else None:
    PPO's pre-update log-probs are recomputed)."""
    ok = token_ids is not None and logprobs and len(logprobs) == len(token_ids)
    return list(logprobs) if ok else None


def tokenize(tokenizer, raw: Iterable[RawSample | tuple], max_len: int
             ) -> tuple[list[Sample], int]:
    """Token ids for each sample; over-long samples are dropped whole. Returns (kept, dropped)."""
    from rlany.chat import render

    eos = tokenizer.eos_token_id
    ends = set(tokenizer.all_special_ids)  # sampled ids that already close the response
    kept, dropped = [], 0
    for r in raw:
        r = RawSample(*r)
        prompt = render(tokenizer, r.messages)
        if r.token_ids is not None:
            resp = list(r.token_ids)
            logprobs = engine_logprobs(r.token_ids, r.logprobs)
        else:
            resp, logprobs = tokenizer(r.response, add_special_tokens=False)["input_ids"], None
        if r.ended and eos is not None and (not resp or resp[-1] not in ends):
            resp, logprobs = resp + [eos], None  # no engine log-prob for an unsampled EOS
        if not resp or len(prompt) + len(resp) > max_len:
            dropped += 1
            continue
        kept.append(Sample(prompt, resp, r.advantage, logprobs, r.token_ids is not None))
    return kept, dropped
