"""The base model's evaluation (and a shared warm start's), shared by the runs of one runs
directory, keyed by the content it was made from.

Every run of an ablation evaluates the base model on the same held-out tasks before it
trains (`eval_base.json`): with the same seed, flags and tasks those are the same
episodes, and on a 2-core CPU a long-horizon config spends 6 (AVX-512) to 18 (AVX2)
minutes on each. So before the loop evaluates the base model, it looks at the run
directories beside its own: one whose `eval_base.json` came from identical flags (every
eval option but the output, the resolved model path), identical eval tasks (sha256), the
same package versions, and the same content is copied in (the summary as is; its sidecar
says where it came from), and the evaluation is skipped.

Names and paths are not content: a model directory's weights, or a fake engine's script,
can change in place. So when an evaluation begins, the loop writes beside it what it is
made from, by content (`eval_base.content.json`): the model's files (`models.
content_digest`: weights, config, tokenizer, a fake script) and the adapters' weights
(sha256). A sibling's evaluation is shared only when its record equals a fresh digest of
this run's model and adapters; a sibling without one is not shared. Anything that differs
evaluates again: a seed, a judge setting, the tasks file, the engine or precision `auto`
resolves to on this machine, a package upgrade, rlany's own code (`versions.rlany_source`).
Never shared, as nothing here can digest what they depend on: a served model (`--engine
openai`: its weights can change behind the URL, and the server gives no fingerprint of
them), a hub id, and tasks of an env whose episodes depend on more than the tasks file and
rlany's code (`openenv`: a server behind a URL or a command; `miniwob`: a browser;
`alfworld`: game files; any plug-in). The loop says why in one line when a sibling has
that evaluation. The warm start's evaluation (`eval_init.json`) is shared the same way (the
warm start itself by `rlany.loop.warm_reuse`): its summary and sidecar then name this
run's adapter paths. A `--print-plan` script records its evaluation as the loop does, from
a digest taken when the plan is printed, which the loop that accepts the evaluation
confirms against a fresh one (`planned_path`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from rlany.models import weights_digest

BASE, INIT = "eval_base.json", "eval_init.json"
# the output's path, and what the sidecar holds resolved (compared resolved, below)
_SKIP = ("output", "engine_resolved", "model", "dtype_resolved", "content")
_ADAPTERS = ("adapter", "judge_adapter")  # compared by their weights, not their paths
# envs whose episodes are the tasks file and rlany's own code (versions.rlany_source)
PINNED_ENVS = ("reasoning", "household", "coding")
_ENV_DEPENDS = {"openenv": "a server that can change behind the same URL or command, and "
                "gives no fingerprint of itself",
                "miniwob": "a browser and the miniwob package", "alfworld": "game files on "
                "disk and the textworld package"}


def unpinned_env(tasks: str | Path) -> str | None:
    """Why episodes of these tasks may differ with the same tasks file and rlany code (an
    env that depends on something outside both); None: they cannot."""
    with open(tasks, encoding="utf-8") as f:
        envs = {json.loads(line)["env"] for line in f if line.strip()}
    for env in sorted(envs - set(PINNED_ENVS), key=str):
        return f"its tasks use env {env}, which depends on " + _ENV_DEPENDS.get(
            env, "code outside rlany (a plug-in)")
    return None


def content_path(output: str | Path) -> Path:
    """Where an evaluation's content record lives: eval_base.json -> eval_base.content.json."""
    return Path(output).with_name(Path(output).stem + ".content.json")


def planned_path(output: str | Path) -> Path:
    """Where a `--print-plan` script puts the content record of an evaluation it runs, for
    the loop to confirm (`eval_done`): eval_base.json -> eval_base.content.planned.json."""
    return Path(output).with_name(Path(output).stem + ".content.planned.json")


