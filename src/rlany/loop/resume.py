"""A run directory resumed under a config: what its finished stages were made with must be
what the config gives them, whether or not the run's `config.json` survives.

`config.json` (the resolved config, echoed when the run began) is compared whole when it is
there (`check_echo`: only `iterations` may be raised). Every finished stage also records
the options it ran with: a file stage in its sidecar (`X.meta.json` "flags"), a checkpoint
in its `rlany.json` ("options"). `check_finished` compares those with the options the config
gives the same stage now, key by key (the stage's own and the run's keys; not the paths and
adapters the loop sets, not a value the config leaves to `auto`, which the stage resolved,
and the model only where a checkpoint records it as given), and refuses a run directory
where a finished stage was made otherwise, or where a stage ran that the config no longer
runs. Either refusal is one line naming the first differing key, so a deleted or
hand-edited `config.json` cannot make the loop skip stages made under another config and go
on under the new one. Not seen without `config.json`: keys that reach no stage's options
(keep_last, eval_every, rm_buffer, init_policy, init_rm: the paths and adapters are the
loop's).
Never compared: `[launch]` (how the stages run: a run may move to another launcher),
the `base_url` a finished stage recorded (a `--print-plan` shard records its own endpoint)
and `allow_unverified` (which adapters may be served, not what was made: a run refused an
unverified adapter resumes with it set)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlany.errors import RlanyError
from rlany.files.jsonl import meta_path

if TYPE_CHECKING:
    from rlany.loop.tables import Run, Stage

CHANGED = "this run directory was started with a different config"
HINT = "use a new name, or restore the config (only iterations may be raised)"
# what switches a stage of an iteration off (tables.STAGES' `enabled`)
# how a run is run, not what it computes: a run may move to another launcher or machine
HOW = ("launch",)
RUN_HOW = ("allow_unverified",)  # run keys of that kind
SWITCHES = {"judge": "step_feedback / rm_training / env_adaptation", "train_rm": "rm_training",
            "adapt_tasks": "env_adaptation"}


def check_echo(echo: Path, config: dict, iterations: int) -> None:
    """The run's `config.json` against the config now: a key added to the config format
    since the run began counts at its default, and `iterations` may be raised."""
    from rlany.loop.config import LoopConfig

    try:
        old = json.loads(echo.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        old = None
    if not isinstance(old, dict):
        raise RlanyError("unreadable: not the JSON of a config", where=str(echo),
                         hint="restore it, or delete it: each finished stage's own record "
                         "is checked without it")
    defaults = {f.name: f.default for f in dataclasses.fields(LoopConfig)
                if f.default is not dataclasses.MISSING}
    old = _retired(old)
    more = iterations >= old.get("iterations", iterations)
    config = _what(config)
    then = {**{k: defaults[k] for k in config.keys() - old.keys() if k in defaults},
            **_what(old),
            **({"iterations": iterations} if more else {})}
    key = _first_difference(_at_defaults(then), _at_defaults(config))
    if key is not None:
        raise RlanyError(f"{CHANGED}: {key} was {_show(_get(then, key))}, the config now "
                         f"gives {_show(_get(config, key))}", where=str(echo), hint=HINT)


def _what(config: dict) -> dict:
    """A config without what says how it runs (HOW, RUN_HOW), not what it makes."""
    run = {k: v for k, v in _dict(config.get("run")).items() if k not in RUN_HOW}
    return {k: (run if k == "run" else v) for k, v in config.items() if k not in HOW}


def _at_defaults(config: dict) -> dict:
    """A stage's key written at its option's default counts as left out: the options are
    the same (a config that drops `lr = 3e-4` from `[train_policy]` resumes what it made),
    except for the keys the loop reads by whether they are written
    (`tables.read_if_written`)."""
    from rlany.loop.config import TABLES
    from rlany.loop.tables import WARM_LR, read_if_written
    from rlany.options import specs

    warm = bool(config.get("warm_start") or config.get("init_policy"))
    written = read_if_written(warm)
    tables = {}
    for table, keys in _dict(config.get("tables")).items():
        fields = specs(TABLES[table].options) if table in TABLES else {}
        tables[table] = {k: v for k, v in _dict(keys).items()
                         if k not in fields or fields[k][1] != v or (table, k) in written}
    policy = tables.get("train_policy", {})
    if warm and not policy.get("full"):  # left out, the lr it trains at: written the same
        tables["train_policy"] = {**policy, "lr": policy.get("lr", WARM_LR)}
    return {**config, "tables": tables} if "tables" in config or warm else config


def _retired(old: dict) -> dict:
    """An echo from before the judge warm start left the loop (`config.RETIRED`):
    `judge_warm_start = false` and its `[judge_sft]` table made nothing, so they are not
    compared; a run that made one (true) differs from every config now, and is refused."""
    if old.get("judge_warm_start", False) is not False:
        return old
    tables = {t: v for t, v in _dict(old.get("tables")).items() if t != "judge_sft"}
    return {**{k: v for k, v in old.items() if k != "judge_warm_start"},
            **({"tables": tables} if "tables" in old else {})}


def _first_difference(old: dict, new: dict) -> str | None:
    """The first key whose value differs: a top-level key, a run key (model, seed, ...) by
    its name, a stage's key as `table.key`."""
    for key in _keys(old, new):
        a, b = old.get(key), new.get(key)
        if a == b:
            continue
        if key == "run":
            inner = _inner(a, b)
        elif key == "tables":
            inner = next((f"{t}.{k}" for t in _keys(_dict(a), _dict(b))
                          if (k := _inner(_dict(a).get(t), _dict(b).get(t)))), None)
        else:
            return key
        if inner is not None:
            return inner
    return None


