"""The shards a `--print-plan` script runs a generation stage in, and their join.

The plan runs rollout, judge and eval as N `--shard I/N` processes (`rlany.shards`), each
writing `DIR/shards/STEM.I-of-N.SUFFIX` beside the stage's output `DIR/STEM.SUFFIX`, then
joins them: eval with `rlany eval --join` (which writes the sidecar), rollout and judge with
`cat` (the concatenation in shard order is the unsharded output byte for byte). `cat`
writes no sidecar, so the loop takes such an output as complete when every shard's sidecar
is there and the output is exactly as long as the shards together (the plan moves it into
place whole), and writes its sidecar from the shards' (`joined_meta`): their flags but the
shard's own, their counts added up, the rates recomputed from the added counts.

A join is checked by identity and order: the shards must be one run's (`one_run`: the
flags of `rlany.shards.SHARD_KEYS` aside), each shard's file must still hold the bytes its
sidecar's `sha256` names, and the output must be shard 0's bytes, then shard 1's, ...
(each slice's digest). Shards joined in another order (a glob sorts `10-of-12` before
`2-of-12`) are joined again in order by the loop, and refused by a plan, which writes
nothing.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from rlany.files.jsonl import meta_path

SHARDED = ("rollout", "judge", "eval")  # the generation stages a plan shards


def shard_paths(output: str | Path, n: int) -> list[Path]:
    """Where the N shards of a stage whose output is `output` write theirs."""
    out = Path(output)
    return [out.parent / "shards" / f"{out.stem}.{i}-of-{n}{out.suffix}" for i in range(n)]


def adopt(output: str, write: bool) -> bool:
    """Whether `output` (no sidecar of its own) is the whole join of a plan's shards; with
    `write`, its sidecar is then written from theirs."""
    from rlany.files.outputs import write_text_atomic

    out = Path(output)
    if not out.is_file() or meta_path(out).exists():
        return False
    # N of at most 5 digits: no plan has more than MAX_SHARDS (rlany.limits)
    name = re.compile(rf"{re.escape(out.stem)}\.[0-9]+-of-([0-9]{{1,5}}){re.escape(out.suffix)}")
    counts = {m[1] for p in (out.parent / "shards").glob(f"{out.stem}.*{out.suffix}")
              if (m := name.fullmatch(p.name))}
    if len(counts) != 1:
        return False
    parts = shard_paths(out, int(counts.pop()))
    if not all(p.is_file() and meta_path(p).is_file() for p in parts):
        return False
    if out.stat().st_size != sum(p.stat().st_size for p in parts):
        return False
    one_run(parts)
    if not in_order(out, parts):
        from rlany.console import info
        from rlany.errors import RlanyError

        if not write:
            raise RlanyError("not the plan's shards joined in shard order (a glob that sorts "
                             "10-of-12 before 2-of-12?)", where=output, hint="delete it: the "
                             "plan joins the shards again, or `rlany loop` rejoins them")
        info(f"loop: {output} holds the shards in another order than 0..{len(parts) - 1}: "
             "joined again in shard order")
        _rejoin(out, parts)
    if write:
        meta = joined_meta(output, parts)
        write_text_atomic(meta_path(out), json.dumps(meta, indent=2, allow_nan=False) + "\n")
    return True


def in_order(out: Path, parts: list[Path]) -> bool:
    """Whether `out` is the shards' bytes in shard order: each slice of it has the digest
    its shard's sidecar records, which the shard's file must still have (else refused)."""
    import hashlib

    from rlany.errors import RlanyError
    from rlany.files.provenance import sha256_file

    ordered = True
    with open(out, "rb") as f:
        for p in parts:
            recorded = json.loads(meta_path(p).read_text(encoding="utf-8")).get("sha256")
            if recorded != sha256_file(p):
                raise RlanyError("this shard's bytes are not the ones its sidecar records "
                                 "(sha256): changed after it was written", where=str(p),
                                 hint=f"delete {p} and its sidecar to run the shard again")
            h, left = hashlib.sha256(), p.stat().st_size
            while left:
                chunk = f.read(min(left, 1 << 20))
                h.update(chunk)
                left -= len(chunk)
            ordered = ordered and h.hexdigest() == recorded
    return ordered


def _rejoin(out: Path, parts: list[Path]) -> None:
    """`out` replaced, whole, by the shards concatenated in shard order."""
    import shutil
    import tempfile

    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    try:
        with open(fd, "wb") as f:
            for p in parts:
                with open(p, "rb") as part:
                    shutil.copyfileobj(part, f)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def one_run(parts: list[Path]) -> None:
    """Shards joined by `cat` are one run's only if their sidecars agree on the inputs and
    on every flag but a shard's own (and its endpoint): shards left from before a config
    changed, beside shards made after, would otherwise join into one output silently."""
    from rlany.errors import RlanyError
    from rlany.shards import differing_flags

    def run_of(p: Path) -> tuple[dict, list]:
        meta = shard_meta(p)
        return meta["flags"], sorted(str(i.get("sha256")) for i in meta["inputs"])

    first = run_of(parts[0])
    for p in parts[1:]:
        flags, inputs = run_of(p)
        keys = differing_flags(first[0], flags)  # all but each shard's own (SHARD_KEYS)
        if keys or inputs != first[1]:
            what = f"other {', '.join(keys)}" if keys else "another input"
            raise RlanyError(f"a shard made with {what} than {parts[0].name}: shards of "
                             "different runs", where=str(p),
                             hint=f"delete {p.parent} to run its stage's shards again")


def shard_meta(part: Path) -> dict:
    """A shard output's sidecar, refused in one line unless it is what a stage writes: an
    object with `flags` and `counts` objects, a list of `inputs` objects and a number of
    seconds (what joining reads)."""
    from rlany.errors import RlanyError
    from rlany.files.provenance import sidecar

    meta = sidecar(part)
    inputs = meta.get("inputs") if meta else None
    wall = meta.get("wall_time_s", 0) if meta else None
    if not (meta and isinstance(meta.get("flags"), dict) and isinstance(meta.get("counts"), dict)
            and isinstance(inputs, list) and all(isinstance(i, dict) for i in inputs)
            and isinstance(wall, (int, float)) and not isinstance(wall, bool)):
        raise RlanyError("a shard's sidecar is damaged (not the flags, inputs, counts and "
                         "wall time a stage writes)", where=str(meta_path(part)),
                         hint=f"delete {part.parent} to run its stage's shards again")
    return meta


def joined_meta(output: str, parts: list[Path]) -> dict:
    """The sidecar of the joined output, from the shards' sidecars."""
    metas = [shard_meta(p) for p in parts]
    first = metas[0]
    flags = {**first.get("flags", {}), "shard": None, "output": output}
    urls = [m.get("flags", {}).get("base_url") for m in metas]
    if all(urls):  # each shard its own endpoint: together, the unsharded run's
        flags["base_url"] = ",".join(dict.fromkeys(urls))
    from rlany.files.provenance import sha256_file

    return {**first, "output": Path(output).name, "sha256": sha256_file(output), "flags": flags,
            "counts": combine([m.get("counts", {}) for m in metas]),
            "wall_time_s": max(float(m.get("wall_time_s") or 0) for m in metas),
            "joined_from": [str(p) for p in parts]}


