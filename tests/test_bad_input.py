"""Bad input battery: every case exits 1 with one clear line naming the file (and line),
no traceback, no output written, and the input untouched."""

from __future__ import annotations

import json

import pytest

from conftest import make_judgment, make_traj, write_jsonl
from rlany.envs.reasoning import make_tasks
from rlany.files.records import to_json


def _traj_lines(n_tasks=2, n=2):
    return [json.dumps(to_json(make_traj(f"t{k}", i, 1 if i else -1))) for k in range(n_tasks)
            for i in range(n)]


def _judg_lines(n_tasks=2, n=2):
    return [json.dumps(to_json(make_judgment(make_traj(f"t{k}", i, 1 if i else -1),
                                             [[1, -1, 1]]))) for k in range(n_tasks)
            for i in range(n)]


def _task_lines(k=3):
    return [json.dumps(to_json(t)) for t in make_tasks(k, seed=0)]


def _mutate(lines, index, fn):
    rows = list(lines)
    obj = json.loads(rows[index])
    fn(obj)
    rows[index] = json.dumps(obj)
    return rows


def _set(path, value):
    def fn(obj):
        target = obj
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return fn


def _del(key):
    return lambda obj: obj.pop(key)


T, J, K = _traj_lines(), _judg_lines(), _task_lines()

# name -> (stage args with {in} {out} {j}, main input lines or bytes, judgments lines,
#          expected substring, expected line number or None)
CASES = {
    "truncated last line": ("score", "\n".join(T)[:-10], None, "truncated", 4),
    "invalid json": ("score", T[:1] + ["{not json"] + T[2:], None, "invalid JSON", 2),
    "wrong type": ("score", _mutate(T, 2, _set(["outcome"], "1")), None, "must be an integer", 3),
    "missing field": ("score", _mutate(T, 1, _del("steps")), None, "missing field 'steps'", 2),
    "another stage's file": ("score", J, None, "looks like a judgments file", 1),
    "empty file": ("score", "", None, "empty input", None),
    "binary bytes": ("score", b"\x89PNG\r\n\x1a\n\x00\xff\xfe", None, "not UTF-8", 1),
    "nan reward": ("score", _traj_lines()[:1] + ['{"traj_id": "x", "outcome": NaN}'], None,
                   "NaN is not valid JSON", 2),
    "inconsistent groups": ("score", [T[0], T[2], T[1]], None, "must be consecutive", 3),
    "outcome zero": ("score", _mutate(T, 0, _set(["outcome"], 0)), None, "outcome must be -1 or +1", 1),
    "duplicate trajectory": ("score", [T[0], T[0]], None, "duplicate trajectory", 2),
    "steps not a list": ("score", _mutate(T, 0, _set(["steps"], {"a": 1})), None, "must be an array", 1),
    "messages not a list": ("score", _mutate(T, 0, lambda o: o["steps"][0].update(prompt_messages="hi")),
                            None, "prompt_messages' must be an array", 1),
    "line is an array": ("score", ["[1, 2, 3]"], None, "must be a JSON object", 1),
    "judge score 2": ("score", T, _mutate(J, 1, lambda o: o["steps"][0]["samples"][0].update(score=2)),
                      "score must be -1, 0 or +1", 2),
    "judgments out of order": ("score", T, [J[1], J[0]] + J[2:], "judgment is for", 1),
    "judgments miss a step": ("score", T, _mutate(J, 0, _set(["steps"], [])), "covers steps", 1),
    "judgments too many": ("score", T, J + [J[0]], "has no trajectory", 5),
    "judgments too few": ("score", T, J[:3], "ended early", 4),
    "infinite advantage": ("train-policy", ['{"traj_id": "a", "advantage": Infinity}'], None,
                           "Infinity is not valid JSON", 1),
    "unknown env": ("rollout", _mutate(K, 1, _set(["env"], "nope")), None, "unknown environment 'nope'", 2),
    "duplicate task id": ("rollout", [K[0], K[1], K[0]], None, "duplicate task_id", 3),
    "spec not an object": ("rollout", _mutate(K, 0, _set(["spec"], [1])), None, "must be an object", 1),
    "lineage wrong type": ("rollout", _mutate(K, 2, _set(["lineage"], {"root_id": 5})), None,
                           "lineage.root_id' must be a string", 3),
    "tasks not utf-8": ("rollout", b'{"task_id": "\xff"}\n', None, "not UTF-8", 1),
    "trajectories of another stage": ("judge", K, None, "looks like a tasks file", 1),
    "eval tasks missing prompt": ("eval", _mutate(K, 0, _del("prompt")), None, "missing field 'prompt'", 1),
    "adapt on tasks with bad env": ("adapt-tasks", _mutate(K, 0, _set(["env"], 3)), None,
                                    "field 'env' must be a string", 1),
}


def _write(path, content):
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, list):
        path.write_text("".join(line + "\n" for line in content))
    else:
        path.write_text(content)


def _args(stage, inp, out, judg, tmp_path):
    fake = tmp_path / "fake.json"
    fake.write_text('["\\\\boxed{1}"]')
    if stage == "score":
        return ["score", "-i", inp, "-o", out] + (["-j", judg] if judg else [])
    if stage == "train-policy":
        return ["train-policy", "-i", inp, "-o", out, "--model", str(tmp_path)]
    if stage in ("rollout", "judge"):
        return [stage, "-i", inp, "-o", out, "--engine", "fake", "--model", str(fake)]
    if stage == "eval":
        return ["eval", "-i", inp, "-o", out, "--engine", "fake", "--model", str(fake)]
    stats = tmp_path / "stats.jsonl"
    stats.write_text("")
    return ["adapt-tasks", "-i", inp, "--stats", str(stats), "-o", out, "--engine", "fake",
            "--model", str(fake)]


