"""The environment loop as the paper's reference code makes it: originals stay in the pool and
rewrites are drawn at most at the replay share; the menu's order does not choose the edit;
`--rewrite learnability` and `--acceptance learnability`."""

from __future__ import annotations

import json
import random
from collections import Counter

from conftest import read_jsonl, write_jsonl
from rlany.engines.fake import FakeEngine
from rlany.envs import make_env
from rlany.envs.household import make_tasks
from rlany.files.records import TaskStats
from rlany.stages.adapt_tasks import AdaptOptions, acceptance, decide, propose
from rlany.stages.edit_choice import PRIOR_WEIGHT, learnability_result, predicted, tallies
from rlany.stages.rollout import RolloutOptions, sample_tasks


def _stats(task_id: str, successes: int, n: int = 8) -> TaskStats:
    return TaskStats(task_id=task_id, n=n, successes=successes, acc=successes / n,
                     mean_steps=1.0, policy_keep=True, policy_reason="", rm_keep=True,
                     rm_reason="", policy_samples=0, rm_samples=0, step_score_mean=None,
                     parse_fail_rate=None, judge_outcome_agreement=None)


def _pool(n: int = 16):
    return make_tasks(n, seed=31, receptacles=3, distractors=1, kinds="pick_and_place",
                      closed=0.5, max_steps=8)


def test_a_pool_keeps_its_originals_and_draws_rewrites_at_the_replay_share():
    """The loop's draw and adaptation over 6 iterations with a stand-in policy that solves
    short plans: every original stays in the pool, each has at most one rewrite beside it,
    and no draw of K = 8 holds more than floor(0.25 x 8) = 2 rewrites (fails on rewrites
    that replace their original or on a uniform draw of the pool)."""
    env = make_env("household")
    pool = _pool()
    originals = [t.task_id for t in pool]
    rng, pending = random.Random(0), []
    accepted = 0
    for it in range(6):
        drawn = sample_tasks(pool + pending, RolloutOptions(sample_tasks=8, iteration=it))
        in_pool = [t for t in drawn if "candidate" not in t.extra]
        assert len(in_pool) == 8 and sum(t.lineage.version > 0 for t in in_pool) <= 2
        stats = {t.task_id: _stats(t.task_id, sum(rng.random() < 0.5 for _ in range(8))
                                   if env.difficulty(t.spec)["plan_length"] <= 3 else 0)
                 for t in drawn}
        opts = AdaptOptions(iteration=it, samples=1, rewrite="learnability")
        pool, decisions = decide(pool, pending, stats, opts)
        accepted += sum(d["accepted"] for d in decisions)
        assert [t.task_id for t in pool if t.lineage.version == 0] == originals
        roots = Counter(t.lineage.root_id for t in pool if t.lineage.version)
        assert all(v == 1 for v in roots.values())
        pending = propose(pool, stats, {}, None, make_env, opts, seen_kinds=tallies(
            decisions))[0]
    rewrites = [t for t in pool if t.lineage.version]
    assert accepted >= 4 and 4 <= len(rewrites) <= accepted and len(pool) == 16 + len(rewrites)
    # the draw of a pool that is now part rewrites still keeps them to the share
    for it in range(6, 16):
        drawn = sample_tasks(pool, RolloutOptions(sample_tasks=8, iteration=it))
        assert len(drawn) == 8 and sum(t.lineage.version > 0 for t in drawn) == 2


