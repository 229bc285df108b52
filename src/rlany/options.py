"""One options dataclass per stage: the single source of truth for every flag.

A stage's options are a frozen, keyword-only dataclass whose fields carry their help text,
scope and bounds (`opt(...)`). From that one class come:

* the typer command (`command`): flag `--max-tokens` <-> field `max_tokens`, same default;
* the loop's TOML table (`from_table`): key `max_tokens` in `[rollout]`, same type rules;
* validation (`validate`): bounds and choices from the field, then the class's own
  `check()` for rules across fields; the same code for the CLI and for `rlany loop`;
* the sidecar's `flags` (`dataclasses.asdict`) and the exact command line the loop prints
  (`to_argv`, joined with `shlex.join`): only fields that differ from their default, so
  parsing the printed argv through the CLI gives an equal options object.

Scopes: "stage" fields are flags and keys of the stage's `[table]` in a loop config; "run"
fields (model, engine, seed, ...) are flags and top-level keys of a loop config, shared by
every stage; "io" fields (paths, adapters, the iteration) are flags the loop sets itself.

Every field is in its command's `--help`: there are no hidden options. `panel=` lists a
group of options under their own heading.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Optional

from rlany import limits
from rlany.engines.base import ENGINES  # the --engine choices
from rlany.errors import RlanyError, UsageError

VLLM_ADAPTERS = ("auto", "lora", "merged")  # --vllm-adapters (rlany.engines.vllm_merged)

SCOPES = ("stage", "run", "io")
SCOPE_ORDER = {"io": 0, "stage": 1, "run": 2}


@dataclass(frozen=True)
class Spec:
    help: str
    scope: str = "stage"
    short: str | None = None  # e.g. "-i"
    choices: tuple[str, ...] = ()
    min: float | None = None
    max: float | None = None
    min_exclusive: bool = False
    panel: str | None = None  # the --help heading it is listed under (default: Options)


def opt(default: Any = dataclasses.MISSING, help: str = "", *, scope: str = "stage",
        short: str | None = None, choices: tuple[str, ...] = (), min: float | None = None,
        max: float | None = None, min_exclusive: bool = False,
        panel: str | None = None) -> Any:
    """A documented option field. No default: a required flag."""
    assert scope in SCOPES, scope
    meta = {"rlany": Spec(help, scope, short, tuple(choices), min, max, min_exclusive,
                          panel)}
    return field(default=default, metadata=meta)


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


@dataclass(frozen=True, kw_only=True)
class EngineFields:
    """Options of every stage that generates (rollout, judge, adapt-tasks, eval). A mixin of
    fields only: every stage keeps its behaviour in its own module."""

    model: str = opt("smollm2", "`smollm2` (after `rlany models prepare smollm2`), a local HF "
                     "model directory, or a hub id where a hub is reachable. --engine fake: a "
                     "script file, or a directory holding fake_script.json.", scope="run")
    engine: str = opt("auto", "auto (vllm on a GPU, hf on a CPU: measured faster there, see "
                      "benchmarks/README.md), vllm, hf, openai (a server), fake (tests).",
                      scope="run", choices=ENGINES)
    adapter: str | None = opt(None, "A PEFT LoRA adapter directory to generate with.",
                              scope="io")
    seed: int = opt(0, "Base seed: sampling seeds derive from it.", scope="run", min=0,
                    max=limits.MAX_SEED)
    dtype: str = opt("auto", "Weights dtype: auto (bf16 where the CPU or GPU has native bf16, "
                     "else float32), bfloat16, float16, float32.", scope="run",
                     choices=("auto", "bfloat16", "float16", "float32"))
    max_model_len: int | None = opt(None, "vllm: context length to reserve KV cache for "
                                    "(default: the model's).", scope="run", min=1)
    base_url: str | None = opt(None, "openai engine: the server's /v1 URL, or several "
                               "separated by commas (requests dealt round-robin; every "
                               "adapter loaded and verified on each).", scope="run")
    max_lora_rank: int = opt(16, "vllm: largest LoRA rank to serve (adapters are padded to "
                             "it; keep it tight).", scope="run", min=1)
    allow_unverified: bool = opt(
        False, "Serve a LoRA adapter whose probe the engine could not score (or scored NaN): "
        "without it such an adapter is refused. The sidecar's adapter_checks record it as "
        "unverified.", scope="run")
    vllm_adapters: str = opt(
        "auto", "vllm: how a LoRA adapter is served: lora (vLLM's LoRA kernels) or merged "
        "(merged once into a cached model directory, the engine restarted on it at each "
        "adapter switch). auto: merged on a CPU, where vLLM's LoRA path measured 10x "
        "slower, lora on a GPU.", scope="run", choices=VLLM_ADAPTERS)
    engine_batch: int = opt(64, "hf: sequences per generate call (the n samples of a "
                            "request stay in one call; constrained requests: prompts per "
                            "pass). Larger is faster on a CPU until memory runs short (64 "
                            "sequences: one call took 0.91x the time of two of 32, "
                            "benchmarks/README.md).", scope="run", min=1,
                            max=limits.MAX_BATCH)


def specs(cls: type) -> dict[str, tuple[Any, Any, Spec]]:
    """name -> (type, default, spec) for every option field of `cls`: the paths first, then
    the stage's own options, then the run's (model, engine, ...), each in field order."""
    hints = typing.get_type_hints(cls)
    fields = [f for f in dataclasses.fields(cls) if "rlany" in f.metadata]
    fields.sort(key=lambda f: SCOPE_ORDER[f.metadata["rlany"].scope])
    return {f.name: (hints[f.name], f.default, f.metadata["rlany"]) for f in fields}


def _base(hint: Any) -> tuple[Any, bool]:
    """(inner type, nullable) of `T | None`."""
    args = typing.get_args(hint)
    if type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        return inner, True
    return hint, False


# -- validation ------------------------------------------------------------------------

def validate(opts: Any, style: str = "cli") -> Any:
    """Check bounds and choices of every field, then `opts.check(name)`. `style` names
    fields as flags ("cli") or as keys of a loop table ("[rollout]")."""
    def name(key: str) -> str:
        return flag(key) if style == "cli" else f"{style} {key}"

    for key, (_, _, spec) in specs(type(opts)).items():
        value = getattr(opts, key)
        if value is None:
            continue
        values = value if isinstance(value, tuple) else (value,)
        for v in values:
            if isinstance(v, float) and not math.isfinite(v):  # nan passes every bound
                raise RlanyError(f"{name(key)} must be a finite number, got {v}")
            if isinstance(v, int) and abs(v) > limits.MAX_INT:  # no option has a use for more
                raise RlanyError(f"{name(key)} is out of range: more than 63 bits")
            if spec.choices and v not in spec.choices:
                raise RlanyError(f"{name(key)} must be one of {', '.join(spec.choices)}, "
                                 f"got {v!r}")
            if spec.min is not None and (v < spec.min or (spec.min_exclusive and
                                                          v == spec.min)):
                op = ">" if spec.min_exclusive else ">="
                raise RlanyError(f"{name(key)} must be {op} {_bound(spec.min)}, got {v}")
            if spec.max is not None and v > spec.max:
                raise RlanyError(f"{name(key)} must be <= {_bound(spec.max)}, got {v}")
    if getattr(opts, "base_url", None) is not None:  # EngineFields: each an http(s) endpoint
        from rlany.engines.endpoints import split_urls
        split_urls(opts.base_url, flag("base_url") if style == "cli" else "'base_url'")
    check = getattr(opts, "check", None)
    if check is not None:
        check(name)  # rules across fields; `name(key)` spells a field for this caller
    return opts


def _bound(x: float) -> str:
    """A bound as a reader writes it: 1,000,000 (not 1e+06), 0.5."""
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


# -- argv ------------------------------------------------------------------------------

def to_argv(command: str, opts: Any) -> list[str]:
    """The command line that makes `opts`: required fields and every field that differs
    from its default."""
    argv = ["rlany", *command.split()]
    for key, (_, default, _) in specs(type(opts)).items():
        value = getattr(opts, key)
        if default is not dataclasses.MISSING and value == default:
            continue
        if isinstance(value, bool):
            argv.append(flag(key) if value else "--no-" + key.replace("_", "-"))
        elif isinstance(value, tuple):
            for v in value:
                argv += [flag(key), str(v)]
        elif value is None:
            raise RlanyError(f"{flag(key)} cannot be set back to none on a command line")
        else:
            argv += [flag(key), _fmt(value)]
    return argv


def _fmt(value: Any) -> str:
    return repr(value) if isinstance(value, float) else str(value)


# -- loop tables -----------------------------------------------------------------------

def from_table(cls: type, table: dict[str, Any], where: str, section: str,
               scopes: tuple[str, ...] = ("stage",), **fixed: Any) -> Any:
    """Options from a loop config table: type-checked keys of the allowed scopes, plus the
    values the loop sets itself (`fixed`), validated like the CLI's."""
    known = {k: v for k, v in specs(cls).items() if v[2].scope in scopes}
    kwargs = dict(fixed)
    for key, value in table.items():
        if key not in known:
            raise RlanyError(f"unknown key '{key}' in [{section}]", where=where,
                             hint=f"known: {', '.join(known)}")
        kwargs[key] = typed(f"[{section}] {key}", value, known[key][0], where)
    try:
        return validate(cls(**kwargs), style=f"[{section}]")
    except RlanyError as e:
        raise RlanyError(e.message, where=where, hint=e.hint) from None


