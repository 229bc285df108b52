"""The base model's evaluation (and a shared warm start's), shared by the runs of one runs
directory.

Every run of an ablation evaluates the base model on the same held-out tasks before it
trains (`eval_base.json`): with the same seed, flags and tasks those are the same
episodes, and on a 2-core CPU a long-horizon config spends 6 (AVX-512) to 18 (AVX2)
minutes on each. So before the loop evaluates the base model, it looks at the run
directories beside its own: one whose `eval_base.json` came from identical flags (every
eval option but the output, the resolved model path), identical eval tasks (sha256) and
the same package versions is copied in
(the summary as is; its sidecar says where it came from), and the evaluation is skipped.
Anything that differs evaluates again: a seed, a judge setting, the tasks file, the engine
or precision `auto` resolves to on this machine, a package upgrade, a change to rlany's own
code (`versions.rlany_source`). A served model (`--engine openai`) is never shared: its
weights can change behind the same URL. The warm start's evaluation (`eval_init.json`) is
shared the same way when its adapters' weights are the sibling's (sha256; the warm start
itself is shared by `rlany.stages.warm_reuse`): its summary and sidecar then name this
run's adapter paths.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

BASE, INIT = "eval_base.json", "eval_init.json"
# the output's path, and what the sidecar holds resolved (compared resolved, below)
_SKIP = ("output", "engine_resolved", "model", "dtype_resolved")
_ADAPTERS = ("adapter", "judge_adapter")  # compared by their weights, not their paths


def weights_digest(path: str | None) -> str | None:
    """sha256 over an adapter's weight files (its other files name its own paths)."""
    import hashlib

    from rlany.provenance import sha256_file
    if path is None:
        return None
    files = sorted(Path(path).glob("*.safetensors")) + sorted(Path(path).glob("*.bin"))
    if not files:
        raise FileNotFoundError(f"{path}: no weights")
    return hashlib.sha256(" ".join(sha256_file(f) for f in files).encode()).hexdigest()


def _comparable(flags: dict, skip: tuple = ()) -> dict:  # as a sidecar holds them
    return json.loads(json.dumps({k: v for k, v in flags.items()
                                  if k not in _SKIP + skip}, default=str))


def _expected(opts: Any) -> dict | None:
    """What a sibling's sidecar must hold to be this evaluation (None: never shared)."""
    from rlany.compat import resolve_dtype
    from rlany.engines import resolve_engine
    from rlany.models import resolve_model
    from rlany.outputs import package_versions
    from rlany.provenance import sha256_file
    from rlany.stageio import GEN_VERSIONS, WEIGHT_ENGINES

    name = Path(opts.output).name
    if (name not in (BASE, INIT) or (name == BASE and (opts.adapter or opts.judge_adapter))
            or opts.trajectories or opts.engine == "openai"):
        return None  # a served model can change behind its URL
    try:
        engine = resolve_engine(opts.engine)[0]
        return {"flags": _comparable(dataclasses.asdict(opts), _ADAPTERS),
                "adapters": [weights_digest(getattr(opts, k)) for k in _ADAPTERS],
                "model": resolve_model(opts.model), "tasks": [sha256_file(opts.input)],
                "engine": engine, "versions": package_versions(*GEN_VERSIONS),
                # as stageio.engine_flags records it: for the engines that load weights
                "dtype": resolve_dtype(opts.dtype) if engine in WEIGHT_ENGINES else None}
    except Exception:  # noqa: BLE001 - the evaluation itself reports what is wrong
        return None


def _holds(meta: dict, want: dict) -> bool:
    from rlany.stageio import resolved_engine

    flags = meta["flags"]
    return (meta.get("stage") == "eval" and _comparable(flags, _ADAPTERS) == want["flags"]
            and [weights_digest(flags.get(k)) for k in _ADAPTERS] == want["adapters"]
            and flags.get("model") == want["model"] and resolved_engine(flags) == want["engine"]
            and flags.get("dtype_resolved") == want["dtype"]
            and [i.get("sha256") for i in meta["inputs"]] == want["tasks"]
            and meta.get("versions") == want["versions"])


def find_base_eval(opts: Any) -> tuple[Path, dict, str] | None:
    """A sibling run's base evaluation this one would repeat: (its path, its sidecar, its
    summary text), read once and checked unchanged after; None: nothing to share."""
    from rlany.jsonl import meta_path

    want = _expected(opts)
    if want is None:
        return None
    out = Path(opts.output)
    for meta_file in sorted(out.parent.parent.glob(f"*/{meta_path(out.name).name}")):
        src = meta_file.parent / out.name
        if src.parent.resolve() == out.parent.resolve():
            continue
        try:
            before = meta_file.read_text()
            meta = json.loads(before)
            if not _holds(meta, want):
                continue
            text = src.read_text()
            if meta_file.read_text() == before:  # not rewritten while it was read
                return src, meta, text
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return None


def map_strings(obj: Any, fn) -> Any:
    """`obj` (JSON) with every string `s` in it replaced by `fn(s)`."""
    if isinstance(obj, str):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: map_strings(v, fn) for k, v in obj.items()}
    if isinstance(obj, list):
        return [map_strings(v, fn) for v in obj]
    return obj


def reuse_base_eval(opts: Any) -> Path | None:
    """Copy a sibling's identical base evaluation to `opts.output` (summary first, the
    sidecar last: the stage is complete only with both). Returns the source, or None."""
    from rlany.jsonl import meta_path
    from rlany.outputs import write_text_atomic

    found = find_base_eval(opts)
    if found is None:
        return None
    src, meta, text = found
    # its summary and sidecar name the sibling's adapter paths (the same weights): this run's
    moved = {meta["flags"][k]: getattr(opts, k) for k in _ADAPTERS
             if meta["flags"].get(k) not in (None, getattr(opts, k))}
    if moved:
        summary = map_strings(json.loads(text), lambda v: moved.get(v, v))
        text = json.dumps(summary, indent=2) + "\n"
        meta["flags"].update({k: getattr(opts, k) for k in _ADAPTERS})
    meta["flags"]["output"] = str(opts.output)
    meta["reused_from"] = str(src)
    write_text_atomic(opts.output, text)
    write_text_atomic(meta_path(opts.output), json.dumps(meta, indent=2) + "\n")
    return src


def eval_done(opts: Any) -> Path:
    """The loop's completion check of an evaluation (its sidecar), which first shares a
    sibling's identical base evaluation when this run has none."""
    from rlany.console import info
    from rlany.jsonl import meta_path

    if not meta_path(opts.output).exists() and (src := reuse_base_eval(opts)):
        what = "warm start's" if src.name == INIT else "base"
        info(f"loop: {what} evaluation shared: {src} (same flags, tasks and versions)")
    return meta_path(opts.output)
