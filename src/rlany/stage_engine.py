"""A stage's engine: its adapters checked before it starts (`check_adapter`, `check_fits`,
`check_lora_targets`), started from the stage's options (`start_engine`; `begin_generation`
with the stage's paths checked and tasks read first, `rlany.stageio`), and what the sidecar
records of it (`engine_flags`, `weights_content`, `adapter_checks`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlany.console import info
from rlany.errors import RlanyError, UsageError
from rlany.stageio import Sides, prepare_paths, read_tasks

GEN_VERSIONS = ("vllm", "torch", "transformers", "peft")  # peft applies the adapters
WEIGHT_ENGINES = ("hf", "vllm")  # engines that load the weights here: their dtype matters


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
    from rlany.engines import make_engine
    from rlany.engines.base import EngineConfig
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
    from rlany.engines.base import ProbesAdapters

    checks = engine.probes.checks if isinstance(engine, ProbesAdapters) else None
    return {"adapter_checks": list(checks)} if checks else {}


def engine_flags(opts: Any, engine: Any) -> dict:
    """The sidecar's `flags`: every option, the resolved model and the engine choice."""
    from dataclasses import asdict

    flags = asdict(opts)
    flags["model"] = engine.model
    from rlany.engines.base import Chosen

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


def resolved_engine(flags: dict) -> str | None:
    """The engine a sidecar's flags ran with (`auto` as it resolved)."""
    return (flags.get("engine_resolved") or {}).get("engine", flags.get("engine"))
