"""File plumbing shared by the stage drivers: inputs checked and read once, adapters checked
and the engine started from a stage's options. The stage modules hold the logic; this module
holds no math and no stage-specific rule (whether two inputs belong together is
`rlany.provenance`).

* `check_paths` refuses an output that would overwrite an input, and an output or a file
  written beside it that is no regular file; `spool_input` copies stdin (or a named pipe)
  to a temp file, for a stage that reads its input twice. `output_lock` (`rlany.locks`,
  imported here by the stages) keeps two processes from writing one output.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlany.console import info
from rlany.errors import RlanyError, UsageError
from rlany.jsonl import JsonlReader
from rlany.locks import lock_path, output_lock, output_state  # noqa: F401 (the stages' import)

GEN_VERSIONS = ("vllm", "torch", "transformers", "peft")  # peft applies the adapters


Sides = dict[str, list[tuple[str, Path, bool]]]  # flag -> (what, path, a directory?)


def prepare_paths(inputs: dict[str, str | None], outputs: dict[str, str | None],
                  sides: Sides | None = None) -> dict[str, str | None]:
    """Refuse outputs that name an input (or each other), then spool `-`, FIFOs and process
    substitutions once into temp files. Returns the readable path of each input."""
    check_paths(inputs, outputs, sides)
    return {k: (spool_input(v)[0] if v else v) for k, v in inputs.items()}


def begin_generation(opts: Any, outputs: dict[str, str | None], engine: Any = None,
                     adapters: dict[str, str | None] | None = None,
                     check: Callable[[Any], None] | None = None,
                     sides: Sides | None = None, pick: Callable[[list], Any] | None = None,
                     stage: str | None = None):
    """(tasks, reader, engine) for a stage that generates from `opts.input`: adapters and
    paths (with the outputs' `sides`) checked and tasks read (bad input, or a task `check`
    refuses, fails before an engine starts), then the engine started unless one is given
    (the loop passes its own). `pick(tasks)`, where given, is returned for the tasks: what
    the run plays (a sample, a shard), its sizes checked (`rlany.limits`) before the engine
    starts. `stage`: the command's name, for `--engine auto`."""
    for flag, adapter in {"--adapter": opts.adapter, **(adapters or {})}.items():
        check_adapter(adapter, flag)
        check_fits(opts, adapter, flag)
    paths = prepare_paths({"--input": opts.input}, outputs, sides)
    tasks, reader = read_tasks(paths["--input"], name=opts.input, check=check)
    picked = tasks if pick is None else pick(tasks)
    return picked, reader, engine or start_engine(opts, stage)


def check_fits(opts: Any, adapter: str | None, flag: str = "--adapter") -> None:
    """An adapter made for another base model fails in one line before any work, where the
    engine loads the weights here (hf, vllm); `rlany.adapters` says what is compared."""
    from rlany import engines
    from rlany.adapters import check_adapter_fits
    from rlany.models import resolve_model

    if not adapter or engines.resolve_engine(opts.engine)[0] not in ("vllm", "hf"):
        return
    try:
        model = resolve_model(opts.model)
    except RlanyError:
        return  # no model to compare with: starting the engine says so
    check_adapter_fits(adapter, model, flag)


def read_tasks(path: str | Path, allow_empty: bool = False, name: str | None = None,
               check: Callable[[Any], None] | None = None):
    """All tasks of a file (a task pool is small), with env names, unique ids and each
    spec checked by its env's own `validate` (`envs.spec_problems`).
    `allow_empty` for candidate files: an iteration may propose no candidate at all.
    `check(task)`: a stage's own rule; the RlanyError it raises is reported at the line."""
    from rlany import envs
    from rlany.records import Task

    reader = JsonlReader(path, Task, "tasks", allow_empty=allow_empty, name=name)
    tasks, seen = [], set()
    known = envs.names()
    checkers: dict = {}  # env name -> one env object whose validate checks every spec
    for where, task in reader:
        if task.env not in known:
            raise RlanyError(f"unknown environment '{task.env}'", where=where,
                             hint=f"known: {', '.join(known)}")
        if task.task_id in seen:
            raise RlanyError(f"duplicate task_id '{task.task_id}'", where=where)
        seen.add(task.task_id)
        if task.env not in checkers:
            checkers[task.env] = envs.make_env(task.env)
        problems = envs.spec_problems(checkers[task.env], task.spec)
        if problems:  # a task its env cannot grade would be scored -1 whatever the answer
            raise RlanyError(f"the {task.env} env refuses this task's spec: "
                             + "; ".join(problems), where=where)
        if check is not None:
            try:
                check(task)
            except RlanyError as e:
                raise RlanyError(e.message, where=where, hint=e.hint) from None
        tasks.append(task)
    return tasks, reader