def test_the_menus_order_does_not_decide_a_seeded_choice():
    """A fixed script that always answers "1" (a small model's habit): the menu it is shown
    is shuffled per proposal, so what it picks spreads over the env's ranks and kinds,
    seeded (a rerun repeats it); metrics record the choice by menu position (all 1 here)
    and by env rank. Fails if the env's order reaches the model unshuffled."""
    pool = _pool()
    table = {t.task_id: _stats(t.task_id, 0) for t in pool}
    first = FakeEngine(lambda request, k: "1")
    cands, _, tally = propose(pool, table, {}, first, make_env, AdaptOptions(samples=1))
    infos = [c.extra["candidate"] for c in cands]
    assert len(infos) == 16 and {i["menu_position"] for i in infos} == {1}
    ranks = Counter(i["env_rank"] for i in infos)
    assert ranks[1] < 8 and len(ranks) >= 3, ranks  # not the env's first edit each time
    assert len({i["edit_kind"] for i in infos}) >= 3
    again, _, _ = propose(pool, table, {}, FakeEngine(lambda request, k: "1"), make_env,
                          AdaptOptions(samples=1))
    assert [c.extra["candidate"] for c in again] == infos  # seeded
    other, _, _ = propose(pool, table, {}, FakeEngine(lambda request, k: "1"), make_env,
                          AdaptOptions(samples=1, seed=1))
    assert [c.extra["candidate"]["env_rank"] for c in other] != [i["env_rank"] for i in infos]
    # the prompt shows the shuffled menu, item 1 the edit taken
    shown = first.calls[0][0].messages[-1]["content"]
    assert f"1. {infos[0]['edit']}\n" in shown
    from rlany.stages.edit_choice import choice_counts

    counts = choice_counts(cands, tally["offered"])
    assert counts["choice_by_position"] == {"1": 16}
    assert sum(counts["choice_by_env_rank"].values()) == 16
    assert sum(counts["choice_by_kind"].values()) == 16
    assert counts["offered_by_kind"]["start holding"] == 16


def test_learnability_picks_the_kind_predicted_nearest_an_even_split():
    """p_hat = (successes + 8 x 0.5) / (rollouts + 8) per (direction, kind): an unseen kind
    is predicted at 0.5 and tried first; among measured kinds the one nearest 0.5 wins."""
    history = [
        {"kind": "decision", "direction": "easier", "edit_kind": "start at", "acc": 0.0, "n": 8},
        {"kind": "decision", "direction": "easier", "edit_kind": "start at", "acc": 0.0, "n": 8},
        {"kind": "decision", "direction": "easier", "edit_kind": "start holding", "acc": 0.375,
         "n": 8},
        {"kind": "decision", "direction": "harder", "edit_kind": "start at", "acc": 0.5, "n": 8},
        {"kind": "decision", "direction": "easier", "edit_kind": "open", "accepted": False,
         "reason": "candidate not rolled out"},
        {"kind": "rewrite_rejected", "direction": "easier", "reasons": []},
    ]
    seen = tallies(history)
    assert seen == {("easier", "start at"): (0.0, 16), ("easier", "start holding"): (3.0, 8),
                    ("harder", "start at"): (4.0, 8)}
    assert predicted("easier", "start at", seen) == 4.0 / (16 + PRIOR_WEIGHT)
    assert predicted("easier", "start holding", seen) == 7.0 / 16
    assert predicted("easier", "step limit", seen) == 0.5
    env = make_env("household")
    task = _pool(1)[0]
    menu = env.edits(task.spec, "easier")
    kinds = [e.kind for e in menu]
    assert {"start at", "start holding", "step limit"} <= set(kinds)
    measured = [e for e in menu if e.kind in ("start at", "start holding")]
    picks = learnability_result(measured, "easier", seen, samples=2).completions
    assert [measured[int(c.text) - 1].kind for c in picks] == ["start holding", "start at"]
    pick = learnability_result(menu, "easier", seen, samples=1).completions[0]
    assert predicted("easier", menu[int(pick.text) - 1].kind, seen) == 0.5  # unseen first


def test_learnability_acceptance_on_a_hand_made_case():
    """--acceptance learnability: acc(q') from >= 8 rollouts inside (alpha_low, alpha_high)
    and p(1-p) above the parent's; the paper's rule on the same numbers differs."""
    learn = AdaptOptions(acceptance="learnability")
    paper = AdaptOptions()
    # easier: 0.0 -> 0.5, the most mixed: both accept
    assert acceptance("easier", 0.0, 0.5, learn, 8)[0] and acceptance("easier", 0.0, 0.5, paper)[0]
    # a harder candidate at 0.25 of a parent at 0.875: 0.1875 > 0.109
    assert acceptance("harder", 0.875, 0.25, learn, 8)[0]
    # easier 0.125 -> 0.75: the paper accepts (0.125 < 0.75 < 0.8); learnability too
    # (0.1875 > 0.109); 0.25 -> 0.75 is as learnable as its parent: refused, the paper accepts
    ok, why = acceptance("easier", 0.25, 0.75, learn, 8)
    assert not ok and why.startswith("not more learnable")
    assert acceptance("easier", 0.25, 0.75, paper)[0]
    # outside the bounds, or from too few rollouts: refused
    assert acceptance("easier", 0.0, 0.875, learn, 8)[1].startswith("not learnable")
    assert acceptance("easier", 0.0, 0.5, learn, 4)[1].startswith("too few rollouts")
    assert acceptance("easier", 0.0, 0.0, learn, 8)[1].startswith("acc(q') = 0")
    # a harder step that makes a 0.9 task 0.6: the paper needs acc(q') < acc(q) only
    assert acceptance("harder", 0.9, 0.6, learn, 8)[0]


