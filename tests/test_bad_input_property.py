"""Property-based bad-input test: every stage's reader gets hostile files (hypothesis).

For each stage input (rollout/eval tasks, judge/score trajectories, score judgments,
score's mixed trajectories+judgments stream, train-policy/train-rm scored, adapt-tasks
tasks/stats/judgments/pending, the loop's TOML) the file is arbitrary bytes, or a valid
file of that stage's records with one line replaced or inserted: arbitrary bytes, arbitrary JSON (deep nesting, huge ints, 1e400,
NaN/Infinity tokens, lone surrogates), or the valid record with one value at a random path
replaced by something else (a wrong type, a hostile token), a key removed, or a key added.

The stage runs in-process (`rlany.cli.main` inside click's `CliRunner.isolation`, so the
one-line error formatting of the real entry point is what is checked), from a file or from
stdin. Whatever the input:

* never a traceback or an internal error; the exit code is 0 or 1;
* exit 1 prints exactly one line `error: ...` and writes nothing (no output, no sidecar,
  no partial, no lock);
* when an independent oracle (below) knows the input is invalid, the stage must fail:
  exit 1, one line `error: FILE:LINE: ...` naming the first bad line (`<stdin>:N` on
  stdin; no line for an empty file), and the engine (or the trainer) never started.

The oracle does not call rlany: it splits the bytes into lines as `readline` does, decodes
UTF-8, parses JSON (NaN/Infinity/1e400 are not JSON numbers) and checks the record's field
types from the dataclass type hints (a chat message: a string role, a string or parts
content). A line is "bad" when that fails, it holds a lone surrogate or it nests deeper
than `rlany.files.jsonl.MAX_DEPTH`. A schema-valid line that differs from the valid file's may
still be rejected by a stage's own rules (outcome must be +-1, ...): then only the general
rules above apply.

Valid inputs run on the fake engine (rollout, judge, eval, adapt-tasks) to the end, so a
crash after reading counts too; the train stages tokenize with the tiny model's tokenizer
and stop where the optimizer would start; the loop stops where the run would start.

`make test` runs a 10-example smoke of three stages; `make test-slow` runs 200 examples
of every stage input.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re
import tempfile
import tomllib
import types
import typing
from contextlib import ExitStack
from datetime import date, datetime, time
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import make_judgment, make_traj
from rlany.envs.reasoning import make_tasks
from rlany.errors import RlanyError
from rlany.files.jsonl import MAX_DEPTH
from rlany.files.records import (
    Judgment,
    Lineage,
    Message,
    Scored,
    Task,
    TaskStats,
    Trajectory,
    to_json,
)

ROOT = Path(__file__).resolve().parents[1]
LOOP_TOML = ROOT / "examples" / "reasoning" / "loop.toml"


# ---------------------------------------------------------------------------------------
# the valid files every example starts from (built once, with the project's own stages)

def _line(record: Any) -> bytes:
    return json.dumps(to_json(record), ensure_ascii=False).encode("utf-8") + b"\n"


def _invoke(argv: list[str], stdin: bytes | None = None) -> tuple[int, str, str]:
    """The real entry point in-process: (exit code, stdout, stderr)."""
    from rlany.cli import main

    runner = CliRunner()
    code: Any = 0
    with runner.isolation(input=stdin, env={"RLANY_DEBUG": None}) as (out, err, _):
        try:
            main(argv)
        except SystemExit as e:
            code = e.code
    code = 0 if code is None else code if isinstance(code, int) else 1  # as sys.exit does
    return (code,
            out.getvalue().decode("utf-8", "replace"), err.getvalue().decode("utf-8", "replace"))


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> dict[str, Any]:
    """Valid lines of each kind, consistent with each other: 3 reasoning tasks; a pending
    candidate (its own id) whose parent has no stats (its `candidate.parent_acc` is read);
    the first task and the candidate rolled out twice (the first always solved, so
    adapt-tasks has a target and reads its judgments); judgments with mixed verdicts;
    scored and task stats from `rlany score`."""
    d = tmp_path_factory.mktemp("base")
    tasks = make_tasks(3, seed=0)
    pending = dataclasses.replace(
        tasks[1], task_id=f"{tasks[2].task_id}.v1.i0",
        lineage=Lineage(root_id=tasks[2].task_id, parent_id=tasks[2].task_id, version=1,
                        direction="harder"),
        extra={"candidate": {"parent_acc": 0.5, "proposed_iter": 0, "critique": "none"}})
    trajs = [make_traj(task_id, i, outcome)
             for task_id, outcomes in ((tasks[0].task_id, (1, 1)), (pending.task_id, (-1, 1)))
             for i, outcome in enumerate(outcomes)]
    judgments = [make_judgment(t, [[1, -1, 1]]) for t in trajs]
    files = {"tasks": [_line(t) for t in tasks], "trajectories": [_line(t) for t in trajs],
             "judgments": [_line(j) for j in judgments], "pending": [_line(pending)],
             # `judge -o -`: each task's trajectories, then their judgments
             "stream": [_line(r) for k in (0, 2) for r in trajs[k:k + 2] + judgments[k:k + 2]]}
    for kind in ("trajectories", "judgments"):
        (d / f"{kind}.jsonl").write_bytes(b"".join(files[kind]))
    code, _, err = _invoke(["score", "-i", str(d / "trajectories.jsonl"), "-j",
                            str(d / "judgments.jsonl"), "-o", str(d / "scored.jsonl"),
                            "--stats", str(d / "stats.jsonl")])
    assert code == 0, err
    for kind in ("scored", "stats"):
        files[kind] = (d / f"{kind}.jsonl").read_bytes().splitlines(keepends=True)
    fake = d / "fake.json"
    fake.write_text(json.dumps(["\\boxed{1}", "The step is right. \\boxed{1}",
                                '```json\n{"question": "What is 1 + 1?", "answer": "2"}\n```']))
    return {"files": files, "fake": str(fake), "toml": LOOP_TOML.read_text(encoding="utf-8")}


# ---------------------------------------------------------------------------------------
# the stage inputs under test

@dataclasses.dataclass(frozen=True)
class Slot:
    stage: str
    flag: str  # the flag of the hostile input
    kind: str  # the key of its valid lines in base["files"]
    cls: Any  # its record type, a tuple of the types a stream mixes, None: the loop's TOML
    allow_empty: bool = False


SLOTS = {
    "rollout-tasks": Slot("rollout", "-i", "tasks", Task),
    "eval-tasks": Slot("eval", "-i", "tasks", Task),
    "judge-trajectories": Slot("judge", "-i", "trajectories", Trajectory),
    "score-trajectories": Slot("score", "-i", "trajectories", Trajectory),
    "score-judgments": Slot("score", "-j", "judgments", Judgment),
    "score-stream": Slot("score-stream", "-i", "stream", (Trajectory, Judgment)),
    "train-policy-scored": Slot("train-policy", "-i", "scored", Scored),
    "train-rm-scored": Slot("train-rm", "-i", "scored", Scored),
    "adapt-tasks": Slot("adapt-tasks", "-i", "tasks", Task),
    "adapt-stats": Slot("adapt-tasks", "--stats", "stats", TaskStats),
    "adapt-judgments": Slot("adapt-tasks", "-j", "judgments", Judgment),
    "adapt-pending": Slot("adapt-tasks", "--pending", "pending", Task, allow_empty=True),
    "loop-config": Slot("loop", "", "toml", None),
}


def _argv(slot: Slot, base: dict, inputs: dict[str, str], out: Path) -> list[str]:
    """The stage's command line: every input its valid file, except the hostile one."""
    fake = ["--engine", "fake", "--model", base["fake"]]
    if slot.stage in ("rollout", "judge"):
        return [slot.stage, "-i", inputs["-i"], "-o", str(out / "out.jsonl"), "--n" if
                slot.stage == "rollout" else "--m", "2", *fake]
    if slot.stage == "eval":
        return ["eval", "-i", inputs["-i"], "-o", str(out / "eval.json"), "--n", "2", "--k",
                "1", "--trajectories", str(out / "eval_traj.jsonl"), *fake]
    if slot.stage.startswith("score"):
        judgments = ["-j", inputs["-j"]] if "-j" in inputs else []  # else a stream
        return ["score", "-i", inputs["-i"], *judgments, "-o", str(out / "scored.jsonl"),
                "--stats", str(out / "stats.jsonl")]
    if slot.stage in ("train-policy", "train-rm"):
        return [slot.stage, "-i", inputs["-i"], "-o", str(out / "ckpt"), "--model", base["tiny"]]
    if slot.stage == "adapt-tasks":
        return ["adapt-tasks", "-i", inputs["-i"], "--stats", inputs["--stats"], "-j",
                inputs["-j"], "--pending", inputs["--pending"], "-o", str(out / "next.jsonl"),
                "--candidates", str(out / "cand.jsonl"), "--decisions", str(out / "dec.jsonl"),
                *fake]
    return ["loop", inputs[""]]


