"""Does a LoRA adapter reach the engine? A fixed probe, scored at training time and again
when an engine loads the adapter.

The trainer records the log-probs of a fixed response to a fixed prompt under the trained
model and under the base model (`rlany.json`, key `probe`). An engine that loads the
adapter scores the same ids; the adapter counts as loaded when its log-probs are closer to
the trained model's than to the base model's and within max(0.1, half the trained-vs-base
distance) of them (mean absolute difference per token: dtype and kernel differences stay
well under that). A zeroed adapter, an adapter silently not applied, or an adapter of
another base model fail the check; an adapter that moved less than 0.1 per token from the
base model cannot be told apart from dtype noise and is reported as `indeterminate`.
A probe the engine did not score (a server without echoed log-probs) or scored NaN or
infinity proves nothing: the adapter is refused, unless the engine was started with
`--allow-unverified`, which serves it and records it as `unverified`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

from rlany.errors import RlanyError

PROBE_MESSAGES = [{"role": "user", "content": "Name three things you can find in a kitchen."}]
PROBE_RESPONSE = "A fridge, a sink and a stove."
# below this mean per-token distance between the trained and the base model, dtype noise
# (bf16 against fp32: a few hundredths per token) could make a loaded adapter look unloaded
MIN_GAP = 0.1
PROBE_CANDIDATES = 8  # training samples tried as the probe (each: two forward passes)
PROBE_MAX_TOKENS = 1024


def probe_ids(tokenizer) -> tuple[list[int], list[int]]:
    from rlany.chat import render

    prompt = render(tokenizer, PROBE_MESSAGES)
    return prompt, tokenizer(PROBE_RESPONSE, add_special_tokens=False)["input_ids"]


def forward_logprobs(net, prompt: list[int], response: list[int]) -> list[float]:
    """log p(response | prompt) per token, computed as the trainer computes it."""
    import torch

    from rlany.logprobs import token_logprobs

    device = next(net.parameters()).device
    ids = torch.tensor([prompt + response], device=device)
    with torch.no_grad():
        logprobs = token_logprobs(net(ids).logits.float(), ids)
    return logprobs[0, len(prompt) - 1:].tolist()


def record(model, tokenizer, samples=()) -> dict | None:
    """The probe of a trained PEFT model (None for full fine-tuning: no base to compare):
    of the first PROBE_CANDIDATES training samples with a response (`samples`: (prompt
    ids, response ids) pairs, at most PROBE_MAX_TOKENS long) and the fixed kitchen probe,
    the one the adapter moved furthest from the base model (the training data's own
    responses move most: a policy adapter's checks on the kitchen probe were mostly below
    MIN_GAP, "indeterminate")."""
    if not hasattr(model, "disable_adapter"):
        return None
    was_training = model.training
    model.eval()
    pairs = [probe_ids(tokenizer)] + [
        (list(p), list(r)) for p, r in samples
        if r and len(p) + len(r) <= PROBE_MAX_TOKENS][:PROBE_CANDIDATES]
    best = None
    for prompt, response in pairs:
        trained = forward_logprobs(model, prompt, response)
        with model.disable_adapter():
            base = forward_logprobs(model, prompt, response)
        gap = _dist(trained, base)
        if best is None or gap > best[0]:
            best = (gap, prompt, response, trained, base)
    model.train(was_training)
    _, prompt, response, trained, base = best
    return {"prompt_ids": prompt, "response_ids": response,
            "logprobs": [round(x, 5) for x in trained],
            "base_logprobs": [round(x, 5) for x in base]}


def _dist(a: list[float], b: list[float]) -> float:
    """Mean absolute difference per token."""
    return sum(abs(x - y) for x, y in zip(a, b)) / max(len(a), 1)


def saved(adapter: str) -> dict | None:
    """The probe an adapter directory's rlany.json holds, if any; one that is not lists of
    ids and log-probs of matching lengths is refused."""
    meta = Path(adapter) / "rlany.json"
    try:
        probe = json.loads(meta.read_text()).get("probe")
    except (OSError, ValueError, AttributeError):
        return None
    lists = [probe.get(k) if isinstance(probe, dict) else None
             for k in ("prompt_ids", "response_ids", "logprobs", "base_logprobs")]
    if probe is not None and not (all(isinstance(x, list) for x in lists) and all(
            isinstance(i, int) for i in lists[0] + lists[1]) and
            len(lists[1]) == len(lists[2]) == len(lists[3])):
        raise RlanyError("rlany.json's probe is damaged (not lists of token ids and "
                         "log-probs of one length)", where=adapter)
    return probe


def check(probe: dict, got: list[float], adapter: str) -> dict:
    """Compare an engine's probe log-probs with the trainer's; raise when the adapter did
    not reach the engine. Returns what was measured (for the sidecar)."""
    if not all(isinstance(x, (int, float)) and math.isfinite(x)
               for x in [*got, *probe["logprobs"], *probe["base_logprobs"]]):
        raise Unscored("the probe's log-probs are not all finite numbers (NaN or infinity "
                       "proves nothing)")
    if len(got) != len(probe["logprobs"]):
        raise RlanyError("adapter probe: the engine tokenized the probe differently; is "
                         "this adapter for this base model?", where=adapter)
    d_trained, d_base = _dist(got, probe["logprobs"]), _dist(got, probe["base_logprobs"])
    gap = _dist(probe["logprobs"], probe["base_logprobs"])
    out = {"adapter": adapter, "to_trained": round(d_trained, 5), "to_base": round(d_base, 5),
           "trained_vs_base": round(gap, 5)}
    if gap < MIN_GAP:
        return {**out, "status": "indeterminate"}
    if d_trained >= d_base or d_trained > max(0.1, gap / 2):
        raise RlanyError(
            f"adapter did not reach the engine: on the probe its log-probs are {d_trained:.4f} "
            f"per token from the trainer's and {d_base:.4f} from the base model's (trained "
            f"vs base: {gap:.4f})", where=adapter,
            hint="a zeroed or corrupt adapter, or one trained on another base model")
    return {**out, "status": "ok"}


class Unscored(Exception):
    """The probe was not scored (or scored NaN / infinity): the adapter is unverified."""


ALLOW_HINT = ("pass --allow-unverified (loop key allow_unverified) to serve "
              "adapters the engine cannot verify; the sidecar records them as unverified")


class Verifier:
    """An engine's adapter checks: each adapter's probe is scored once, right after the
    engine loads it; a refused adapter stays refused for the engine's lifetime (every later
    use raises the same error), never silently served. `allow_unverified`: an adapter whose
    probe the engine did not score (or scored NaN / infinity) is served, recorded as
    "unverified", instead of refused."""

    def __init__(self, allow_unverified: bool = False) -> None:
        self.checks: list[dict] = []  # one per verified adapter (the sidecar's adapter_checks)
        self._refused: dict[str, RlanyError] = {}
        self.allow_unverified = allow_unverified

    def loaded(self, adapter: str, path: str,
               score: Callable[[dict], list[float] | str]) -> None:
        """`score(probe)` gives the engine's log-probs of the probe's response ids, or a
        reason (str) why this engine cannot score them: refused, or with `allow_unverified`
        recorded as "unverified"."""
        try:
            probe = saved(path)
            if probe is None:
                return
            got = score(probe)
            if isinstance(got, str):
                raise Unscored(got)
            self.checks.append(check(probe, got, adapter))
        except RlanyError as e:
            self._refused[path] = e
        except Unscored as e:
            if not self.allow_unverified:
                self._refused[path] = RlanyError(
                    f"adapter not verified: {e}", where=adapter, hint=ALLOW_HINT)
            else:
                self.checks.append({"adapter": adapter, "status": "unverified", "why": str(e)})

    def refuse(self, path: str, error: RlanyError) -> None:
        """Refuse `path` for the engine's lifetime (an engine's own reason, e.g. a server
        that had an adapter under its name which the probe could not confirm)."""
        self._refused[path] = error

    def require(self, path: str) -> None:
        if path in self._refused:
            raise self._refused[path]
