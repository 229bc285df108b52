"""The environment loop: from an unsolvable pool, easier rewrites and the acceptance rule reach
a solvable task; the env's account the rewriter reads; the random control; the loop's
env-loop metrics."""

from __future__ import annotations

import json
import random

import pytest

from conftest import one_line, read_jsonl, run_cli, write_jsonl
from rlany.engines.fake import FakeEngine
from rlany.envs import make_env
from rlany.envs.household import make_tasks
from rlany.files.records import Step, TaskStats, Trajectory
from rlany.stages.adapt_metrics import env_loop_counts, summary_line
from rlany.stages.adapt_tasks import AdaptOptions, decide, propose
from rlany.stages.env_account import task_account, verdict_only
from rlany.stages.rewrites import RandomEdits, reparent, stepping_stones


def _stats(task_id: str, successes: int, n: int = 8) -> TaskStats:
    return TaskStats(task_id=task_id, n=n, successes=successes, acc=successes / n,
                     mean_steps=1.0, policy_keep=True, policy_reason="", rm_keep=True,
                     rm_reason="", policy_samples=0, rm_samples=0, step_score_mean=None,
                     parse_fail_rate=None, judge_outcome_agreement=None)


def _policy(env, spec: dict, rng: random.Random, n: int = 8) -> int:
    """A stand-in policy that solves only short plans: each episode succeeds w.p. 0.5 when a
    shortest plan has at most 2 actions, never otherwise."""
    return sum(rng.random() < 0.5 for _ in range(n)) if env.difficulty(spec)[
        "plan_length"] <= 2 else 0


def _adapt(descend: int, iterations: int = 8, engine=None,
           every: list | None = None) -> tuple[list, list, list]:
    """`adapt-tasks` as the loop runs it, on a pool whose plans (4+ actions) the stand-in
    policy never solves; returns (pool, last decisions, last candidates); `every` collects
    each iteration's decisions. Originals stay: each accepted decision adds one task to the
    pool, beside its original or in its adapted parent's place, at most one an original."""
    env = make_env("household")
    pool = make_tasks(2, seed=5, rooms=1, receptacles=3, distractors=1, closed=1.0,
                      kinds="pick_and_place")
    assert all(env.difficulty(t.spec)["plan_length"] >= 4 for t in pool)
    rng, pending, decisions, originals = random.Random(0), [], [], list(pool)
    # the model's pick: the first (gentlest) edit
    engine = engine or FakeEngine(lambda request, k: "1")
    for it in range(iterations):
        stats = {t.task_id: _stats(t.task_id, _policy(env, t.spec, rng)) for t in pool + pending}
        opts = AdaptOptions(iteration=it, samples=1, descend=descend)
        before, (pool, decisions) = pool, decide(pool, pending, stats, opts)
        assert sum(d["accepted"] for d in decisions) == len(
            {t.task_id for t in pool} - {t.task_id for t in before})
        assert [t for t in pool if t.lineage.version == 0] == originals
        roots = [t.lineage.root_id for t in pool if t.lineage.version]
        assert len(roots) == len(set(roots))
        (every if every is not None else []).extend(decisions)
        for d in decisions:  # nothing unsolved or not easier is ever accepted
            assert not d["accepted"] or 0 < d["acc"] < 0.8 and d["acc"] > d["parent_acc"]
        stones = stepping_stones(pending, decisions, pool, descend)
        pending = [reparent(c, stones) for c in
                   propose(pool + stones, stats, {}, engine, make_env, opts)[0]]
        assert all(c.lineage.parent_id in {t.task_id for t in pool} for c in pending)
    return pool, decisions, pending


def test_adaptation_from_an_unsolvable_pool_reaches_a_solvable_task():
    """Fails if the easier direction or the acceptance rule is broken: with stepping stones
    the pool ends with tasks the policy solves, reached through accepted easier rewrites;
    with the paper's rule alone (one gentlest edit from the pool task, acc(q') > 0 to
    accept) every candidate stays unsolved and nothing is accepted."""
    env = make_env("household")
    stuck, decisions, _ = _adapt(descend=0)
    assert all(t.lineage.version == 0 for t in stuck) and len(stuck) == 2
    assert decisions and not any(d["accepted"] for d in decisions)
    pool, decisions, pending = _adapt(descend=4)
    solved = [t for t in pool if env.difficulty(t.spec)["plan_length"] <= 2]
    assert solved, [env.difficulty(t.spec) for t in pool]
    for t in solved:  # each got there by easier edits (a stone's counted), recorded
        assert t.lineage.direction == "easier" and t.lineage.version >= 2
        assert t.lineage.accepted_iter is not None and "candidate" not in t.extra
    counts = env_loop_counts(pool, decisions, pending, make_env)
    assert counts["adapted_share"] > 0 and counts["lineage_depth_max"] >= 2
    assert counts["difficulty"]["plan_length"] < 4


