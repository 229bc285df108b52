"""Files that do not belong together are refused, by class: judgments of another rollout
(by sidecar digest, or by the responses digest each judgment carries), stats and judgments
of another pool or rollout, impossible records, task specs their env cannot grade, and a
checkpoint chain with a missing, damaged or pruned link. Also the loop's run lock and its
config checks (paths included, usage errors naming the command-line value)."""

from __future__ import annotations

import fcntl
import json
import shutil

import pytest

from conftest import make_judgment, make_traj, one_line, read_jsonl, write_jsonl
from rlany.envs.reasoning import make_tasks
from rlany.errors import RlanyError


@pytest.fixture
def two_rollouts(tmp_path, cli):
    """Two rollouts of one pool (same ids, other responses), each judged: real sidecars."""
    tasks = write_jsonl(tmp_path / "tasks.jsonl", make_tasks(3, seed=0))
    fake = tmp_path / "fake.json"
    fake.write_text(json.dumps({"rules": [
        {"match": "## The agent", "responses": ["ok \\boxed{+1}", "bad \\boxed{-1}"]},
        {"responses": ["\\boxed{1}", "\\boxed{2}", "\\boxed{3}", "\\boxed{4}"]}]}))
    out = {}
    for name, seed in (("a", 0), ("b", 7)):
        traj, judg = tmp_path / f"traj_{name}.jsonl", tmp_path / f"judg_{name}.jsonl"
        for args in (["rollout", "-i", tasks, "-o", traj, "--n", "3", "--seed", str(seed)],
                     ["judge", "-i", traj, "-o", judg, "--m", "2"]):
            r = cli(*map(str, args), "--engine", "fake", "--model", str(fake))
            assert r.returncode == 0, r.stderr
        out[name] = (traj, judg)
    assert [t["traj_id"] for t in read_jsonl(out["a"][0])] == \
        [t["traj_id"] for t in read_jsonl(out["b"][0])]
    return tasks, fake, out


def test_judgments_of_another_rollout_are_refused(two_rollouts, tmp_path, cli):
    _, _, runs = two_rollouts
    (traj_a, judg_a), (_, judg_b) = runs["a"], runs["b"]
    out = tmp_path / "scored.jsonl"
    # by the sidecar: judg_b was made from traj_b's bytes
    assert "another trajectories file" in one_line(
        cli("score", "-i", str(traj_a), "-j", str(judg_b), "-o", str(out)), 1)
    # without a sidecar (a copy, or a stream): by each judgment's responses digest
    copy = tmp_path / "copy.jsonl"
    shutil.copyfile(judg_b, copy)
    line = one_line(cli("score", "-i", str(traj_a), "-j", str(copy), "-o", str(out)), 1)
    assert "copy.jsonl:" in line and "judged other responses" in line
    mixed = "".join(a + b for a, b in zip(traj_a.read_text().splitlines(keepends=True),
                                          copy.read_text().splitlines(keepends=True)))
    assert "judged other responses" in one_line(
        cli("score", "-i", "-", "-o", str(out), stdin=mixed), 1)
    assert not out.exists()
    # the right pair is accepted
    r = cli("score", "-i", str(traj_a), "-j", str(judg_a), "-o", str(out))
    assert r.returncode == 0, r.stderr


def test_a_hand_made_judgment_is_paired_by_id_and_steps_only(tmp_path, cli):
    """No sidecar and no digest: what can still be checked is checked (ids, every step)."""
    trajs = [make_traj("t", i, 1 if i else -1, n_steps=2) for i in range(2)]
    traj = write_jsonl(tmp_path / "traj.jsonl", trajs)
    judg = write_jsonl(tmp_path / "judg.jsonl", [make_judgment(t, [[1], [-1]]) for t in trajs])
    assert cli("score", "-i", str(traj), "-j", str(judg), "-o",
               str(tmp_path / "s.jsonl")).returncode == 0
    rows = read_jsonl(judg)
    rows[0]["steps"][1]["step"] = 5  # a judged step that does not exist
    write_jsonl(judg, rows)
    assert "covers steps [0, 5]" in one_line(
        cli("score", "-i", str(traj), "-j", str(judg), "-o", str(tmp_path / "s.jsonl")), 1)


