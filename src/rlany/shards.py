"""Sharded stages: `--shard I/N` runs shard I of N of `rollout`, `judge` or `eval`.

A stage works in batches: rollout and eval play `--batch-tasks` tasks at a time, judge sends
task groups to the engine until a batch holds `--batch-trajectories` trajectories. The B
batches of the whole input (for rollout and eval after `--sample-tasks` drew its sample
from the whole input) are cut into N contiguous blocks in order, as even as whole batches
allow (the first B mod N shards take one batch more). So

* a task's samples are never split, and a shard plays exactly the batches the unsharded run
  plays: the same requests with the same seeds (derived from seed, task, iteration, turn and
  sample, never from a position). Even an engine whose samples depend on what else is in
  its batch (hf seeds one batched call; batched kernels round differently) gives a shard
  the bytes the unsharded run gives those tasks;
* the N outputs, concatenated in shard order (`cat`), are the unsharded output byte for
  byte; eval's summaries join with `rlany eval --join` (`rlany.stages.eval.join`);
* each shard is an ordinary run of the stage: its own output, lock, partial output and
  sidecar (`flags.shard`, and `counts.shard`: which tasks it took), so it resumes alone.

Fewer batches than shards leaves some shards empty (an empty output, said on stderr): a
smaller `--batch-tasks` (`--batch-trajectories`) makes finer shards.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from rlany.errors import RlanyError, UsageError
from rlany.options import opt

SPEC = re.compile(r"([0-9]+)/([0-9]+)")
# The one definition of the flags that may differ between shards of one run: the shard's
# own, its output (and eval's trajectories), its endpoint (a plan gives each shard one of
# --base-url's), eval's --join. Every join (`eval --join`, the loop adopting a plan's `cat`)
# compares all the other flags.
SHARD_KEYS = ("shard", "output", "trajectories", "join", "base_url")


JOINED = ("The N outputs, concatenated in shard order (cat), are the unsharded output byte "
          "for byte; each shard resumes on its own output.")


def shard_opt(what: str, joined: str = JOINED) -> Any:
    """The `--shard` field of a stage (`what`: how its work is cut; `joined`: how the
    shards' outputs make the unsharded one), for the help."""
    return opt(None, f"Run shard I of N (I/N, 0 <= I < N): {what}, with the seeds an "
               f"unsharded run gives them. {joined}", scope="io")


def parse(spec: str | None) -> tuple[int, int] | None:
    """(I, N) of `--shard I/N`, None without one; anything else is a usage error."""
    from rlany.limits import MAX_SHARDS

    if spec is None:
        return None
    m = SPEC.fullmatch(spec)
    if not m or len(spec) > 40 or not int(m[1]) < int(m[2]):  # 40: no int of 1000s of digits
        raise UsageError(f"--shard must be I/N, two whole numbers with 0 <= I < N (shard I of "
                         f"N), got {spec[:40]!r}")
    if int(m[2]) > MAX_SHARDS:
        raise UsageError(f"--shard {spec}: at most {MAX_SHARDS:,} shards (rlany.limits)")
    return int(m[1]), int(m[2])


def batch_starts(sizes: list[int], limit: int) -> list[int]:
    """Where each batch begins: items are taken in order until the batch holds `limit` or
    more (rollout: tasks of size 1, `--batch-tasks`; judge: task groups, their
    trajectories counted, `--batch-trajectories`). The rule `rollout.rollout` and
    `judge.judge` batch by."""
    starts, size = [], 0
    for k, s in enumerate(sizes):
        if size == 0:
            starts.append(k)
        size += s
        if size >= limit:
            size = 0
    return starts


def take(items: list, limit: int, shard: tuple[int, int] | None, *, stage: str,
         batch_flag: str, sizes: list[int] | None = None, unit: str = "tasks"
         ) -> tuple[list, dict]:
    """The items shard (I, N) takes (whole batches, see the module doc) and the sidecar's
    record of them, `{"shard": {index, of, start, end, total}}`: positions [start, end) of
    the `total` items all shards cover. Without a shard: every item and {}."""
    if shard is None:
        return items, {}
    from rlany.console import info

    starts = batch_starts(sizes or [1] * len(items), limit) + [len(items)]
    batches, (i, n) = len(starts) - 1, shard
    q, r = divmod(batches, n)  # the first r shards take q + 1 batches, the others q
    start, end = starts[i * q + min(i, r)], starts[(i + 1) * q + min(i + 1, r)]
    if start == end:
        info(f"{stage}: shard {i}/{n} has no {unit}: the {len(items)} {unit} make {batches} "
             f"batch{'es' if batches != 1 else ''} of {batch_flag} {limit}, fewer than {n} "
             f"shards (a smaller {batch_flag} makes finer shards); writing an empty output")
    return items[start:end], {"shard": {"index": i, "of": n, "start": start, "end": end,
                                        "total": len(items)}}


def refuse_sharded_input(path: str) -> None:
    """`--shard` cuts a whole input: an input whose sidecar says it is already one shard of
    a run is refused (a shard's output is judged whole, without --shard)."""
    from rlany.files.provenance import sidecar

    meta = sidecar(path) or {}
    flags = meta.get("flags")
    spec = flags.get("shard") if isinstance(flags, dict) else None
    if spec:
        raise UsageError(f"--shard: {path} is already shard {spec} of a {meta.get('stage')} "
                         "(its sidecar says so); give it without --shard, or shard the whole "
                         "output (the shards concatenated)")


def read_parts(path: str, name: str) -> list[tuple[str, dict]]:
    """The JSON objects of a file holding one or more concatenated (`cat`) summaries, each
    with where it begins (`name:line`)."""
    name = "<stdin>" if name == "-" else name
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise RlanyError("not UTF-8 text", where=name) from None
    except (FileNotFoundError, IsADirectoryError):
        raise RlanyError("no such file of shard summaries", where=name) from None
    from rlany.files.jsonl import _finite_float, _reject_constant  # NaN, 1e400: not JSON numbers

    decoder = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)
    pos, parts = 0, []
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos == len(text):
            break
        where = f"{name}:{text.count(chr(10), 0, pos) + 1}"
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except (ValueError, RecursionError) as e:
            raise RlanyError(f"not a JSON summary ({str(e)[:100]})", where=where) from None
        if not isinstance(obj, dict):
            raise RlanyError("not a JSON object", where=where)
        parts.append((where, obj))
    if not parts:
        raise RlanyError("empty: expected the summaries of the shards", where=name)
    return parts