STAGE_INPUTS = {"rollout": {"-i": "tasks"}, "eval": {"-i": "tasks"},
                "judge": {"-i": "trajectories"},
                "score": {"-i": "trajectories", "-j": "judgments"},
                "score-stream": {"-i": "stream"},
                "train-policy": {"-i": "scored"}, "train-rm": {"-i": "scored"},
                "adapt-tasks": {"-i": "tasks", "--stats": "stats", "-j": "judgments",
                                "--pending": "pending"},
                "loop": {"": "toml"}}


# ---------------------------------------------------------------------------------------
# the oracle: which inputs are certainly invalid, and where (independent of rlany)



def _lines(content: bytes) -> list[bytes]:
    """Lines as `readline` returns them (split after each b"\\n")."""
    parts = content.split(b"\n")
    lines = [p + b"\n" for p in parts[:-1]]
    return lines + ([parts[-1]] if parts[-1] else [])


def _no_constant(name: str) -> Any:
    raise ValueError(name)


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(text)
    return value


def _depth(obj: Any) -> int:
    best, stack = 0, [(obj, 1)]
    while stack:
        value, d = stack.pop()
        if isinstance(value, (list, dict)):
            best = max(best, d)
            stack.extend((v, d + 1) for v in (value.values() if isinstance(value, dict)
                                              else value))
    return best