def read_stats(path: str | Path, name: str | None = None,
               tasks: set[str] | None = None) -> dict:
    """Task stats by task id, each once; with `tasks`, every id must be one of them (stats
    of another pool are refused at their line, never silently ignored)."""
    from rlany.records import TaskStats

    stats: dict = {}
    for where, s in JsonlReader(path, TaskStats, "task stats", name=name):
        if s.task_id in stats:
            raise RlanyError(f"duplicate task_id '{s.task_id}'", where=where)
        if tasks is not None and s.task_id not in tasks:
            raise RlanyError(f"stats of task '{s.task_id}', which is neither in the pool nor "
                             "pending: these stats come from another pool", where=where,
                             hint="give the task_stats.jsonl of a rollout of this pool")
        stats[s.task_id] = s
    return stats


def check_adapter(adapter: str | None, flag: str = "--adapter") -> None:
    """A LoRA adapter directory that an engine or the trainer can load, checked before
    either starts: adapter_config.json a LoRA config with a positive integer rank and
    target modules, the weights present and readable (safetensors: the header and each
    lora_A/lora_B tensor's rank), and rlany.json, where there is one, valid JSON. Anything
    else is one line naming the flag and the directory."""
    if not adapter:
        return
    d = Path(adapter)
    config_file = d / "adapter_config.json"
    if not config_file.is_file():
        raise RlanyError(f"{flag}: not a LoRA adapter directory (no adapter_config.json)",
                         where=adapter)
    config = _json_file(config_file, flag)
    rank = config.get("r") if isinstance(config, dict) else None
    targets = config.get("target_modules") if isinstance(config, dict) else None
    if not isinstance(config, dict) or config.get("peft_type", "LORA") != "LORA":
        raise RlanyError(f"{flag}: adapter_config.json is not a LoRA config", where=adapter)
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise RlanyError(f"{flag}: adapter_config.json 'r' must be a positive integer, got "
                         f"{rank!r}", where=adapter)
    if not (isinstance(targets, str) or (isinstance(targets, list) and targets and all(
            isinstance(t, str) for t in targets))):
        raise RlanyError(f"{flag}: adapter_config.json 'target_modules' must be a string or "
                         "a list of strings", where=adapter)
    if (d / "rlany.json").exists():
        _json_file(d / "rlany.json", flag)
    weights = d / "adapter_model.safetensors"
    if not weights.is_file():
        if (d / "adapter_model.bin").is_file():
            return  # a pickled adapter: only loading it can tell
        raise RlanyError(f"{flag}: no adapter weights (adapter_model.safetensors)",
                         where=adapter)
    from safetensors import safe_open

    try:
        with safe_open(str(weights), framework="pt") as f:
            shapes = {k: f.get_slice(k).get_shape() for k in f.keys()}
    except Exception as e:  # safetensors raises its own error types for a damaged file
        raise RlanyError(f"{flag}: adapter weights are unreadable ({type(e).__name__}: "
                         f"{str(e)[:120]})", where=str(weights)) from None
    patterns = config.get("rank_pattern") or {}
    for key, shape in shapes.items():
        lora = ".lora_A." in key and (shape[0] if shape else None) or \
            ".lora_B." in key and (shape[-1] if shape else None)
        if lora and not patterns and lora != rank:
            raise RlanyError(f"{flag}: tensor {key} has rank {lora}, adapter_config.json says "
                             f"r = {rank}", where=str(weights))
    if not any(".lora_A." in k for k in shapes):
        raise RlanyError(f"{flag}: the adapter weights hold no LoRA tensors", where=str(weights))


def _json_file(path: Path, flag: str) -> Any:
    import json

    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise RlanyError(f"{flag}: {path.name} is not valid JSON ({e})",
                         where=str(path.parent)) from None


