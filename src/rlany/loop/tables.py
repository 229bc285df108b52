"""The loop's stage tables: which command runs in which order, on which paths, with what
forced, and how each one's completion is seen (the `Loop` in `rlany.loop.loop` runs them;
the tables see it as a `Run`, what they read of it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from rlany.files.jsonl import meta_path
from rlany.loop.config import LoopConfig
from rlany.loop.eval_reuse import eval_done  # the base evaluation may be a sibling run's


class Run(Protocol):
    """What a stage table reads of the run it names files for: `rlany.loop.loop.Loop`, or
    `rlany.loop.resume`'s view of it that looks up no checkpoint."""

    cfg: LoopConfig
    dir: Path

    @property
    def init_policy(self) -> str | None: ...

    @property
    def init_rm(self) -> str | None: ...

    def latest(self, kind: str, before: int) -> str | None: ...

    def rm_input(self, d: Path, it: int) -> str: ...

    def joined(self, out: Path, older: list[Path], done: Path, why: str, *now: Path) -> str: ...


@dataclass(frozen=True)
class Stage:
    table: str  # config table = the command's options class (rlany.stages.BY_TABLE)
    done: Callable[[Any], Path]  # the file whose presence marks the stage complete
    io: Callable[[Run, Path, int], dict]  # the paths and adapters the loop sets
    enabled: Callable[[LoopConfig], bool] = lambda cfg: True
    engine: bool = True  # a generating command gets the engine (False: it needs none here)
    # values that win over the config's table (the table's own values win over `io`)
    forced: Callable[[Run], dict] = lambda lp: {}
    # a trainer with nothing to learn from is skipped, the model staying as it was: the loop
    # passes `--skipped DIR/TABLE.skipped.json`, which the trainer writes (`skip_file`)
    may_skip: bool = False


def _judged(cfg: LoopConfig) -> bool:
    """The judge runs when something reads its verdicts: step feedback (unless score takes
    the env's labels as step scores, `[score] step_scores = "label"`), the reward model's
    training, or the task adaptation's critiques (unless `[adapt_tasks] critic = "env"`:
    its rewriter reads the env's account of the episodes instead)."""
    # S from the env's step labels or its step rewards: no judge needed for step feedback
    labels = cfg.tables.get("score", {}).get("step_scores") in ("label", "env-reward")
    critic = cfg.tables.get("adapt_tasks", {}).get("critic", "auto")
    return ((cfg.step_feedback and not labels) or cfg.rm_training
            or (cfg.env_adaptation and critic != "env"))


def _meta(opts: Any) -> Path:  # a file stage's sidecar is written last
    return meta_path(opts.output)


def _ckpt(opts: Any) -> Path:  # a checkpoint directory is complete with its rlany.json
    return Path(opts.output) / "rlany.json"


def _kl_init(lp: Run, table: str) -> dict:
    """`kl_ref = "init"`: the KL's reference is the run's first model of that kind (the
    warm start's adapter or init_rm, else the base model), the same one in every
    iteration."""
    if lp.cfg.tables.get(table, {}).get("kl_ref") != "init":
        return {}
    first = lp.init_policy if table == "train_policy" else lp.init_rm
    return {"kl_ref": first or "base"}


# RL's learning rate from a warm start where [train_policy] gives none (docs/stages/loop.md:
# mid.toml, 3 seeds, against 3e-4 with either KL reference)
WARM_LR = 1e-4


def _train_policy_forced(lp: Run) -> dict:
    """A policy that starts warm (`init_policy` or `warm_start`) and whose config gives no
    `[train_policy] lr` (nor `full`) trains at WARM_LR; `kl_ref = "init"` resolved."""
    table = lp.cfg.tables.get("train_policy", {})
    warm = lp.init_policy is not None and "lr" not in table and not table.get("full")
    return {**({"lr": WARM_LR} if warm else {}), **_kl_init(lp, "train_policy")}


def read_if_written(warm: bool) -> set[tuple[str, str]]:
    """(table, key)s whose mere presence the loop reads, so that writing one at its default
    is not leaving it out: `[eval] judge` (false: no judge; left out: the loop's, see
    eval_judge) and, for a policy that starts warm, `[train_policy] lr` (left out:
    WARM_LR)."""
    return {("eval", "judge"), *([("train_policy", "lr")] if warm else [])}


def skip_file(d: Path, table: str) -> str:
    """Where a training stage of iteration directory `d` says it had nothing to learn from."""
    return f"{d}/{table}.skipped.json"


