"""Provenance: do two inputs come from the same run? A stage's inputs are checked against
each other through their `.meta.json` sidecars (which input each was made from, by sha256)
before anything is computed: judgments of another rollout, or stats scored with other
judgments, are refused with one line naming the file."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from rlany.errors import RlanyError
from rlany.jsonl import JsonlReader, meta_path
from rlany.records import Judgment


def sidecar(path: str | Path) -> dict | None:
    """The `.meta.json` of an input (None: hand-made data, or stdin)."""
    meta = meta_path(path)
    if str(path) == "-" or not meta.is_file():
        return None
    try:
        data = json.loads(meta.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise RlanyError("unreadable sidecar metadata", where=str(meta)) from None
    return data if isinstance(data, dict) else None


def _source(meta: dict | None, stage: str, index: int = 0) -> str | None:
    """The sha256 of input `index` that a `stage` sidecar records (None where unknown)."""
    if not meta or meta.get("stage") != stage:
        return None
    inputs = meta.get("inputs")
    if not isinstance(inputs, list) or len(inputs) <= index or not isinstance(
            inputs[index], dict):
        return None
    sha = inputs[index].get("sha256")
    return sha if isinstance(sha, str) else None


def check_judged(trajectories: str, judgments: str, names: tuple[str, str]) -> None:
    """Judgments whose sidecar names the trajectories they were made from must name this
    trajectories file (by content digest). Without a sidecar, `pairing.check_judgment`
    still compares each judgment's responses digest with its trajectory's."""
    judged = _source(sidecar(judgments), "judge")
    if judged is not None and judged != sha256_file(trajectories):
        raise RlanyError(f"these judgments were made from another trajectories file "
                         f"(sha256 {judged[:12]}), not from {names[0]}", where=names[1],
                         hint="judge these trajectories, or give this rollout's judgments")


def check_adapt_inputs(stats: str, judgments: str | None, names: tuple[str, str | None]
                       ) -> None:
    """adapt-tasks' stats and judgments must come from one rollout: where both sidecars
    say, the trajectories they were made from are the same file, and the judgments are the
    ones those stats were scored with."""
    stats_meta = sidecar(stats)
    if judgments is None or stats_meta is None:
        return
    scored_from = _source(stats_meta, "score")
    judged_from = _source(sidecar(judgments), "judge")
    if scored_from and judged_from and scored_from != judged_from:
        raise RlanyError("the task stats and the judgments come from different rollouts "
                         f"(trajectories sha256 {scored_from[:12]} vs {judged_from[:12]})",
                         where=names[1], hint="give the judgments of the rollout the stats "
                         "were scored from")
    scored_with = _source(stats_meta, "score", 1)
    if scored_with and scored_with != sha256_file(judgments):
        raise RlanyError(f"{names[0]} was scored with other judgments than this file",
                         where=names[1], hint="give the judgments the stats were scored with")


def check_scored_from(stats: str, trajectories: str, names: tuple[str, str]) -> None:
    """adapt-tasks' trajectories (the env's account) must be the ones its stats were scored
    from, where the stats' sidecar says."""
    scored_from = _source(sidecar(stats), "score")
    if scored_from and scored_from != sha256_file(trajectories):
        raise RlanyError(f"{names[0]} was scored from another trajectories file",
                         where=names[1], hint="give the trajectories the stats were scored "
                         "from")


def judged_tasks(judgments: str, name: str | None) -> dict[str, str]:
    """task id -> where it is first judged, for checking judgments against the stats."""
    seen: dict[str, str] = {}
    for where, j in JsonlReader(judgments, Judgment, "judgments", allow_empty=True, name=name):
        seen.setdefault(j.task_id, where)
    return seen


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