def combine(parts: list[dict]) -> dict:
    """Shards' counts as one run's: numbers added, lists joined, the whole input's
    `input_tasks` kept, the rates recomputed from the added counts (a balanced accuracy,
    which has no counts here, as the mean of the shards' weighted by their labelled
    verdicts); anything else kept where the shards agree."""
    out: dict = {}
    for key in dict.fromkeys(k for p in parts for k in p):
        values = [p.get(key) for p in parts]
        if key == "shard":
            continue
        if key == "input_tasks" or all(v == values[0] for v in values[1:]) and \
                not _number(values[0]):
            out[key] = values[0]
        elif all(isinstance(v, list) for v in values):
            out[key] = [x for v in values for x in v]
        elif all(_number(v) for v in values):
            out[key] = sum(values)
        else:
            out[key] = None
    if "parse_fail_rate" in out:
        out["parse_fail_rate"] = out["unparseable"] / out["verdicts"] if out["verdicts"] \
            else 0.0
    if "positive_share" in out:
        readable = out["positive"] + out["negative"]
        out["positive_share"] = out["positive"] / readable if readable else None
    # a shard's success rate is over this run's episodes that ran (`ran`; a resumed shard's
    # earlier part is not in it): weighted by that count
    for key, weight in (("success_rate", lambda p: p.get("ran", p["trajectories"])),
                        ("label_accuracy", lambda p: p["labelled_verdicts"])):
        if key in out:
            pairs = [(p[key], weight(p)) for p in parts if p.get(key) is not None]
            total = sum(w for _, w in pairs)
            out[key] = sum(v * w for v, w in pairs) / total if total else (
                0.0 if key == "success_rate" else None)
    return out


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