def content_key(opts: Any) -> tuple[dict | None, str]:
    """What an evaluation is made from beyond its flags, tasks file and versions, by
    content: the model's files (a fake engine's script) and the adapters' weights. (None,
    why) where that cannot be known here: then it is not shared."""
    from rlany.engines import resolve_engine
    from rlany.models import content_digest, resolve_model

    try:
        engine = resolve_engine(opts.engine, stage="eval")[0]
        if engine == "openai":
            return None, ("the model is served (--engine openai): its weights can change "
                          "behind the URL, and the server gives no fingerprint of them")
        why = unpinned_env(opts.input)
        if why:
            return None, why
        model = Path(opts.model if engine == "fake" else resolve_model(opts.model))
        if not model.exists():
            return None, f"the model {opts.model} is a hub id: no files here to digest"
        return {"model": content_digest(model),
                "adapters": [weights_digest(getattr(opts, k)) for k in _ADAPTERS]}, ""
    except Exception as e:  # noqa: BLE001 - the evaluation itself reports what is wrong
        return None, f"what it is made from cannot be digested ({type(e).__name__}: {e})"


def _comparable(flags: dict, skip: tuple = ()) -> dict:  # as a sidecar holds them
    return json.loads(json.dumps({k: v for k, v in flags.items()
                                  if k not in _SKIP + skip}, default=str))


def _expected(opts: Any) -> dict | None:
    """What a sibling's sidecar must hold to be this evaluation (None: never shared)."""
    from rlany.compat import resolve_dtype
    from rlany.engines import resolve_engine
    from rlany.files.outputs import package_versions
    from rlany.files.provenance import sha256_file
    from rlany.models import resolve_model
    from rlany.stage_engine import GEN_VERSIONS, WEIGHT_ENGINES

    name = Path(opts.output).name
    if (name not in (BASE, INIT) or (name == BASE and (opts.adapter or opts.judge_adapter))
            or opts.trajectories or opts.engine == "openai"):
        return None  # a served model can change behind its URL
    try:
        engine = resolve_engine(opts.engine, stage="eval")[0]
        return {"flags": _comparable(dataclasses.asdict(opts), _ADAPTERS),
                "model": resolve_model(opts.model), "tasks": [sha256_file(opts.input)],
                "engine": engine, "versions": package_versions(*GEN_VERSIONS),
                # as stage_engine.engine_flags records it: for the engines that load weights
                "dtype": resolve_dtype(opts.dtype) if engine in WEIGHT_ENGINES else None}
    except Exception:  # noqa: BLE001 - the evaluation itself reports what is wrong
        return None


def _holds(meta: dict, want: dict) -> bool:
    from rlany.stage_engine import resolved_engine

    flags = meta["flags"]
    return (meta.get("stage") == "eval" and _comparable(flags, _ADAPTERS) == want["flags"]
            and flags.get("model") == want["model"] and resolved_engine(flags) == want["engine"]
            and flags.get("dtype_resolved") == want["dtype"]
            and [i.get("sha256") for i in meta["inputs"]] == want["tasks"]
            and meta.get("versions") == want["versions"])


def _read_key(output: Path) -> dict | None:
    path = content_path(output)
    return json.loads(path.read_text()) if path.is_file() else None


def _differs(theirs: dict | None, ours: dict) -> str:
    """Why a sibling's evaluation, identical in flags, tasks and versions, is not this one."""
    if not isinstance(theirs, dict):
        return "it records no digest of the model it was made from"
    if theirs.get("model") != ours["model"]:
        return (f"the model's files changed since (sha256 {str(theirs.get('model'))[:12]} "
                f"then, {ours['model'][:12]} now)")
    return "the adapters' weights differ (sha256)"


def _siblings(out: Path) -> list[Path]:
    """The sidecars of the same evaluation in the run directories beside this one's."""
    from rlany.files.jsonl import meta_path

    return [m for m in sorted(out.parent.parent.glob(f"*/{meta_path(out.name).name}"))
            if m.parent.resolve() != out.parent.resolve()]


def find_base_eval(opts: Any, key: dict) -> tuple[tuple[Path, dict, str] | None, str | None]:
    """A sibling run's evaluation this one would repeat, made from the same content `key`:
    ((its path, its sidecar, its summary text), None), read once and checked unchanged
    after; (None, why) where one is identical but for its content; (None, None)."""
    want = _expected(opts)
    if want is None:
        return None, None
    why = None
    for meta_file in _siblings(Path(opts.output)):
        src = meta_file.parent / Path(opts.output).name
        try:
            before = meta_file.read_text()
            meta = json.loads(before)
            if not _holds(meta, want):
                continue
            theirs = _read_key(src)
            if theirs != key:
                why = why or f"{src}: {_differs(theirs, key)}"
                continue
            text = src.read_text()
            if meta_file.read_text() == before and _read_key(src) == theirs:  # not rewritten
                return (src, meta, text), None
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return None, why