def assert_one_line_error(r, must_contain, where):
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert must_contain in lines[0], lines[0]
    assert where in lines[0], lines[0]


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input(name, tmp_path, cli):
    stage, content, judg_lines, expected, line = CASES[name]
    inp = tmp_path / "input.jsonl"
    _write(inp, content)
    judg = None
    if judg_lines is not None:
        judg = tmp_path / "judgments.jsonl"
        _write(judg, judg_lines)
    before = inp.read_bytes()
    out = tmp_path / "out" / "output.jsonl"
    r = cli(*_args(stage, str(inp), str(out), str(judg) if judg else None, tmp_path))
    culprit = judg if judg is not None and expected in (
        "score must be -1, 0 or +1", "judgment is for", "covers steps", "has no trajectory") else inp
    where = f"{culprit}:{line}:" if line else str(culprit)
    assert_one_line_error(r, expected, where)
    assert not out.exists() and not list(out.parent.glob("*.jsonl")) if out.parent.exists() else True
    assert inp.read_bytes() == before


def test_a_100_mb_line(tmp_path, cli):
    inp = tmp_path / "big.jsonl"
    with open(inp, "wb") as f:
        f.write(b'{"traj_id": "' + b"a" * (100 * 2**20) + b'"}\n')
    r = cli("score", "-i", str(inp), "-o", str(tmp_path / "s.jsonl"))
    assert_one_line_error(r, "line longer than 64 MiB", f"{inp}:1:")
    assert not (tmp_path / "s.jsonl").exists()


def test_wrong_schema_version(tmp_path, cli):
    inp = write_jsonl(tmp_path / "traj.jsonl", [make_traj("t", 0, 1)])
    (tmp_path / "traj.meta.json").write_text(json.dumps({"schema_version": 99}))
    r = cli("score", "-i", str(inp), "-o", str(tmp_path / "s.jsonl"))
    assert_one_line_error(r, "schema version 99", "traj.meta.json")


@pytest.mark.parametrize("args,expected", [
    (["score", "-i", "{missing}", "-o", "{out}"], "no such trajectories file"),
    (["score", "-i", "{dir}", "-o", "{out}"], "is a directory"),
    (["score", "-i", "{traj}", "--rm-acc-min", "0.9", "--rm-acc-max", "0.1", "-o", "{out}"], "--rm-acc-min"),
    (["rollout", "-i", "{tasks}", "-o", "{out}", "--engine", "hf", "--model", "/nonexistent/model"], "no such model directory"),
    (["rollout", "-i", "{tasks}", "-o", "{out}", "--engine", "hf", "--model", "{dir}"], "not a model directory"),
    (["rollout", "-i", "{tasks}", "-o", "{out}", "--adapter", "{dir}"], "not a LoRA adapter directory"),
    (["rollout", "-i", "{tasks}", "-o", "{out}", "--n", "0"], "--n must be >= 1"),
    (["rollout", "-i", "{tasks}", "-o", "{out}", "--engine", "nope"], "'nope' is not one of"),
    (["eval", "-i", "{tasks}", "-o", "{out}", "--n", "2", "--k", "4"], "--k must be <= --n 2"),
    (["loop", "{badtoml}"], "invalid TOML"),
    (["loop", "{unknownkey}"], "unknown key 'lambda'"),
    (["train-policy", "-i", "{noscored}", "-o", "{out}", "--model", "{tiny}"], "no training samples"),
])
def test_bad_flags_and_paths(args, expected, tmp_path, cli, tiny_model):
    (tmp_path / "d").mkdir()
    traj = write_jsonl(tmp_path / "traj.jsonl", [make_traj("t", 0, 1)])
    tasks = tmp_path / "tasks.jsonl"
    _write(tasks, K)
    (tmp_path / "bad.toml").write_text("name = \n")
    (tmp_path / "unknown.toml").write_text('name = "x"\ntasks = "t.jsonl"\nlambda = 1\n')
    from rlany.stages.score import ScoreOptions, score_group
    scored, _ = score_group([("x:1", make_traj("t", 0, 1), None), ("x:2", make_traj("t", 1, 1), None)],
                            ScoreOptions(lam=0.0))
    noscored = write_jsonl(tmp_path / "noscored.jsonl", scored)   # uniform outcome: nothing kept
    fmt = {"missing": str(tmp_path / "nope.jsonl"), "dir": str(tmp_path / "d"),
           "out": str(tmp_path / "out.jsonl"), "traj": str(traj), "tasks": str(tasks),
           "badtoml": str(tmp_path / "bad.toml"), "unknownkey": str(tmp_path / "unknown.toml"),
           "noscored": str(noscored), "tiny": tiny_model}
    r = cli(*[a.format(**fmt) for a in args])
    usage = any(a in args for a in ("--rm-acc-min", "--n", "--engine")) and args[0] != "loop" \
        and "--model" not in args
    assert r.returncode == (2 if usage else 1), r.stderr   # 2: a flag's value; 1: bad input
    lines = [x for x in r.stderr.splitlines() if x.strip() and not x.startswith(("Loading", "train-"))]
    assert len(lines) == 1 and expected in lines[0] and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "out.jsonl").exists()
