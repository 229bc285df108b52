"""The loop's config: a flat TOML file, top-level run keys plus one table per stage whose
keys are that stage's flags. Every value goes through the stage's own options class, so
defaults and validation are the CLI's; the whole config is checked before anything runs."""

from __future__ import annotations

import dataclasses
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlany.errors import RlanyError, UsageError
from rlany.loop.launch import Launch, parse_launch
from rlany.stages import BY_TABLE


def _run_keys() -> dict[str, Any]:
    """Run-scope fields of every stage: key -> type (they agree across stages)."""
    from rlany.options import specs

    keys: dict[str, Any] = {}
    for stage in BY_TABLE.values():
        for key, (hint, _, spec) in specs(stage.options).items():
            if spec.scope == "run":
                keys.setdefault(key, hint)
    return keys


TABLES = BY_TABLE  # one config table per command: its flags
# what an older config may hold that the loop no longer has, refused with what replaces it
GONE = ("the judge warm start is a recipe of public stages now, ending in an adapter the "
        "loop's judge starts from: init_rm = \"DIR/rm\" (docs/stages/loop.md, \"A "
        "supervised judge\")")
RETIRED = {"judge_warm_start": GONE, "judge_sft": GONE}


def _retired(key: str, raw: dict, path: str) -> RlanyError:
    """A key of the retired judge warm start: where it was on, what replaces it; where it
    was off (an older example's `[judge_sft]` beside no warm start), that it had no effect."""
    what = f"[{key}] is no longer a loop table" if key == "judge_sft" else \
        f"'{key}' is no longer a loop key"
    if raw.get("judge_warm_start") is True:
        return RlanyError(what, where=path, hint=RETIRED[key])
    return RlanyError(f"{what}: remove it (the judge warm start it belonged to was off here, "
                      "so it had no effect)", where=path)


@dataclass
class LoopConfig:
    name: str
    tasks: str
    iterations: int = 3
    runs_dir: str = "runs"
    eval_tasks: str | None = None
    keep_last: int = 2
    eval_every: int = 1
    init_policy: str | None = None  # a LoRA adapter (e.g. `rlany sft`'s) iteration 0 starts from
    warm_start: bool = False  # make one first: the env's expert on the pool, then sft
    # a judge LoRA adapter (e.g. `rlany train-rm`'s) iteration 0 judges with, train-rm continues
    init_rm: str | None = None
    step_feedback: bool = True
    rm_training: bool = True
    env_adaptation: bool = True
    # the judge trains on the scored steps of the last rm_buffer iterations (1: its own)
    rm_buffer: int = 1
    run: dict[str, Any] = field(default_factory=dict)  # model, engine, seed, ... as given
    tables: dict[str, dict[str, Any]] = field(default_factory=dict)  # [stage] key -> value
    # [launch]: how training runs (a launcher), and what --print-plan starts (loop.launch)
    launch: Launch = field(default_factory=Launch)
    path: str = "loop.toml"

    @staticmethod
    def keys() -> dict[str, Any]:
        """The loop's own top-level keys and their types (the fields above); the run keys
        (model, engine, seed, ...) come from the stages' options classes (scope "run")."""
        hints = typing.get_type_hints(LoopConfig)
        return {k: v for k, v in hints.items()
                if k not in ("run", "tables", "launch", "path")}

    @property
    def run_dir(self) -> Path:
        return Path(self.runs_dir) / self.name

    def options(self, table: str, **io: Any) -> Any:
        """The options object of one stage: run keys + its table + what the loop sets."""
        from rlany.options import from_table, specs

        cls = TABLES[table].options
        fields = specs(cls)
        run = {k: v for k, v in self.run.items() if k in fields and fields[k][2].scope == "run"}
        return from_table(cls, self.tables.get(table, {}), self.path, table, **run, **io)