def _strings(obj: Any):
    stack = [obj]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            yield value
        elif isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())


def _lone_surrogate(obj: Any) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for s in _strings(obj) for c in s)


def _schema_ok(hint: Any, value: Any) -> bool:
    """Does `value` have the JSON shape of type `hint` (a record class or a field type)?"""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None:
            return type(None) in args
        return _schema_ok(next(a for a in args if a is not type(None)), value)
    if origin is list:
        (inner,) = typing.get_args(hint)
        return isinstance(value, list) and all(_schema_ok(inner, v) for v in value)
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            return False
        hints = typing.get_type_hints(hint)
        for f in dataclasses.fields(hint):
            if f.name == "extra":
                continue
            if f.name not in value:
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    return False
            elif not _schema_ok(hints[f.name], value[f.name]):
                return False
        return True
    if hint is Message:  # what engines, judge and trainer read of a chat message
        if not isinstance(value, dict) or not isinstance(value.get("role"), str):
            return False
        content = value.get("content")
        return isinstance(content, str) or isinstance(content, list) and all(
            isinstance(p, dict) and (p.get("type") != "image_url" or isinstance(
                p.get("image_url"), dict) and isinstance(p["image_url"].get("url"), str))
            and (p.get("type") != "text" or isinstance(p.get("text"), str)) for p in content)
    if hint is Any:
        return True
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        try:
            return math.isfinite(value)
        except OverflowError:  # an integer too large for a float
            return False
    if hint is str:
        return isinstance(value, str)
    if hint is dict:
        return isinstance(value, dict)
    raise AssertionError(f"oracle: no rule for {hint!r}")


def _classify(raw: bytes, cls: Any) -> tuple[str, Any]:
    """("bad" | "ok", parsed object) for one non-blank line."""
    try:
        text = raw.decode("utf-8")
        obj = json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except (ValueError, RecursionError):  # also UnicodeDecodeError and JSONDecodeError
        return "bad", None
    kinds = cls if isinstance(cls, tuple) else (cls,)  # a stream: a line of any of them
    if _depth(obj) > MAX_DEPTH or _lone_surrogate(obj) or not any(
            _schema_ok(kind, obj) for kind in kinds):
        return "bad", None
    return "ok", obj


NO_CLAIM = object()


def must_fail_at(content: bytes, slot: Slot, valid: list[bytes]) -> Any:
    """The line number (None: the whole file) where the stage must fail, or NO_CLAIM.
    A claim needs every line before the bad one to be the valid file's, in order."""
    expected = [json.loads(v) for v in valid]
    seen: list[Any] = []
    for number, raw in enumerate(_lines(content), 1):
        if not raw.strip():
            continue
        verdict, obj = _classify(raw, slot.cls)
        if verdict == "bad":
            return number
        if seen + [obj] != expected[:len(seen) + 1]:
            return NO_CLAIM
        seen.append(obj)
    return NO_CLAIM if seen or slot.allow_empty else None


