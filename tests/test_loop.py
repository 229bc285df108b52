"""adapt-tasks rules, and the loop's skip/resume logic with a fake engine and a tiny model."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import read_jsonl, write_jsonl
from rlany.engines.fake import FakeEngine
from rlany.envs.reasoning import make_tasks
from rlany.errors import RlanyError
from rlany.files.records import Lineage, Task, TaskStats
from rlany.loop.loop import Loop, load_config
from rlany.stages.adapt_tasks import AdaptOptions, acceptance, decide
from rlany.stages.rewrites import parse_spec

OPTS = AdaptOptions(alpha_high=0.8, alpha_low=0.2)


@pytest.mark.parametrize("direction,parent,child,ok", [
    ("harder", 1.0, 0.5, True),
    ("harder", 1.0, 0.2, False),     # alpha_low is exclusive
    ("harder", 0.9, 0.9, False),     # not harder than the parent
    ("harder", 1.0, 0.0, False),     # acc(q') = 0: never accepted
    ("easier", 0.0, 0.5, True),
    ("easier", 0.0, 0.8, False),     # alpha_high is exclusive
    ("easier", 0.1, 0.1, False),     # not easier
    ("easier", 0.0, 0.0, False),     # unsolved rewrite proves nothing
])
def test_acceptance_rule_boundaries(direction, parent, child, ok):
    accepted, reason = acceptance(direction, parent, child, OPTS)
    assert accepted is ok and reason


def _stats(task_id, acc, n=4):
    return TaskStats(task_id=task_id, n=n, successes=round(acc * n), acc=acc, mean_steps=1.0,
                     policy_keep=True, policy_reason="", rm_keep=True, rm_reason="",
                     policy_samples=0, rm_samples=0, step_score_mean=None,
                     parse_fail_rate=None, judge_outcome_agreement=None)


def test_accepted_candidate_goes_beside_its_original_and_keeps_lineage():

    pool = make_tasks(3, seed=0)
    parent = pool[1]
    cand = Task(task_id="c1", env="reasoning", spec={"question": "What is 9 + 9 + 9?",
                                                     "answer": "27"}, prompt=parent.prompt,
                lineage=Lineage(root_id=parent.task_id, parent_id=parent.task_id, version=1,
                                direction="harder"),
                extra={"candidate": {"parent_acc": 1.0}})
    reject = Task(task_id="c2", env="reasoning", spec={"question": "q", "answer": "1"},
                  prompt="", lineage=Lineage(root_id="x", parent_id=pool[2].task_id,
                                             version=1, direction="harder"))
    stats = {parent.task_id: _stats(parent.task_id, 1.0), "c1": _stats("c1", 0.5),
             "c2": _stats("c2", 0.0)}
    new_pool, decisions = decide(pool, [cand, reject], stats,
                                 AdaptOptions(iteration=3))
    # originals stay: the accepted rewrite goes beside its original, not in its place
    assert [t.task_id for t in new_pool] == [pool[0].task_id, parent.task_id, "c1",
                                             pool[2].task_id]
    assert new_pool[2].lineage.accepted_iter == 3 and "candidate" not in new_pool[2].extra
    assert [d["accepted"] for d in decisions] == [True, False]
    assert "acc(q') = 0" in decisions[1]["reason"]
    # a rewrite of the rewrite (made from the same original) takes its place
    again = replace(cand, task_id="c3", lineage=replace(cand.lineage, parent_id="c1"))
    stats.update(c1=_stats("c1", 1.0), c3=_stats("c3", 0.5))
    newer, (d,) = decide(new_pool, [again], stats, AdaptOptions(iteration=4))
    assert d["accepted"] and [t.task_id for t in newer] == [
        pool[0].task_id, parent.task_id, "c3", pool[2].task_id]
    # at most --rewrites-per-root rewrites of an original: a second one is refused
    other = replace(cand, task_id="c4")
    stats.update(c4=_stats("c4", 0.5))
    same, (d,) = decide(newer, [other], stats, AdaptOptions(iteration=4))
    assert not d["accepted"] and d["reason"].startswith(f"root full: {parent.task_id} has 1")
    assert same == newer
    two, (d,) = decide(newer, [other], stats, AdaptOptions(iteration=4, rewrites_per_root=2))
    assert d["accepted"] and [t.task_id for t in two][1:4] == [parent.task_id, "c3", "c4"]


@pytest.mark.parametrize("text,spec", [
    ('```json\n{"question": "What is 2 + 2?", "answer": "4"}\n```', {"question": "What is 2 + 2?", "answer": "4"}),
    ('Sure! {"a": 1} and then {"b": {"c": 2}}', {"b": {"c": 2}}),
    ("no json here", None),
    ('```json\n{"broken": \n```', None),
    ("[1, 2, 3]", None),
])
def test_parse_spec(text, spec):
    assert parse_spec(text) == spec


# ---------------------------------------------------------------------------------------
# the loop


def responder(request, k):
    """Policy, judge and rewriter in one fake model, chosen by the prompt."""
    last = request.messages[-1]["content"]
    if "## Its spec (JSON)" in last:   # rewriter: a harder/easier arithmetic question
        q = re.search(r'"question": "What is ([^"]+)\?"', last)
        expr = (q.group(1) if q else "1 + 1") + " + 1"
        spec = {"question": f"What is {expr}?", "answer": str(eval(expr))}
        return f"```json\n{json.dumps(spec)}\n```"
    if "## The agent's response" in last:   # judge
        return ["looks right \\boxed{+1}", "wrong \\boxed{-1}", "unsure"][k % 3]
    m = re.search(r"What is ([0-9+\-* ]+)\?", last)   # policy
    value = eval(m.group(1))
    first = int(m.group(1).split()[0])
    if first % 2 == 0 or k % 2 == 0:   # even first operand: always right (acc 1 -> harder)
        return f"\\boxed{{{value}}}"
    return "\\boxed{-1}"


def _config(tmp_path, tiny_model, keep_last=1, **switches):
    tasks = write_jsonl(tmp_path / "tasks.jsonl", make_tasks(4, seed=5))
    evals = write_jsonl(tmp_path / "eval.jsonl", make_tasks(2, seed=6, split="eval"))
    lines = [f'name = "{switches.pop("name", "t")}"', f'runs_dir = "{tmp_path / "runs"}"',
             "iterations = 2", f'tasks = "{tasks}"', f'eval_tasks = "{evals}"',
             f'model = "{tiny_model}"', 'engine = "fake"', f"keep_last = {keep_last}"]
    lines += [f"{k} = {str(v).lower()}" for k, v in switches.items()]
    lines += ["[rollout]", "n = 4", "[judge]", "m = 3", "[train_policy]", "micro_batch = 4",
              "grad_accum = 1", "lora_r = 4", "[train_rm]", "micro_batch = 8", "grad_accum = 1",
              "lora_r = 4", "max_steps = 1", "[eval]", "n = 2", "k = [1, 2]"]
    path = tmp_path / "loop.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _run(config, **kw):
    cfg = load_config(config, kw)
    loop = Loop(cfg, config)
    loop.executor.engine = FakeEngine(responder, model="fake")   # inject the engine
    loop.run()
    return loop


def test_loop_runs_resumes_and_skips(tmp_path, tiny_model):
    config = _config(tmp_path, tiny_model, keep_last=2)
    loop = _run(config)
    run = loop.dir
    metrics = read_jsonl(run / "metrics.jsonl")
    assert [m["iteration"] for m in metrics] == [0, 1]
    it0, it1 = run / "iter_000", run / "iter_001"
    for name in ("trajectories.jsonl", "judgments.jsonl", "scored.jsonl", "task_stats.jsonl",
                 "next_tasks.jsonl", "candidates.jsonl", "decisions.jsonl", "eval.json"):
        assert (it1 / name).exists(), name
    # iteration 0 proposed harder rewrites of the always-solved tasks; iteration 1 rolled
    # them out beside the pool and decided on each with a reason
    cands = read_jsonl(it0 / "candidates.jsonl")
    assert cands and all(c["lineage"]["direction"] == "harder" for c in cands)
    rolled = {t["task_id"] for t in read_jsonl(it1 / "rollout_tasks.jsonl")}
    assert {c["task_id"] for c in cands} <= rolled
    decisions = [d for d in read_jsonl(it1 / "decisions.jsonl") if d["kind"] == "decision"]
    assert len(decisions) == len(cands) and all(d["reason"] for d in decisions)
    assert metrics[1]["accepted_tasks"] == sum(d["accepted"] for d in decisions)
    # the policy adapter of iteration 0 is what iteration 1 rolled out with
    traj = read_jsonl(it1 / "trajectories.jsonl")[0]
    assert traj["policy"]["adapter"] == str(it0 / "policy")
    assert (it0 / "policy" / "rlany.json").exists()   # keep_last = 2: nothing pruned

    # a rerun of a finished run does nothing and calls no engine
    again = _run(config)
    assert again.executor.engine.stats.calls == 0

    # killed in the middle of iteration 1's judge: the judge's output, everything after it
    # and done.json are missing (pruning only ever happens after done.json)
    snapshot = {n: (it1 / n).read_bytes() for n in ("judgments.jsonl", "scored.jsonl",
                                                    "next_tasks.jsonl")}
    for name in ("done.json", "judgments.jsonl", "judgments.meta.json", "scored.jsonl",
                 "scored.meta.json", "task_stats.jsonl", "task_stats.meta.json",
                 "next_tasks.jsonl", "next_tasks.meta.json", "eval.json", "eval.meta.json"):
        (it1 / name).unlink()
    shutil.rmtree(it1 / "policy")
    shutil.rmtree(it1 / "rm")
    resumed = _run(config)
    assert resumed.executor.engine.stats.calls > 0
    for name, data in snapshot.items():
        assert (it1 / name).read_bytes() == data, name   # same records, no duplicates
    final = read_jsonl(run / "metrics.jsonl")
    assert len(final) == 2
    # stage times come from the sidecars, so stages finished before the kill still count
    assert {"rollout", "judge", "train_policy", "adapt", "eval"} <= set(final[1]["seconds"])


def test_one_stage_steps_through_a_run_to_the_same_result(tmp_path, tiny_model):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    whole = _run(_config(tmp_path / "a", tiny_model, keep_last=2))
    config = _config(tmp_path / "b", tiny_model, keep_last=2)
    stages = []
    while True:
        loop = Loop(load_config(config), config, one_stage=True)
        loop.executor.engine = FakeEngine(responder, model="fake")
        ran = loop.run()
        if ran is None:
            break
        stages.append(ran)
    # eval of the base model, then 7 stages per iteration
    assert stages == ["eval"] + ["rollout", "judge", "score", "train-policy", "train-rm",
                                 "adapt-tasks", "eval"] * 2
    for name in ("trajectories.jsonl", "judgments.jsonl", "scored.jsonl", "next_tasks.jsonl"):
        a = (whole.dir / "iter_001" / name).read_text()
        b = (loop.dir / "iter_001" / name).read_text()
        assert a.replace(str(tmp_path / "a"), "") == b.replace(str(tmp_path / "b"), ""), name


def test_ablation_switches_change_what_runs(tmp_path, tiny_model):
    config = _config(tmp_path, tiny_model, name="policy-only", step_feedback=False,
                     rm_training=False, env_adaptation=False)
    loop = _run(config)
    d = loop.dir / "iter_000"
    # keep_last = 1: iteration 0's policy was pruned once iteration 1 finished
    assert (d / "policy.pruned").exists() and not (d / "policy").exists()
    assert (loop.dir / "iter_001" / "policy" / "rlany.json").exists()
    assert not (d / "judgments.jsonl").exists()      # nothing needs the judge
    assert not (d / "rm").exists() and not (d / "candidates.jsonl").exists()
    assert (d / "next_tasks.jsonl").read_bytes() == (d / "tasks.jsonl").read_bytes()
    scored = read_jsonl(d / "scored.jsonl")
    assert all(s["reward"] == t["outcome"] for t in scored for s in t["steps"])   # λ = 0
    # more iterations continue the finished run (any other change is refused)
    longer = _run(config, iterations=3)
    assert [m["iteration"] for m in read_jsonl(longer.dir / "metrics.jsonl")] == [0, 1, 2]
    assert json.loads((longer.dir / "config.json").read_text())["iterations"] == 3
    assert longer.executor.engine.stats.calls > 0
    with pytest.raises(RlanyError, match="different config"):
        _run(config, iterations=3, seed=1)
    with pytest.raises(RlanyError, match="different config"):   # fewer: refused
        _run(config, iterations=2)


def test_a_pool_sharing_tasks_with_eval_tasks_is_named(tmp_path, monkeypatch, capsys):
    """Success on eval tasks the pool also holds is not held-out: a choice (success on the
    pool itself), so named on stderr, not refused; disjoint files say nothing."""
    from rlany.loop.config import _check_files

    monkeypatch.chdir(tmp_path)
    tasks = make_tasks(3, seed=0)
    write_jsonl(tmp_path / "t.jsonl", tasks)
    write_jsonl(tmp_path / "e.jsonl", [replace(tasks[2], task_id="e0", split="eval")])
    write_jsonl(tmp_path / "d.jsonl", make_tasks(2, seed=9, split="eval"))
    config = tmp_path / "c.toml"
    config.write_text('name = "x"\ntasks = "t.jsonl"\neval_tasks = "e.jsonl"\n')
    _check_files(load_config(str(config)))
    err = capsys.readouterr().err
    assert "eval_tasks holds 1 of the pool's tasks (the spec of 'e0')" in err
    config.write_text('name = "x"\ntasks = "t.jsonl"\neval_tasks = "d.jsonl"\n')
    _check_files(load_config(str(config)))
    assert "eval_tasks holds" not in capsys.readouterr().err


def test_config_errors(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_jsonl(tmp_path / "t.jsonl", make_tasks(2, seed=0))
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\ntasks = "t.jsonl"\nlambda = 3\n')
    with pytest.raises(RlanyError, match="unknown key 'lambda'"):
        load_config(str(bad))
    bad.write_text('name = "x"\ntasks = "t.jsonl"\nstep_feedback = false\n[score]\nlam = 1.0\n')
    with pytest.raises(RlanyError, match="step_feedback = false"):
        load_config(str(bad))
    # --no-step-feedback on the command line is the ablation of a config that sets lam
    bad.write_text('name = "x"\ntasks = "t.jsonl"\n[score]\nlam = 1.0\nlone_step = "zero"\n')
    cfg = load_config(str(bad), {"step_feedback": False})
    assert not cfg.step_feedback and cfg.tables["score"] == {"lone_step": "zero", "lam": 0.0}
    bad.write_text('name = "x"\ntasks = "t.jsonl"\n[rollout]\nn = "four"\n')
    with pytest.raises(RlanyError, match=r"\[rollout\] n' must be int"):
        load_config(str(bad))
    # the engine serves LoRA adapters: a full model is refused before any work, not at
    # the next iteration's rollout
    for table in ("train_policy", "train_rm"):
        bad.write_text(f'name = "x"\ntasks = "t.jsonl"\n[{table}]\nfull = true\n')
        with pytest.raises(RlanyError, match=rf"\[{table}\] full = true"):
            load_config(str(bad))
    # score needs every step judged: last steps alone would fail it after rollout and judge
    bad.write_text('name = "x"\ntasks = "t.jsonl"\n[judge]\nlast_step_only = true\n')
    with pytest.raises(RlanyError, match=r"\[judge\] last_step_only = true: score gives"):
        load_config(str(bad))


def test_set_overrides_a_table_or_top_level_key(tmp_path, cli, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_jsonl(tmp_path / "t.jsonl", make_tasks(2, seed=0))
    config = tmp_path / "c.toml"
    config.write_text('name = "x"\ntasks = "t.jsonl"\n[train_policy]\nlr = 1e-5\n')
    cfg = load_config(str(config), sets=["train_policy.lr=3e-4", "eval_every = 5"])
    assert cfg.tables["train_policy"]["lr"] == 3e-4 and cfg.eval_every == 5
    assert cfg.options("train_policy", input="-", output="o").lr == 3e-4
    cfg = load_config(str(config), sets=["train_policy.target_modules=q_proj,v_proj"])
    assert cfg.tables["train_policy"]["target_modules"] == "q_proj,v_proj"  # not TOML: text
    for bad, message in (("lr", "expected KEY=VALUE"), ("nope.lr=1", "no table"),
                         ("a.b.c=1", "expected KEY=VALUE")):
        with pytest.raises(RlanyError, match=message) as e:
            load_config(str(config), sets=[bad])
        assert e.value.exit_code == 2
    with pytest.raises(RlanyError, match="must be"):   # the same checks as the file's values
        load_config(str(config), sets=["rollout.n=0"])
    r = cli("loop", str(config), "--set", "train_policy.lr=-1", cwd=tmp_path)  # as the file's
    assert r.returncode == 2 and "--set train_policy.lr=-1:" in r.stderr   # named, usage
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_report_writes_plots_and_tables(tmp_path, cli):
    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    rows = [{"iteration": i, "train_acc": 0.4 + 0.1 * i, "eval_success": 0.5 + 0.05 * i,
             "accepted_tasks": i, "seconds": {"rollout": 3.0, "judge": 5.0}} for i in range(3)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "eval_base.json").write_text(json.dumps({"success_rate": 0.45}))
    r = cli("report", str(run))
    assert r.returncode == 0, r.stderr
    md = (run / "report" / "report.md").read_text()
    assert "| 2 | 0.600 | 0.600 |" in md and (run / "report" / "eval_success.png").stat().st_size > 1000
    r = cli("report", str(run), str(run), "-o", str(tmp_path / "cmp"))  # would count twice
    assert r.returncode == 1 and f"{run}: given twice" in r.stderr
    import shutil
    shutil.copytree(run, tmp_path / "runs" / "q", ignore=shutil.ignore_patterns("report"))
    r = cli("report", str(run), str(tmp_path / "runs" / "q"), "-o", str(tmp_path / "cmp"))
    assert r.returncode == 0 and "| r | 0.450 | 0.600 |" in (tmp_path / "cmp" / "report.md").read_text()
    assert "Held-out success" not in md            # no episode counts: no gain line
    (run / "eval_base.json").write_text(json.dumps({"success_rate": 0.125, "trajectories": 128,
                                                    "success_ci95": [0.07, 0.2]}))
    (run / "iter_002").mkdir()
    (run / "iter_002" / "eval.json").write_text(json.dumps(
        {"success_rate": 0.375, "trajectories": 128, "success_ci95": [0.3, 0.46]}))
    (run / "iter_002" / "done.json").write_text("{}")
    assert cli("report", str(run)).returncode == 0
    md = (run / "report" / "report.md").read_text()
    assert "gain +0.250, 95% interval +0.145 to +0.348 (above the base model beyond noise)" in md
    assert "warm start" not in md
    (run / "eval_init.json").write_text(json.dumps({"success_rate": 0.375, "trajectories": 128,
                                                    "success_ci95": [0.3, 0.46]}))
    assert cli("report", str(run)).returncode == 0
    md = (run / "report" / "report.md").read_text()   # RL's own part: none here
    assert "From the warm start (eval_init.json), RL's own part: 0.375" in md
    assert "gain +0.000, 95% interval" in md and "within noise" in md


def test_cli_adapt_tasks_with_no_pending_candidates(tmp_path, cli):
    """An iteration may propose no candidate: an empty pending file is fine."""
    pool = write_jsonl(tmp_path / "tasks.jsonl", make_tasks(2, seed=0))
    stats = write_jsonl(tmp_path / "stats.jsonl", [_stats(t.task_id, 0.5)
                                                   for t in make_tasks(2, seed=0)])
    (tmp_path / "pending.jsonl").write_text("")
    script = tmp_path / "fake.json"
    script.write_text('["no rewrite"]')
    r = cli("adapt-tasks", "-i", str(pool), "--stats", str(stats), "--pending",
            str(tmp_path / "pending.jsonl"), "-o", str(tmp_path / "next.jsonl"),
            "--candidates", str(tmp_path / "cands.jsonl"), "--engine", "fake", "--model",
            str(script))
    assert r.returncode == 0, r.stderr
    assert read_jsonl(tmp_path / "next.jsonl") == read_jsonl(pool)
    assert (tmp_path / "cands.jsonl").read_text() == ""


def test_adapt_edits_mode_picks_an_env_edit_and_records_it():
    from rlany.engines.fake import FakeEngine
    from rlany.envs import make_env
    from rlany.envs.household import make_tasks as household_tasks
    from rlany.files.records import TaskStats
    from rlany.stages.adapt_tasks import propose

    pool = household_tasks(3, seed=2)

    def stats(task_id, acc):
        return TaskStats(task_id=task_id, n=4, successes=int(acc * 4), acc=acc, mean_steps=1.0,
                         policy_keep=True, policy_reason="", rm_keep=True, rm_reason="",
                         policy_samples=0, rm_samples=0, step_score_mean=None,
                         parse_fail_rate=None, judge_outcome_agreement=None)

    table = {pool[0].task_id: stats(pool[0].task_id, 1.0),
             pool[1].task_id: stats(pool[1].task_id, 0.0),
             pool[2].task_id: stats(pool[2].task_id, 0.5)}
    engine = FakeEngine(lambda request, k: "2")
    critiques = {pool[0].task_id: "- the agent found the apple at once"}
    cands, rejected, tally = propose(pool, table, critiques, engine, make_env,
                                     AdaptOptions(samples=2))
    assert len(cands) == 2 and not rejected
    assert {k: tally[k] for k in ("proposals", "valid_proposals", "edits_tasks",
                                  "free_tasks")} == {"proposals": 4, "valid_proposals": 4,
                                                     "edits_tasks": 2, "free_tasks": 0}
    env = make_env("household")
    for k, (cand, (parent, direction)) in enumerate(zip(cands, [(pool[0], "harder"),
                                                                (pool[1], "easier")])):
        menu = env.edits(parent.spec, direction)
        info = cand.extra["candidate"]
        # item 2 of the menu as shown, shuffled: the env's item env_rank
        assert info["menu_position"] == 2 and info["menu_size"] == len(menu)
        chosen = menu[info["env_rank"] - 1]
        assert cand.spec == chosen.spec and env.validate(cand.spec) == []
        assert (info["edit"], info["edit_kind"]) == (chosen.description, chosen.kind)
        assert cand.lineage.direction == direction
        # the prompt lists the numbered edits, item 2 the one chosen; the answer is
        # constrained to their numbers
        request = engine.calls[0][k]
        assert request.sampling.choices == tuple(str(j) for j in range(1, len(menu) + 1))
        assert f"2. {chosen.description}\n" in request.messages[-1]["content"]
    assert cands[0].extra["candidate"]["critique"] == critiques[pool[0].task_id]
    # free mode asks for JSON instead
    engine = FakeEngine(lambda request, k: "no json here")
    cands, rejected, tally = propose(pool, table, {}, engine, make_env,
                                     AdaptOptions(rewrite="free"))
    assert not cands and len(rejected) == 2 and tally["valid_proposals"] == 0


def test_adapt_summary_model_condenses_the_critiques():
    from rlany.engines.fake import FakeEngine
    from rlany.envs import make_env
    from rlany.envs.reasoning import make_tasks as reasoning_tasks
    from rlany.files.records import TaskStats
    from rlany.stages.adapt_tasks import propose

    pool = reasoning_tasks(1, seed=0)
    table = {pool[0].task_id: TaskStats(
        task_id=pool[0].task_id, n=4, successes=4, acc=1.0, mean_steps=1.0, policy_keep=True,
        policy_reason="", rm_keep=True, rm_reason="", policy_samples=0, rm_samples=0,
        step_score_mean=None, parse_fail_rate=None, judge_outcome_agreement=None)}
    engine = FakeEngine.from_rules([{"match": "three short sentences",
                                     "responses": ["It adds well."]},
                                    {"responses": ["1"]}])
    cands, _, _ = propose(pool, table, {pool[0].task_id: "- right sum"}, engine, make_env,
                          AdaptOptions(summary="model"))
    assert len(engine.calls) == 2       # the summaries, then the rewrites
    assert "right sum" in engine.calls[0][0].messages[-1]["content"]
    assert "It adds well." in engine.calls[1][0].messages[-1]["content"]
    assert cands and cands[0].extra["candidate"]["critique"] == "It adds well."


def test_a_verdict_only_judge_is_trained_with_the_verdict_objective(tmp_path, tiny_model):
    """[judge] max_tokens = 0: the judge's samples are bare verdicts, so train-rm's default
    objective (auto) trains the verdict token of every judged step (rlany.training.verdict), and
    the next iteration judges with that adapter."""
    config = _config(tmp_path, tiny_model, step_feedback=True, rm_training=True,
                     env_adaptation=False)
    Path(config).write_text(Path(config).read_text().replace(
        "[judge]\nm = 3\n", "[judge]\nm = 3\nmax_tokens = 0\n"))
    loop = _run(config)
    trained = [json.loads((loop.dir / f"iter_{it:03d}" / "rm" / "rlany.json").read_text())
               for it in (0, 1) if (loop.dir / f"iter_{it:03d}" / "rm").exists()]
    assert trained and all(t["options"]["objective"] == "logloss" for t in trained)
    judged = [j for j in read_jsonl(loop.dir / "iter_000" / "judgments.jsonl") if j["steps"]]
    assert judged and all(s["text"] in ("\\boxed{+1}", "\\boxed{-1}")
                          for j in judged for st in j["steps"] for s in st["samples"])


def test_runs_of_one_runs_dir_share_an_identical_base_evaluation(tmp_path, tiny_model):
    from rlany.models import resolve_model

    config = _config(tmp_path, tiny_model)

    def first_stage(name, seed=0, sets=()):
        loop = Loop(load_config(config, {"name": name, "seed": seed}, list(sets)), config,
                    one_stage=True)
        loop.executor.engine = FakeEngine(responder, model=resolve_model(tiny_model))
        return loop.run(), loop.dir

    assert first_stage("a")[0] == "eval"
    ran, b = first_stage("b")   # the same base evaluation: copied, so iteration 0 runs next
    a = b.parent / "a"
    assert ran == "rollout"
    assert (b / "eval_base.json").read_bytes() == (a / "eval_base.json").read_bytes()
    meta = json.loads((b / "eval_base.meta.json").read_text())
    assert meta["reused_from"] == str(a / "eval_base.json")
    assert meta["flags"]["output"] == str(b / "eval_base.json")
    # another seed, another eval setting or other rlany code evaluates again
    assert first_stage("c", seed=1)[0] == "eval"
    assert first_stage("d", sets=["eval.n=3"])[0] == "eval"
    for run in (a, b):
        meta = json.loads((run / "eval_base.meta.json").read_text())
        meta["versions"]["rlany_source"] = "0" * 16
        (run / "eval_base.meta.json").write_text(json.dumps(meta))
    assert first_stage("e")[0] == "eval"


def test_rm_buffer_trains_the_judge_on_the_last_iterations_steps(tmp_path, tiny_model):
    config = _config(tmp_path, tiny_model, keep_last=2, rm_buffer=2)
    loop = _run(config)
    it0, it1 = loop.dir / "iter_000", loop.dir / "iter_001"
    assert not (it0 / "rm_input.jsonl").exists()   # iteration 0 has only its own steps
    both = (it0 / "scored.jsonl").read_bytes() + (it1 / "scored.jsonl").read_bytes()
    assert (it1 / "rm_input.jsonl").read_bytes() == both
    ckpt = json.loads((it1 / "rm" / "rlany.json").read_text())
    assert str(it1 / "rm_input.jsonl") in json.dumps(ckpt)
    with pytest.raises(RlanyError, match="rm_buffer"):
        load_config(config, {"rm_buffer": 0})


def test_eval_judge_false_stops_the_evaluations_judge_even_with_a_trained_one(tmp_path,
                                                                               monkeypatch):
    """`[eval] judge = false` said no judge, yet a loop with a reward-model adapter judged
    every evaluation (the adapter implies --judge: 340 s instead of 127 s per evaluation on
    mid.toml). Left out, the evaluation still measures the trained judge."""
    from types import SimpleNamespace

    from rlany.loop.tables import EVAL
    monkeypatch.chdir(tmp_path)
    write_jsonl(tmp_path / "t.jsonl", make_tasks(2, seed=0))
    config = tmp_path / "c.toml"
    config.write_text('name = "x"\ntasks = "t.jsonl"\neval_tasks = "t.jsonl"\n')
    for sets, judge in (([], "rm-1"), (["eval.judge=false"], None),
                        (["eval.judge=true"], "rm-1")):
        lp = SimpleNamespace(cfg=load_config(str(config), sets=sets),
                             latest=lambda kind, it: f"{kind}-{it}")
        assert EVAL.io(lp, tmp_path, 0)["judge_adapter"] == judge, sets