def load_config(path: str, overrides: dict[str, Any] | None = None,
                sets: list[str] = ()) -> LoopConfig:
    """Read and check a whole config (every stage's options are built once with placeholder
    paths), so a bad value fails here with one line, before anything runs. `sets` are the
    command line's `--set KEY=VALUE` (KEY top-level or TABLE.KEY, VALUE a TOML value)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
        tomllib.loads(text)
    except OSError as e:
        raise RlanyError(f"cannot read config: {e.strerror}", where=path) from None
    except (ValueError, RecursionError) as e:  # TOML, UTF-8, an integer of 1000s of digits
        raise RlanyError(f"invalid TOML: {str(e)[:200]}", where=path) from None
    overrides = overrides or {}
    try:
        return _load(path, text, overrides, list(sets))
    except UsageError:
        raise
    except RlanyError as e:
        culprit = _culprit(path, text, overrides, list(sets), e.message)
        if culprit is None:
            raise
        raise UsageError(f"{culprit}: {e.message}", hint=e.hint) from None


# the command line's overrides, as the user typed them (for usage errors that name them)
OVERRIDE_FLAGS = {"name": "--name", "iterations": "--iterations", "seed": "--seed",
                  "runs_dir": "--runs-dir", "step_feedback": "--[no-]step-feedback",
                  "rm_training": "--[no-]rm-training",
                  "env_adaptation": "--[no-]env-adaptation"}


def _culprit(path: str, text: str, overrides: dict[str, Any], sets: list[str],
             message: str) -> str | None:
    """The command-line value that makes a config fail (None: the file itself fails the
    same way). The file alone is loaded, then with each override or `--set` alone."""
    if not overrides and not sets:
        return None

    def fails(over: dict[str, Any], given: list[str]) -> bool:
        try:
            _load(path, text, over, given)
        except RlanyError as e:
            return e.message == message
        return False
    if fails({}, []):
        return None
    for key, value in overrides.items():
        if fails({key: value}, []):
            shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
            return f"{OVERRIDE_FLAGS.get(key, key)} {shown}"
    for item in sets:
        if fails({}, [item]):
            return f"--set {item[:80]}{'...' if len(item) > 80 else ''}"
    return "the command line's overrides (" + ", ".join(
        [OVERRIDE_FLAGS.get(k, k) for k in overrides] + [f"--set {i}" for i in sets]) + ")"


def _load(path: str, text: str, overrides: dict[str, Any], sets: list[str]) -> LoopConfig:
    from rlany.options import typed

    raw = tomllib.loads(text)
    raw.update(overrides)
    for item in sets:
        _apply_set(raw, item)
    tables, run_keys, loop_keys = TABLES, _run_keys(), LoopConfig.keys()
    top: dict[str, Any] = {}
    run: dict[str, Any] = {}
    sections: dict[str, dict] = {}
    launch = Launch()
    for key, value in raw.items():
        if key == "launch":
            launch = parse_launch(value, path)
        elif key in tables:
            if not isinstance(value, dict):
                raise RlanyError(f"[{key}] must be a table", where=path)
            sections[key] = dict(value)
        elif key in loop_keys:
            top[key] = typed(key, value, loop_keys[key], path)
        elif key in RETIRED:
            raise _retired(key, raw, path)
        elif key in run_keys:
            run[key] = typed(key, value, run_keys[key], path)
        else:
            raise RlanyError(f"unknown key '{key}'", where=path,
                             hint=f"top-level keys: {', '.join([*loop_keys, *run_keys])}; "
                             f"tables: {', '.join(tables)}, launch")
    for required in ("name", "tasks"):
        if required not in top:
            raise RlanyError(f"missing '{required}'", where=path)
    for key in ("iterations", "keep_last", "eval_every", "rm_buffer"):
        if top.get(key, 1) < 1:
            raise RlanyError(f"'{key}' must be >= 1, got {top[key]}", where=path)
    _check_name(top["name"], path)
    cfg = LoopConfig(**top, run=run, tables=sections, launch=launch, path=path)
    _check_launch(cfg)
    for key in ("init_policy", "init_rm"):
        if getattr(cfg, key) is not None:  # "" too: never read as a start
            _check_init(cfg, key)
    if cfg.warm_start:
        _check_warm_start(cfg)
    for table in ("train_policy", "train_rm"):  # before an iteration's work is spent
        _check_kl_ref(cfg, table)
        if cfg.tables.get(table, {}).get("full"):
            raise RlanyError(f"[{table}] full = true: the loop's engine serves the base model "
                             "with LoRA adapters and cannot load a fully fine-tuned model",
                             where=cfg.path, hint="use LoRA in the loop; `rlany train-policy "
                             "--full` works as a stage on its own")
    if cfg.tables.get("judge", {}).get("last_step_only"):  # score needs every step's
        raise RlanyError("[judge] last_step_only = true: score gives step rewards to every "
                         "step, so it refuses judgments of the last step alone", where=cfg.path,
                         hint="to measure a judge on last steps: [eval] judge_last_step_only")
    for table in tables:  # every stage's options, checked before anything runs (and before
        cfg.options(table, **_placeholders(tables[table].options))  # _resolve reads them)
    _resolve(cfg, overrides)
    for table in tables:  # and with what _resolve derived
        cfg.options(table, **_placeholders(tables[table].options))
    _check_files(cfg)
    return cfg


def _check_name(name: str, where: str) -> None:
    """A run name is one directory under runs_dir: not empty, not `.`/`..`, no slash."""
    if not name.strip() or name in (".", "..") or any(c in name for c in "/\\\0") or \
            name != name.strip() or name.startswith("-"):
        raise RlanyError(f"'name' must be a plain directory name, got {name!r}", where=where,
                         hint="letters, digits, '-', '_' and '.', e.g. name = \"demo\"")


def _check_files(cfg: LoopConfig) -> None:
    """The config's paths, before anything is written: the task files read and checked
    like every stage reads them (pool tasks also in eval_tasks are named: held-out success
    would count tasks trained on), runs_dir a directory (or absent)."""
    from rlany.console import info
    from rlany.envs.make import spec_key  # make-tasks --exclude's identity of a task
    from rlany.stageio import read_tasks

    specs: dict = {}
    for key in ("tasks", "eval_tasks"):
        value = getattr(cfg, key)
        if value is not None:
            if not Path(value).is_file():
                raise RlanyError(f"'{key}' {value!r}: no such file", where=cfg.path)
            specs[key] = {spec_key(t): t.task_id for t in read_tasks(value)[0]}
    both = [i for s, i in specs.get("eval_tasks", {}).items() if s in specs.get("tasks", {})]
    if both:  # a choice (success on the pool itself), not a mistake to refuse
        info(f"{cfg.path}: note: eval_tasks holds {len(both)} of the pool's tasks (the spec "
             f"of '{both[0]}'): their success is not held-out (`rlany envs make-tasks ... "
             "--exclude POOL` makes disjoint ones)")
    for directory in (Path(cfg.runs_dir), cfg.run_dir):
        if directory.exists() and not directory.is_dir():
            raise RlanyError(f"{str(directory)!r} is a file, not a directory", where=cfg.path,
                             hint="'runs_dir' (and runs_dir/name) must be directories")


def _check_launch(cfg: LoopConfig) -> None:
    """[launch] against the engine: a plan's shards are one per endpoint of an openai engine
    with several (with one endpoint, any number: each sends to it); its servers are an
    openai engine's."""
    from rlany.engines.endpoints import split_urls

    engine, launch = cfg.run.get("engine"), cfg.launch
    try:
        urls = split_urls(cfg.run.get("base_url"), "'base_url'") if engine == "openai" else []
    except RlanyError as e:
        raise RlanyError(e.message, where=cfg.path, hint=e.hint) from None
    if len(urls) > 1 and launch.shards not in (None, len(urls)):
        raise RlanyError(f"'[launch] shards' = {launch.shards}, but the openai engine has "
                         f"{len(urls)} endpoints: a plan runs one shard per endpoint",
                         where=cfg.path, hint="leave shards out")
    if launch.serve is not None and engine != "openai":
        raise RlanyError(f"'[launch] serve' starts the servers of an openai engine; the "
                         f"engine is {engine or 'auto'}", where=cfg.path,
                         hint='engine = "openai" with base_url = "http://127.0.0.1:8000/v1,..."')
    if launch.serve is not None and not urls:
        raise RlanyError("'[launch] serve' needs base_url: the endpoints to start",
                         where=cfg.path)


