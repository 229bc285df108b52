"""The sampled tokens' log-probs of a transformers `generate`, kept as they are sampled.

`generate(output_logits=True)` keeps every decode step's full logits (batch x vocab floats
per step: 64 rows x 96 steps x SmolLM2's 49k vocabulary is 1.2 GB) until it returns, and the
engine then stacked and log-softmaxed them all to read one number per step. This keeps one
step's logits at a time instead: hooks on the network that `generate` runs see each decode
step's raw logits (the model's own output, before temperature, top-p or a choice mask: the
untempered policy) and, at the next step's call, the token sampled from them (the last
column of that call's input ids); the last step's token is read from the final sequences.
Same numbers as the stacked log_softmax (tested to 1e-5, fp32).
"""

from __future__ import annotations


class SampledLogprobs:
    """Use as a context around one `generate` call on `net` (the transformers model whose
    forward `generate` runs; a PEFT wrapper's base model); then `rows(sequences)`."""

    def __init__(self, net):
        self.net = net
        self.steps: list = []  # per decode step, (B,) log-probs of the sampled tokens
        self.last = None  # the latest step's log-softmax, waiting for its sampled token

    def __enter__(self):
        self._handles = [
            self.net.register_forward_pre_hook(self._before, with_kwargs=True),
            self.net.register_forward_hook(self._after)]
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        return False

    def _take(self, tokens) -> None:
        self.steps.append(self.last.gather(-1, tokens.reshape(-1, 1).to(self.last.device))[:, 0])
        self.last = None

    def _before(self, module, args, kwargs):
        if self.last is not None:  # this call's input ends in the token sampled last step
            ids = kwargs.get("input_ids", args[0] if args else None)
            self._take(ids[:, -1])

    def _after(self, module, args, output):
        import torch

        logits = output.logits[:, -1].float()
        self.last = torch.log_softmax(logits, -1)

    def rows(self, new_tokens) -> list[list[float]]:
        """Per row, the log-probs of its generated tokens (`new_tokens`: (B, T) ids that
        generate appended; positions after a row ended are padding, sliced off by the
        caller)."""
        import torch

        if self.last is not None:
            self._take(new_tokens[:, len(self.steps)])
        if not self.steps:
            return [[] for _ in range(new_tokens.shape[0])]
        return torch.stack(self.steps, 1).tolist()
