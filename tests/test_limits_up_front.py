"""Refused up front, in one line, before an engine starts or a model loads:

* sizes no run can hold (`rlany.limits`): a flag past its ceiling, and the products that
  need the input's size (episodes per batch and per output, judge samples per call and
  verdicts per output), usage errors (exit 2); a shard is checked alone;
* `--kl-ref init` outside a loop, a usage error (exit 2): tests/test_kl_ref.py;
* every file a stage writes beside its output (a sidecar, a partial output and its index,
  a lock, a trainer's metrics, partial state and temp checkpoint) that is a FIFO, a link
  (to /proc or anywhere), or the wrong kind of file: the same usage error as `-o` there.
Nothing is written in any of these cases."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import make_judgment, make_traj, one_line, write_jsonl
from rlany.envs.reasoning import make_tasks
from rlany.stages.score import ScoreOptions, score_group

BIG = "1000000000"


@pytest.fixture
def work(tmp_path) -> Path:
    """A folder with tasks files of 4, 20 and 1,001 tasks, trajectories and a fake script."""
    for n in (4, 20, 1001):
        write_jsonl(tmp_path / f"tasks{n}.jsonl", make_tasks(n, seed=1))
    write_jsonl(tmp_path / "traj.jsonl", [make_traj(f"t{k}", i, 1) for k in range(20)
                                          for i in range(2)])
    write_jsonl(tmp_path / "traj10k.jsonl", [make_traj(f"t{k}", 0, 1) for k in range(10_001)])
    (tmp_path / "fake.json").write_text(json.dumps(["\\boxed{7}"]))
    return tmp_path


def _made(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


FAKE = ("--engine", "fake", "--model", "{w}/fake.json")
CASES = [  # (argv, the refusal), run in the work folder: {w}
    (("rollout", "-i", "{w}/tasks4.jsonl", "-o", "{w}/out.jsonl", "--n", BIG, *FAKE),
     "--n must be <= 100,000, got 1000000000"),
    (("rollout", "-i", "{w}/tasks4.jsonl", "-o", "{w}/out.jsonl", "--batch-tasks", BIG, *FAKE),
     "--batch-tasks must be <= 1,000,000"),
    (("rollout", "-i", "{w}/tasks4.jsonl", "-o", "{w}/out.jsonl", "--max-tokens", BIG, *FAKE),
     "--max-tokens must be <= 1,048,576"),
    (("rollout", "-i", "{w}/tasks4.jsonl", "-o", "{w}/out.jsonl", "--engine-batch", BIG,
      *FAKE), "--engine-batch must be <= 1,000,000"),
    (("rollout", "-i", "{w}/tasks20.jsonl", "-o", "{w}/out.jsonl", "--n", "100000", *FAKE),
     "--n 100000 x 16 tasks per batch (--batch-tasks) = 1,600,000 episodes stepped together"),
    (("rollout", "-i", "{w}/tasks1001.jsonl", "-o", "{w}/out.jsonl", "--n", "100000",
      "--batch-tasks", "1", *FAKE),
     "--n 100000 x 1,001 tasks = 100,100,000 episodes: over the 100,000,000"),
    (("eval", "-i", "{w}/tasks4.jsonl", "-o", "{w}/eval.json", "--n", BIG, *FAKE),
     "--n must be <= 100,000"),
    (("eval", "-i", "{w}/tasks4.jsonl", "-o", "{w}/eval.json", "--judge", "--m", BIG, *FAKE),
     "--m must be <= 100,000"),
    (("eval", "-i", "{w}/tasks20.jsonl", "-o", "{w}/eval.json", "--n", "100000",
      "--batch-tasks", "1", *FAKE), "= 2,000,000 episodes: over the 1,000,000 one eval"),
    (("judge", "-i", "{w}/traj.jsonl", "-o", "{w}/out.jsonl", "--m", BIG, *FAKE),
     "--m must be <= 100,000"),
    (("judge", "-i", "{w}/traj.jsonl", "-o", "{w}/out.jsonl", "--m", "100000", *FAKE),
     "--m 100000 x 40 trajectories per batch (--batch-trajectories) = 4,000,000 samples"),
    (("judge", "-i", "{w}/traj10k.jsonl", "-o", "{w}/out.jsonl", "--m", "100000",
      "--batch-trajectories", "10", *FAKE),
     "--m 100000 x 10,001 judged steps = 1,000,100,000 verdicts"),
]


@pytest.mark.parametrize("argv, says", CASES, ids=[" ".join(c[0][:1] + c[0][5:7])
                                                    for c in CASES])
def test_sizes_no_run_can_hold_are_refused_before_the_engine_starts(work, cli, argv, says):
    before = _made(work)
    r = cli(*(a.format(w=work) for a in argv))
    assert says in one_line(r, 2), r.stderr
    assert "starting engine" not in r.stderr and _made(work) == before


def test_a_shard_is_checked_alone(work, cli):
    """1,001 tasks x 100,000 episodes is over one output's ceiling; half of them is not:
    that shard passes the check and goes on (to the engine, which is not there)."""
    argv = ["rollout", "-i", f"{work}/tasks1001.jsonl", "-o", f"{work}/out.jsonl", "--n",
            "100000", "--batch-tasks", "1", "--engine", "fake", "--model", f"{work}/nothing"]
    assert "100,100,000 episodes" in one_line(cli(*argv), 2)
    r = cli(*argv, "--shard", "0/2")
    assert "starting engine" in r.stderr and "nothing" in one_line(r, 1)


# -- every file written beside an output, checked as -o is --------------------------

def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _to_proc(path: Path) -> None:
    path.symlink_to("/proc/self/fd/1")


def _file(path: Path) -> None:
    path.write_text("mine\n")


def _dir_link(path: Path) -> None:
    (path.parent / "elsewhere").mkdir()
    path.symlink_to(path.parent / "elsewhere")


@pytest.mark.parametrize("name, make, what", [
    ("ckpt.metrics.jsonl", _fifo, "--output's metrics"),
    ("ckpt.metrics.jsonl", _to_proc, "--output's metrics"),
    ("ckpt.partial", _file, "--output's partial state"),
    ("ckpt.tmp", _dir_link, "--output's temp checkpoint"),
    (".ckpt.lock", _fifo, "--output's lock"),
])
def test_a_trainers_side_outputs_are_checked_before_the_model_loads(tmp_path, cli, tiny_model,
                                                                    name, make, what):
    trajs = [make_traj("q", i, +1 if i < 2 else -1) for i in range(4)]
    scored, _ = score_group([(f"x:{i}", t, None) for i, t in enumerate(trajs)],
                            ScoreOptions())
    data = write_jsonl(tmp_path / "scored.jsonl", scored)
    make(tmp_path / name)
    before = _made(tmp_path)
    r = cli("train-policy", "-i", str(data), "-o", str(tmp_path / "ckpt"), "--model",
            tiny_model)
    assert one_line(r, 2).startswith(f"usage error: {what} {tmp_path / name}: "), r.stderr
    assert "samples (" not in r.stderr and _made(tmp_path) == before  # the model never loaded


@pytest.mark.parametrize("stage, name, make, what", [
    ("rollout", "out.meta.json", _fifo, "--output's sidecar"),
    ("rollout", "out.jsonl.partial", _fifo, "--output's partial output"),
    ("rollout", "out.jsonl.partial.idx", _to_proc, "--output's partial index"),
    ("rollout", ".out.jsonl.lock", _fifo, "--output's lock"),
    ("judge", "out.jsonl.partial", _fifo, "--output's partial output"),
    ("judge", ".out.jsonl.lock", _to_proc, "--output's lock"),
    ("eval", "out.meta.json", _fifo, "--output's sidecar"),
])
def test_a_stages_side_outputs_are_checked_before_the_engine_starts(work, cli, stage, name,
                                                                    make, what):
    make(work / name)
    before = _made(work)
    out = work / ("out.json" if stage == "eval" else "out.jsonl")
    source = work / ("traj.jsonl" if stage == "judge" else "tasks4.jsonl")
    r = cli(stage, "-i", str(source), "-o", str(out), "--engine", "fake", "--model",
            str(work / "fake.json"))
    assert one_line(r, 2).startswith(f"usage error: {what} {work / name}: "), r.stderr
    assert "starting engine" not in r.stderr and _made(work) == before


def test_score_checks_both_sidecars_before_writing(tmp_path, cli):
    """score commits its two files together, then their sidecars: a FIFO at the stats'
    sidecar was found only after both files were in place."""
    trajs = [make_traj("q", i, 1 if i < 2 else -1) for i in range(4)]
    t = write_jsonl(tmp_path / "traj.jsonl", trajs)
    j = write_jsonl(tmp_path / "judg.jsonl", [make_judgment(x, [[1, -1, 1]]) for x in trajs])
    _fifo(tmp_path / "task_stats.meta.json")
    before = _made(tmp_path)
    r = cli("score", "-i", str(t), "-j", str(j), "-o", str(tmp_path / "scored.jsonl"))
    assert one_line(r, 2).startswith("usage error: --stats's sidecar "), r.stderr
    assert _made(tmp_path) == before