def _init_rank(adapter: str) -> int:
    """The LoRA rank of a starting adapter (its adapter_config.json's r; 0: unknown)."""
    import json

    try:
        r = json.loads((Path(adapter) / "adapter_config.json").read_text()).get("r")
    except (OSError, ValueError, AttributeError):
        return 0
    return r if isinstance(r, int) else 0


def _check_init(cfg: LoopConfig, key: str) -> None:
    """init_policy / init_rm: a LoRA adapter directory (its config and weights readable,
    `stage_engine.check_adapter`) made for the run's base model, which training continues it on
    whatever the engine (`rlany.adapters`; a model that is no local directory, e.g. a
    served one, cannot be compared here)."""
    from rlany.adapters import check_adapter_fits
    from rlany.models import resolve_model
    from rlany.stage_engine import check_adapter

    adapter = getattr(cfg, key)
    if not adapter.strip():
        raise RlanyError(f"{key} is empty: give a LoRA adapter directory, or leave it out",
                         where=cfg.path)
    if not (Path(adapter) / "adapter_config.json").is_file():
        made_by = "rlany sft" if key == "init_policy" else "rlany train-rm"
        raise RlanyError(f"{key} {adapter!r} is not a LoRA adapter directory "
                         "(no adapter_config.json)", where=cfg.path,
                         hint=f"e.g. the output of `{made_by}`")
    try:
        check_adapter(adapter, key)
    except RlanyError as e:
        raise RlanyError(e.message, where=cfg.path, hint=e.hint or f"{key} = {adapter!r}") \
            from None
    try:
        model = resolve_model(cfg.options("rollout", input="-").model)
    except RlanyError:
        return  # no local model: starting the engine says so, or it is a served name
    check_adapter_fits(adapter, model, key)


