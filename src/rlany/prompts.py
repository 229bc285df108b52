"""Prompt templates of the reward model, and the parser of its verdicts.

The judge sees the task (the policy's first user message), the recent history, the current
observation, the policy's response and what the environment answered (`step_prompts` builds
each step's prompt from a trajectory), reasons, and ends with `\\boxed{+1}` (a good step)
or `\\boxed{-1}` (a bad step). `parse_verdict` maps its text to +1, -1 or 0 (unparseable):
it never raises, whatever the model wrote.
`generate_verdicts` draws the judge's samples so that every verdict can be read
(`--verdict constrained`, DESIGN section 4): free reasoning, then a constrained verdict.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlany.engines.base import Completion, Engine, Request, Result
    from rlany.files.records import Trajectory

JUDGE_SYSTEM = (
    "You are a careful reviewer of an AI agent's work. You judge one step at a time: "
    "is this step correct and does it move the agent toward completing the task?"
)

JUDGE_USER = """## Task
{task}

## Earlier steps
{history}

## What the agent saw at this step
{obs}

## The agent's response at this step
{response}

## What happened next
{next_obs}

Think briefly about whether this step is correct and useful for the task. Then give your \
verdict on the last line as \\boxed{{+1}} for a good step or \\boxed{{-1}} for a bad step."""

MAX_FIELD_CHARS = 4000  # a runaway observation or response is cut, with a marker


def clip(text: str, limit: int = MAX_FIELD_CHARS) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {len(text) - limit} characters cut]"


def judge_messages(task: str, history: list[str], obs: str, response: str,
                   next_obs: str, images: list[str] = (), next_images: list[str] = ()
                   ) -> list[dict]:
    """The judge prompt; with image observations, the screens before and after the step
    come first (in that order) and the text says which is which."""
    from rlany.chat import user_content

    user = JUDGE_USER.format(task=clip(task), history="\n".join(history) or "(none)",
                             obs=clip(obs), response=clip(response),
                             next_obs=clip(next_obs) or "(nothing)")
    if images or next_images:
        user = (f"(Images: the first {len(images)} show the screen at this step, the next "
                f"{len(next_images)} the screen after it.)\n\n{user}")
    return [{"role": "system", "content": JUDGE_SYSTEM},
            {"role": "user", "content": user_content(user, [*images, *next_images])}]


def step_prompts(traj: Trajectory, history_steps: int, obs_lines: int = 0
                 ) -> list[list[dict]]:
    """The judge prompt of every step of one trajectory.

    The task is the policy's first user message; at step 0 its observation part is left out
    (the prompt shows the observation anyway), and at later steps it is cut to `obs_lines`
    lines (0: whole), as is what happened next. Earlier steps are listed as the action and
    the first line of what the env answered (the full state is in the current observation).
    """
    from rlany.chat import text_of

    prompts = []
    obs0 = traj.steps[0].obs if traj.steps else ""
    for t, step in enumerate(traj.steps):
        first_user = next((text_of(m["content"]) for m in step.prompt_messages
                           if m["role"] == "user"), "")
        if obs0 and first_user.endswith(obs0):
            head = first_user[:-len(obs0)]
            if t == 0:
                first_user = head.strip() or first_user
            elif obs_lines:
                first_user = head + _lines(obs0, obs_lines)
        next_obs = _lines(step.next_obs, obs_lines) if obs_lines else step.next_obs
        earlier = traj.steps[max(0, t - history_steps):t]
        history = [f"step {t - len(earlier) + k}: {clip(s.action or s.response, 300)} -> "
                   f"{clip(_first_line(s.next_obs), 300)}" for k, s in enumerate(earlier)]
        prompts.append(judge_messages(first_user, history, step.obs, step.response,
                                      next_obs, step.images, step.next_images))
    return prompts


def _lines(text: str, n: int) -> str:
    return "\n".join(text.splitlines()[:n])


def _first_line(text: str) -> str:
    return next((line for line in text.splitlines() if line.strip()), "")


_BOXED = re.compile(r"\\boxed\s*\{((?:[^{}]|\{[^{}]*\})*)\}")
_TAIL = re.compile(
    r"(?:verdict|score|answer|rating)\s*(?:is)?\s*[:=]?\s*\**\s*([+\-−–]?\s*1(?:\.0+)?)\b",
    re.IGNORECASE)
_POS = {"+1", "1", "1.0", "+1.0", "good", "correct", "yes", "positive"}
_NEG = {"-1", "-1.0", "bad", "incorrect", "wrong", "no", "negative"}


def _normalize(token: str) -> str:
    token = re.sub(r"\\text\s*\{([^{}]*)\}", r"\1", token)
    token = token.strip().strip("$").strip().strip("{}").strip()
    token = token.replace("−", "-").replace("–", "-").replace("—", "-")
    token = re.sub(r"\s+", "", token)
    return token.strip(".").lower()


def parse_verdict(text: str) -> int:
    """+1, -1, or 0 when no verdict can be read. The last verdict in the text wins."""
    if not isinstance(text, str):
        return 0
    boxed = _BOXED.findall(text)
    if boxed:
        token = _normalize(boxed[-1])
        if token in _POS:
            return 1
        if token in _NEG:
            return -1
        return 0
    tail = _TAIL.findall(text)
    if tail:
        token = _normalize(tail[-1])
        return 1 if token in _POS else -1 if token in _NEG else 0
    return 0


VERDICT_CHOICES = ("\\boxed{+1}", "\\boxed{-1}")
VERDICT_STOP = "\\boxed{"
VERDICT_MODES = ("constrained", "free")
VERDICT_MAX_TOKENS = 32  # phase 2: a choice's tokens and EOS (vLLM may spell it longer)


def generate_verdicts(engine: Engine, requests: Sequence[Request],
                      mode: str = "constrained") -> list[Result]:
    """The judge's samples for `requests`, every verdict readable in constrained mode.

    free: one generate call; whatever the judge wrote is parsed (0 when unreadable).
    constrained with max_tokens 0 (every request): no reasoning; each request is one
      constrained call whose n samples are the verdicts (one prompt pass for all of them).
    constrained, per sample j of a step:
      phase 1: the judge reasons freely up to max_tokens, stopping at "\\boxed{" or EOS;
      phase 2: the same assistant message continues (`Request.continuation`: the sampled
        ids of the reasoning; EOS and the tokens holding "\\boxed{" are dropped) and
        is decoded as exactly one of VERDICT_CHOICES, so S_j is in {-1, +1}.
    The verdict is sampled from the judge's own distribution restricted to the two
    choices (same temperature), token by token along each choice's canonical tokens.
    A sample that ended by itself (EOS) with a readable verdict (e.g. "Verdict: -1") is
    kept as it is. Each returned completion's text is reasoning + verdict, its token_ids
    the sampled ids of both phases (exactly what the judge was fed: a forward pass over
    the prompt and them gives its log-probs), finish_reason that of the verdict ("stop").
    Engines without real token ids (fake) continue from the text alone.
    """
    from dataclasses import replace

    from rlany.engines.base import (
        Completion,
        Decodes,
        Request,
        Sampling,
        real_token_ids,
        stable_seed,
    )

    if mode == "free":
        return engine.generate(requests)
    if mode != "constrained":
        raise ValueError(f"verdict mode must be one of {VERDICT_MODES}, not {mode!r}")
    if requests and all(r.sampling.max_tokens == 0 for r in requests):
        # no reasoning: the m samples of a step are the verdict alone, drawn together
        return engine.generate([replace(r, sampling=replace(
            r.sampling, max_tokens=VERDICT_MAX_TOKENS, choices=VERDICT_CHOICES))
            for r in requests])
    first = engine.generate([replace(r, sampling=replace(
        r.sampling, stop=(*r.sampling.stop, VERDICT_STOP))) for r in requests])
    exact = real_token_ids(engine) and isinstance(engine, Decodes)
    pending = []
    for i, result in enumerate(first):
        for k, c in enumerate(result.completions):
            if c.finish_reason == "stop" and c.stop_reason is None and parse_verdict(c.text):
                continue  # it ended by itself with a readable verdict
            pending.append((i, k, *_reasoning(engine, c, exact)))
    asks = []
    for i, k, ids, text in pending:
        s = requests[i].sampling
        asks.append(Request(messages=requests[i].messages, adapter=requests[i].adapter,
                            continuation=tuple(ids), continuation_text=text,
                            sampling=Sampling(n=1, max_tokens=VERDICT_MAX_TOKENS,
                                              temperature=s.temperature, top_p=s.top_p,
                                              seed=None if s.seed is None else
                                              stable_seed(s.seed, "verdict", k),
                                              logprobs=s.logprobs, choices=VERDICT_CHOICES)))
    for (i, k, ids, text), result in zip(pending, engine.generate(asks) if asks else []):
        c, v = first[i].completions[k], result.completions[0]
        logprobs = None
        if c.logprobs is not None and v.logprobs is not None:
            logprobs = c.logprobs[:len(ids)] + v.logprobs
        first[i].completions[k] = Completion(text=text + v.text, token_ids=ids + v.token_ids,
                                             finish_reason=v.finish_reason, logprobs=logprobs)
    return first


def _reasoning(engine: Engine, c: Completion, exact: bool) -> tuple[list[int], str]:
    """(ids, text) of a phase-1 sample to continue: without its EOS, and without the
    tokens that hold the stop string (the last of them may also hold reasoning text: it is
    dropped too, so that the ids spell exactly the text)."""
    ids = list(c.token_ids)
    if not exact:
        return ids, c.text
    if c.finish_reason == "stop" and c.stop_reason is None:
        ids = ids[:-1]  # the EOS that ended it
    if c.stop_reason is not None:
        full = engine.decode(ids)
        cut = full.find(c.stop_reason)
        target = full[:cut] if cut >= 0 else full
        while ids and not target.startswith(engine.decode(ids)):
            ids.pop()
    return ids, engine.decode(ids)


UNIT_TEST_SYSTEM = (
    "You write unit tests for programming problems. A good test is correct (a right program "
    "passes it) and catches wrong programs (common mistakes fail it)."
)

UNIT_TEST_USER = """## Problem
{problem}

