"""`rlany eval --join`: the unsharded summary from the summaries of `--shard I/N` runs.

The shards (`rlany.shards.in_order`) are taken in shard order whatever order they come in
(a glob that sorts `10-of-12` before `2-of-12` is joined as 0, 1, 2, ...), and refused
unless they are shards 0..N-1 of one run, each once, covering the input's tasks in order
without gap or overlap, each summary still the rows and counts its shard wrote (their
sha256). Their task rows are joined in shard order and their counts added up, through
`eval_summary.summary_of`, the function an unsharded run's summary comes from.
"""

from __future__ import annotations

import time

from rlany.errors import RlanyError
from rlany.stages.eval_summary import summary_of, write_summary

GENERATION = ("completion_tokens", "generate_calls", "generate_seconds", "prefill_seconds")


def join(shard_paths: str, output: str) -> dict:
    """`rlany eval --join SHARDS -o OUTPUT`: the unsharded summary from the shards'
    summaries (`rlany.shards`): their task rows in shard order and their counts added up,
    through `summary_of`; adapter checks are every shard's, the generation counts their
    sums, wall_time_s the slowest shard's; the sidecar's first input is the tasks file the
    shards ran (an unsharded eval's only one)."""
    from rlany import shards
    from rlany.files.provenance import sha256_file
    from rlany.stageio import prepare_paths

    started = time.time()
    path = prepare_paths({"--join": shard_paths}, {"--output": output})["--join"]
    parts = shards.in_order(shards.read_parts(path, shard_paths), shard_paths)
    first = parts[0]
    ks = [int(key[len("pass@"):]) for key in first if key.startswith("pass@")]
    try:
        summary = summary_of(first["policy"], [row for p in parts for row in p["per_task"]],
                             _added([p["sums"] for p in parts]), ks, first.get("judge"))
        urls = [p["shard"].get("base_url") for p in parts]
        checks = joined_checks([p.get("adapter_checks", []) for p in parts], urls)
        summary.update({"adapter_checks": checks} if checks else {})
        for key in GENERATION:  # the shards' generation added up (seconds: of every process)
            if all(key in p for p in parts):
                summary[key] = round(sum(p[key] for p in parts), 3)
        summary["wall_time_s"] = max(float(p["wall_time_s"]) for p in parts)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise RlanyError(f"a shard's summary is damaged ({type(e).__name__}: {e})",
                         where=shard_paths) from None
    flags = {**(first["shard"].get("flags") or {}), "shard": None, "trajectories": None,
             "output": output, "join": shard_paths}
    if all(urls):  # each shard its own endpoint: together, the unsharded run's
        flags["base_url"] = ",".join(dict.fromkeys(urls))
    # the tasks the shards ran first, as an unsharded eval's sidecar has them (`report`
    # compares evaluations by it), then the summaries joined
    inputs = [dict(first["shard"]["input"]),
              {"path": shard_paths, "sha256": sha256_file(path), "records": len(parts)}]
    write_summary(summary, output, ks, flags=flags, inputs=inputs, started=started,
           counts={"shards": len(parts)})
    return summary


def joined_checks(checks: list[list[dict]], urls: list[str | None]) -> list[dict]:
    """The shards' adapter checks (`checks[i]`: shard i's). Where each shard sent to an
    endpoint of its own (`urls`), as the unsharded run on all of them records its checks
    (`rlany.engines.endpoints`): each naming its endpoint, adapter by adapter in the order
    first checked, each on the endpoints in order."""
    if not all(urls) or len(set(urls)) != len(urls) or len(urls) < 2:
        return [c for part in checks for c in part]
    tagged = [{**c, "endpoint": c.get("endpoint", url)} for part, url in zip(checks, urls)
              for c in part]
    first: dict = {}
    for c in tagged:
        first.setdefault(c.get("adapter"), len(first))
    return sorted(tagged, key=lambda c: first[c.get("adapter")])  # stable: shard order


def _added(sums: list[dict]) -> dict:
    """Shards' counts added key by key (nested: policy, judge, unit_tests)."""
    out: dict = {}
    for s in sums:
        for key, value in s.items():
            if isinstance(value, dict):
                out[key] = _added([out.get(key, {}), value])
            elif isinstance(value, int) and not isinstance(value, bool):
                out[key] = out.get(key, 0) + value
            else:
                raise ValueError(f"sums {key!r} is not a count")
    return out
