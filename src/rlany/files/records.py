"""The record contract: plain frozen dataclasses whose field names are the JSON keys.

Every record that crosses a stage boundary is defined here; `docs/stages/*.md` documents
them for people. Rules (DESIGN §2):

* unknown top-level columns ride along untouched in `extra` and are written back out;
* ids are deterministic: `traj_id = f"{task_id}/{iteration}/{sample}"`;
* the samples of one task are written next to each other, so stages stream group by group;
* the schema version lives in each output's `X.meta.json` sidecar, not in every line.

`from_json` validates types field by field and raises `RlanyError` naming the field, so a
caller that knows the file and line can report `path:line: what is wrong`. Records are also
checked for meaning when built (`__post_init__`: an outcome of +1 or -1, counts that add up,
rates in [0, 1]), so an impossible record is refused at the line that holds it.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from functools import cache
from typing import Any, TypeVar

from rlany.errors import RlanyError

SCHEMA_VERSION = 1


class Message(dict):
    """One chat message, `{"role": "system" | "user" | "assistant", "content": ...}`: the
    content a string, or a list of OpenAI-style parts (`rlany.chat`). Only a type for the
    reader: `from_json` checks this shape and keeps the plain dict."""


def _optional() -> Any:
    """A field added to the contract later: None by default and then left out of the JSON,
    so files without it stay byte-identical."""
    return field(default=None, metadata={"omit_none": True})


def traj_id(task_id: str, iteration: int, sample: int) -> str:
    return f"{task_id}/{iteration}/{sample}"


def responses_digest(steps: list[Step]) -> str:
    """The digest a judgment keeps of the trajectory it judged: sha256 of the JSON list of
    its step responses. `rlany score` pairs a judgment with a trajectory only when they
    match, so judgments of another rollout with the same ids are refused."""
    import hashlib
    import json

    data = json.dumps([s.response for s in steps], ensure_ascii=False)
    return hashlib.sha256(data.encode("utf-8", "surrogatepass")).hexdigest()


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise RlanyError(message)


def _rate(value: float | None, name: str, low: float = 0.0) -> None:
    _require(value is None or low <= value <= 1.0,
             f"field '{name}' must be between {low:g} and 1, got {value}")


@dataclass(frozen=True)
class Lineage:
    root_id: str
    parent_id: str | None = None
    version: int = 0
    direction: str | None = None  # "harder" | "easier" | None for an original task
    accepted_iter: int | None = None


@dataclass(frozen=True)
class Task:
    task_id: str
    env: str  # a registered environment name
    spec: dict  # env-specific JSON: goal, world, problem + tests, ...
    prompt: str  # what the policy is told
    lineage: Lineage | None = None
    split: str = "train"  # train | eval
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Step:
    obs: str
    prompt_messages: list[Message]  # the exact chat messages the policy saw
    response: str
    action: str | None  # the parsed action; None when the response held no valid action
    next_obs: str
    info: dict = field(default_factory=dict)
    images: list[str] = field(default_factory=list)  # image files shown with obs
    next_images: list[str] = field(default_factory=list)  # image files shown with next_obs
    # the sampled response token ids (training uses these, never a re-tokenization of
    # `response`), the engine's log-prob of each under the untempered policy where the
    # engine gives them, and why generation ended ("stop": EOS or a stop string; "length")
    token_ids: list[int] | None = _optional()
    logprobs: list[float] | None = _optional()
    finish_reason: str | None = _optional()
    # the digest of the env's state key of `obs` (`rlany.envs.KeysStates`: which steps of a
    # task's rollouts met the same state, `score --step-credit gigpo`); absent: the env has none
    state: str | None = _optional()


@dataclass(frozen=True)
class Trajectory:
    traj_id: str
    task_id: str
    iteration: int
    sample: int
    steps: list[Step]
    outcome: int  # +1 success, -1 otherwise
    finish: str  # success | failure | max_steps | error
    policy: dict  # {"model": ..., "adapter": ...}
    prompt_tokens: int = 0
    completion_tokens: int = 0
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        _require(self.outcome in (-1, 1), f"outcome must be -1 or +1, got {self.outcome}")
        _require(self.iteration >= 0 and self.sample >= 0,
                 "fields 'iteration' and 'sample' must be >= 0")
        _require(self.prompt_tokens >= 0 and self.completion_tokens >= 0,
                 "token counts must be >= 0")


@dataclass(frozen=True)
class JudgeSample:
    text: str  # the judge's full output: reasoning, then the verdict (or the unit test)
    score: int  # +1 good step, -1 bad step, 0 unparseable
    # mode "unit-tests": the test this sample wrote ({"input", "output"}; None: unparseable);
    # score is then +1 when this trajectory's program passes it, -1 when it fails
    test: dict | None = None
    token_ids: list[int] | None = _optional()  # the sampled ids of `text` (reasoning + verdict)
    finish_reason: str | None = _optional()  # "stop" | "length": EOS is trained only after "stop"

    def __post_init__(self) -> None:
        _require(self.score in (-1, 0, 1), f"score must be -1, 0 or +1, got {self.score}")


@dataclass(frozen=True)
class StepJudgment:
    step: int  # index into Trajectory.steps
    judge_messages: list[Message]  # the judge prompt, shared by the m samples
    samples: list[JudgeSample]

    def __post_init__(self) -> None:
        _require(self.step >= 0, f"field 'step' must be >= 0, got {self.step}")


MODES = ("steps", "unit-tests")  # what a judgment holds (Judgment.mode)


@dataclass(frozen=True)
class Judgment:
    traj_id: str
    task_id: str
    judge: dict  # {"model": ..., "adapter": ...}
    steps: list[StepJudgment]
    # "steps": m verdicts per step; "unit-tests": m tests written once per task, shared by
    # its trajectories (same texts, in the same order), each run against every program
    mode: str = "steps"
    # not judged (`judge --select used`): why; steps is then empty and `score` gives the
    # trajectory no step scores and the reward model no samples
    skipped: str | None = None
    # sha256 of the judged trajectory's step responses (`responses_digest`); absent in
    # hand-made judgments, which are then paired by id and step count only
    responses_sha256: str | None = _optional()
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ScoredJudgeSample:
    text: str
    score: int
    reward: float  # consistency reward R_i * S_ij, or the unparseable penalty
    advantage: float  # standardized within the m samples of the step
    keep: bool  # used for reward-model training
    token_ids: list[int] | None = _optional()
    finish_reason: str | None = _optional()


@dataclass(frozen=True)
class ScoredStep:
    step: int
    prompt_messages: list[Message]
    response: str
    step_score: float  # mean_j S_ij over the m judge samples (0 without a judge)
    reward: float  # R_i = O + lambda * step_score
    advantage: float  # standardized across the task's trajectories at this step index (or GiGPO's)
    keep: bool  # used for policy training
    truncated: bool = False  # the response hit max_tokens: trained without a closing EOS
    token_ids: list[int] | None = _optional()  # the sampled response ids (see Step)
    logprobs: list[float] | None = _optional()  # the engine's log-probs of token_ids, if exact
    judge_messages: list[Message] | None = None
    judge: list[ScoredJudgeSample] = field(default_factory=list)
    # what the judge's verdict on this step must agree with (R_it, or the env label under
    # `score --rm-target label`); None where the step gives no reward-model data
    rm_target: float | None = _optional()
    # `score --step-credit gigpo` (rlany.stages.gigpo): the step's anchor group and size, its
    # discounted return and the two advantages that make `advantage`; absent otherwise
    gigpo: dict | None = _optional()


@dataclass(frozen=True)
class Scored:
    traj_id: str
    task_id: str
    iteration: int
    sample: int
    outcome: int
    task_acc: float
    steps: list[ScoredStep]
    policy: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        _require(self.outcome in (-1, 1), f"outcome must be -1 or +1, got {self.outcome}")
        _rate(self.task_acc, "task_acc")


@dataclass(frozen=True)
class TaskStats:
    task_id: str
    n: int
    successes: int
    acc: float
    mean_steps: float
    policy_keep: bool
    policy_reason: str
    rm_keep: bool
    rm_reason: str
    policy_samples: int
    rm_samples: int
    step_score_mean: float | None
    parse_fail_rate: float | None
    judge_outcome_agreement: float | None
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        _require(self.n >= 1, f"field 'n' must be >= 1, got {self.n}")
        _require(0 <= self.successes <= self.n,
                 f"field 'successes' must be between 0 and n = {self.n}, got {self.successes}")
        _require(math.isclose(self.acc, self.successes / self.n, abs_tol=1e-9),
                 f"field 'acc' is {self.acc} but successes / n = {self.successes}/{self.n}")
        _require(self.mean_steps >= 0 and self.policy_samples >= 0 and self.rm_samples >= 0,
                 "step and sample counts must be >= 0")
        _rate(self.parse_fail_rate, "parse_fail_rate")
        _rate(self.judge_outcome_agreement, "judge_outcome_agreement")
        _rate(self.step_score_mean, "step_score_mean", low=-1.0)


# ---------------------------------------------------------------------------------------
# JSON <-> dataclass

R = TypeVar("R")

@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def from_json(cls: type[R], obj: Any, path: str = "") -> R:
    """Build a `cls` from parsed JSON, checking every field's type."""
    if not isinstance(obj, dict):
        raise RlanyError(f"{path or 'record'} must be a JSON object, got {_json_type(obj)}")
    hints = _hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    has_extra = "extra" in names
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name == "extra":
            continue
        key = f"{path}.{f.name}" if path else f.name
        if f.name not in obj:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise RlanyError(f"missing field '{key}'")
            continue
        kwargs[f.name] = _convert(hints[f.name], obj[f.name], key)
    if has_extra:
        kwargs["extra"] = {k: v for k, v in obj.items() if k not in names or k == "extra"}
    return cls(**kwargs)