Write ONE new test for this problem: an input that a subtly wrong program would get wrong, \
and the exact output a correct program prints for it. Think briefly, work the output out \
carefully, then end with:
INPUT:
```
the test input, exactly as given on standard input
```
OUTPUT:
```
the expected standard output
```"""

MAX_TEST_CHARS = 10_000  # a longer input or expected output is refused as unparseable


def unit_test_messages(problem: str) -> list[dict]:
    return [{"role": "system", "content": UNIT_TEST_SYSTEM},
            {"role": "user", "content": UNIT_TEST_USER.format(problem=clip(problem))}]


_LABELLED_BLOCK = re.compile(
    r"(?:^|\n)[ \t#*_]*(input|output)[ \t*_]*:?[ \t*_]*\n?[ \t]*```[^\n`]*\n(.*?)```",
    re.IGNORECASE | re.DOTALL)


def parse_unit_test(text: str) -> dict | None:
    """{"input", "output"} from the last INPUT block and the OUTPUT block after it, or None.

    Labels may be decorated (`**Input:**`, `### Output`); each must be followed by a fenced
    block. An empty expected output, or one longer than MAX_TEST_CHARS, is unparseable."""
    if not isinstance(text, str):
        return None
    blocks = [(m.group(1).lower(), m.group(2)) for m in _LABELLED_BLOCK.finditer(text)]
    for k in range(len(blocks) - 2, -1, -1):
        (label_a, data), (label_b, expected) = blocks[k], blocks[k + 1]
        if label_a == "input" and label_b == "output":
            data, expected = data.rstrip("\n"), expected.strip()
            if not expected or len(data) > MAX_TEST_CHARS or len(expected) > MAX_TEST_CHARS:
                return None
            return {"input": data, "output": expected}
    return None


REWRITE_SYSTEM = (
    "You design training tasks for an AI agent. You rewrite a task so that its difficulty "
    "fits the agent, keeping it well-formed and solvable."
)

REWRITE_USER = """## The task
{description}

