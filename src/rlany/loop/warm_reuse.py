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
shared by `rlany.loop.eval_reuse` (the adapters compared by their weights' sha256).
A run whose warm start has begun finishes its own; anything that differs makes its own.

Names and paths are not content: the base model's weights can change in place, and an
adapter trained on the old weights is not this run's warm start. So when a run makes its
own, it first writes what it is made from beside it (`warm_start.content.json`): the base
model's files (`models.content_digest`: weights, config, tokenizer), and the sft's own
`adapter`'s weights where it continues one. A sibling's warm start is shared only when its
record equals a fresh digest of this run's base model; without one (or where the base
model changed while the warm start was made) it is not. Never shared, as nothing here can
digest what they depend on: a hub id, and a pool of an env whose episodes depend on more
than the tasks file and rlany's code (`eval_reuse.unpinned_env`). The loop says why in
one line when a sibling has a warm start.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

DEMOS, SFT = "demos.jsonl", "sft"


def content_path(warm: Path) -> Path:
    """Where a warm start's content record lives: warm_start -> warm_start.content.json."""
    return warm.with_name(warm.name + ".content.json")


def rewrite(obj: Any, old: str, new: str) -> Any:
    """`obj` (JSON) with every string that is path `old` or under it moved under `new`."""
    from rlany.loop.eval_reuse import map_strings

    return map_strings(obj, lambda s: new + s[len(old):] if s == old or s.startswith(old + "/")
                       else s)


def _normal_flags(flags: dict) -> dict:  # as compared: paths rewritten, dtype resolved
    from rlany.compat import resolve_dtype
    from rlany.loop.eval_reuse import _comparable

    out = _comparable(flags)
    if "dtype" in out:
        out["dtype"] = resolve_dtype(out["dtype"])
    return out


def _expected(rollout: Any, sft: Any) -> dict | None:
    import torch

    from rlany.files.outputs import package_versions
    from rlany.files.provenance import sha256_file
    from rlany.models import resolve_model
    from rlany.stage_engine import GEN_VERSIONS
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


def _content(rollout: Any, sft: Any) -> tuple[dict | None, str]:
    """What the warm start is made from beyond its flags, pool and versions, by content:
    the base model's files (the expert plays without a model; sft trains on them) and an
    adapter sft continues. (None, why) where that cannot be known here: not shared."""
    from rlany.loop.eval_reuse import unpinned_env
    from rlany.models import content_digest, resolve_model, weights_digest

    try:
        why = unpinned_env(rollout.input)
        if why:
            return None, why
        base = Path(resolve_model(sft.model))
        if not base.exists():
            return None, f"the base model {sft.model} is a hub id: no files here to digest"
        return {"base": content_digest(base),
                "adapter": weights_digest(getattr(sft, "adapter", None))}, ""
    except Exception as e:  # noqa: BLE001 - the stages themselves report what is wrong
        return None, f"what it is made from cannot be digested ({type(e).__name__}: {e})"


def _read_record(warm: Path) -> dict | None:
    path = content_path(warm)
    return json.loads(path.read_text()) if path.is_file() else None


def _matches(warm: Path, want: dict, old: str, new: str, key: dict
             ) -> tuple[tuple[dict, dict] | None, str | None]:
    """A sibling's complete warm start that is this run's: ((its demos sidecar, its sft
    rlany.json), both rewritten to this run's paths), None; (None, why) where it is
    identical but for what it was made from; (None, None) otherwise."""
    from rlany.files.jsonl import meta_path
    from rlany.files.provenance import sha256_file
    from rlany.models import weights_digest

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
    if not ok or not weights_digest(str(warm / SFT)):
        return None, None
    theirs = _read_record(warm)
    return ((meta, ckpt), None) if theirs == key else (None, f"{warm}: {_differs(theirs, key)}")


def _differs(theirs: dict | None, ours: dict) -> str:
    """Why a sibling's warm start, identical in flags, pool and versions, is not this one."""
    if not isinstance(theirs, dict) or not theirs.get("base"):
        return "it records no digest of the base model it was made from"
    if theirs["base"] != ours["base"]:
        return (f"the base model's files changed since (sha256 {str(theirs['base'])[:12]} "
                f"then, {ours['base'][:12]} now)")
    return "the adapter sft continued differs (sha256)"


def _record(warm: Path, key: dict | None) -> None:
    """What this run's own warm start is made from (none: never shared)."""
    from rlany.loop.eval_reuse import write_record

    write_record(content_path(warm), key)


def _still(warm: Path, key: dict | None) -> None:
    """A warm start begun here and not finished: made from something else than when it
    began (the base model changed in between), it is never shared."""
    try:
        record = _read_record(warm)
    except (OSError, ValueError):
        record = {}
    if record is not None and record != key:
        _record(warm, {"base": None, "changed": "what it is made from changed while it was "
                       "made"})


def share_warm_start(rollout: Any, sft: Any, warm: Path) -> Path | None:
    """Copy a sibling run's identical warm start, made from the same content, into `warm`
    (this run's, empty); else record what this run's own is made from. `rollout` and `sft`
    are the options this run's two warm-start stages would run with. Returns the source
    directory, or None (nothing shared: the stages run)."""
    from rlany.console import info

    if (warm / SFT / "rlany.json").is_file():  # complete
        return None
    key, why = _content(rollout, sft)
    if any(warm.iterdir()):  # begun here: it finishes its own
        _still(warm, key)
        return None
    want = _expected(rollout, sft)
    if key is not None and want is not None:
        src, why = _copy_sibling(warm, want, key)
        if src is not None:
            return src
    elif key is None and not _siblings(warm):
        why = ""  # nothing beside it to share: nothing to say
    if why:
        info(f"loop: warm start not shared: {why}")
    _record(warm, key)
    return None


def _siblings(warm: Path) -> list[Path]:
    """The complete warm starts in the run directories beside this one's."""
    run = warm.parent
    return [src for src in sorted(run.parent.glob(f"*/{warm.name}"))
            if src.parent.resolve() != run.resolve() and (src / SFT / "rlany.json").is_file()]


def _copy_sibling(warm: Path, want: dict, key: dict) -> tuple[Path | None, str | None]:
    """Copy the first sibling warm start that is this run's into `warm`: (its source, None),
    or (None, why not where one was identical but for what it was made from)."""
    from rlany.files.jsonl import meta_path
    from rlany.files.outputs import write_text_atomic

    run, why = warm.parent, None
    for src in _siblings(warm):
        old, new = str(run.parent / src.parent.name), str(run)
        try:
            found, whynot = _matches(src, want, old, new, key)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        if found is None:
            why = why or whynot
            continue
        meta, ckpt = found
        tmp = run / f".{warm.name}.share-tmp"
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(src, tmp,
                            ignore=shutil.ignore_patterns("rlany.json", "*.meta.json"))
            origin = str(src)
            write_text_atomic(meta_path(tmp / DEMOS),
                              json.dumps({**meta, "reused_from": origin}, indent=2,
                                         allow_nan=False) + "\n")
            write_text_atomic(tmp / SFT / "rlany.json",  # a checkpoint is complete with it
                              json.dumps({**ckpt, "reused_from": origin}, indent=2,
                                         allow_nan=False) + "\n")
            if _matches(src, want, old, new, key)[0] is None:  # changed while it was copied
                raise OSError("changed")
            if any(warm.iterdir()):
                return None, None
            _record(warm, key)
            warm.rmdir()
            tmp.rename(warm)
            return src, None
        except (OSError, ValueError, KeyError, TypeError, shutil.Error):
            continue  # gone or changed while it was read: the next one, or its own
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return None, why