def to_json(record: Any) -> Any:
    """The inverse of `from_json`: dataclasses become dicts, `extra` is flattened back."""
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(record):
            value = getattr(record, f.name)
            if f.name == "extra" or (value is None and f.metadata.get("omit_none")):
                continue
            out[f.name] = to_json(value)
        extra = getattr(record, "extra", None)
        if extra:
            out.update(extra)
        return out
    if isinstance(record, list):
        return [to_json(x) for x in record]
    if isinstance(record, dict):
        return {k: to_json(v) for k, v in record.items()}
    return record


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array",
            dict: "object"}.get(type(value), type(value).__name__)


def _check_message(value: Any, key: str) -> dict:
    """A chat message as the engines, the judge and the trainer read it."""
    if not isinstance(value, dict):
        raise RlanyError(f"field '{key}' must be an object, got {_json_type(value)}")
    if not isinstance(value.get("role"), str):
        raise RlanyError(f"field '{key}.role' must be a string, got "
                         f"{_json_type(value.get('role'))}")
    content = value.get("content")
    if isinstance(content, list):
        for i, part in enumerate(content):
            where = f"{key}.content[{i}]"
            if not isinstance(part, dict):
                raise RlanyError(f"field '{where}' must be an object, got {_json_type(part)}")
            if part.get("type") == "text" and not isinstance(part.get("text"), str):
                raise RlanyError(f"field '{where}.text' must be a string")
            if part.get("type") == "image_url" and not (
                    isinstance(part.get("image_url"), dict)
                    and isinstance(part["image_url"].get("url"), str)):
                raise RlanyError(f"field '{where}.image_url.url' must be a string")
    elif not isinstance(content, str):
        raise RlanyError(f"field '{key}.content' must be a string or an array of parts, got "
                         f"{_json_type(content)}")
    return value