## Its spec (JSON)
```json
{spec}
```

## How the agent does
It solved this task in {acc:.0%} of its attempts, so the task is too {state}.
A reviewer's critiques of the agent's attempts:
{critiques}

## What to do
Write a new version of the task that is a little {direction}. {advice}
Keep the same JSON keys and make sure the new task is correct and solvable.
Answer with the new spec only, as one JSON object in a ```json block."""

_ADVICE = {
    "harder": "Change one thing that raises the difficulty, guided by what the agent already "
              "does well.",
    "easier": "Change one thing that lowers the difficulty, guided by the mistakes in the "
              "critiques.",
}


def rewrite_messages(description: str, spec: dict, acc: float, direction: str,
                     critiques: str) -> list[dict]:
    import json

    user = REWRITE_USER.format(description=clip(description), spec=json.dumps(spec, indent=2),
                               acc=acc, state="easy" if direction == "harder" else "hard",
                               critiques=critiques, direction=direction,
                               advice=_ADVICE[direction])
    return [{"role": "system", "content": REWRITE_SYSTEM}, {"role": "user", "content": user}]


EDIT_USER = """## The task
{description}

## How the agent does
It solved this task in {acc:.0%} of its attempts, so the task is too {state}.
What a reviewer saw in the agent's attempts:
{critiques}

## Possible edits (each makes the task a little {direction})
{edits}

Pick the edit that best fits what the reviewer saw. {advice}
Answer with the edit's number only."""


def edit_messages(description: str, acc: float, direction: str, critiques: str,
                  edits: list[str]) -> list[dict]:
    """The prompt of `adapt-tasks --rewrite edits`: the task, the critique summary and the
    env's numbered edits; the answer is decoded as one of the numbers (`edit_choices`)."""
    listed = "\n".join(f"{k}. {e}" for k, e in enumerate(edits, 1))
    user = EDIT_USER.format(description=clip(description), acc=acc, critiques=critiques,
                            state="easy" if direction == "harder" else "hard",
                            direction=direction, edits=listed, advice=_ADVICE[direction])
    return [{"role": "system", "content": REWRITE_SYSTEM}, {"role": "user", "content": user}]


def edit_choices(count: int) -> tuple[str, ...]:
    return tuple(str(k) for k in range(1, count + 1))


SUMMARY_SYSTEM = "You summarize reviews of an AI agent's work, briefly and concretely."

SUMMARY_USER = """A reviewer judged the steps of an AI agent on this task:
{description}

The reviewer's critiques:
{critiques}

In at most three short sentences, say what the agent does wrong or right, most common \
first. Do not repeat the task."""


def summary_messages(description: str, critiques: str) -> list[dict]:
    """`adapt-tasks --summary model`: the model condenses the extracted critiques (the
    paper's summarized critic) before the rewrite prompt reads them."""
    user = SUMMARY_USER.format(description=clip(description, 1500), critiques=critiques)
    return [{"role": "system", "content": SUMMARY_SYSTEM}, {"role": "user", "content": user}]