def test_a_parent_takes_one_candidate_an_iteration():
    """With stepping stones a parent has several candidates at once (its own rewrite and its
    stones'); a random pick makes them differ, so two can pass in one iteration: the first
    is accepted, the next rejected as "parent replaced" (each accepted decision adds one
    pool task: `_adapt` checks it), and counted as such; one that passes once its original
    already has its rewrite is rejected as "root full"."""
    every: list = []
    _adapt(descend=4, engine=RandomEdits(0, 0), every=every)
    full = [d for d in every if d["reason"].startswith("root full: ")]
    assert full and not any(d["accepted"] for d in full)
    replaced = [d for d in every if d["reason"].startswith("parent replaced by ")]
    assert replaced and all(not d["accepted"] and d["acc"] > 0 for d in replaced)
    won = {(d["iteration"], d["parent_id"]): d["task_id"] for d in every if d["accepted"]}
    assert all(d["reason"].startswith(f"parent replaced by {won[d['iteration'], d['parent_id']]}")
               for d in replaced)
    counts = env_loop_counts([], replaced, [], make_env)
    assert counts["rejected_by_reason"] == {"parent_replaced": len(replaced)}


def test_a_decision_says_where_its_parents_accuracy_came_from():
    """The parent rolled out beside its candidate (as the loop's rollout always does) is
    compared under the same policy; a parent without stats falls back to its accuracy at
    proposal, and the decision says which."""
    from dataclasses import replace

    from rlany.files.records import Lineage

    pool = make_tasks(2, seed=5)
    cand = replace(pool[0], task_id="c", extra={"candidate": {"parent_acc": 0.0}},
                   lineage=Lineage(root_id=pool[0].task_id, parent_id=pool[0].task_id,
                                   version=1, direction="easier"))
    fresh = {"c": _stats("c", 2), pool[0].task_id: _stats(pool[0].task_id, 4)}
    (d,), = [decide(pool, [cand], fresh, AdaptOptions(iteration=1))[1]]
    assert (d["parent_acc"], d["parent_acc_from"], d["accepted"]) == (0.5, "rollout", False)
    (d,), = [decide(pool, [cand], {"c": fresh["c"]}, AdaptOptions(iteration=1))[1]]
    assert (d["parent_acc"], d["parent_acc_from"], d["accepted"]) == (0.0, "proposal", True)


def test_no_rewrite_becomes_a_held_out_task():
    """Two edits can reach an eval task's spec (reasoning: 9 + 7 -> 15 + 76 -> 6 + 0): a
    proposal identical to a held-out task is rejected, named, and the next sample tried."""
    pool = make_tasks(2, seed=5)
    stats = {t.task_id: _stats(t.task_id, 0) for t in pool}
    opts = AdaptOptions(iteration=0, samples=1)
    first = FakeEngine(lambda request, k: "1")
    cands = propose(pool, stats, {}, first, make_env, opts)[0]
    held = {json.dumps(cands[0].spec, sort_keys=True)}
    again, rejections, _ = propose(pool, stats, {}, first, make_env, opts, held)
    assert [c.task_id for c in again] == [c.task_id for c in cands[1:]]
    assert rejections[-1]["reasons"] == ["near-duplicate of a held-out task (100)"]
    twice = FakeEngine(lambda request, k: str(k + 1))  # a second sample: the next edit
    (c, *_), _, _ = propose(pool, stats, {}, twice, make_env, AdaptOptions(samples=2), held)
    assert c.lineage.parent_id == pool[0].task_id and json.dumps(
        c.spec, sort_keys=True) not in held