def _convert(hint: Any, value: Any, key: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None:
            if type(None) in args:
                return None
            raise RlanyError(f"field '{key}' must not be null")
        (inner,) = [a for a in args if a is not type(None)]
        return _convert(inner, value, key)
    if origin is list:
        if not isinstance(value, list):
            raise RlanyError(f"field '{key}' must be an array, got {_json_type(value)}")
        (inner,) = typing.get_args(hint) or (Any,)
        return [_convert(inner, v, f"{key}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(hint):
        return from_json(hint, value, key)
    if hint is Message:
        return _check_message(value, key)
    if hint is Any:
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise RlanyError(f"field '{key}' must be a boolean, got {_json_type(value)}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise RlanyError(f"field '{key}' must be an integer, got {_json_type(value)}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise RlanyError(f"field '{key}' must be a number, got {_json_type(value)}")
        try:
            number = float(value)
        except OverflowError:  # an integer beyond the float range
            raise RlanyError(f"field '{key}' is too large for a number") from None
        if not math.isfinite(number):
            raise RlanyError(f"field '{key}' must be finite, got {value}")
        return number
    if hint is str:
        if not isinstance(value, str):
            raise RlanyError(f"field '{key}' must be a string, got {_json_type(value)}")
        return value
    if hint is dict:
        if not isinstance(value, dict):
            raise RlanyError(f"field '{key}' must be an object, got {_json_type(value)}")
        return value
    raise TypeError(f"records: no converter for {hint!r}")  # a bug in this module, not input