def _check_kl_ref(cfg: LoopConfig, table: str) -> None:
    """A `kl_ref` adapter directory is checked at load, by the trainer's own check."""
    from rlany.training.driver import check_kl_ref

    ref = cfg.tables.get(table, {}).get("kl_ref")
    if isinstance(ref, str):
        check_kl_ref(ref, f"[{table}] kl_ref", in_loop=True)


# the warm start's LoRA is the one train-policy continues: its shape is [train_policy]'s
WARM_SHAPE = ("lora_r", "lora_alpha", "target_modules", "lora_layers", "dtype")


def _check_warm_start(cfg: LoopConfig) -> None:
    if cfg.init_policy:
        raise RlanyError("warm_start = true makes the first policy adapter; init_policy gives "
                         "one: set one of them", where=cfg.path)
    shaped = [k for k in (*WARM_SHAPE, "full", "adapter") if k in cfg.tables.get("sft", {})]
    if shaped:
        raise RlanyError(f"[sft] {', '.join(shaped)}: the warm start's LoRA is the one "
                         "train-policy continues, so it takes [train_policy]'s shape",
                         where=cfg.path, hint="set them in [train_policy]")


def _apply_set(raw: dict[str, Any], item: str) -> None:
    """One `--set KEY=VALUE` into the parsed config; a VALUE that is not TOML is a string."""
    key, eq, text = item.partition("=")
    key = key.strip()
    if not eq or not key or key.count(".") > 1 or "" in key.split("."):
        raise UsageError(f"--set {item!r}: expected KEY=VALUE or TABLE.KEY=VALUE",
                         hint="e.g. --set train_policy.lr=1e-4 --set eval_every=5")
    try:
        value = tomllib.loads(f"v = {text.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = text.strip()
    except ValueError:  # an integer of thousands of digits (Python's int limit)
        raise UsageError(f"--set {item[:60]}...: {key} is out of range: more than 63 bits") \
            from None
    table, _, name = key.rpartition(".")
    if table:
        if table not in TABLES and table != "launch":
            raise UsageError(f"--set {item!r}: no table [{table}]",
                             hint=RETIRED.get(table, f"tables: {', '.join(TABLES)}, launch"))
        section = raw.setdefault(table, {})
        if not isinstance(section, dict):
            raise UsageError(f"--set {item!r}: [{table}] is not a table")
        section[name] = value
    else:
        raw[name] = value


def _resolve(cfg: LoopConfig, overrides: dict[str, Any]) -> None:
    """The values the loop derives from the config, written into it so that the printed
    commands carry them: lambda from step_feedback, eval's judge settings, the LoRA rank
    (the largest trained or, with init_policy / init_rm, continued)."""
    score = cfg.tables.setdefault("score", {})
    if not cfg.step_feedback:
        if score.get("lam", 0.0) != 0.0 and overrides.get("step_feedback") is not False:
            raise RlanyError("step_feedback = false means lambda = 0, but [score] lam is set",
                             where=cfg.path, hint="remove one of them")
        score["lam"] = 0.0  # --no-step-feedback on the command line is the ablation: it wins
    judge, evaluation = cfg.tables.get("judge", {}), cfg.tables.setdefault("eval", {})
    from rlany.stages.eval import JUDGE_FIELDS

    for eval_key, judge_key in JUDGE_FIELDS.items():
        if judge_key in judge and eval_key not in evaluation:
            evaluation[eval_key] = judge[judge_key]
    if "max_lora_rank" not in cfg.run:
        # vLLM pads every adapter to max_lora_rank: serve exactly the largest rank trained
        from rlany.stages.train_policy import TrainOptions
        cfg.run["max_lora_rank"] = max(  # the trainers continue init_* in their shape
            [cfg.tables.get(t, {}).get("lora_r", TrainOptions.lora_r)
             for t in ("train_policy", "train_rm")]
            + [_init_rank(a) for a in (cfg.init_policy, cfg.init_rm) if a])


def _placeholders(cls: type) -> dict[str, str]:
    return {f.name: "-" for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