def test_a_candidate_without_a_parent_or_direction_is_refused_by_line(tmp_path):
    """A hand-made candidates file whose lineage has no parent or an unknown direction, or
    whose id is a pool task's, would be judged by the wrong rule: refused, `file:line:
    ...`, exit 1, nothing written."""
    from rlany.files.records import to_json

    pool = make_tasks(2, seed=2)
    write_jsonl(tmp_path / "pool.jsonl", pool)
    cand = {**to_json(pool[1]), "task_id": "cand-1"}
    cand["lineage"] = {"root_id": pool[0].task_id, "parent_id": pool[0].task_id,
                       "version": 1, "direction": "Harder"}
    write_jsonl(tmp_path / "pending.jsonl", [cand])
    write_jsonl(tmp_path / "stats.jsonl", [])
    r = run_cli("adapt-tasks", "-i", "pool.jsonl", "--stats", "stats.jsonl", "--pending",
                "pending.jsonl", "-o", "next.jsonl", "--candidates", "cands.jsonl",
                cwd=tmp_path)
    line = one_line(r, 1)
    assert line.startswith("error: pending.jsonl:1: a candidate needs lineage.parent_id"), line
    assert not (tmp_path / "next.jsonl").exists() and not (tmp_path / "cands.jsonl").exists()
    cand["lineage"]["direction"] = "easier"  # --descend's hops and via: a count, an id
    for hops, via in ((None, None), ("1", None), (True, None), (-1, None), (1, 7)):
        cand["candidate"] = {"parent_acc": 0.0, "hops": hops, "via": via}
        write_jsonl(tmp_path / "pending.jsonl", [cand])
        r = run_cli("adapt-tasks", "-i", "pool.jsonl", "--stats", "stats.jsonl", "--pending",
                    "pending.jsonl", "-o", "next.jsonl", "--candidates", "cands.jsonl",
                    "--descend", "2", cwd=tmp_path)
        assert "pending.jsonl:1: field 'candidate.hops' must be a count" in one_line(r, 1)
    # a candidate with a pool task's id: the two would share one stats line, and the
    # acceptance rule would compare the parent with itself or with another task
    cand.update(task_id=pool[1].task_id, candidate={"parent_acc": 0.0})
    write_jsonl(tmp_path / "pending.jsonl", [cand])
    r = run_cli("adapt-tasks", "-i", "pool.jsonl", "--stats", "stats.jsonl", "--pending",
                "pending.jsonl", "-o", "next.jsonl", "--candidates", "cands.jsonl",
                cwd=tmp_path)
    assert one_line(r, 1) == (f"error: pending.jsonl:1: candidate '{pool[1].task_id}' has "
                              "the id of a task in the pool")
    assert not (tmp_path / "next.jsonl").exists()


def _traj(k: int, outcome: int, labels: list[int], task_id: str = "a") -> Trajectory:
    steps = [Step(obs="o", prompt_messages=[], response=f"{j}", action=f"go to shelf {j}",
                  next_obs=f"You arrive at shelf {j}.\nOn it: nothing.",
                  info={"label": label}) for j, label in enumerate(labels)]
    return Trajectory(traj_id=f"t{k}", task_id=task_id, iteration=0, sample=k, steps=steps,
                      outcome=outcome, finish="success" if outcome == 1 else "max_steps",
                      policy={})


def test_env_account_says_how_episodes_failed():
    trajs = [_traj(0, 1, [1]), _traj(1, -1, [1, -1, -1]), _traj(2, -1, [1, -1, -1])]
    text = task_account(trajs, limit=3)
    lines = text.splitlines()
    assert lines[0] == "- the policy succeeded in 1 of 3 episodes"
    # the failed episode first, its twin dropped as a near-duplicate, the success last
    assert len(lines) == 3 and "ran out of steps after 3 actions" in lines[1]
    assert "go to shelf 1 [off-plan] -> go to shelf 2 [off-plan]" in lines[1]
    assert "Last observation: You arrive at shelf 2. On it: nothing." in lines[1]
    assert lines[2].startswith("- succeeded after 1 actions: go to shelf 0. ")
    # steps a judge scored -1 are marked too, where the env labels nothing
    unlabelled = _traj(3, -1, [0, 0])
    assert "go to shelf 0 [off-plan]" in task_account([unlabelled], 1, {"t3": {0}})
    from dataclasses import replace

    broken = replace(_traj(4, -1, [1]), finish="error")  # the env's fault: out of the count
    assert task_account([_traj(0, 1, [1]), broken], limit=1).splitlines()[0] == \
        "- the policy succeeded in 1 of 1 episodes (1 more ended in an env error)"
    # an errored episode is told last: real failures fill the rewriter's few slots first
    told = task_account([broken, _traj(5, -1, [1, -1])], limit=1).splitlines()
    assert len(told) == 2 and "ran out of steps" in told[1]
    assert verdict_only("- \\boxed{1}\n- \\boxed{-1}") and verdict_only("(no critiques)")
    assert not verdict_only("- the agent never opened the drawer")


