"""Does a LoRA adapter fit a base model? Checked before anything loads or is written.

`stage_engine.check_adapter` checks an adapter directory on its own (a LoRA config, readable
weights of its rank). `check_adapter_fits` checks it against the base model it is about to
be loaded on: without it, an adapter made for another base model dies inside PEFT with a
state-dict error (a traceback, exit 70), or, where only some layers are missing, loads in
part without a word. The model is built on the meta device from its config (no weights
read); the adapter's safetensors header gives its tensors' names and shapes. Refused, in
one line naming the flag, the adapter and the first misfit:
* a LoRA tensor for a module the model does not have (another architecture, more layers);
* a lora_A / lora_B whose input / output size is not that module's (another width);
* any other saved tensor (modules_to_save, e.g. a resized vocabulary) whose shape is not
  the model's parameter of that name;
* an adapter with no safetensors (a pickled `adapter_model.bin`) whose target_modules
  (a list) name no module of the model.
Not refused: an adapter_config.json `base_model_name_or_path` other than the model given
(a model moved or copied keeps its content; names are not content). It is named in the
hint where the adapter does not fit. Two models of the same shape but other weights cannot
be told apart here: that is for content digests, not shapes.

Every command that loads an adapter on a base model calls this first: the trainers
(`training.driver`: --adapter and --kl-ref); rollout / judge / eval `--adapter` and the
loop's `init_policy` call it where they check their adapters (`stageio`, `loop.config`).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

from rlany.errors import RlanyError

# PEFT's saved names: base_model.model.<module>.<lora part>[.weight] (the adapter's name
# is left out of the file)
_LORA_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+?)\."
                       r"(?P<part>lora_A|lora_B|lora_embedding_A|lora_embedding_B)"
                       r"(?:\.weight)?$")


def check_adapter_fits(adapter: str | None, model: str, flag: str = "--adapter") -> None:
    """Refuse, in one line, a LoRA `adapter` directory that does not fit the base `model`
    (a model directory or a name transformers resolves): the module doc's rules. Silent
    where the model's config cannot be read (loading the model then says what is wrong)
    or the adapter is no LoRA directory (`stage_engine.check_adapter` says that)."""
    if not adapter or not (Path(adapter) / "adapter_config.json").is_file():
        return
    shapes = _model_shapes(str(model))
    if shapes is None:
        return
    modules, params = shapes
    try:
        config = json.loads((Path(adapter) / "adapter_config.json").read_text())
    except (OSError, ValueError):
        return  # stage_engine.check_adapter names a damaged config
    config = config if isinstance(config, dict) else {}
    made_for = config.get("base_model_name_or_path")

    def misfit(what: str) -> RlanyError:
        hint = (f"its adapter_config.json names base model {made_for!r}; give that --model, "
                "or an adapter trained on this one" if made_for else
                "give the base model it was trained on")
        return RlanyError(f"{flag}: made for another base model than {model}: {what}",
                          where=adapter, hint=hint)

    tensors = _adapter_shapes(Path(adapter) / "adapter_model.safetensors")
    if tensors is None:  # pickled weights: only the config's target modules can be checked
        targets = config.get("target_modules")
        if isinstance(targets, list) and targets and not any(
                _find(modules, t) for t in targets if isinstance(t, str)):
            raise misfit(f"its target_modules {targets} match no module of the model")
        return
    for key, shape in tensors.items():
        problem = _tensor_misfit(key, shape, modules, params)
        if problem:
            raise misfit(problem)


def _tensor_misfit(key: str, shape: list[int], modules: dict, params: dict) -> str | None:
    """What is wrong with one saved tensor on this model, or None."""
    m = _LORA_KEY.match(key)
    if m is None:  # a saved whole module (modules_to_save) or another PEFT tensor
        name = key.removeprefix("base_model.model.")
        want = params.get(name)
        if want is not None and list(want) != list(shape):
            return f"its tensor {name} has shape {list(shape)}, the model's {list(want)}"
        return None
    name = _find(modules, m["module"])
    if name is None:
        return f"it adapts {m['module']}, which the model does not have"
    sizes = modules[name]  # (in, out) of the module, or None where unknown
    if sizes is None or len(shape) != 2:
        return None
    part = m["part"]
    side, got = (("input", shape[1]) if part.endswith("A") else ("output", shape[0]))
    want = sizes[0] if side == "input" else sizes[1]
    if got != want:
        return (f"its {part} of {name} has {side} size {got}, the model's {name} has "
                f"{want}")
    return None


def _find(modules: dict, name: str) -> str | None:
    """The model's module `name`, or the one module whose name ends with it (or it with
    the module's: a model wrapped one level more or less)."""
    if name in modules:
        return name
    hits = [n for n in modules if n.endswith("." + name) or name.endswith("." + n)]
    return hits[0] if len(hits) == 1 else None


def _adapter_shapes(weights: Path) -> dict[str, list[int]] | None:
    """Tensor name -> shape from a safetensors header; None where there is no such file
    (a damaged one is `stage_engine.check_adapter`'s to name)."""
    if not weights.is_file():
        return None
    from safetensors import safe_open

    try:
        with safe_open(str(weights), framework="pt") as f:
            return {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
    except Exception:  # safetensors raises its own error types; check_adapter names them
        return None


@lru_cache(maxsize=8)
def _model_shapes(model: str) -> tuple[dict, dict] | None:
    """({module name: (in, out) or None}, {parameter name: shape}) of `model`, built on
    the meta device from its config; None where the config cannot be read or built."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(model)
        with torch.device("meta"):
            net = AutoModelForCausalLM.from_config(config)
    except Exception:  # any failure here is the model loader's to report, with its words
        return None
    modules = {name: _sizes(module) for name, module in net.named_modules() if name}
    params = {name: tuple(p.shape) for name, p in net.named_parameters()}
    return modules, params


def _sizes(module) -> tuple[int, int] | None:
    """(input size, output size) of the layer types LoRA adapts by shape: Linear (and
    its quantized kin), transformers' Conv1D (GPT-2), Embedding; None for others."""
    if isinstance(getattr(module, "in_features", None), int) and \
            isinstance(getattr(module, "out_features", None), int):
        return module.in_features, module.out_features
    if type(module).__name__ == "Conv1D" and hasattr(module, "nx") and hasattr(module, "nf"):
        return module.nx, module.nf
    if isinstance(getattr(module, "num_embeddings", None), int) and \
            isinstance(getattr(module, "embedding_dim", None), int):
        return module.num_embeddings, module.embedding_dim
    return None