def test_cli_learnability_reads_the_history_and_records_the_choice(tmp_path, cli):
    """`adapt-tasks --rewrite learnability --history`: no model; the history's kinds steer
    the choice, and the sidecar's counts have the choice by kind and position."""
    pool = _pool(4)
    tasks = write_jsonl(tmp_path / "tasks.jsonl", pool)
    stats = write_jsonl(tmp_path / "stats.jsonl", [_stats(t.task_id, 0) for t in pool])
    history = tmp_path / "history.jsonl"
    # every kind of the menu measured at 0 but "start holding" measured at an even split
    kinds = ["start at", "open", "remove object", "remove receptacle", "step limit", "move"]
    rows = [{"kind": "decision", "direction": "easier", "edit_kind": k, "acc": 0.0, "n": 64}
            for k in kinds]
    rows.append({"kind": "decision", "direction": "easier", "edit_kind": "start holding",
                 "acc": 0.5, "n": 8})
    history.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["adapt-tasks", "-i", str(tasks), "--stats", str(stats), "-o",
            str(tmp_path / "next.jsonl"), "--candidates", str(tmp_path / "cands.jsonl"),
            "--rewrite", "learnability", "--samples", "1", "--model", "no-such-model"]
    r = cli(*args, "--history", str(history))
    assert r.returncode == 0, r.stderr
    cands = read_jsonl(tmp_path / "cands.jsonl")
    assert [c["candidate"]["edit_kind"] for c in cands] == ["start holding"] * 4
    counts = json.loads((tmp_path / "next.meta.json").read_text())["counts"]
    assert counts["choice_by_kind"] == {"start holding": 4}
    assert sum(counts["choice_by_position"].values()) == 4
    history.write_text('{"kind": "decision", "direction": "easier", "acc": 2, "n": 8}\n')
    r = cli(*args, "--history", str(history))
    assert r.returncode == 1 and f"{history}:1: a decision needs" in r.stderr
    r = cli(*args[:-6], "--history", str(history))  # --rewrite auto: nothing reads it
    assert r.returncode == 2 and "--history is what --rewrite learnability" in r.stderr


def test_loop_chooses_by_learnability_from_the_earlier_decisions(tmp_path, tiny_model):
    """`[adapt_tasks] rewrite = "learnability"` and `[score] candidates = "train"` from a
    loop config: each iteration after the first joins the earlier decisions into
    edit_history.jsonl, which adapt-tasks reads; candidates record their kind and menu
    position and metrics.jsonl the choice by kind."""
    from test_loop import _config, _run

    config = _config(tmp_path, tiny_model, step_feedback=False, rm_training=False,
                     env_adaptation=True, iterations=3)
    text = open(config).read().replace("iterations = 2\n", "")
    with open(config, "w") as f:
        f.write(text + '[adapt_tasks]\ncritic = "env"\nrewrite = "learnability"\n'
                '[score]\ncandidates = "train"\n')
    run = _run(config).dir
    it = [run / f"iter_{k:03d}" for k in range(3)]
    assert not (it[0] / "edit_history.jsonl").exists()
    assert (it[1] / "edit_history.jsonl").read_bytes() == (it[0] / "decisions.jsonl").read_bytes()
    assert (it[2] / "edit_history.jsonl").read_bytes() == b"".join(
        (d / "decisions.jsonl").read_bytes() for d in it[:2])
    meta = json.loads((it[2] / "next_tasks.meta.json").read_text())
    assert meta["flags"]["history"] == str(it[2] / "edit_history.jsonl")
    assert meta["flags"]["rewrite"] == "learnability"
    score = json.loads((it[1] / "scored.meta.json").read_text())
    assert score["flags"]["candidates"] == "train"
    cands = read_jsonl(it[0] / "candidates.jsonl")
    assert cands and all({"edit_kind", "menu_position", "env_rank"} <= set(c["candidate"])
                         for c in cands)
    metrics = read_jsonl(run / "metrics.jsonl")
    assert sum(metrics[0]["env_loop"]["choice_by_kind"].values()) == len(cands)