def test_random_rewrite_is_a_seeded_uniform_pick_of_the_same_menu():
    pool = make_tasks(3, seed=2)
    table = {t.task_id: _stats(t.task_id, 0) for t in pool}
    picks = []
    for seed in (0, 0, 1):
        cands, _, tally = propose(pool, table, {}, RandomEdits(seed, 4), make_env,
                                  AdaptOptions(samples=1, rewrite="random"))
        picks.append([c.extra["candidate"]["edit"] for c in cands])
        assert tally["valid_proposals"] == len(pool) == len(cands)
    assert picks[0] == picks[1]  # a rerun repeats it
    env = make_env("household")
    menus = [[e.description for e in env.edits(t.spec, "easier")] for t in pool]
    assert all(p in m for p, m in zip(picks[0], menus))
    seen = {RandomEdits(s, 0).generate([_menu_request(5)])[0].completions[0].text
            for s in range(40)}
    assert seen == {"1", "2", "3", "4", "5"}  # every edit of the menu can be drawn


def test_excluded_edits_never_reach_the_menu():
    """--exclude-edits "goal kind,step limit": a curriculum kept to the pool's kind of task;
    the random rewriter draws from what is left, and every edit left is still offered."""
    pool = make_tasks(6, seed=2)
    table = {t.task_id: _stats(t.task_id, 0) for t in pool}
    env, names = make_env("household"), ("goal kind", "step limit")
    full = [[e.description for e in env.edits(t.spec, "easier")] for t in pool]
    assert any(d.startswith(names) for m in full for d in m)  # the menu had them
    for seed in range(5):
        cands, _, _ = propose(pool, table, {}, RandomEdits(seed, 0), make_env,
                              AdaptOptions(samples=1, rewrite="random",
                                           exclude_edits=" goal kind, step limit"))
        edits = [c.extra["candidate"]["edit"] for c in cands]
        assert edits and not any(e.startswith(names) for e in edits)
        assert all(e in m for e, m in zip(edits, full))


def test_an_exclusion_that_matches_no_edit_is_named(capsys):
    """A misspelt --exclude-edits name would leave the whole menu in, silently: the stage
    names it (and not the names that did leave an edit out)."""
    pool = make_tasks(6, seed=2)
    table = {t.task_id: _stats(t.task_id, 0) for t in pool}
    propose(pool, table, {}, RandomEdits(0, 0), make_env,
            AdaptOptions(samples=1, rewrite="random", exclude_edits="goal knd,step limit"))
    err = capsys.readouterr().err
    assert "--exclude-edits 'goal knd' left out no edit of 6 task(s)' menus" in err
    assert "step limit" not in err


def test_an_exclusion_with_free_rewrites_is_refused():
    """--rewrite free shows the model no menu, so --exclude-edits would do nothing: refused
    as a usage error, by its flag on the command line and by its key in a loop table."""
    from rlany.errors import RlanyError
    from rlany.options import validate

    with pytest.raises(RlanyError, match="--exclude-edits changes the env's menu of edits, "
                                         "and --rewrite free shows the model none"):
        validate(AdaptOptions(rewrite="free", exclude_edits="goal kind"))
    with pytest.raises(RlanyError, match=r"\[adapt_tasks\] exclude_edits changes"):
        validate(AdaptOptions(rewrite="free", exclude_edits="goal kind"), "[adapt_tasks]")
    with pytest.raises(RlanyError, match="--allow-edits changes"):
        validate(AdaptOptions(rewrite="free", allow_edits="goal kind"))
    validate(AdaptOptions(rewrite="edits", exclude_edits="goal kind"))  # a menu: fine