def _inner(a: Any, b: Any) -> str | None:
    a, b = _dict(a), _dict(b)
    return next((k for k in _keys(a, b) if a.get(k) != b.get(k)), None)


def _keys(a: dict, b: dict) -> list:
    return [*b, *(k for k in a if k not in b)]


def _dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _get(config: dict, key: str) -> Any:
    """The value of a key `_first_difference` names."""
    if key in config:
        return config[key]
    table, _, name = key.rpartition(".")
    if table:
        return config.get("tables", {}).get(table, {}).get(name)
    return config.get("run", {}).get(key)


def _show(value: Any) -> str:
    return "absent" if value is None else json.dumps(value)


class _Planned:
    """What the stage tables read of a Loop to name a stage's files and options, without
    touching any file: no checkpoint is looked up (the adapter a stage starts from is a
    path the loop sets, not a flag of the config)."""

    def __init__(self, loop: Run):
        self.cfg, self.dir = loop.cfg, loop.dir
        self.init_policy, self.init_rm = loop.init_policy, loop.init_rm

    def latest(self, kind: str, before: int) -> None:
        return None

    def rm_input(self, d: Path, it: int) -> str:
        return str(d / "scored.jsonl")

    def joined(self, out: Path, *_: object) -> str:
        return str(out)


def _units(loop: Run) -> Iterator[tuple[Stage, Path, int, dict, bool]]:
    """Every stage a run directory may hold, in the loop's order: (stage, directory,
    iteration, paths the loop sets, whether this config runs it)."""
    from rlany.loop.tables import EVAL, STAGES, WARM_START

    cfg = loop.cfg
    for stage in WARM_START:
        yield stage, loop.dir / "warm_start", 0, {}, cfg.warm_start
    evals = [EVAL] if cfg.eval_tasks else []  # an evaluation measures: never "not run"
    for name in ("eval_base.json", "eval_init.json"):
        for stage in evals:
            yield stage, loop.dir, -1, dict(output=str(loop.dir / name)), True
    iterations = sorted(int(p.name[5:]) for p in loop.dir.glob("iter_*")
                        if p.name[5:].isdigit() and p.is_dir())
    for it in iterations:
        d = loop.dir / f"iter_{it:03d}"
        for stage in (*STAGES, *evals):
            yield stage, d, it, {}, stage is EVAL or stage.enabled(cfg)


def check_finished(loop: Run) -> None:
    """Each finished stage's recorded options against the config's (module docstring)."""
    from rlany.loop.tables import EVAL

    planned = _Planned(loop)
    for stage, d, it, io, runs in _units(loop):
        table = stage.table
        opts = loop.cfg.options(table, **{**stage.io(planned, d, it), **io})
        opts = dataclasses.replace(opts, **stage.forced(planned))
        done = meta_path(opts.output) if stage is EVAL else stage.done(opts)
        recorded = _recorded(done)
        if recorded is None:
            continue
        if not runs:
            switch = d.name if d.name.endswith("warm_start") else SWITCHES[stage.table]
            raise RlanyError(f"{CHANGED}: {table} ran in it, and this config does not run "
                             f"it ({switch})", where=str(done), hint=HINT)
        key = _differs(opts, recorded, engine_named=done.name != "rlany.json")
        if key is not None:
            name = key if _scope(opts, key) == "run" else f"{table}.{key}"
            raise RlanyError(f"{CHANGED}: {name} was {_show(recorded[key])} for this "
                             f"finished stage, the config now gives "
                             f"{_show(_plain(getattr(opts, key)))}", where=str(done),
                             hint=HINT)


def _recorded(done: Path) -> dict | None:
    """The options a finished stage recorded (None: not finished, or nothing recorded)."""
    if not done.is_file():
        return None
    try:
        data = json.loads(done.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None  # the stage's own reader reports a damaged file where it reads it
    recorded = data.get("options" if done.name == "rlany.json" else "flags") \
        if isinstance(data, dict) else None
    return recorded if isinstance(recorded, dict) else None


def _scope(opts: Any, key: str) -> str:
    from rlany.options import specs

    return specs(type(opts))[key][2].scope


def _differs(opts: Any, recorded: dict, engine_named: bool) -> str | None:
    """The first of the stage's own and the run's keys whose recorded value is not the one
    the config gives (a key the record lacks, from an older rlany, is not compared). A
    generating stage's sidecar (`engine_named`) records the model as its engine names it
    (a served model's name, a resolved directory): the model is compared in checkpoints,
    which record it as the config gave it. `base_url` is where the stage generated, not
    what: a shard (`--print-plan`) records its own endpoint."""
    from rlany.options import specs

    for key, (_, _, spec) in specs(type(opts)).items():
        if spec.scope == "io" or key not in recorded or key in ("base_url", *RUN_HOW) or (
                key == "model" and engine_named):
            continue
        want, got = _plain(getattr(opts, key)), recorded[key]
        if want == got or want == "auto" or (key == "model" and _same_model(want, got)):
            continue
        return key
    return None


def _plain(value: Any) -> Any:
    """A value as its JSON record reads back (tuples as lists)."""
    return json.loads(json.dumps(value))


def _same_model(want: Any, got: Any) -> bool:
    """The same model, spelled another way (a relative path, an alias)."""
    from rlany.models import resolve_model

    if not isinstance(want, str) or not isinstance(got, str):
        return False
    try:
        return resolve_model(want) == got or Path(want).resolve() == Path(got).resolve()
    except (RlanyError, OSError):
        return False
