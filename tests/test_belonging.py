"""Records that do not belong together are refused even without sidecars (issue 50, item 2):
judgments of another pool's rollout with the same ids (by what they judged), trajectories of
two pools in one task group and records of another pool's task (by the task's digest), a
record repeated in a trainer's, judge's or score's input (naming both lines), and a run
directory resumed under a changed config whether or not its config.json survives."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import make_judgment, make_traj, one_line, read_jsonl, write_jsonl
from rlany.envs.reasoning import make_tasks
from rlany.errors import RlanyError
from rlany.files.records import Trajectory, from_json, to_json

ONE_ANSWER = {"rules": [{"match": "## The agent", "responses": ["ok \\boxed{+1}",
                                                                "bad \\boxed{-1}"]},
                        {"responses": ["\\boxed{4}"]}]}  # every question: the same answer


@pytest.fixture
def two_pools(tmp_path, cli):
    """Two pools with the same task ids and other questions, each rolled out (the same
    response everywhere: the responses digest cannot tell them apart) and judged."""
    pool_a = make_tasks(3, seed=0)
    rows = [to_json(t) for t in make_tasks(3, seed=9)]
    for row, task in zip(rows, pool_a):
        row["task_id"] = row["lineage"]["root_id"] = task.task_id
    assert [r["spec"] for r in rows] != [t.spec for t in pool_a]
    fake = tmp_path / "fake.json"
    fake.write_text(json.dumps(ONE_ANSWER))
    out = {}
    for name, tasks in (("a", [to_json(t) for t in pool_a]), ("b", rows)):
        pool = write_jsonl(tmp_path / f"pool_{name}.jsonl", tasks)
        traj, judg = tmp_path / f"traj_{name}.jsonl", tmp_path / f"judg_{name}.jsonl"
        for args in (["rollout", "-i", pool, "-o", traj, "--n", "2"],
                     ["judge", "-i", traj, "-o", judg, "--m", "2"]):
            r = cli(*map(str, args), "--engine", "fake", "--model", str(fake))
            assert r.returncode == 0, r.stderr
        out[name] = (traj, judg)
    assert [t["steps"][0]["response"] for t in read_jsonl(out["a"][0])] == \
        [t["steps"][0]["response"] for t in read_jsonl(out["b"][0])]
    return out


def test_judgments_of_another_pool_with_the_same_ids_are_refused_without_a_sidecar(
        two_pools, tmp_path, cli):
    (traj_a, judg_a), (_, judg_b) = two_pools["a"], two_pools["b"]
    copy = tmp_path / "copy.jsonl"  # no sidecar: checked by what each judgment judged
    shutil.copyfile(judg_b, copy)
    out = tmp_path / "scored.jsonl"
    line = one_line(cli("score", "-i", str(traj_a), "-j", str(copy), "-o", str(out)), 1)
    assert "copy.jsonl:1:" in line and "judged another trajectory" in line
    stream = "".join(a + b for a, b in zip(traj_a.read_text().splitlines(keepends=True),
                                           copy.read_text().splitlines(keepends=True)))
    line = one_line(cli("score", "-i", "-", "-o", str(out), stdin=stream), 1)
    assert "<stdin>:2:" in line and "judged another trajectory" in line
    assert not out.exists()
    r = cli("score", "-i", str(traj_a), "-j", str(judg_a), "-o", str(out))
    assert r.returncode == 0, r.stderr


def _with_digest(judgments, trajectories, path):
    """Judgments as `rlany judge` writes them with `provenance.judgment_origin`."""
    from rlany.files.provenance import judgment_origin

    rows = read_jsonl(judgments)
    for row, traj in zip(rows, read_jsonl(trajectories)):
        row.update(judgment_origin(from_json(Trajectory, traj)))
    return write_jsonl(path, rows)


def test_a_judgment_with_the_trajectory_digest_is_paired_by_the_whole_trajectory(
        two_pools, tmp_path, cli):
    traj_a, judg_a = two_pools["a"]
    judged = _with_digest(judg_a, traj_a, tmp_path / "judged.jsonl")
    out = str(tmp_path / "s.jsonl")
    assert cli("score", "-i", str(traj_a), "-j", str(judged), "-o", out).returncode == 0
    rows = read_jsonl(traj_a)  # the same responses and prompts, another outcome
    rows[1].update(outcome=1, finish="success")
    other = write_jsonl(tmp_path / "other.jsonl", rows)
    line = one_line(cli("score", "-i", str(other), "-j", str(judged), "-o", out), 1)
    assert "judged.jsonl:2:" in line and "trajectory_sha256" in line
    # an older judgment without the digest (and here no sidecar): paired the old way, by
    # id, responses and what its prompts show, which an outcome is not
    older = write_jsonl(tmp_path / "older.jsonl", [
        {k: v for k, v in row.items() if k not in ("trajectory_sha256", "task_sha256")}
        for row in read_jsonl(judg_a)])
    assert cli("score", "-i", str(other), "-j", str(older), "-o", out).returncode == 0


def test_a_hand_made_judgment_is_still_paired_by_id_and_steps(tmp_path, cli):
    trajs = [make_traj("t", i, 1 if i else -1, n_steps=2) for i in range(2)]
    traj = write_jsonl(tmp_path / "traj.jsonl", trajs)
    judg = write_jsonl(tmp_path / "judg.jsonl", [make_judgment(t, [[1], [-1]]) for t in trajs])
    assert cli("score", "-i", str(traj), "-j", str(judg), "-o",
               str(tmp_path / "s.jsonl")).returncode == 0


def test_trajectories_of_two_pools_in_one_task_group_are_refused(tmp_path, cli):
    trajs = [to_json(make_traj("t", i, 1 if i else -1)) for i in range(3)]
    for row, digest in zip(trajs, ("a" * 64, "a" * 64, "b" * 64)):
        row["task_sha256"] = digest
    path = write_jsonl(tmp_path / "traj.jsonl", trajs)
    line = one_line(cli("score", "-i", str(path), "-o", str(tmp_path / "s.jsonl")), 1)
    assert "traj.jsonl:3:" in line and "traj.jsonl:1" in line and "two pools" in line


def test_stats_and_judgments_of_another_pools_tasks_are_refused_by_the_task_digest(
        two_pools, tmp_path, cli):
    """What adapt-tasks calls (`provenance.check_answers_pool`) on records that carry the
    digest of the task they answer (`task_sha256`); records without it are unknown."""
    from rlany.files.provenance import TASK_SHA256, check_answers_pool, task_digest
    from rlany.files.records import Task

    pools = {k: [from_json(Task, r) for r in read_jsonl(tmp_path / f"pool_{k}.jsonl")]
             for k in "ab"}
    judg_b = read_jsonl(two_pools["b"][1])
    stats = tmp_path / "stats.jsonl"
    r = cli("score", "-i", str(two_pools["b"][0]), "-j", str(two_pools["b"][1]), "-o",
            str(tmp_path / "s.jsonl"), "--stats", str(stats))
    assert r.returncode == 0, r.stderr
    bare = write_jsonl(tmp_path / "bare.jsonl", [  # no sidecar, no digest: unknown
        {k: v for k, v in row.items() if k != TASK_SHA256} for row in read_jsonl(stats)])
    check_answers_pool(pools["a"], str(bare), None, ("bare.jsonl", None))
    by_id = {t.task_id: t for t in pools["b"]}
    for name, rows in (("stats_b.jsonl", read_jsonl(stats)), ("judg_b.jsonl", judg_b)):
        for row in rows:
            row[TASK_SHA256] = task_digest(by_id[row["task_id"]])
        write_jsonl(tmp_path / name, rows)
    stats_b, judgments_b = str(tmp_path / "stats_b.jsonl"), str(tmp_path / "judg_b.jsonl")
    check_answers_pool(pools["b"], stats_b, judgments_b, ("stats_b.jsonl", "judg_b.jsonl"))
    with pytest.raises(RlanyError, match="task stats of another task .* another pool") as e:
        check_answers_pool(pools["a"], stats_b, None, ("stats_b.jsonl", None))
    assert e.value.where == "stats_b.jsonl:1"
    with pytest.raises(RlanyError, match="judgment of another task") as e:
        check_answers_pool(pools["a"], str(bare), judgments_b, ("bare.jsonl", "judg_b.jsonl"))
    assert e.value.where == "judg_b.jsonl:1"


# -- a record repeated -------------------------------------------------------------------

@pytest.fixture
def scored(tmp_path):
    from rlany.stages.score import ScoreOptions, score_group

    trajs = [make_traj("q", i, +1 if i < 2 else -1, n_steps=2) for i in range(4)]
    scores = [[[1, -1, 1], [1, 1, -1]], [[1, 1, 1], [-1, 1, 1]],
              [[-1, -1, 1], [-1, 1, -1]], [[1, -1, -1], [-1, -1, -1]]]
    records, _ = score_group([(f"x:{i}", t, make_judgment(t, s))
                              for i, (t, s) in enumerate(zip(trajs, scores))], ScoreOptions())
    assert all(any(s.keep for s in r.steps) for r in records)
    return records, trajs


@pytest.mark.parametrize("command", ["train-policy", "train-rm", "sft"])
def test_a_trainers_input_with_a_record_repeated_is_refused_naming_both_lines(
        command, scored, tmp_path, cli):
    records, trajs = scored
    rows = [to_json(r) for r in (trajs if command == "sft" else records)]
    data = write_jsonl(tmp_path / "in.jsonl", [*rows, rows[1]])
    r = cli(command, "-i", str(data), "-o", str(tmp_path / "out"), "--model",
            str(tmp_path / "no-model"))  # refused before any model is looked for
    line = one_line(r, 1)
    assert "in.jsonl:5:" in line and "first at" in line and "in.jsonl:2" in line
    assert "trained on twice" in line and not (tmp_path / "out").exists()


def test_a_scored_record_holding_a_step_twice_is_refused(scored, tmp_path, cli):
    rows = [to_json(r) for r in scored[0]]
    rows[2]["steps"][1]["step"] = 0
    data = write_jsonl(tmp_path / "in.jsonl", rows)
    line = one_line(cli("train-policy", "-i", str(data), "-o", str(tmp_path / "out"),
                        "--model", "x"), 1)
    assert "in.jsonl:3:" in line and "step 0 twice" in line


def test_engine_logprobs_of_another_adapter_than_training_starts_from_are_refused(
        scored, tmp_path, cli):
    """PPO's pre-update log-probs from generation are the sampling policy's: records sampled
    by iter_000's adapter, trained from the base model, would measure the ratio and the KL
    against another policy. Refused at the record; `--old-logprobs recompute` trains."""
    rows = [to_json(r) for r in scored[0]]
    for row in rows:
        row["policy"] = {"model": "m", "adapter": "runs/a/iter_000/policy"}
        for step in row["steps"]:  # the sampled ids and the engine's log-prob of each
            step["token_ids"] = step.get("token_ids") or [11, 12]
            step["logprobs"] = [-0.5] * len(step["token_ids"])
    data = write_jsonl(tmp_path / "in.jsonl", rows)
    line = one_line(cli("train-policy", "-i", str(data), "-o", str(tmp_path / "out"),
                        "--model", str(tmp_path / "no-model")), 1)
    assert "in.jsonl:1:" in line and "sampled by adapter runs/a/iter_000/policy, but " \
        "training starts from None" in line and not (tmp_path / "out").exists()
    line = one_line(cli("train-policy", "-i", str(data), "-o", str(tmp_path / "out"),
                        "--model", str(tmp_path / "no-model"), "--old-logprobs",
                        "recompute"), 1)
    assert "sampled by" not in line   # past the check: it fails at the missing model
    del rows[-1]["steps"][-1]["logprobs"]  # one sample without: auto recomputes them all
    data = write_jsonl(tmp_path / "in.jsonl", rows)
    line = one_line(cli("train-policy", "-i", str(data), "-o", str(tmp_path / "out"),
                        "--model", str(tmp_path / "no-model")), 1)
    assert "sampled by" not in line
    line = one_line(cli("train-policy", "-i", str(data), "-o", str(tmp_path / "out"),
                        "--model", str(tmp_path / "no-model"), "--old-logprobs",
                        "generation"), 1)    # which it is told not to: refused
    assert "in.jsonl:1:" in line and "sampled by adapter" in line


def test_judge_and_score_inputs_with_a_record_repeated_are_refused(tmp_path, cli):
    trajs = [make_traj("t", i, 1 if i else -1) for i in range(3)]
    judgments = [make_judgment(t, [[1]]) for t in trajs]
    repeated = write_jsonl(tmp_path / "traj.jsonl", [*trajs, trajs[2]])  # consecutive
    out = str(tmp_path / "out.jsonl")
    line = one_line(cli("score", "-i", str(repeated), "-o", out), 1)
    assert "traj.jsonl:4:" in line and "duplicate trajectory 't/0/2' (first at" in line
    line = one_line(cli("judge", "-i", str(repeated), "-o", out, "--engine", "fake",
                        "--model", "x"), 1)
    assert "traj.jsonl:4:" in line and "duplicate trajectory" in line
    later = write_jsonl(tmp_path / "later.jsonl",
                        [*trajs, make_traj("u", 0, 1), trajs[0]])  # after another task
    assert "appears again" in one_line(cli("score", "-i", str(later), "-o", out), 1)
    traj = write_jsonl(tmp_path / "t3.jsonl", trajs)
    judg = write_jsonl(tmp_path / "j.jsonl", [*judgments, judgments[2]])
    line = one_line(cli("score", "-i", str(traj), "-j", str(judg), "-o", out), 1)
    assert "j.jsonl:4:" in line and "has no trajectory" in line
    judg = write_jsonl(tmp_path / "j.jsonl", [judgments[0], judgments[0], judgments[2]])
    assert "j.jsonl:2:" in one_line(cli("score", "-i", str(traj), "-j", str(judg), "-o",
                                        out), 1)


# -- a run directory resumed under another config ----------------------------------------

def _config(tmp_path, model, n=4, rm_training=True, lr=None, seed=None) -> str:
    tasks = tmp_path / "tasks.jsonl"
    if not tasks.exists():
        write_jsonl(tasks, make_tasks(3, seed=5))
    settings = {"name": "run", "runs_dir": str(tmp_path / "runs"), "iterations": 1,
                "tasks": str(tasks), "model": model, "engine": "fake", "keep_last": 3,
                "env_adaptation": False, "rm_training": rm_training,
                **({"seed": seed} if seed is not None else {})}
    lines = [f"{k} = {json.dumps(v)}" for k, v in settings.items()]
    lines += ["[rollout]", f"n = {n}", "[judge]", "m = 2", "[train_policy]",
              "micro_batch = 4", "grad_accum = 1", "lora_r = 4", "max_steps = 1",
              *([f"lr = {lr}"] if lr else []), "[train_rm]", "micro_batch = 4",
              "grad_accum = 1", "lora_r = 4", "max_steps = 1"]
    path = tmp_path / f"loop{len(list(tmp_path.glob('loop*.toml')))}.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.fixture
def finished_run(tmp_path, tiny_model, cli):
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    (model / "fake_script.json").write_text(json.dumps({"rules": [
        {"match": "## The agent", "responses": ["ok \\boxed{+1}", "bad \\boxed{-1}"]},
        {"responses": ["\\boxed{5}", "\\boxed{8}", "\\boxed{9}"]}]}))
    config = _config(tmp_path, str(model))
    r = cli("loop", config)
    assert r.returncode == 0, r.stderr
    return tmp_path / "runs" / "run", str(model)


@pytest.mark.parametrize("echo", ["kept", "deleted"])
def test_a_changed_config_is_refused_for_the_stages_already_done(echo, finished_run, tmp_path,
                                                                 cli):
    run, model = finished_run
    if echo == "deleted":
        (run / "config.json").unlink()
    line = one_line(cli("loop", _config(tmp_path, model, n=6), "--iterations", "2"), 1)
    assert "different config: rollout.n was 4" in line and "gives 6" in line
    assert "only iterations may be raised" in line
    assert ("config.json" in line) == (echo == "kept")
    assert not (run / "iter_001").exists()
    if echo == "deleted":  # a stage's own record names it, whichever key changed
        assert "iter_000/trajectories.meta.json" in line


@pytest.mark.parametrize("change, words", [
    (dict(seed=3), "seed was 0"),
    (dict(lr=1e-5), "train_policy.lr was 0.0003"),
    (dict(rm_training=False), "train_rm ran in it, and this config does not run it"),
])
def test_without_config_json_each_finished_stage_checks_its_own_record(change, words,
                                                                       finished_run, tmp_path):
    from rlany.loop.loop import Loop, load_config

    run, model = finished_run
    (run / "config.json").unlink()
    config = _config(tmp_path, model, **change)
    with pytest.raises(RlanyError, match="different config") as e:
        Loop(load_config(config), config)._init_run_dir()
    assert words in e.value.message and not (run / "config.json").exists()
    same = _config(tmp_path, model)  # the run's own config: resumed, and echoed again
    Loop(load_config(same, {"iterations": 2}), same)._init_run_dir()
    assert json.loads((run / "config.json").read_text())["iterations"] == 2


def test_a_key_written_at_its_default_resumes_the_run_that_left_it_out(finished_run,
                                                                        tmp_path):
    from rlany.loop.loop import Loop, load_config

    run, model = finished_run
    written = _config(tmp_path, model, lr=3e-4)  # train-policy's default, now written out
    Loop(load_config(written, {"iterations": 2}), written)._init_run_dir()
    echo = json.loads((run / "config.json").read_text())
    assert echo["tables"]["train_policy"]["lr"] == 3e-4 and echo["iterations"] == 2
    other = _config(tmp_path, model, lr=1e-4)    # not the default: still refused
    with pytest.raises(RlanyError, match="train_policy.lr was 0.0003"):
        Loop(load_config(other, {"iterations": 2}), other)._init_run_dir()


def test_a_key_the_loop_reads_by_presence_is_not_its_default_left_out(finished_run,
                                                                       tmp_path):
    from pathlib import Path

    from rlany.loop.loop import Loop, load_config

    run, model = finished_run
    config = Path(_config(tmp_path, model))  # `[eval] judge = false`: no judge, unlike none
    config.write_text(config.read_text() + "[eval]\njudge = false\n")
    with pytest.raises(RlanyError, match="eval.judge was absent, the config now gives false"):
        Loop(load_config(str(config)), str(config))._init_run_dir()