def test_random_rewrites_read_no_summary_and_auto_reads_what_a_task_has():
    """--rewrite random with --summary model would let the model pick the edits (the control
    gone): refused. --critic auto takes the judge's critiques where they say more than
    verdicts, else the env's account, and a task with only verdicts keeps them."""
    from rlany.errors import RlanyError
    from rlany.options import validate
    from rlany.stages.critiques import either

    for rewrite in ("random", "learnability"):
        with pytest.raises(RlanyError, match=f"--rewrite {rewrite} chooses without a model"):
            validate(AdaptOptions(rewrite=rewrite, summary="model"))
    judged = {"a": "- the agent never opened it", "b": "- \\boxed{-1}", "c": "- \\boxed{1}"}
    accounts = {"a": "env a", "b": "env b", "d": "env d"}
    assert either(judged, accounts, ["a", "b", "c", "d", "e"]) == {
        "a": judged["a"], "b": "env b", "c": judged["c"], "d": "env d"}


def _menu_request(n: int):
    from rlany.engines.base import Request, Sampling

    return Request(messages=[], sampling=Sampling(choices=tuple(str(k) for k in
                                                                range(1, n + 1))))


def test_summary_line_and_counts_name_the_rejections():
    pool = make_tasks(2, seed=2)
    decisions = [{"task_id": "c1", "parent_id": "p", "direction": "easier", "accepted": True,
                  "reason": "easier: ...", "parent_acc": 0.0, "acc": 0.25},
                 {"task_id": "c2", "parent_id": "p", "direction": "easier", "accepted": False,
                  "reason": "acc(q') = 0: not proven solvable", "parent_acc": 0.0, "acc": 0.0},
                 {"task_id": "c3", "parent_id": "x", "direction": "harder", "accepted": False,
                  "reason": "parent not in pool"}]
    counts = env_loop_counts(pool, decisions, [], make_env)
    assert counts["rejected_by_reason"] == {"unsolved": 1, "parent_gone": 1}
    assert counts["accepted_by_direction"] == {"easier": 1, "harder": 0}
    assert counts["candidate_acc"] == 0.125 and counts["accepted_acc"] == 0.25
    assert set(counts["difficulty"]) == {"plan_length", "size", "max_steps"}
    line = summary_line({**counts, "accepted": 1, "pending": 3, "targets": 0, "candidates": 0,
                         "rewrites_rejected": 0, "pool": 2}, "next.jsonl", 0.1)
    assert "accepted 1 of 3 candidates (acc 0.25 vs parents 0.00)" in line
    assert "rejected: 1 parent gone, 1 unsolved" in line and "plan_length" in line


def test_cli_adapt_tasks_with_the_env_critic(tmp_path, cli):
    """--critic env: the rewriter reads the env's account of the episodes, no judgments;
    the env-loop counts land in the pool's sidecar."""
    pool = make_tasks(1, seed=2)
    tasks = write_jsonl(tmp_path / "tasks.jsonl", pool)
    stats = write_jsonl(tmp_path / "stats.jsonl", [_stats(pool[0].task_id, 0, n=2)])
    trajs = [_traj(k, -1, [-1, -1], pool[0].task_id) for k in range(2)]
    traj_file = write_jsonl(tmp_path / "trajectories.jsonl", trajs)
    script = tmp_path / "fake.json"
    script.write_text('["1"]')
    args = ["adapt-tasks", "-i", str(tasks), "--stats", str(stats), "-o",
            str(tmp_path / "next.jsonl"), "--candidates", str(tmp_path / "cands.jsonl"),
            "--engine", "fake", "--model", str(script), "--critic", "env"]
    r = cli(*args)
    assert r.returncode == 2 and "--trajectories" in r.stderr
    r = cli(*args, "--trajectories", str(traj_file))
    assert r.returncode == 0, r.stderr
    cand = read_jsonl(tmp_path / "cands.jsonl")[0]
    assert "succeeded in 0 of 2 episodes" in cand["candidate"]["critique"]
    assert "[off-plan]" in cand["candidate"]["critique"]
    counts = json.loads((tmp_path / "next.meta.json").read_text())["counts"]
    assert counts["proposed"] == {"easier": 1, "harder": 0} and "difficulty" in counts
    assert "1 new candidates (1 easier, 0 harder" in r.stderr
    # episodes of another rollout (one succeeded, where the stats say none of 2): refused
    other = write_jsonl(tmp_path / "other.jsonl", [trajs[0], _traj(1, 1, [1], pool[0].task_id)])
    elsewhere = [str(tmp_path / "x.jsonl") if a.endswith("next.jsonl") else
                 str(tmp_path / "y.jsonl") if a.endswith("cands.jsonl") else a for a in args]
    r = cli(*elsewhere, "--trajectories", str(other))
    assert r.returncode == 1 and f"{other}:1: task '{pool[0].task_id}': 1 of 2 episodes " \
        "succeeded here, 0 of 2 in its stats" in r.stderr and not (tmp_path / "x.jsonl").exists()