def _score(cli, traj, judg, tmp_path, name):
    stats = tmp_path / f"{name}_stats.jsonl"
    r = cli("score", "-i", str(traj), "-j", str(judg), "-o", str(tmp_path / f"{name}.jsonl"),
            "--stats", str(stats))
    assert r.returncode == 0, r.stderr
    return stats


def test_adapt_refuses_stats_and_judgments_of_another_pool_or_rollout(two_rollouts, tmp_path,
                                                                       cli):
    tasks, fake, runs = two_rollouts
    stats_a = _score(cli, *runs["a"], tmp_path, "a")
    _score(cli, *runs["b"], tmp_path, "b")
    base = ["adapt-tasks", "--engine", "fake", "--model", str(fake), "-o",
            str(tmp_path / "next.jsonl"), "--candidates", str(tmp_path / "cand.jsonl")]
    other_pool = write_jsonl(tmp_path / "other.jsonl", make_tasks(3, seed=9))
    line = one_line(cli(*base, "-i", str(other_pool), "--stats", str(stats_a)), 1)
    assert "another pool" in line and "a_stats.jsonl:1" in line
    line = one_line(cli(*base, "-i", str(tasks), "--stats", str(stats_a), "-j",
                        str(runs["b"][1])), 1)
    assert "different rollouts" in line
    # judgments of tasks the stats do not have (no sidecars to compare: by content)
    foreign = tmp_path / "foreign.jsonl"
    rows = read_jsonl(runs["a"][1])
    rows[0]["task_id"] = "not-in-pool"
    write_jsonl(foreign, rows)
    assert "was scored with other judgments" in one_line(
        cli(*base, "-i", str(tasks), "--stats", str(stats_a), "-j", str(foreign)), 1)
    bare = tmp_path / "bare_stats.jsonl"  # no sidecar either: checked by content
    shutil.copyfile(stats_a, bare)
    line = one_line(cli(*base, "-i", str(tasks), "--stats", str(bare), "-j", str(foreign)), 1)
    assert "foreign.jsonl:1" in line and "has no stats" in line
    assert not (tmp_path / "next.jsonl").exists()
    r = cli(*base, "-i", str(tasks), "--stats", str(stats_a), "-j", str(runs["a"][1]))
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("change, words", [
    ({"acc": 1.7}, "'acc' is 1.7"),
    ({"successes": 9}, "'successes' must be between 0 and n"),
    ({"n": 0}, "'n' must be >= 1"),
    ({"parse_fail_rate": 1.5}, "'parse_fail_rate' must be between 0 and 1"),
    ({"judge_outcome_agreement": -0.1}, "'judge_outcome_agreement' must be between"),
    ({"step_score_mean": 3.0}, "'step_score_mean' must be between -1 and 1"),
    ({"rm_samples": -2}, "sample counts must be >= 0"),
])
def test_impossible_task_stats_are_refused_at_their_line(change, words, tmp_path, cli):
    tasks = write_jsonl(tmp_path / "tasks.jsonl", make_tasks(2, seed=0))
    stats = [{"task_id": t.task_id, "n": 4, "successes": 2, "acc": 0.5, "mean_steps": 1.0,
              "policy_keep": True, "policy_reason": "", "rm_keep": True, "rm_reason": "",
              "policy_samples": 4, "rm_samples": 4, "step_score_mean": 0.0,
              "parse_fail_rate": 0.0, "judge_outcome_agreement": 0.5}
             for t in make_tasks(2, seed=0)]
    stats[1].update(change)
    path = tmp_path / "stats.jsonl"
    path.write_text("".join(json.dumps(s) + "\n" for s in stats))
    line = one_line(cli("adapt-tasks", "-i", str(tasks), "--stats", str(path), "-o",
                        str(tmp_path / "n.jsonl"), "--engine", "fake", "--model", "x"), 1)
    assert "stats.jsonl:2" in line and words in line


