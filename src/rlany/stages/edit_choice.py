"""How one edit is chosen from an env's menu (`adapt-tasks --rewrite edits|random|learnability`)
and what the choices were, as numbers.

The menu is shuffled per proposal (seeded by the run's seed, the iteration and the task), so
a rewriter that takes the first item does not take the env's first edit: position cannot
choose. Each candidate records its edit's kind, its position in the menu it was shown (1 =
first) and its rank in the env's own order (`env_rank`).

`--rewrite learnability` (no model): the edit whose predicted success is nearest 0.5, i.e.
the largest predicted learnability p(1-p). The prediction is per (direction, edit kind),
from what the run has measured of that kind: the decided candidates of earlier iterations
(`--history`, their decisions.jsonl) and of this one, each with its success acc and its
rollouts n:
    p_hat(kind) = (sum_i acc_i n_i + PRIOR_WEIGHT * PRIOR_MEAN) / (sum_i n_i + PRIOR_WEIGHT)
a Beta-binomial posterior mean whose prior is one candidate's worth of rollouts
(PRIOR_WEIGHT = 8) at an even split (PRIOR_MEAN = 0.5): a kind never measured is predicted
at 0.5, so every kind is tried before the measured ones are preferred (optimism under
uncertainty), and a measured kind moves toward its own rate as its rollouts grow. Ties
(e.g. two unseen kinds) go to the kind chosen least so far in this run's proposals, then to
the earlier item of the shuffled menu; with `--samples` > 1 the next nearest follow.
"""

from __future__ import annotations

import random
from collections import Counter

from rlany.engines.base import Completion, Result, stable_seed

PRIOR_MEAN = 0.5
PRIOR_WEIGHT = 8.0


def shuffled(menu: list, seed: int, iteration: int, task_id: str) -> tuple[list, list[int]]:
    """(the menu in a seeded random order, each item's 1-based rank in the env's order)."""
    order = list(range(len(menu)))
    random.Random(stable_seed(seed, "menu", iteration, task_id)).shuffle(order)
    return [menu[k] for k in order], [k + 1 for k in order]


def edit_kind(decision_or_info: dict) -> str | None:
    """The edit kind a candidate or decision records (older ones: the edit's head)."""
    if decision_or_info.get("edit_kind"):
        return decision_or_info["edit_kind"]
    edit = decision_or_info.get("edit")
    return edit.split(":")[0].strip() if edit else None


def tallies(decisions: list[dict]) -> dict[tuple[str, str], tuple[float, int]]:
    """(direction, edit kind) -> (successes, rollouts) over decided, rolled-out candidates."""
    out: dict[tuple[str, str], tuple[float, int]] = {}
    for d in decisions:
        kind = edit_kind(d)
        if d.get("kind", "decision") != "decision" or kind is None or "acc" not in d:
            continue
        n = int(d.get("n") or 1)
        s, m = out.get((d["direction"], kind), (0.0, 0))
        out[d["direction"], kind] = (s + d["acc"] * n, m + n)
    return out


def predicted(direction: str, kind: str, seen: dict) -> float:
    s, n = seen.get((direction, kind), (0.0, 0))
    return (s + PRIOR_WEIGHT * PRIOR_MEAN) / (n + PRIOR_WEIGHT)


def learnability_result(menu: list, direction: str, seen: dict, samples: int,
                        chosen: Counter | None = None) -> Result:
    """The answer `--rewrite learnability` gives a menu: its items' numbers, nearest
    predicted success 0.5 first, `samples` of them (repeating the last). Ties go to the kind
    chosen least so far in this run (`chosen`, updated: unmeasured kinds are spread over
    one iteration's proposals), then to menu order."""
    chosen = Counter() if chosen is None else chosen
    ranked = sorted(range(len(menu)), key=lambda k: (
        abs(predicted(direction, menu[k].kind_name, seen) - 0.5),
        chosen[direction, menu[k].kind_name], k))
    picks = [ranked[min(j, len(ranked) - 1)] for j in range(samples)]
    chosen[direction, menu[picks[0]].kind_name] += 1
    return Result(prompt_token_ids=[], completions=[
        Completion(text=str(k + 1), token_ids=[], finish_reason="stop") for k in picks])


def choice_counts(candidates: list, offered: Counter) -> dict:
    """The choices of this run's candidates by edit kind, by position in the menu shown and
    by rank in the env's order; `offered`: menu items by kind (the chance baseline)."""
    infos = [c.extra.get("candidate", {}) for c in candidates]
    infos = [i for i in infos if "menu_position" in i]

    def count(key: str) -> dict:
        return dict(sorted(Counter(str(i[key]) for i in infos).items()))

    return {"choice_by_kind": dict(sorted(Counter(i["edit_kind"] for i in infos).items())),
            "choice_by_position": count("menu_position"),
            "choice_by_env_rank": count("env_rank"),
            "offered_by_kind": dict(sorted(offered.items()))}