def typed(key: str, value: Any, hint: Any, where: str) -> Any:
    """A TOML value checked against a field type (ints widen to floats; lists to tuples)."""
    inner, nullable = _base(hint)
    if typing.get_origin(inner) is tuple:
        (elem,) = {a for a in typing.get_args(inner) if a is not Ellipsis}
        if not isinstance(value, list):
            raise RlanyError(f"'{key}' must be a list", where=where)
        return tuple(typed(key, v, elem, where) for v in value)
    if inner is float and isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:  # TOML integers have no size limit
            raise RlanyError(f"'{key}' is too large for a number", where=where) from None
    if not isinstance(value, inner) or (inner is int and isinstance(value, bool)):
        raise RlanyError(f"'{key}' must be {inner.__name__}, got {type(value).__name__}",
                         where=where)
    if inner is int and abs(value) > limits.MAX_INT:  # formatting it could fail (rlany.limits)
        raise RlanyError(f"'{key}' is out of range: more than 63 bits", where=where)
    return value


# -- typer commands --------------------------------------------------------------------

def command(app: Any, name: str, cls: type, run: Callable[[Any], Any], doc: str,
            examples: tuple[str, ...]) -> None:
    """Register `rlany NAME` with one flag per field of `cls`; it validates the options and
    calls `run(opts)`."""
    import typer

    params, lists = [], set()
    for key, (hint, default, spec) in specs(cls).items():
        inner, nullable = _base(hint)
        names = [flag(key)] + ([spec.short] if spec.short else [])
        kw: dict[str, Any] = {"help": spec.help + (" Can be repeated." if
                                                   typing.get_origin(inner) is tuple else ""),
                              "rich_help_panel": spec.panel}
        if inner is bool:
            names = [f"{flag(key)}/--no-{key.replace('_', '-')}"]
        if typing.get_origin(inner) is tuple:
            (elem,) = {a for a in typing.get_args(inner) if a is not Ellipsis}
            annotation, lists = Optional[list[elem]], lists | {key}
            kw["show_default"] = ", ".join(map(str, default))
            default = None
        else:
            if spec.choices:
                inner = typing.Literal[spec.choices]  # typer shows and checks the choices
            annotation = Optional[inner] if nullable else inner
        required = default is dataclasses.MISSING
        params.append(inspect.Parameter(
            key, inspect.Parameter.KEYWORD_ONLY,
            default=inspect.Parameter.empty if required else default,
            annotation=Annotated[annotation, typer.Option(*names, **kw)]))

    def cli(**kwargs: Any) -> None:
        for key in lists:
            if kwargs[key] is None:
                kwargs.pop(key)
            else:
                kwargs[key] = tuple(kwargs[key])
        try:
            opts = validate(cls(**kwargs))
        except RlanyError as e:  # a flag's value: a usage error (exit 2), not bad input
            raise UsageError(e.message, hint=e.hint) from None
        run(opts)

    cli.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    cli.__doc__ = doc
    cli.__name__ = name.replace("-", "_")
    cli.options_class = cls  # type: ignore[attr-defined]  # for tests and docs/gen_cli.py
    epilog = "**Example**\n\n" + "\n\n".join(f"`{line}`" for line in examples)
    app.command(name, epilog=epilog)(cli)