def toml_must_fail(content: bytes) -> Any:
    try:
        tomllib.loads(content.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None  # a config error names the file, not a line
    except RecursionError:
        return NO_CLAIM
    return NO_CLAIM


# ---------------------------------------------------------------------------------------
# hostile content

TOKEN = "\x00rlany-raw-token\x00"  # a value replaced by a raw JSON token after dumping
TOKEN_JSON = json.dumps(TOKEN).encode()


def _nest(depth: int, opener: str) -> str:
    closer = "]" if opener == "[" else "}"
    return opener * depth + ("0" if opener != "[" else "") + closer * depth


raw_tokens = st.one_of(
    st.sampled_from(["NaN", "-NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1e-400",
                     "-0", "1.7976931348623157e308", "0.1e999", "01", "+1", "1.", ".5",
                     "'a'", "undefined", "", "}", "[1,]", '{"a" 1}', "tru", "nul",
                     '"\\ud800"', '"\\udfff"', '"x\\ud83d"', '"\\udc00\\ud800"',
                     '"\\ud83d\\ude00"', '"\\u0000"', '"\\x41"', '"\x01"', '"\\uZZZZ"',
                     '{"a": 1, "a": 2}', "[" * 3000, "]"]),
    st.integers(1, 5000).map(lambda n: "9" * n),  # huge ints, past the 4300-digit limit too
    st.integers(1, 5000).map(lambda n: "-" + "9" * n + ".5e-3"),
    st.builds(_nest, st.integers(1, 3000), st.sampled_from(["[", '{"k":'])),
)
characters = st.one_of(st.characters(), st.characters(categories=["Cs"]),
                       st.sampled_from("\n\r\t\"\\\x00\u2028\ufeff"))
texts = st.text(characters, max_size=12)
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(min_value=2**63),
                    st.integers(max_value=-(2**1100)), st.floats(allow_nan=False,
                                                                 allow_infinity=False),
                    texts, st.just(TOKEN))
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner,
                                                                          max_size=3),
    max_leaves=8)
wrong_types = st.sampled_from([None, True, False, 0, 1, -1, 2, 1.5, -0.0, "", "x", "1", [],
                               {}, [1], ["x"], {"a": 1}, [{}], 2**70])
values = st.one_of(wrong_types, json_values)


def _dump(draw, obj: Any) -> bytes:
    """One JSON line: ASCII-escaped or raw UTF-8 (a lone surrogate then makes invalid
    UTF-8 bytes), the raw token (if any) spliced in."""
    text = json.dumps(obj, ensure_ascii=draw(st.booleans()))
    data = text.encode("utf-8", "surrogatepass")
    if TOKEN_JSON in data:
        data = data.replace(TOKEN_JSON, draw(raw_tokens).encode("utf-8", "surrogatepass"), 1)
    return data


def _paths(obj: Any, prefix: tuple = ()):
    for key, value in (obj.items() if isinstance(obj, dict) else
                       enumerate(obj) if isinstance(obj, list) else ()):
        yield prefix + (key,)
        yield from _paths(value, prefix + (key,))


def _get(obj: Any, path: tuple) -> Any:
    for key in path:
        obj = obj[key]
    return obj


FIELD_NAMES = sorted({f.name for cls in (Task, Trajectory, Judgment, Scored, TaskStats,
                                         Lineage, Judgment)
                      for f in dataclasses.fields(cls)} | {"candidate", "parent_acc"})


@st.composite
def mutated(draw, record: dict) -> bytes:
    """The valid record with one change: a value replaced, a key or item removed, a key
    added (any path, nested ones included)."""
    obj = copy.deepcopy(record)
    paths = list(_paths(obj))
    op = draw(st.sampled_from(["set", "set", "set", "delete", "add"]))
    if op == "add":
        where = draw(st.sampled_from([()] + [p for p in paths
                                             if isinstance(_get(obj, p), dict)]))
        key = draw(st.sampled_from(FIELD_NAMES) | texts)
        _get(obj, where)[key] = draw(values)
    else:
        path = draw(st.sampled_from(paths))
        parent = _get(obj, path[:-1])
        if op == "delete":
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(values)
    return _dump(draw, obj)