@pytest.mark.parametrize("path, value, words", [
    (["outcome"], 0, "outcome must be -1 or +1"),
    (["sample"], -1, "must be >= 0"),
    (["completion_tokens"], -5, "token counts must be >= 0"),
])
def test_impossible_trajectories_are_refused_at_their_line(path, value, words, tmp_path, cli):
    rows = read_jsonl(write_jsonl(tmp_path / "t.jsonl", [make_traj("t", i, 1)
                                                        for i in range(2)]))
    rows[1][path[0]] = value
    write_jsonl(tmp_path / "t.jsonl", rows)
    line = one_line(cli("score", "-i", str(tmp_path / "t.jsonl"), "-o",
                        str(tmp_path / "s.jsonl")), 1)
    assert "t.jsonl:2" in line and words in line


@pytest.mark.parametrize("env, spec, words", [
    ("reasoning", {"question": "What is 2 + 2?", "answer": "5"}, "wrong answer"),
    ("reasoning", {"question": "", "answer": "5"}, "non-empty string"),
    ("household", {"rooms": "kitchen"}, "household env refuses"),
    ("coding", {"question": "q", "tests": []}, "spec.tests must be"),
])
@pytest.mark.parametrize("stage", ["rollout", "eval"])
def test_a_spec_its_env_cannot_grade_is_refused_before_an_engine_starts(env, spec, words, stage,
                                                                         tmp_path, cli):
    from rlany.files.records import to_json

    rows = [to_json(t) for t in make_tasks(2, seed=0)]
    rows[1].update(env=env, spec=spec)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = cli(stage, "-i", str(tasks), "-o", str(tmp_path / "out.jsonl"), "--engine", "fake",
            "--model", str(tmp_path / "no-script.json"))
    line = one_line(r, 1)
    assert "tasks.jsonl:2" in line and words in line and "starting engine" not in r.stderr


# -- the loop: checkpoint chain, run lock, config -----------------------------------------

def _loop_config(tmp_path, tiny_model, **top) -> str:
    tasks = write_jsonl(tmp_path / "tasks.jsonl", make_tasks(3, seed=5))
    (tmp_path / "fake.json").write_text(json.dumps({"rules": [
        {"match": "## The agent", "responses": ["ok \\boxed{+1}", "bad \\boxed{-1}"]},
        {"responses": ["\\boxed{5}", "\\boxed{8}", "\\boxed{9}"]}]}))
    model = tmp_path / "model"
    if not model.exists():
        shutil.copytree(tiny_model, model)
        shutil.copyfile(tmp_path / "fake.json", model / "fake_script.json")
    settings = {"name": "run", "runs_dir": str(tmp_path / "runs"), "iterations": 3,
                "tasks": str(tasks), "model": str(model), "engine": "fake", "keep_last": 3,
                "env_adaptation": False, **top}
    lines = [f"{k} = {json.dumps(v)}" for k, v in settings.items()]
    lines += ["[rollout]", "n = 4", "[judge]", "m = 2", "[train_policy]", "micro_batch = 4",
              "grad_accum = 1", "lora_r = 4", "max_steps = 1", "[train_rm]", "micro_batch = 4",
              "grad_accum = 1", "lora_r = 4", "max_steps = 1"]
    path = tmp_path / "loop.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.mark.parametrize("kind, damage, words", [  # each kind of damage, on both chains
    ("policy", "deleted", "missing or incomplete"),
    ("policy", "garbage config", "adapter_config.json is not valid JSON"),
    ("rm", "incomplete", "missing or incomplete"),
    ("rm", "pruned", "was pruned"),
])
def test_a_broken_checkpoint_chain_stops_the_loop_naming_the_link(damage, words, kind, tmp_path,
                                                                  tiny_model, cli):
    config = _loop_config(tmp_path, tiny_model, iterations=2)
    assert cli("loop", config).returncode == 0
    run = tmp_path / "runs" / "run"
    shutil.rmtree(run / "iter_001")  # iteration 1 again: it must start from iteration 0's
    ckpt = run / "iter_000" / kind
    assert (ckpt / "rlany.json").exists()
    if damage in ("deleted", "pruned"):
        shutil.rmtree(ckpt)
        if damage == "pruned":
            (run / "iter_000" / f"{kind}.pruned").write_text("pruned by keep_last\n")
    elif damage == "incomplete":
        (ckpt / "rlany.json").unlink()
    else:
        (ckpt / "adapter_config.json").write_text("{")
    r = cli("loop", config)
    line = one_line(r, 1)
    assert str(ckpt) in line and words in line
    first_user = "trajectories.jsonl" if kind == "policy" else "judgments.jsonl"
    assert not (run / "iter_001" / first_user).exists()  # the stage that needs it never ran
    assert not (run / "iter_001" / "done.json").exists()