def map_strings(obj: Any, fn) -> Any:
    """`obj` (JSON) with every string `s` in it replaced by `fn(s)`."""
    if isinstance(obj, str):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: map_strings(v, fn) for k, v in obj.items()}
    if isinstance(obj, list):
        return [map_strings(v, fn) for v in obj]
    return obj


def reuse_base_eval(opts: Any, key: dict) -> tuple[Path | None, str | None]:
    """Copy a sibling's identical evaluation, made from the same content `key`, to
    `opts.output` (its content record and summary first, the sidecar last: the stage is
    complete only with it). Returns (the source, None), or (None, why not where a sibling
    was identical but for its content)."""
    from rlany.files.jsonl import meta_path
    from rlany.files.outputs import write_text_atomic

    found, why = find_base_eval(opts, key)
    if found is None:
        return None, why
    src, meta, text = found
    # its summary and sidecar name the sibling's adapter paths (the same weights): this run's
    moved = {meta["flags"][k]: getattr(opts, k) for k in _ADAPTERS
             if meta["flags"].get(k) not in (None, getattr(opts, k))}
    if moved:
        summary = map_strings(json.loads(text), lambda v: moved.get(v, v))
        text = json.dumps(summary, indent=2, allow_nan=False) + "\n"
        meta["flags"].update({k: getattr(opts, k) for k in _ADAPTERS})
    meta["flags"]["output"] = str(opts.output)
    meta["reused_from"] = str(src)
    write_text_atomic(content_path(opts.output), json.dumps(key, indent=2, allow_nan=False) + "\n")
    write_text_atomic(opts.output, text)
    write_text_atomic(meta_path(opts.output), json.dumps(meta, indent=2, allow_nan=False) + "\n")
    return src, None


def write_record(path: Path, key: dict | None) -> None:
    """A content record at `path`: what an evaluation or a warm start is made from (None:
    none, so it is never shared). Unwritable: unrecorded, so never shared; the stage itself
    reports a directory's faults."""
    from rlany.files.outputs import write_text_atomic

    try:
        if key is None:
            path.unlink(missing_ok=True)
        else:
            write_text_atomic(path, json.dumps(key, indent=2, allow_nan=False) + "\n")
    except OSError:
        pass


def _confirm_planned(opts: Any) -> None:
    """A `--print-plan` script's evaluation, done: the content record its script wrote
    before it from a digest taken when the plan was printed (`planned_path`) becomes the
    evaluation's record where a fresh digest is the same (the content was that before and
    after), else it has none (never shared)."""
    planned = planned_path(opts.output)
    try:
        theirs = json.loads(planned.read_text())
    except (OSError, ValueError):
        return
    key = content_key(opts)[0]
    write_record(content_path(opts.output), key if key is not None and key == theirs else None)
    planned.unlink(missing_ok=True)


def eval_done(opts: Any) -> Path:
    """The loop's completion check of an evaluation (its sidecar), which first shares a
    sibling's identical base evaluation when this run has none, or else records what this
    run's own is made from (evaluated right after); one a plan's script made is confirmed
    (`_confirm_planned`)."""
    from rlany.console import info
    from rlany.files.jsonl import meta_path

    out = Path(opts.output)
    if out.name not in (BASE, INIT):
        return meta_path(out)
    if meta_path(out).exists():
        _confirm_planned(opts)
        return meta_path(out)
    what = "warm start's" if out.name == INIT else "base"
    key, why = content_key(opts)
    if key is not None:
        src, why = reuse_base_eval(opts, key)
        if src is not None:
            info(f"loop: {what} evaluation shared: {src} (same flags, tasks, versions and "
                 "model content)")
            return meta_path(out)
    elif not _siblings(out):
        why = ""  # nothing beside it to share: nothing to say
    if why:
        info(f"loop: {what} evaluation not shared: {why}")
    write_record(content_path(out), key)  # before this run's own evaluation
    return meta_path(out)