@st.composite
def hostile_line(draw, record: dict) -> bytes:
    kind = draw(st.sampled_from(["bytes", "token", "value", "mutated", "mutated",
                                 "mutated", "mutated"]))
    if kind == "bytes":
        return draw(st.binary(max_size=80))
    if kind == "token":
        return draw(raw_tokens).encode("utf-8", "surrogatepass")
    if kind == "value":
        return _dump(draw, draw(json_values))
    return draw(mutated(record))


@st.composite
def jsonl_content(draw, valid: list[bytes]) -> bytes:
    """Arbitrary bytes (1 in 8), or the valid file with one line replaced or inserted."""
    if draw(st.integers(0, 7)) == 0:
        return draw(st.binary(max_size=300))
    k = draw(st.integers(0, len(valid) - 1))
    line = draw(hostile_line(json.loads(valid[k])))
    keep = k if draw(st.booleans()) else k + 1  # insert before line k, or replace it
    lines = [v.rstrip(b"\n") for v in valid[:k]] + [line] + \
        [v.rstrip(b"\n") for v in valid[keep:]]
    end = draw(st.sampled_from([b"\n", b"\r\n"]))
    return end.join(lines) + (end if draw(st.integers(0, 3)) else b"")


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return {math.inf: "inf", -math.inf: "-inf"}.get(value, "nan" if value != value
                                                         else repr(value))
    if isinstance(value, (int, datetime, date, time)):
        return str(value) if isinstance(value, int) else value.isoformat()
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"


def _toml_dump(config: dict) -> str:
    top = [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in config.items()
           if not isinstance(v, dict)]
    tables = [f"[{json.dumps(k)}]\n" + "".join(f"{json.dumps(kk)} = {_toml_value(vv)}\n"
                                                for kk, vv in v.items())
              for k, v in config.items() if isinstance(v, dict)]
    return "\n".join(top) + "\n\n" + "\n".join(tables)


toml_scalars = st.one_of(st.booleans(), st.integers(), st.integers(min_value=2**63),
                         st.floats(), texts, st.datetimes(), st.dates(), st.times())
toml_values = st.one_of(st.sampled_from([0, -1, 1.5, "", "x", True, [], {}, math.nan,
                                         math.inf, 2**64, 10**400]),
                        st.recursive(toml_scalars, lambda inner: st.lists(inner, max_size=3) |
                                     st.dictionaries(texts, inner, max_size=2), max_leaves=6))


@st.composite
def toml_content(draw, valid: str) -> bytes:
    """Arbitrary bytes or text, or the example config with one value replaced, a key
    removed or a key added (at the top or in a stage's table)."""
    kind = draw(st.integers(0, 7))
    if kind == 0:
        return draw(st.binary(max_size=200))
    if kind == 1:
        return draw(st.text(characters, max_size=200)).encode("utf-8", "surrogatepass")
    config = tomllib.loads(valid)
    paths = [p for p in _paths(config) if len(p) <= 2 and not isinstance(p[-1], int)]
    path = draw(st.sampled_from(paths))
    parent = _get(config, path[:-1])
    op = draw(st.sampled_from(["set", "set", "delete", "add"]))
    if op == "delete":
        del parent[path[-1]]
    elif op == "add":
        parent = draw(st.sampled_from([config] + [v for v in config.values()
                                                  if isinstance(v, dict)]))
        parent[draw(st.sampled_from(FIELD_NAMES) | texts)] = draw(toml_values)
    else:
        parent[path[-1]] = draw(toml_values)
    return _toml_dump(config).encode("utf-8", "surrogatepass")


# ---------------------------------------------------------------------------------------
# running one example

STOPPED = "stopped where the real work would start"


class Stopped(RlanyError):
    """Raised by the patched trainer and loop where the real work would start."""


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


_tokenizers: dict[str, Any] = {}


