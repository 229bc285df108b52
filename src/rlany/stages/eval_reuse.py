"""The base model's evaluation, shared by the runs of one runs directory.

Every run of an ablation evaluates the base model on the same held-out tasks before it
trains (`eval_base.json`): with the same seed, flags and tasks those are the same episodes,
and on a 2-core CPU a long-horizon config spends ~9 minutes on each. So before the loop
evaluates the base model, it looks at the run directories beside its own: one whose
`eval_base.json` came from identical flags (every eval option but the output, the resolved
model path), identical eval tasks (sha256) and the same package versions is copied in
(the summary as is; its sidecar says where it came from), and the evaluation is skipped.
Anything that differs (a seed, a judge setting, the tasks file, the engine, an upgrade)
evaluates again. A different precision or engine resolves to other flags, so a run on
another machine's kind of CPU shares only when it would have run the same command.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

BASE = "eval_base.json"
_SKIP = ("output", "engine_resolved", "model")  # the output's path; how the engine resolved


def _comparable(flags: dict) -> dict:  # as the sidecar holds them (paths, tuples)
    return json.loads(json.dumps({k: v for k, v in flags.items() if k not in _SKIP},
                                 default=str))


def find_base_eval(opts: Any) -> Path | None:
    """A sibling run's base evaluation this one would repeat (None: nothing to share)."""
    from rlany.jsonl import meta_path
    from rlany.models import resolve_model
    from rlany.outputs import package_versions
    from rlany.provenance import sha256_file
    from rlany.stageio import GEN_VERSIONS

    out = Path(opts.output)
    if out.name != BASE or opts.adapter or opts.judge_adapter or opts.trajectories:
        return None
    want = _comparable(dataclasses.asdict(opts))
    try:
        model, tasks = resolve_model(opts.model), sha256_file(opts.input)
    except Exception:  # noqa: BLE001 - the evaluation itself reports what is wrong
        return None
    versions = package_versions(*GEN_VERSIONS)
    for meta_file in sorted(out.parent.parent.glob(f"*/{meta_path(BASE).name}")):
        src = meta_file.parent / BASE
        if src.parent.resolve() == out.parent.resolve() or not src.is_file():
            continue
        try:
            meta = json.loads(meta_file.read_text())
            same = (meta.get("stage") == "eval" and _comparable(meta["flags"]) == want
                    and meta["flags"].get("model") == model
                    and [i.get("sha256") for i in meta["inputs"]] == [tasks]
                    and meta.get("versions") == versions)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        if same:
            return src
    return None


def reuse_base_eval(opts: Any) -> Path | None:
    """Copy a sibling's identical base evaluation to `opts.output` (summary first, the
    sidecar last: the stage is complete only with both). Returns the source, or None."""
    from rlany.jsonl import meta_path
    from rlany.outputs import write_text_atomic

    src = find_base_eval(opts)
    if src is None:
        return None
    meta = json.loads(meta_path(src).read_text())
    meta["flags"]["output"] = str(opts.output)
    meta["reused_from"] = str(src)
    write_text_atomic(opts.output, src.read_text())
    write_text_atomic(meta_path(opts.output), json.dumps(meta, indent=2) + "\n")
    return src


def eval_done(opts: Any) -> Path:
    """The loop's completion check of an evaluation (its sidecar), which first shares a
    sibling's identical base evaluation when this run has none."""
    from rlany.console import info
    from rlany.jsonl import meta_path

    if not meta_path(opts.output).exists() and (src := reuse_base_eval(opts)):
        info(f"loop: base evaluation shared: {src} (same flags, tasks and versions)")
    return meta_path(opts.output)
