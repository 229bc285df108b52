"""The trainer's model: loaded from disk (a base model with a fresh or a saved LoRA
adapter, or a full model), or borrowed from the hf engine that already holds the base
weights (one copy in memory)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlany.training.fields import TrainFields


def lora_config(opts: TrainFields, model=None):
    """The LoRA of `opts`; with `lora_layers` N, on the top N of `model`'s layers only."""
    from peft import LoraConfig

    targets = (opts.target_modules if opts.target_modules == "all-linear"
               else [t.strip() for t in opts.target_modules.split(",") if t.strip()])
    layers = None
    if opts.lora_layers:
        total = model.config.num_hidden_layers
        layers = list(range(max(0, total - opts.lora_layers), total))
    return LoraConfig(r=opts.lora_r, lora_alpha=opts.lora_alpha, lora_dropout=opts.lora_dropout,
                      target_modules=targets, task_type="CAUSAL_LM",
                      layers_to_transform=layers)


TRAINED = "default"  # the adapter being trained: PEFT saves "default" at the top level


def train_only_trained(model) -> None:
    """Only TRAINED's LoRA tensors train (PEFT's set_adapter and load_adapter change which
    adapters' tensors do; an engine's served adapters and the base never train)."""
    for name, p in model.named_parameters():
        p.requires_grad_(f".{TRAINED}." in name and "lora_" in name)


@contextmanager
def borrowed_model(engine, adapter: str | None, opts: TrainFields):
    """The hf engine's own network as the trainer's model: the base weights in memory are
    shared, never copied. The engine hands it over with its base weights exactly (an
    adapter it generated with is merged into them: `HfEngine.lend` takes it out); a
    trainable LoRA adapter (TRAINED: `adapter`'s weights, or a fresh one seeded as
    `load_model` seeds it) is added, only its tensors train, and PEFT's layers are taken out
    afterwards (the checkpoint on disk is what the engine merges next). The network goes
    back in eval mode with no tensor requiring gradients. Yields (model, tokenizer)."""
    import torch
    from peft import PeftModel, get_peft_model

    from rlany.compat import enable_cpu_masked_gqa
    from rlany.engines.hf_merge import drop_peft_marks
    enable_cpu_masked_gqa()

    net = engine.lend()
    if adapter:
        model = PeftModel.from_pretrained(net, adapter, adapter_name=TRAINED, is_trainable=True)
    else:
        torch.manual_seed(opts.seed)
        model = get_peft_model(net, lora_config(opts, net), adapter_name=TRAINED)
    train_only_trained(model)
    try:
        yield model, engine.tokenizer
    finally:
        engine.net = model.unload()  # the LoRA layers out again, the base untouched
        drop_peft_marks(engine.net)
        engine.net.eval()
        for p in engine.net.parameters():
            p.requires_grad_(False)
            p.grad = None


def master_fp32(opts: TrainFields) -> bool:
    """Full fine-tuning in bf16 keeps its weights (and AdamW's state) in fp32 and runs the
    forward under bf16 autocast, as every trainer does: an update below a bf16 weight's
    spacing (2^-8 of its size) is rounded away, and at full fine-tuning's ~1e-6 that is
    most of them (a tiny model at lr 1e-6 in pure bf16 changed 1.5% of its weights in 2
    steps: docs/stages/train-policy.md). LoRA needs no such copy: PEFT keeps the adapter's
    own weights in fp32. Not under DeepSpeed, whose own bf16 mode keeps fp32 master weights
    (and checks that no autocast encloses its engine)."""
    from accelerate.utils import parse_flag_from_env

    from rlany.compat import resolve_dtype
    return (opts.full and resolve_dtype(opts.dtype) == "bfloat16"
            and not parse_flag_from_env("ACCELERATE_USE_DEEPSPEED"))


# the packages a checkpoint's numbers depend on (rlany.json `versions`, with rlany's own)
TRAIN_VERSIONS = ("torch", "transformers", "peft", "accelerate")


def autocast_bf16(opts: TrainFields, device_type: str) -> bool:
    """Whether the trainer's forward runs under bf16 autocast: full fine-tuning with fp32
    master weights (above), and LoRA in bf16 on a GPU. PEFT keeps LoRA's adapters in fp32,
    so without autocast every adapted linear casts its bf16 input to fp32 and back: one
    forward + backward of SmolLM2-360M's shape (16 x 896 tokens, LoRA r16 on every linear)
    ran at 53k tokens/s, 70k under autocast, against 94k for full bf16 (H200,
    benchmarks/results/gpu.json `lora_probe`). Not on a CPU, where every learning result
    was measured without it; not under DeepSpeed (as above)."""
    from accelerate.utils import parse_flag_from_env

    from rlany.compat import resolve_dtype
    return master_fp32(opts) or (
        not opts.full and device_type == "cuda" and resolve_dtype(opts.dtype) == "bfloat16"
        and not parse_flag_from_env("ACCELERATE_USE_DEEPSPEED"))


def load_model(base: str, adapter: str | None, opts: TrainFields):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlany.compat import enable_cpu_masked_gqa, resolve_dtype
    enable_cpu_masked_gqa()

    tokenizer = AutoTokenizer.from_pretrained(adapter if opts.full and adapter else base)
    dtype = "float32" if master_fp32(opts) else resolve_dtype(opts.dtype)
    model = AutoModelForCausalLM.from_pretrained(adapter if opts.full and adapter else base,
                                                 dtype=getattr(torch, dtype))
    if opts.full:
        return model, tokenizer
    from peft import PeftModel, get_peft_model

    if adapter:
        model = PeftModel.from_pretrained(model, adapter, is_trainable=True)
    else:
        torch.manual_seed(opts.seed)  # LoRA A is random-initialized: make it reproducible
        model = get_peft_model(model, lora_config(opts, model), adapter_name=TRAINED)
    return model, tokenizer


REFERENCE = "kl_reference"  # the --kl-ref adapter, loaded beside TRAINED while it is read


@contextmanager
def reference_policy(model, ref: str):
    """`model` (a PeftModel training TRAINED, perhaps beside adapters an engine serves)
    acting as the KL's fixed reference for the duration: `base` with every adapter off, or
    the LoRA adapter directory `ref` loaded beside TRAINED and made active, then removed.
    TRAINED is active and the only trainable tensors again afterwards."""
    if ref == "base":
        with model.disable_adapter():
            yield
        return
    model.load_adapter(ref, adapter_name=REFERENCE, is_trainable=False)
    model.set_adapter(REFERENCE)
    try:
        yield
    finally:
        model.set_adapter(TRAINED)
        model.delete_adapter(REFERENCE)
        train_only_trained(model)