def test_loop_adapts_without_a_judge_and_records_the_env_loop(tmp_path, tiny_model):
    """The +adapt arm: `[adapt_tasks] critic = "env"`, no step feedback, no reward-model
    training: no judge runs, the rewriter reads the env's account, and metrics.jsonl has the
    env loop's numbers in every iteration."""
    from test_loop import _config, _run

    config = _config(tmp_path, tiny_model, step_feedback=False, rm_training=False,
                     env_adaptation=True)
    with open(config, "a") as f:
        f.write('[adapt_tasks]\ncritic = "env"\n')
    run = _run(config).dir
    assert not list(run.glob("iter_*/judgments.jsonl"))
    metrics = read_jsonl(run / "metrics.jsonl")
    loop = [m["env_loop"] for m in metrics]
    assert all(set(e) >= {"proposed", "rejected_by_reason", "difficulty", "adapted_share"}
               for e in loop)
    assert loop[1]["pending"] == sum(loop[0]["proposed"].values())
    cands = read_jsonl(run / "iter_000" / "candidates.jsonl")
    assert cands and all("episodes" in c["candidate"]["critique"] for c in cands)
    meta = json.loads((run / "iter_000" / "next_tasks.meta.json").read_text())
    assert meta["flags"]["held_out"] == str(tmp_path / "eval.jsonl")  # never proposed
    assert meta["inputs"][-1]["path"] == str(tmp_path / "eval.jsonl")
    # rlany report: the env loop's table and panels, only for a run that adapts
    from rlany.stages.report import write_report

    write_report([str(run)], tmp_path / "report")
    md = (tmp_path / "report" / "report.md").read_text()
    assert "The environment loop:" in md and "| proposed (easier/harder) |" in md
    assert (tmp_path / "report" / "adapted_share.png").exists()  # reasoning: no difficulty


def test_score_trains_on_candidates_only_when_asked():
    """`score --candidates trial` (the paper): a candidate's rollouts decide its acceptance
    and are not trained on; `train`: its mixed-outcome group is trained like the pool's."""
    from dataclasses import replace

    from rlany.stages.score import ScoreOptions, score_group

    trajs = [replace(_traj(k, 1 if k == 0 else -1, [1, -1], "c"), extra={"candidate": True})
             for k in range(4)]
    group = [(f"x:{k}", t, None) for k, t in enumerate(trajs)]
    scored, stats = score_group(group, ScoreOptions())
    assert not stats.policy_keep and stats.policy_reason == "candidate task, not accepted yet"
    assert not any(s.keep for sc in scored for s in sc.steps)
    scored, stats = score_group(group, ScoreOptions(candidates="train"))
    assert stats.policy_keep and stats.policy_reason == "mixed outcomes"
    assert any(s.keep for sc in scored for s in sc.steps)


def test_an_answer_runs_the_action_it_names_in_its_case():
    """Issue 51's KENETH case: the numbered line exactly as the observation lists it runs
    that action, not a case variant listed before it."""
    from rlany.envs import parse_action

    admissible = ['click [3]', 'type "keneth" into [5]', 'type "KENETH" into [5]']
    assert parse_action('4. type "KENETH" into [5]', admissible)[0] == admissible[2]
    assert parse_action('type "keneth" into [5]', admissible)[0] == admissible[1]
    assert parse_action('Type "Keneth" into [5]', admissible) == (
        None, {"parse": "ambiguous case", "text": 'Type "Keneth" into [5]'})
    assert parse_action("Go to Table 1.", ["go to table 1", "look"])[0] == "go to table 1"