def check_lora_targets(model: str, target_modules: str, flag: str = "--target-modules") -> None:
    """Refuse LoRA target modules that match no module of `model` (a local model directory)
    before its weights load: the model is built on the meta device from its config."""
    if target_modules == "all-linear" or not (Path(model) / "config.json").is_file():
        return
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(model)
        with torch.device("meta"):
            net = AutoModelForCausalLM.from_config(config)
    except (OSError, ValueError, KeyError, TypeError):
        return  # loading the model reports what is wrong with it
    names = [n for n, _ in net.named_modules()]
    wanted = [t.strip() for t in target_modules.split(",") if t.strip()]
    missing = [t for t in wanted if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        leaves = sorted({n.rsplit(".", 1)[-1] for n, m in net.named_modules()
                         if isinstance(m, torch.nn.Linear)})
        raise UsageError(f"{flag}: {', '.join(missing)} match(es) no module of the model",
                         hint=f"its linear layers: {', '.join(leaves)}; or all-linear")


def start_engine(opts: Any, stage: str | None = None):
    """The engine an options object (EngineFields) asks for; `engine auto` is resolved for
    this machine and `stage` (the command's name: `engines.resolve_engine`) and the reason
    is printed (and kept in `engine.choice`)."""
    from rlany import engines
    from rlany.engines import EngineConfig, make_engine
    from rlany.models import resolve_model

    kind, reason = engines.resolve_engine(opts.engine, stage=stage)
    if kind != "openai" and opts.base_url:
        raise RlanyError(f"--base-url is only for --engine openai, not {kind}")
    model = resolve_model(opts.model) if kind in ("vllm", "hf") else opts.model
    info(f"starting engine {kind} ({reason}): {model}")
    engine = make_engine(EngineConfig(kind=kind, model=model, dtype=opts.dtype, seed=opts.seed,
                                      max_model_len=opts.max_model_len, base_url=opts.base_url,
                                      max_lora_rank=opts.max_lora_rank,
                                      batch_size=opts.engine_batch,
                                      allow_unverified_adapter=opts.allow_unverified,
                                      vllm_adapters=opts.vllm_adapters))
    engine.choice = {"engine": kind, "reason": reason}
    if kind == "vllm":  # how it serves adapters (rlany.engines.vllm_merged)
        engine.choice["adapters"] = engine.adapters
    return engine


def adapter_checks(engine: Any) -> dict:
    """The sidecar's record of the adapter probes the engine ran (rlany.probe), if any."""
    from rlany.engines import ProbesAdapters

    checks = engine.probes.checks if isinstance(engine, ProbesAdapters) else None
    return {"adapter_checks": list(checks)} if checks else {}


def engine_flags(opts: Any, engine: Any) -> dict:
    """The sidecar's `flags`: every option, the resolved model and the engine choice."""
    from dataclasses import asdict

    flags = asdict(opts)
    flags["model"] = engine.model
    from rlany.engines import Chosen

    if isinstance(engine, Chosen) and engine.choice:
        flags["engine_resolved"] = engine.choice
    if "dtype" in flags and resolved_engine(flags) in WEIGHT_ENGINES:
        from rlany.compat import resolve_dtype
        flags["dtype_resolved"] = resolve_dtype(flags["dtype"])
    # a served model's or a no-model name is no folder here that happens to share it
    flags["content"] = weights_content(flags, resolved_engine(flags) in (*WEIGHT_ENGINES,
                                                                          "fake"))
    return flags


def weights_content(flags: dict, local: bool = True) -> dict[str, str]:
    """What the stage generates with, by content, not by name: the local model's files
    (`models.content_digest`; a fake engine's script) and each adapter's weights. A partial
    output made with weights since rewritten in place is then refused on resume (its header
    holds these), and the sidecar says what made the output. A served model or a hub id has
    no local files, nor has `rollout --expert`'s or `judge --labels`' name (`local` False:
    the engine loads no weights here): named only."""
    from rlany.errors import RlanyError
    from rlany.models import content_digest, weights_digest

    out, model = {}, flags.get("model")
    digests = [("model", model, content_digest)] if local and isinstance(model, str) and \
        Path(model).exists() else []
    digests += [(k, str(flags[k]), weights_digest) for k in ("adapter", "judge_adapter")
                if flags.get(k)]
    for key, path, digest in digests:
        try:
            out[key] = digest(path)
        except OSError as e:
            raise RlanyError(f"its files cannot be read to name it by content ({e})",
                             where=path) from None
    return out


WEIGHT_ENGINES = ("hf", "vllm")  # engines that load the weights here: their dtype matters


def resolved_engine(flags: dict) -> str | None:
    """The engine a sidecar's flags ran with (`auto` as it resolved)."""
    return (flags.get("engine_resolved") or {}).get("engine", flags.get("engine"))


def check_paths(inputs: dict[str, str | None], outputs: dict[str, str | None],
                sides: Sides | None = None) -> None:
    """Usage errors before anything is read or written: an output, its `.meta.json`
    sidecar or a file the stage writes beside it (`sides`: a partial output and its index,
    a lock, a trainer's metrics, partial state and temp checkpoint) that is not a regular
    file (`outputs.check_target`: a device, a FIFO, a link, a directory; a side directory:
    not a directory), any of those naming an input file or an input's sidecar (writing it
    would destroy the input or its provenance), two outputs naming one file, or more than
    one input or output on stdin/stdout. The same file under two names (a symlink, a hard
    link) counts as one. Keys are the flags, for the message."""
    from rlany.jsonl import meta_path
    from rlany.outputs import check_target

    for group, what in ((inputs, "stdin"), (outputs, "stdout")):
        dashes = [flag for flag, p in group.items() if p == "-"]
        if len(dashes) > 1:
            raise UsageError(f"{' and '.join(dashes)} both use {what} (-); at most one can")
    seen: dict[Any, str] = {}

    def keys(p: str | Path) -> list:
        out: list = [os.path.realpath(p)]
        try:
            st = os.stat(p)
            out.append((st.st_dev, st.st_ino))
        except OSError:
            pass
        return out

    for flag, p in inputs.items():
        if p and p != "-":
            for path, label in ((p, flag), (meta_path(p), f"{flag}'s sidecar")):
                for key in keys(path):
                    seen.setdefault(key, label)
    for flag, p in outputs.items():
        if not p or p == "-":
            continue
        beside = [(f"{flag}'s sidecar", meta_path(p), False),
                  *((f"{flag}'s {what}", path, d) for what, path, d in (sides or {}).get(flag, ()))]
        for label, path, _ in [(flag, p, False), *beside]:
            for key in keys(path):
                if key in seen:
                    raise UsageError(f"{label} {path} is also {seen[key]}: writing it would "
                                     "destroy that file; choose another output")
            for key in keys(path):
                seen[key] = label
        try:
            check_target(p)
        except RlanyError as e:
            raise UsageError(f"{flag} {p}: {e.message}", hint=e.hint) from None
        for label, path, directory in beside:
            try:
                check_target(path, directory=directory)
            except RlanyError as e:
                raise UsageError(f"{label} {path}: {e.message}", hint="remove it, or choose "
                                 f"another {flag}") from None


def spool_input(path: str) -> tuple[str, str]:
    """(a path that can be read more than once, the name to show): stdin (`-`) and named
    pipes are copied to a temp file, removed when the process exits; a plain file is
    returned as it is."""
    if path != "-":
        try:
            if not stat.S_ISFIFO(os.stat(path).st_mode):
                return path, path
        except OSError:
            return path, path  # the reader reports a missing file with its name
    import atexit

    if path == "-" and sys.stdin is None:
        raise RlanyError("stdin is closed", where="<stdin>")
    fd, tmp = tempfile.mkstemp(prefix="rlany-stdin.", suffix=".jsonl")
    with os.fdopen(fd, "wb") as f:
        if path == "-":
            shutil.copyfileobj(sys.stdin.buffer, f)
        else:
            with open(path, "rb") as src:
                shutil.copyfileobj(src, f)
    atexit.register(lambda: Path(tmp).unlink(missing_ok=True))
    return tmp, path


def resumable_sides(path: str) -> Sides:
    """The files a resumable output (rollout, judge) writes beside `path`: checked with it."""
    from rlany.outputs import partial_paths

    if path == "-":
        return {}
    partial, index = partial_paths(path)
    return {"--output": [("partial output", partial, False), ("partial index", index, False),
                         ("lock", lock_path(path), False)]}