def _patches(stack: ExitStack, slot: Slot, started: list[str]) -> None:
    """Record every engine/model start; stop trainers and the loop before real work."""
    import rlany.stage_engine

    real_start = rlany.stage_engine.start_engine

    def start_engine(opts, stage=None):
        started.append("engine")
        return real_start(opts, stage)

    stack.enter_context(mock.patch.object(rlany.stage_engine, "start_engine", start_engine))
    if slot.stage.startswith("train"):
        import rlany.training.model
        import rlany.training.trainer

        def load_model(base, adapter, opts):
            started.append("model")
            if base not in _tokenizers:
                from transformers import AutoTokenizer
                _tokenizers[base] = AutoTokenizer.from_pretrained(base)
            return None, _tokenizers[base]

        def train(samples, model, tokenizer, opts, *args, **kwargs):
            # what the real trainer would choke on (an IndexError in the embedding) must
            # have been refused with a line number before
            vocab = json.loads((Path(opts.model) / "config.json").read_text())["vocab_size"]
            assert samples and all(0 <= i < vocab for s in samples
                                   for i in s.prompt_ids + s.response_ids), "untrainable ids"
            raise Stopped(f"{STOPPED} (training)")

        stack.enter_context(mock.patch.object(rlany.training.model, "load_model", load_model))
        stack.enter_context(mock.patch.object(rlany.training.trainer, "train", train))
    if slot.stage == "loop":
        import rlany.loop.loop

        class Loop:
            def __init__(self, cfg, *args, **kwargs):
                started.append("loop")

            def run(self):
                raise Stopped(f"{STOPPED} (the loop)")

        stack.enter_context(mock.patch.object(rlany.loop.loop, "Loop", Loop))


class Outcome(typing.NamedTuple):
    claim: Any  # the oracle's: the line where the stage must fail, None, or NO_CLAIM
    code: int
    stderr_lines: list[str]


def check(slot: Slot, base: dict, content: bytes, use_stdin: bool) -> Outcome:
    """Run the stage on `content` and assert the rules (module docstring)."""
    valid = base["files"].get(slot.kind)
    with tempfile.TemporaryDirectory(prefix="rlany-prop-") as tmp:
        root = Path(tmp)
        inputs = {}
        for flag, kind in STAGE_INPUTS[slot.stage].items():
            path = root / "in" / (f"{kind}.toml" if kind == "toml" else f"{kind}.jsonl")
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(content if flag == slot.flag else
                             base["toml"].encode() if kind == "toml" else b"".join(
                                 base["files"][kind]))
            inputs[flag] = str(path)
        hostile = inputs[slot.flag]
        name = hostile
        if use_stdin:
            inputs[slot.flag], name = "-", "<stdin>"
        out = root / "out"
        started: list[str] = []
        with ExitStack() as stack:
            _patches(stack, slot, started)
            code, stdout, stderr = _invoke(_argv(slot, base, inputs, out),
                                           content if use_stdin else None)
        claim = (toml_must_fail(content) if slot.cls is None else
                 must_fail_at(content, slot, valid))
        report = f"exit {code}, claim {claim!r}\nstderr: {stderr[-3000:]}\nstdout: {stdout[-500:]}"
        assert "Traceback" not in stdout + stderr, report
        assert "internal error" not in stderr, report
        assert code in (0, 1), report
        lines = [x for x in stderr.splitlines() if x.strip()]
        assert len(_files(root / "in")) == len(inputs), _files(root / "in")  # nothing beside
        if code == 1:
            assert lines and _files(out) == [], f"{report}\nwritten: {_files(out)}"
            if lines[-1].startswith(f"error: {STOPPED}"):  # valid: work would start here
                assert claim is NO_CLAIM, report
                return Outcome(claim, code, lines)
            assert len(lines) == 1 and lines[0].startswith("error: "), report
        if claim is NO_CLAIM:
            return Outcome(claim, code, lines)
        assert code == 1, report
        assert not started, f"{report}\nstarted: {started}"
        where = re.escape(name) + (f":{claim}" if claim is not None else "")
        assert re.match(rf"error: {where}: \S", lines[0]), report
    return Outcome(claim, code, lines)


SLOW = settings(max_examples=200, deadline=None, database=None, print_blob=True,
                suppress_health_check=list(HealthCheck))
SMOKE = settings(max_examples=10, deadline=None, database=None, derandomize=True,
                 suppress_health_check=list(HealthCheck))


def _content(slot: Slot, base: dict) -> st.SearchStrategy[bytes]:
    if slot.cls is None:
        return toml_content(base["toml"])
    return jsonl_content(base["files"][slot.kind])


