"""Training state through Accelerate: the resumable partial state and the final weights.

`save_state`/`load_state` run on every process (under FSDP and DeepSpeed ZeRO-3 each
saves its shard of weights and optimizer state), `get_state_dict` gathers the final
weights; rank-0-only `optimizer.state_dict()` and `save_pretrained` would miss the shards.

Layout of `OUT.partial/`: `step-N/` (what `save_state` wrote after optimizer step N) and
`state.json` (`{"step": N, "data_sha256", "plan", "update"}`: what a resume must share),
written last and atomically, so a save killed midway leaves the previous state in force.
The final checkpoint is written to `OUT.tmp/` and renamed to OUT, so a directory named OUT
is always complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from rlany._testhook import pause
from rlany.errors import RlanyError


def side_dirs(output: Path) -> list[tuple[str, Path, bool]]:
    """The directories a trainer fills beside OUT (`stageio.check_paths` checks them)."""
    return [("partial state", output.with_name(output.name + ".partial"), True),
            ("temp checkpoint", output.with_name(output.name + ".tmp"), True)]


def save_trainable_only(acc, model) -> None:
    """`save_state` writes a model's whole state dict; keep its trainable tensors only (a
    LoRA run saves the adapter, not the frozen base model; loaded with strict=False).
    FSDP and DeepSpeed save through their own code and are left alone."""
    names = {n for n, p in model.named_parameters() if p.requires_grad}

    def keep_trainable(models, weights, output_dir) -> None:
        for state in weights:
            for key in [k for k in state if k not in names]:
                del state[key]

    acc.register_save_state_pre_hook(keep_trainable)


# the flags that change an update (besides the data and the plan): a resumed run with
# another --lr would go on from the old run's weights and optimizer under the new rate
UPDATE_FLAGS = ("lr", "lr_schedule", "max_grad_norm", "weight_decay", "full", "lora_r",
                "lora_alpha", "lora_dropout", "lora_layers", "target_modules", "dtype",
                "clip_eps", "kl_beta", "kl_ref", "old_logprobs", "balance")


def update_key(opts, meta: dict) -> dict:
    """What an interrupted training must share with its resume beyond data and plan: the
    base model and the adapter it started from (by path and by content: rewritten in place
    is another start), the objective and the update's flags."""
    from rlany.stage_engine import weights_content

    return {"model": meta.get("base_model"), "adapter": meta.get("init_adapter"),
            "weights": weights_content({"model": meta.get("base_model"),
                                        "adapter": meta.get("init_adapter")}),
            "objective": meta.get("objective"),
            **{k: getattr(opts, k) for k in UPDATE_FLAGS if hasattr(opts, k)}}


def saved_step(partial: Path, meta: dict, plan: str | None = None,
               update: dict | None = None) -> int:
    """The optimizer step an interrupted run of the same data, the same plan (`plan`: a
    hash of the samples and their order into steps) and the same `update_key` saved (0:
    none)."""
    state_file = partial / "state.json"
    if not state_file.exists():
        return 0
    state = _read_state(state_file)
    if state.get("data_sha256") != meta.get("data_sha256"):
        raise RlanyError("an interrupted training of other data is in the way",
                         where=str(partial), hint="delete it to start over")
    was = state.get("update") if isinstance(state.get("update"), dict) else None
    changed = [f"--{k.replace('_', '-')} {was.get(k)} -> {v}" if k != "weights" else
               "the start's weights were rewritten in place" for k, v in
               (update or {}).items() if was is not None and k in was and was[k] != v]
    if changed:  # older states recorded none
        raise RlanyError(f"an interrupted training with other settings is in the way "
                         f"({', '.join(changed)})", where=str(partial),
                         hint="rerun with the same flags, or delete it to start over")
    if plan is not None and state.get("plan", plan) != plan:  # older states have none
        raise RlanyError("an interrupted training with other samples or batching is in the "
                         "way (flags such as --epochs, --micro-batch, --seed, --max-len or "
                         "--all-outcomes changed)", where=str(partial),
                         hint="rerun with the same flags, or delete it to start over")
    return state["step"]


def _read_state(state_file: Path) -> dict:
    """state.json as `save_state` writes it ({"step": N >= 1, "data_sha256": str | null,
    "plan": str | null}); damaged (cut, edited, not a file) is one line naming it."""
    def damaged(what: str) -> RlanyError:
        return RlanyError(f"damaged resumable training state: {what}", where=str(state_file),
                          hint=f"delete {state_file.parent} to start the training over")

    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
    except OSError as e:
        raise damaged(f"cannot read it ({e.strerror or type(e).__name__})") from None
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise damaged(f"not JSON ({str(e)[:80]})") from None
    if not isinstance(state, dict):
        raise damaged(f"not a JSON object but {type(state).__name__}")
    step = state.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise damaged(f"'step' must be an integer >= 1, got {step!r:.40}")
    for key in ("data_sha256", "plan"):
        if not isinstance(state.get(key), (str, type(None))):
            raise damaged(f"'{key}' must be a string, got {state[key]!r:.40}")
    return state


def plan_key(samples: list, steps: list[list[int]]) -> str:
    """What a resumed run must share with the interrupted one: every sample's tokens and
    weight, and which samples make each optimizer step."""
    h = hashlib.sha256()
    for s in samples:
        key = [s.prompt_ids, s.response_ids, s.advantage]
        if getattr(s, "target", None) is not None:  # a verdict sample's target
            key.append(s.target)
        h.update(json.dumps(key).encode())
    h.update(json.dumps(steps).encode())
    return h.hexdigest()


def save_state(acc, partial: Path, step: int, meta: dict, plan: str | None = None,
               update: dict | None = None) -> None:
    """Every process saves its part into step-N/; then the main process points state.json
    at it (atomically), so a save killed midway leaves the previous one in force."""
    acc.save_state(str(partial / f"step-{step}"))
    acc.wait_for_everyone()
    if acc.is_main_process:
        tmp = partial / "state.json.tmp"
        tmp.write_text(json.dumps({"step": step, "data_sha256": meta.get("data_sha256"),
                                   "plan": plan, "update": update}, allow_nan=False))
        os.replace(tmp, partial / "state.json")
        for old in partial.glob("step-*"):
            if old.name != f"step-{step}":
                shutil.rmtree(old, ignore_errors=True)
        pause("state")  # a test hook (rlany._testhook): the kill test stops here


def load_state(acc, partial: Path, step: int) -> None:
    from accelerate.utils import DistributedType

    # only the trainable tensors were saved (above); DeepSpeed's loader takes no `strict`
    kwargs = {} if acc.distributed_type == DistributedType.DEEPSPEED else {"strict": False}
    try:
        acc.load_state(str(partial / f"step-{step}"), **kwargs)
    except (OSError, RuntimeError, ValueError, KeyError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RlanyError(f"cannot resume from the state saved at step {step}: {first}",
                         where=str(partial), hint="delete it to start over") from e


def save_final(model, weights: dict, tokenizer, output: Path, meta: dict) -> None:
    tmp = output.with_name(output.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    # PEFT keeps the adapter's tensors; only the trained one (a model borrowed from the
    # engine also holds the adapters it serves)
    kw = {"selected_adapters": [model.active_adapter]} if hasattr(model, "peft_config") else {}
    model.save_pretrained(tmp, state_dict=weights, **kw)
    if not hasattr(model, "peft_config"):  # a full model directory needs its tokenizer
        tokenizer.save_pretrained(tmp)
    (tmp / "rlany.json").write_text(json.dumps(meta, indent=2, allow_nan=False) + "\n")
    os.replace(tmp, output)