def _history(lp: Run, d: Path, it: int) -> str | None:
    """`[adapt_tasks] rewrite = "learnability"`: what it estimates from, the decisions of
    the earlier iterations, joined into edit_history.jsonl (None before any)."""
    if lp.cfg.tables.get("adapt_tasks", {}).get("rewrite") != "learnability" or it == 0:
        return None
    older = [lp.dir / f"iter_{j:03d}" / "decisions.jsonl" for j in range(it)]
    return lp.joined(d / "edit_history.jsonl", older, d / "next_tasks.meta.json",
                     'rewrite = "learnability"')


def pending_candidates(loop: Run, it: int) -> str | None:
    """Last iteration's candidates.jsonl, which this iteration's rollout also plays (None:
    none pending)."""
    prev = loop.dir / f"iter_{it - 1:03d}" / "candidates.jsonl"
    return str(prev) if it > 0 and prev.exists() else None


STAGES = (
    Stage("rollout", _meta, lambda lp, d, it: dict(
        input=f"{d}/rollout_tasks.jsonl", output=f"{d}/trajectories.jsonl",
        adapter=lp.latest("policy", it), iteration=it)),
    Stage("judge", _meta, lambda lp, d, it: dict(
        input=f"{d}/trajectories.jsonl", output=f"{d}/judgments.jsonl",
        adapter=lp.latest("rm", it)), enabled=_judged),
    Stage("score", lambda o: meta_path(o.stats), lambda lp, d, it: dict(
        input=f"{d}/trajectories.jsonl", output=f"{d}/scored.jsonl",
        stats=f"{d}/task_stats.jsonl",
        judgments=f"{d}/judgments.jsonl" if _judged(lp.cfg) else None)),
    Stage("train_policy", _ckpt, lambda lp, d, it: dict(
        input=f"{d}/scored.jsonl", output=f"{d}/policy", adapter=lp.latest("policy", it),
        iteration=it, skipped=skip_file(d, "train_policy")), may_skip=True,
        forced=_train_policy_forced),
    Stage("train_rm", _ckpt, lambda lp, d, it: dict(
        input=lp.rm_input(d, it), output=f"{d}/rm", adapter=lp.latest("rm", it),
        iteration=it, skipped=skip_file(d, "train_rm")), enabled=lambda cfg: cfg.rm_training,
        may_skip=True,
        forced=lambda lp: _kl_init(lp, "train_rm")),
    Stage("adapt_tasks", _meta, lambda lp, d, it: dict(
        input=f"{d}/tasks.jsonl", stats=f"{d}/task_stats.jsonl",
        judgments=f"{d}/judgments.jsonl" if _judged(lp.cfg) else None,
        trajectories=f"{d}/trajectories.jsonl", pending=pending_candidates(lp, it),
        output=f"{d}/next_tasks.jsonl", candidates=f"{d}/candidates.jsonl",
        decisions=f"{d}/decisions.jsonl", iteration=it, history=_history(lp, d, it),
        held_out=lp.cfg.eval_tasks),  # never adapted into a held-out task
        enabled=lambda cfg: cfg.env_adaptation),
)


def _warm_shape(lp: Run) -> dict:
    from rlany.loop.config import WARM_SHAPE

    policy = lp.cfg.options("train_policy", input="-", output="-")
    return {k: getattr(policy, k) for k in WARM_SHAPE}


WARM_START = (  # runs/NAME/warm_start/, before the base evaluation
    Stage("rollout", _meta, lambda lp, d, it: dict(
        input=lp.cfg.tasks, output=f"{d}/demos.jsonl", adapter=None, iteration=0),
        engine=False,  # every pool task once, by the env's expert (no model)
        forced=lambda lp: dict(expert=True, n=1, sample_tasks=None, constrain_actions=False)),
    Stage("sft", _ckpt, lambda lp, d, it: dict(
        input=f"{d}/demos.jsonl", output=f"{d}/sft", adapter=None), forced=_warm_shape),
)
EVAL = Stage("eval", eval_done, lambda lp, d, it: dict(
    input=lp.cfg.eval_tasks, output=f"{d}/eval.json", adapter=lp.latest("policy", it + 1),
    judge_adapter=eval_judge(lp.cfg, lp.latest("rm", it + 1))))


def eval_judge(cfg, adapter: str | None) -> str | None:
    """The judge adapter the evaluation measures: the loop's trained one (its step accuracy
    each evaluation, `eval --judge-adapter` implying `--judge`) unless `[eval] judge = false`
    says no judge, which a config that leaves `judge` out does not."""
    return None if cfg.tables.get("eval", {}).get("judge") is False else adapter
