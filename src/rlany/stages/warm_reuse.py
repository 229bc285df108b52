"""The warm start, shared by the runs of one runs directory.

With `warm_start = true` every run of an ablation first makes the same adapter: the env's
expert on the pool (`warm_start/demos.jsonl`), then `rlany sft` on it (`warm_start/sft`),
then evaluates it (`eval_init.json`). With the same seed, pool, shape and code those are
the same bytes in every arm (a household mid.toml run spends ~6 minutes on the sft and ~5
on its evaluation on a 2-core CPU). So before a run makes its own, it looks at the run
directories beside it: a complete `warm_start/` whose demos came from identical rollout
flags, pool (sha256) and package versions (rlany's own code included), and whose sft
checkpoint records identical options (dtype as resolved here), base model, demos (sha256),
training package versions and device (cpu or cuda), with its weights there, is copied in
whole (a temp directory renamed into place; the copied sidecars
and `rlany.json` name this run's paths and say `reused_from`). `eval_init.json` is then
shared by `rlany.stages.eval_reuse` (the adapters compared by their weights' sha256).
A run whose warm start has begun finishes its own; anything that differs makes its own.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

DEMOS, SFT = "demos.jsonl", "sft"


def rewrite(obj: Any, old: str, new: str) -> Any:
    """`obj` (JSON) with every string that is path `old` or under it moved under `new`."""
    from rlany.stages.eval_reuse import map_strings

    return map_strings(obj, lambda s: new + s[len(old):] if s == old or s.startswith(old + "/")
                       else s)


def _normal_flags(flags: dict) -> dict:  # as compared: paths rewritten, dtype resolved
    from rlany.compat import resolve_dtype
    from rlany.stages.eval_reuse import _comparable

    out = _comparable(flags)
    if "dtype" in out:
        out["dtype"] = resolve_dtype(out["dtype"])
    return out


def _expected(rollout: Any, sft: Any) -> dict | None:
    import torch

    from rlany.models import resolve_model
    from rlany.outputs import package_versions
    from rlany.provenance import sha256_file
    from rlany.stageio import GEN_VERSIONS
    from rlany.training.model import TRAIN_VERSIONS

    try:
        return {"rollout": _normal_flags(dataclasses.asdict(rollout)),
                "sft": _normal_flags(dataclasses.asdict(sft)),
                "pool": [sha256_file(rollout.input)], "base": resolve_model(sft.model),
                "versions": package_versions(*GEN_VERSIONS),
                "train_versions": package_versions(*TRAIN_VERSIONS),
                # the trainer runs otherwise on a GPU (autocast, no shared prefixes)
                "device": "cuda" if torch.cuda.is_available() else "cpu"}
    except Exception:  # noqa: BLE001 - the stages themselves report what is wrong
        return None


def _matches(warm: Path, want: dict, old: str, new: str) -> tuple[dict, dict] | None:
    """A sibling's complete warm start that is this run's: (its demos sidecar, its sft
    rlany.json), both rewritten to this run's paths; None otherwise."""
    from rlany.jsonl import meta_path
    from rlany.provenance import sha256_file
    from rlany.stages.eval_reuse import weights_digest

    meta = rewrite(json.loads(meta_path(warm / DEMOS).read_text()), old, new)
    ckpt = rewrite(json.loads((warm / SFT / "rlany.json").read_text()), old, new)
    ok = (meta.get("stage") == "rollout" and _normal_flags(meta["flags"]) == want["rollout"]
          and [i.get("sha256") for i in meta["inputs"]] == want["pool"]
          and meta.get("versions") == want["versions"]
          and ckpt.get("kind") == "sft" and ckpt.get("base_model") == want["base"]
          and _normal_flags(ckpt["options"]) == want["sft"]
          and ckpt.get("versions") == want["train_versions"]  # older checkpoints: none
          and ckpt.get("device") == want["device"]
          and ckpt.get("data_sha256") == sha256_file(warm / DEMOS))
    return (meta, ckpt) if ok and weights_digest(str(warm / SFT)) else None


def share_warm_start(rollout: Any, sft: Any, warm: Path) -> Path | None:
    """Copy a sibling run's identical warm start into `warm` (this run's, empty). `rollout`
    and `sft` are the options this run's two warm-start stages would run with. Returns the
    source directory, or None (nothing shared: the stages run)."""
    from rlany.jsonl import meta_path
    from rlany.outputs import write_text_atomic

    if any(warm.iterdir()):  # begun here: it finishes its own
        return None
    want = _expected(rollout, sft)
    if want is None:
        return None
    run = warm.parent
    for src in sorted(run.parent.glob(f"*/{warm.name}")):
        if src.parent.resolve() == run.resolve() or not (src / SFT / "rlany.json").is_file():
            continue
        old, new = str(run.parent / src.parent.name), str(run)
        try:
            found = _matches(src, want, old, new)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        if found is None:
            continue
        meta, ckpt = found
        tmp = run / f".{warm.name}.share-tmp"
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(src, tmp,
                            ignore=shutil.ignore_patterns("rlany.json", "*.meta.json"))
            origin = str(src)
            write_text_atomic(meta_path(tmp / DEMOS),
                              json.dumps({**meta, "reused_from": origin}, indent=2) + "\n")
            write_text_atomic(tmp / SFT / "rlany.json",  # a checkpoint is complete with it
                              json.dumps({**ckpt, "reused_from": origin}, indent=2) + "\n")
            if _matches(src, want, old, new) is None:  # changed while it was copied
                raise OSError("changed")
            if any(warm.iterdir()):
                return None
            warm.rmdir()
            tmp.rename(warm)
            return src
        except (OSError, ValueError, KeyError, TypeError, shutil.Error):
            continue  # gone or changed while it was read: the next one, or its own
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return None