@pytest.mark.slow
@pytest.mark.parametrize("slot_name", sorted(SLOTS))
def test_hostile_input_fails_cleanly(slot_name, base, request):
    slot = SLOTS[slot_name]
    if slot.stage.startswith("train"):
        base = {**base, "tiny": request.getfixturevalue("tiny_model")}

    @SLOW
    @given(content=_content(slot, base), use_stdin=st.booleans() if slot.cls else st.just(False))
    def run(content, use_stdin):
        check(slot, base, content, use_stdin)

    run()


@pytest.mark.parametrize("slot_name", sorted(n for n, s in SLOTS.items()
                                             if s.cls and not s.stage.startswith("train")))
def test_the_valid_files_reach_the_work(slot_name, base):
    """The base files themselves pass each stage's checks: a refusal of valid input would
    otherwise pass every property above as "a one-line error" (it happened: a pending
    candidate with a pool task's id)."""
    slot = SLOTS[slot_name]
    out = check(slot, base, b"".join(base["files"][slot.kind]), use_stdin=False)
    assert out.code == 0 or out.stderr_lines[-1].startswith(f"error: {STOPPED}"), \
        out.stderr_lines


@pytest.mark.parametrize("slot_name", ["score-trajectories", "rollout-tasks", "judge-trajectories"])
def test_hostile_input_smoke(slot_name, base):
    slot = SLOTS[slot_name]

    @SMOKE
    @given(content=_content(slot, base), use_stdin=st.booleans())
    def run(content, use_stdin):
        check(slot, base, content, use_stdin)

    run()


@pytest.mark.parametrize("content,claim", [
    (b'{"task_id": "\\ud800", "env": "reasoning", "spec": {}, "prompt": "p"}\n', 2),
    (b'{"task_id": "a", "env": "reasoning", "spec": {"x": "\\udc00"}, "prompt": "p"}\n', 2),
    (b'{"task_id": "a", "env": "reasoning", "spec": {"x": 1e400}, "prompt": "p"}\n', 2),
    (b'{"task_id": "a", "env": "reasoning", "spec": {"x": NaN}, "prompt": "p"}\n', 2),
    (b"[" * 3000 + b"]" * 3000 + b"\n", 2),
    (b'{"task_id": "a", "env": "reasoning", "prompt": "p", "spec": {"x": ' + b"[" * 900 +
     b"]" * 900 + b"}}\n", 2),
    (b'{"task_id": "a", "env": "reasoning", "prompt": "p", "spec": {}, "x": ' + b"[" * 990 +
     b"]" * 990 + b"}\n", 2),
    (b'{"task_id": "a", "env": "reasoning", "prompt": "p", "spec": {"x": ' + b"[" * 98 +
     b"]" * 98 + b"}}\n", NO_CLAIM),  # 100 levels: read (and rolled out as a broken task)
], ids=["lone-surrogate-id", "lone-surrogate-in-spec", "1e400", "NaN", "3000-deep-line",
        "900-deep-spec", "990-deep-extra", "100-deep-spec"])
def test_known_hostile_lines(content, claim, base):
    """Fixed cases the properties above reach only by chance: a valid first task, then
    the hostile line."""
    content = b"".join(base["files"]["tasks"][:1]) + content
    for use_stdin in (False, True):
        assert check(SLOTS["rollout-tasks"], base, content, use_stdin).claim == claim


@pytest.mark.parametrize("token_ids,error", [([1, 2], None), ([10**6], "outside"),
                                             ([2**70], "outside"), ([-1], "negative")])
def test_token_ids_outside_the_vocabulary(token_ids, error, base, tiny_model):
    """Recorded token ids the model cannot embed (the oracle cannot judge them without
    the model): refused at their line before the model loads, not an IndexError in
    training."""
    lines = base["files"]["scored"]
    record = json.loads(lines[2])  # a kept step (line 2's task has one outcome: none kept)
    assert record["steps"][0]["keep"]
    record["steps"][0]["token_ids"] = token_ids
    content = b"".join(lines[:2]) + json.dumps(record).encode() + b"\n" + b"".join(lines[3:])
    for use_stdin in (False, True):
        outcome = check(SLOTS["train-policy-scored"], {**base, "tiny": tiny_model}, content,
                        use_stdin)
        assert outcome.code == 1, outcome
        if error is None:
            assert outcome.stderr_lines[-1].startswith(f"error: {STOPPED}"), outcome
        else:
            assert re.match(rf"error: \S+:3: token id -?\d+ is {error}", outcome.stderr_lines[0]), outcome