def in_order(parts: list[tuple[str, dict]], name: str) -> list[dict]:
    """The shards' summaries sorted by shard index, refused unless they are shards 0..N-1
    of one run, each once: the same N, the same input (sha256) and the same flags but for
    the shard's own (`SHARD_KEYS`)."""
    name = "<stdin>" if name == "-" else name
    by_index: dict[int, tuple[str, dict]] = {}
    first: tuple[str, dict] | None = None
    for where, part in parts:
        shard = part.get("shard")
        if not (isinstance(shard, dict) and isinstance(part.get("sums"), dict)
                and isinstance(shard.get("index"), int) and isinstance(shard.get("of"), int)):
            raise RlanyError("not the summary of a shard (no `shard` and `sums`): give the "
                             "summaries written with --shard I/N", where=where)
        problem = _damage(part)
        if problem:
            raise RlanyError(f"a shard's summary is damaged: {problem}", where=where,
                             hint="give the summaries eval --shard I/N wrote, unedited")
        first = first or (where, part)
        _same_run(first, (where, part))
        if shard["index"] in by_index:
            raise RlanyError(f"shard {shard['index']}/{shard['of']} appears twice (first at "
                             f"{by_index[shard['index']][0]})", where=where)
        by_index[shard["index"]] = (where, part)
    n = first[1]["shard"]["of"] if first else 0
    missing = [f"{i}/{n}" for i in range(n) if i not in by_index]
    if missing or set(by_index) - set(range(n)):
        raise RlanyError(f"the shards are not 0..{n - 1} of {n}: missing "
                         f"{', '.join(missing) or 'none'}, got {sorted(by_index)}", where=name,
                         hint="give every shard's summary once")
    end = 0  # shard i's tasks begin where shard i-1's ended; the last ends with the input
    for i in range(n):
        where, part = by_index[i]
        shard = part["shard"]
        if digest(part.get("per_task"), part["sums"]) != shard.get("sha256"):
            raise RlanyError(f"shard {i}/{n}'s rows and counts are not the ones it wrote (their "
                             "sha256 differs from its record)", where=where,
                             hint="run that shard again")
        if shard.get("start") != end or i == n - 1 and shard.get("end") != shard.get("total"):
            raise RlanyError(f"shard {i}/{n} covers tasks [{shard.get('start')}, "
                             f"{shard.get('end')}) of {shard.get('total')}, not the ones "
                             f"after shard {i - 1}'s (which end at {end})" if i else
                             f"shard 0/{n} does not begin with the first task", where=where)
        end = shard.get("end")
    return [by_index[i][1] for i in range(n)]


