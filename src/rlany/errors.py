"""The one exception type for expected failures.

An `RlanyError` is something a user can fix (bad input, a missing file, conflicting
flags). The CLI prints it as one line `where: what is wrong` and exits 1; a traceback is
shown only when `RLANY_DEBUG=1`. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class RlanyError(Exception):
    exit_code = 1  # bad input; a UsageError (a flag's value or a flag combination) exits 2

    def __init__(self, message: str, where: str | None = None, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.where = where
        self.hint = hint

    def one_line(self) -> str:
        text = f"{self.where}: {self.message}" if self.where else self.message
        if self.hint:
            text += f" (hint: {self.hint})"
        # every line break the input may carry into the message (\r, \v, \x1e, \u2028, ...)
        return " ".join(text.splitlines())


class UsageError(RlanyError):
    """A bad flag value or combination on the command line: one line, exit code 2."""

    exit_code = 2


class NoSamples(RlanyError):
    """A trainer found nothing to learn from (every advantage zero, no trajectory succeeded,
    every sample too long). The command exits 1 with this line; the loop records the stage
    as skipped and the model stays as it was."""


def unexpected_line(e: Exception, role: str | None = None) -> tuple[str, str, int]:
    """(label, line, exit code) for an exception no stage turned into an RlanyError: torch's
    out-of-memory is the device's limit, an outside fault (exit 1) with what to lower for
    the command's `role` (the stage registry's engine role: "borrows", a trainer;
    "generates"; or "loop"); any other is a bug (exit 70), reported in one line."""
    if type(e).__name__ == "OutOfMemoryError":  # torch.OutOfMemoryError (CUDA's, and others)
        what = ". ".join(str(e).split(". ")[:3]).rstrip(".")  # need, capacity, free
        hint = ("lower --micro-batch or --max-len, or add --grad-checkpointing"
                if role == "borrows" else
                "lower the failing stage's batch or lengths in the config (e.g. "
                "[train_policy] micro_batch, grad_checkpointing = true; engine_batch)"
                if role == "loop" else
                "lower --engine-batch (hf), --max-model-len (vllm) or --max-tokens")
        return "error", f"out of GPU memory ({what}): {hint}", 1
    return ("internal error", f"{type(e).__name__}: {e} (rerun with RLANY_DEBUG=1 for the "
            "traceback and report it)", 70)