def test_a_second_loop_on_one_run_directory_is_refused(tmp_path, tiny_model, cli):
    config = _loop_config(tmp_path, tiny_model, iterations=1)
    run = tmp_path / "runs" / "run"
    run.mkdir(parents=True)
    with open(run / ".loop.lock", "a") as held:  # what a running loop holds
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        line = one_line(cli("loop", config), 1)
    assert "another `rlany loop` is running" in line
    assert not (run / "config.json").exists()
    assert cli("loop", config).returncode == 0 and not (run / ".loop.lock").exists()


@pytest.mark.parametrize("args, words", [
    (["--name", ""], "--name '': 'name' must be a plain directory name"),
    (["--name", "../x"], "plain directory name"),
    (["--iterations", "0"], "--iterations 0: 'iterations' must be >= 1"),
    (["--set", "keep_last=0"], "--set keep_last=0: 'keep_last' must be >= 1"),
    (["--set", "rollout.n=0"], "--set rollout.n=0:"),
    (["--set", "tasks=missing.jsonl"], "--set tasks=missing.jsonl: 'tasks'"),
    (["--set", "eval_tasks=missing.jsonl"], "--set eval_tasks=missing.jsonl"),
    (["--runs-dir", "{file}"], "is a file, not a directory"),
])
def test_loop_usage_errors_name_the_command_line_value_and_write_nothing(args, words, tmp_path,
                                                                          tiny_model, cli):
    config = _loop_config(tmp_path, tiny_model)
    (tmp_path / "afile").write_text("x")
    args = [a.replace("{file}", str(tmp_path / "afile")) for a in args]
    assert words in one_line(cli("loop", config, *args), 2)
    assert not (tmp_path / "runs").exists()


def test_a_bad_path_in_the_config_writes_nothing_and_the_fix_runs(tmp_path, tiny_model, cli):
    config = _loop_config(tmp_path, tiny_model, iterations=1, eval_tasks="nope.jsonl")
    assert "'eval_tasks' 'nope.jsonl': no such file" in one_line(cli("loop", config), 1)
    assert not (tmp_path / "runs").exists()
    good = _loop_config(tmp_path, tiny_model, iterations=1)
    assert cli("loop", good).returncode == 0


def test_a_config_changed_before_any_stage_ran_is_taken(tmp_path, tiny_model):
    """A run directory whose config.json was written but no stage finished (a crash before
    the first stage) takes the corrected config; once a stage ran it is refused."""
    from rlany.loop.loop import Loop, load_config

    config = _loop_config(tmp_path, tiny_model, iterations=1)
    run = tmp_path / "runs" / "run"
    run.mkdir(parents=True)
    (run / "config.json").write_text('{"name": "run", "iterations": 7}\n')
    loop = Loop(load_config(config), config)
    loop._init_run_dir()
    assert json.loads((run / "config.json").read_text())["iterations"] == 1
    (run / "iter_000").mkdir()
    (run / "config.json").write_text('{"name": "run", "iterations": 7}\n')
    with pytest.raises(RlanyError, match="different config"):
        loop._init_run_dir()