def digest(per_task: Any, sums: dict) -> str:
    """sha256 of an eval shard's rows and counts (canonical JSON): what `--join` checks."""
    import hashlib

    data = json.dumps([per_task, sums], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(data.encode()).hexdigest()


def _damage(part: dict) -> str | None:
    """What in a shard's summary is not what `eval --shard` writes (None: nothing): the
    shard's numbers (0 <= index < of <= MAX_SHARDS), its input and flags, the counts
    (whole numbers >= 0), rows, adapter checks, pass@K keys and wall time that --join
    reads. Types only: that the shards make one run is `in_order`'s."""
    from rlany.limits import MAX_SHARDS

    shard, index, of = part["shard"], part["shard"]["index"], part["shard"]["of"]
    if isinstance(index, bool) or isinstance(of, bool) or not 0 <= index < of <= MAX_SHARDS:
        return f"shard {str(index)[:12]}/{str(of)[:12]} is not I/N with 0 <= I < N <= " \
               f"{MAX_SHARDS:,} (rlany.limits)"
    for key in ("input", "flags"):
        if not isinstance(shard.get(key), dict):
            return f"its shard.{key} is not an object"
    if not isinstance(part.get("policy"), dict):
        return "its policy is not an object"
    for key, kind in (("per_task", "rows"), ("adapter_checks", "checks")):
        value = part.get(key, [])
        if not (isinstance(value, list) and all(isinstance(x, dict) for x in value)):
            return f"its {key} is not a list of {kind}"
    wall = part.get("wall_time_s")
    if isinstance(wall, bool) or not isinstance(wall, (int, float)) or wall < 0:
        return f"its wall_time_s is not a number of seconds: {str(wall)[:20]}"
    bad_k = [k for k in part if k.startswith("pass@") and not (
        k[5:].isdigit() and k[5:].isascii() and len(k) <= 11 and int(k[5:]) >= 1)]
    if bad_k:
        return f"its key {bad_k[0][:20]!r} is not pass@K with K a whole number >= 1"
    return _bad_count(part["sums"], "sums")


def _bad_count(sums: dict, at: str) -> str | None:
    """The first of a summary's `sums` that is not a count (a whole number >= 0)."""
    for key, value in sums.items():
        if isinstance(value, dict):
            problem = _bad_count(value, f"{at}.{key}")
            if problem:
                return problem
        elif isinstance(value, bool) or not isinstance(value, int) or value < 0:
            return f"its {at}.{str(key)[:20]} is not a count: {str(value)[:20]}"
    return None


def _same_run(first: tuple[str, dict], other: tuple[str, dict]) -> None:
    (w0, a), (w1, b) = first, other
    sa, sb = a["shard"], b["shard"]
    if sa["of"] != sb["of"]:
        raise RlanyError(f"a shard of {sb['of']}, but the one at {w0} is of {sa['of']}",
                         where=w1)
    sha = [(s.get("input") or {}).get("sha256") for s in (sa, sb)]
    if sha[0] != sha[1]:
        raise RlanyError(f"a shard of another input (sha256 {str(sha[1])[:12]}) than the one "
                         f"at {w0} ({str(sha[0])[:12]})", where=w1)
    fa, fb = sa.get("flags") or {}, sb.get("flags") or {}
    for key in differing_flags(fa, fb)[:1]:
        raise RlanyError(f"a shard made with {key} = {json.dumps(fb.get(key))}, the one "
                         f"at {w0} with {json.dumps(fa.get(key))}: shards of different "
                         "runs", where=w1)


def shard_flags(flags: dict) -> dict:
    """A sidecar's flags without the ones each shard has its own of."""
    return {k: v for k, v in flags.items() if k not in SHARD_KEYS}


def differing_flags(a: dict, b: dict) -> list[str]:
    """The flags two shards of one run would share that they do not (sorted): all but each
    shard's own (`SHARD_KEYS`)."""
    fa, fb = shard_flags(a), shard_flags(b)
    return sorted(k for k in set(fa) | set(fb) if fa.get(k) != fb.get(k))
