"""LoRA adapters merged into the hf engine's weights for generation, the base kept exact.

An adapter is a low-rank update W' = W + (alpha / r) B A of some linear layers. Unmerged
(PEFT's LoRA layers), every adapted linear runs its base matmul and the two low-rank ones
beside it, in the adapter's fp32 with its bf16 input cast up and back: on a CPU a rollout
of learn.toml's shape spent 1.6x the CPU time of the base model (torch profiler, 16 tasks x
8, bf16; `aten::copy_` 17.6 s against 0.9 s). Merged, the adapted model is the base model's
graph with other numbers in it, so it generates at the base model's speed.

`Merged` merges one adapter at a time in place: PEFT loads the adapter (its config, its
key names, every LoRA variant it knows), the adapted layers' own parameters are copied
aside, and PEFT's `merge_and_unload` adds the update (a bf16 weight plus the fp32 update,
rounded once) and takes its layers out again. `restore` copies the saved parameters back:
the base weights are bit-for-bit what they were, so switching adapters, or lending the
network to a trainer, never drifts. Memory: one copy of the adapted layers' parameters
(q_proj + v_proj of SmolLM2-135M: 15 MB in bf16; every linear: 0.2 GB), no second model.
An adapter is read from disk each time it is merged (a few MB; the loop switches adapter
once a stage), so nothing is cached for adapters no longer in use.
"""

from __future__ import annotations

from pathlib import Path

from rlany.errors import RlanyError

MERGING = "rlany_merge"  # the adapter's name inside PEFT while it is merged


class Merged:
    """The engine's network with at most one adapter merged into it (`active`)."""

    def __init__(self, net) -> None:
        self.net = net
        self.active: str | None = None  # resolved path of the merged adapter, if any
        self._saved: list[tuple[object, str, object]] = []  # (module, name, exact copy)

    def use(self, path: str | None):
        """Merge the adapter at `path` (None: the base model); returns the network to run."""
        if path == self.active:
            return self.net
        self.restore()
        if path is not None:
            self._merge(path)
        return self.net

    def restore(self):
        """The base weights back, exactly; returns the network (now the base model)."""
        import torch

        with torch.no_grad():
            for module, name, copy in self._saved:
                getattr(module, name).data.copy_(copy)
        self._saved, self.active = [], None
        return self.net

    def _merge(self, path: str) -> None:
        import torch
        from peft import PeftModel
        from peft.tuners.lora import LoraLayer

        if not (Path(path) / "adapter_config.json").exists():
            raise RlanyError("not a LoRA adapter directory (no adapter_config.json)", where=path)
        wrapped = PeftModel.from_pretrained(self.net, path, adapter_name=MERGING)
        if getattr(wrapped.peft_config[MERGING], "modules_to_save", None):
            self.net = wrapped.unload()  # whole modules replaced: restore could not undo it
            drop_peft_marks(self.net)
            raise RlanyError("an adapter with modules_to_save (whole modules trained) cannot "
                             "be merged and restored by the hf engine", where=path)
        with torch.no_grad():
            for layer in wrapped.modules():
                if isinstance(layer, LoraLayer):
                    base = layer.get_base_layer()
                    self._saved += [(base, name, p.detach().clone())
                                    for name, p in base.named_parameters(recurse=False)]
            self.net = wrapped.merge_and_unload(safe_merge=False)
        drop_peft_marks(self.net)
        self.net.eval()
        self.active = path


def drop_peft_marks(net) -> None:
    """PEFT leaves its config on a model it wrapped (`peft_config`); the next wrap (another
    adapter, or a trainer borrowing the network) would then see adapters that are gone."""
    for attr in ("peft_config", "_hf_peft_config_loaded"):
        if attr in vars(net):
            delattr(net, attr)
