"""The `rlany` command line: thin typer commands that open files, build options and call a
stage function. The stage modules hold the logic; nothing here does math.

Every command: `-i/--input`, `-o/--output` (`-` = stdin/stdout), data on stdout only,
people on stderr, expected failures exit 1 with one line `file:line: what is wrong`.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from rlany import limits
from rlany.console import console, info
from rlany.envs.make import MAX_TASKS, SPLITS, excluding, parse_knobs, spec_key
from rlany.errors import RlanyError, UsageError, unexpected_line
from rlany.options import command
from rlany.stages import COMMANDS

app = typer.Typer(
    help="rlany: RLAnything as Unix stages. A policy, a generative reward model and the "
    "environment's tasks learn together: tasks -> rollout -> judge -> score -> "
    "train-policy / train-rm -> adapt-tasks -> tasks.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
)

OutputOpt = Annotated[str, typer.Option("-o", "--output", help="Output JSONL file; - for stdout.")]
SeedOpt = Annotated[int, typer.Option(help="Base seed.", min=0, max=limits.MAX_SEED)]


def _example(*lines: str) -> str:
    return "**Example**\n\n" + "\n\n".join(f"`{line}`" for line in lines)


# ---------------------------------------------------------------------------------------
# the stages: one options class each (its fields are the flags), one driver `run(opts)`

for _stage in COMMANDS:
    command(app, _stage.name, _stage.options, _stage.run, _stage.help, _stage.examples)
del _stage


# ---------------------------------------------------------------------------------------
# loop and report


@app.command("loop", epilog=_example(
    "rlany loop examples/reasoning/loop.toml",
    "rlany loop examples/reasoning/loop.toml --name policy-only --no-rm-training "
    "--no-env-adaptation --no-step-feedback",
    "rlany loop examples/household/learn.toml --name warm --set warm_start=true",
    "rlany loop examples/reasoning/loop.toml --print-plan > next.sh && bash next.sh"))
def loop_cmd(
    config: Annotated[str, typer.Argument(help="A TOML run config (see examples/*/loop.toml).")],
    name: Annotated[Optional[str], typer.Option(help="Override the run name.")] = None,
    iterations: Annotated[Optional[int], typer.Option(help="Override iterations.")] = None,
    seed: Annotated[Optional[int], typer.Option(help="Override the seed.")] = None,
    runs_dir: Annotated[Optional[str], typer.Option(help="Override runs_dir.")] = None,
    step_feedback: Annotated[Optional[bool], typer.Option(
        "--step-feedback/--no-step-feedback", help="Override: integrated step rewards "
        "(off: outcome only).")] = None,
    rm_training: Annotated[Optional[bool], typer.Option(
        "--rm-training/--no-rm-training", help="Override: train the reward model.")] = None,
    env_adaptation: Annotated[Optional[bool], typer.Option(
        "--env-adaptation/--no-env-adaptation", help="Override: adapt the tasks.")] = None,
    one_stage: Annotated[bool, typer.Option(
        "--one-stage", help="Run only the next incomplete stage, then exit (step through "
        "a run; each call starts its own engine).")] = False,
    set_: Annotated[Optional[list[str]], typer.Option(
        "--set", help="Override one config value, KEY=VALUE with a TOML value: a top-level "
        "key (eval_every=5) or TABLE.KEY (train_policy.lr=1e-4); repeatable.")] = None,
    stop_after: Annotated[Optional[int], typer.Option(
        "--stop-after", min=0, help="Stop once iteration N (0-based) is done; a later "
        "run goes on from there.")] = None,
    print_plan: Annotated[bool, typer.Option(
        "--print-plan", help="A dry run: print what is left of the next iteration as a "
        "bash script on stdout (its commands as the loop would run them, with [launch]'s "
        "shards, servers and training launcher), and exit. Runs nothing, writes nothing; "
        "the script, run as it is, does the iteration (docs/stages/loop.md).")] = False,
) -> None:
    """Run the closed loop: rollout -> judge -> score -> train-policy -> train-rm ->
    adapt-tasks (+ eval), one directory per iteration under runs/NAME/. Rerunning the same
    command after a kill skips finished stages and resumes the interrupted one."""
    from rlany.loop.loop import Loop, load_config

    overrides = {k: v for k, v in {"name": name, "iterations": iterations, "seed": seed,
                                   "runs_dir": runs_dir, "step_feedback": step_feedback,
                                   "rm_training": rm_training,
                                   "env_adaptation": env_adaptation}.items() if v is not None}
    if print_plan and (one_stage or stop_after is not None):
        raise UsageError(f"--print-plan runs nothing, so "
                         f"{'--one-stage' if one_stage else '--stop-after'} does not go with "
                         "it (a plan is the next iteration)")
    cfg = load_config(config, overrides, sets=set_ or [])
    if print_plan:
        from rlany.loop.plan import Plan, loop_command

        plan = Plan(cfg, loop_command(config, overrides, set_ or []))
        Loop(cfg, config, executor=plan).run()
        sys.stdout.write(plan.script())
        return
    from rlany.loop.executors import executor_for  # in this process, or [launch] train's

    ran = Loop(cfg, config, one_stage=one_stage, stop_after=stop_after,
               executor=executor_for(cfg)).run()
    if ran:
        info(f"loop: stopped after {ran} (--one-stage); rerun for the next stage")


@app.command("report", epilog=_example("rlany report runs/demo",
                                       "rlany report runs/base runs/policy runs/full -o cmp"))
def report_cmd(
    runs: Annotated[list[str], typer.Argument(help="One or more run directories.")],
    output: Annotated[Optional[str], typer.Option(
        "-o", "--output", help="Report directory (default: RUN/report for one run).")] = None,
) -> None:
    """Plots (PNG) of what the runs measured, with 95% intervals, and a markdown table of one
    run or of several side by side (the seeds of one arm, runs named ARM-sSEED, drawn as one
    line with a band)."""
    from rlany.stages.report import write_report

    if output is None:
        if len(runs) > 1:
            raise RlanyError("several runs need -o/--output for the comparison report")
        output = str(Path(runs[0]) / "report")
    written = write_report(runs, Path(output))
    info(f"report: {len(written)} files -> {output}/report.md")


# ---------------------------------------------------------------------------------------
# models and envs

from rlany import model_commands  # noqa: E402 (rlany merge, rlany models: model directories)

app.command("merge", epilog=_example(model_commands.MERGE_EXAMPLE))(model_commands.merge_cmd)
app.add_typer(model_commands.models_app, name="models")


envs_app = typer.Typer(help="List, inspect and make tasks for environments.",
                       no_args_is_help=True)
app.add_typer(envs_app, name="envs")


@envs_app.command("list", epilog=_example("rlany envs list"))
def envs_list() -> None:
    """Registered environments: built-in and from the `rlany.envs` entry-point group."""
    from rlany import envs

    for name in envs.names():
        print(name)


@envs_app.command("show", epilog=_example("rlany envs show reasoning"))
def envs_show(name: Annotated[str, typer.Argument(help="Environment name.")]) -> None:
    """Describe an environment: its documentation and task knobs."""
    import inspect

    from rlany import envs

    f = envs.factory(name)
    print(inspect.getdoc(inspect.getmodule(f)) or inspect.getdoc(f) or name)


@envs_app.command("make-tasks", epilog=_example(
    "rlany envs make-tasks reasoning --n 32 --seed 0 -o tasks.jsonl",
    "rlany envs make-tasks reasoning --n 8 --seed 1 --knob digits=2 --split eval -o eval.jsonl",
    "rlany envs make-tasks miniwob --n 16 --seed 0 --knob screens=none -o web.jsonl",
    "rlany envs make-tasks openenv --n 16 --seed 0 --knob url=http://127.0.0.1:8000 -o oe.jsonl",
    "rlany envs make-tasks reasoning --n 32 --seed 2 --split eval --exclude tasks.jsonl "
    "-o heldout.jsonl"))
def envs_make_tasks(
    name: Annotated[str, typer.Argument(help="Environment name.")],
    output: OutputOpt = "-",
    n: Annotated[int, typer.Option("--n", help=f"How many tasks (1 to {MAX_TASKS:,}).")] = 16,
    seed: SeedOpt = 0,
    split: Annotated[str, typer.Option(help="train or eval.")] = "train",
    knob: Annotated[Optional[list[str]], typer.Option(
        help="Environment knob as key=value (repeatable, each key once); see `rlany envs "
        "show NAME`.")] = None,
    exclude: Annotated[Optional[str], typer.Option(
        help="A tasks JSONL: leave out every generated task whose spec equals one there "
        "(a held-out split that shares no problem with a training pool); the generator "
        "draws on until --n remain.")] = None,
) -> None:
    """Generate a tasks JSONL from an environment's generator (deterministic per seed)."""
    import inspect

    from rlany import envs
    from rlany.files.outputs import AtomicJsonl, write_meta
    from rlany.stageio import prepare_paths, read_tasks

    started = time.time()
    if n < 1:
        raise UsageError(f"--n must be >= 1, got {n}")
    if n > MAX_TASKS:
        raise UsageError(f"--n {n} is more than {MAX_TASKS:,} tasks", hint="a pool is read "
                         "whole by every stage; make several files with different --seed")
    if split not in SPLITS:
        raise UsageError(f"--split must be one of {', '.join(SPLITS)}, got '{split}'")
    module = inspect.getmodule(envs.factory(name))
    make = getattr(module, "make_tasks", None)
    if make is None:
        raise RlanyError(f"environment '{name}' has no task generator")
    knobs = parse_knobs(knob or [], dict(inspect.signature(make).parameters), name)
    paths = prepare_paths({"--exclude": exclude}, {"--output": output})
    inputs = []
    kwargs = dict(seed=seed, split=split, **knobs)
    try:
        if exclude:
            excluded, reader = read_tasks(paths["--exclude"], name=exclude)
            inputs.append(reader)
            tasks = excluding(make, {spec_key(t) for t in excluded}, n, kwargs)
        else:
            tasks = make(n=n, **kwargs)
    except RlanyError as e:  # the generator refused its knobs: the command line's fault
        if e.where or "--exclude" in e.message:
            raise
        raise UsageError(f"--knob: {e.message}" if knobs else e.message, hint=e.hint) from None
    with AtomicJsonl(output) as out:
        out.write_all(tasks)
    write_meta(output, stage="envs make-tasks", inputs=inputs, started=started,
               flags={"env": name, "n": n, "seed": seed, "split": split, **knobs,
                      **({"exclude": exclude} if exclude else {})},
               counts={"tasks": len(tasks)})
    info(f"envs: {len(tasks)} {name} tasks -> {output}")


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is, so it unwinds as an interrupt does: locks
    released, temp files removed, partial outputs kept for a resume."""


_OS_ERRORS = {  # errno -> (what, hint) for the machine's state, said once for every stage
    errno.ENOSPC: ("no space left on the device", "free some space and rerun; the output "
                   "was not replaced"),
    errno.EDQUOT: ("disk quota exceeded", "free some space and rerun; the output was not "
                   "replaced"),
    errno.EROFS: ("read-only file system", "write the output somewhere writable"),
    errno.EACCES: ("permission denied", None),
    errno.EPERM: ("operation not permitted", None),
    errno.EPIPE: ("the reader of the output closed the pipe", None),
    errno.EISDIR: ("is a directory", None),
    errno.ENOTDIR: ("a parent of this path is a file, not a directory", None),
    errno.EEXIST: ("already exists and is not a directory", None),
    errno.ENAMETOOLONG: ("file name too long", None),
}


def os_error_line(e: OSError) -> str:
    """One line for an OSError a user or the machine caused (a full disk, a read-only or
    forbidden directory, a closed pipe): `path: what (hint)`."""
    if e.errno is None and e.filename is None:  # raised with a message of its own only
        return RlanyError(str(e) or type(e).__name__).one_line()
    what, hint = _OS_ERRORS.get(e.errno, (e.strerror or type(e).__name__, None))
    if e.filename is None:  # stdout: there is no output file to speak of
        return RlanyError(what, where="<stdout>").one_line()
    return RlanyError(what, where=str(e.filename), hint=hint).one_line()


def _quiet_stdout() -> None:
    """After stdout failed (closed pipe, full device), point it at /dev/null so the
    interpreter's last flush cannot fail a second time."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, AttributeError, ValueError):
        sys.stdout = None  # type: ignore[assignment]


def main(argv: list[str] | None = None) -> None:
    """Console entry point. Exit codes: 0 done, 1 bad input or the machine's state (a full
    disk, a read-only directory, a closed stream: one line `file:line: what is wrong`), 2
    bad usage (one line), 130 interrupted (Ctrl-C), 143 terminated (SIGTERM), 70 a bug.
    RLANY_DEBUG=1 shows tracebacks."""
    import click

    # typer >= 0.2x vendors its own click (typer._click): its usage errors are not
    # click.UsageError. BadParameter is public; its base is the vendored UsageError.
    usage_errors = (click.UsageError, typer.BadParameter.__mro__[1])
    debug = bool(os.environ.get("RLANY_DEBUG"))
    terminated, printed = [], False

    def on_term(signum, frame):
        terminated.append(signum)
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        code = app(args=argv, prog_name="rlany", standalone_mode=False)
        if sys.stdout is not None:
            sys.stdout.flush()  # a full device or a closed pipe is reported here, not lost
    except usage_errors as e:
        ctx = getattr(e, "ctx", None)
        if type(e).__name__ == "NoArgsIsHelpError":  # bare `rlany` / `rlany models`
            print(ctx.get_help() if ctx else "", file=sys.stderr)
            sys.exit(2)
        if debug:
            raise
        command = ctx.command_path if ctx else "rlany"
        message = e.format_message().replace("\n", " ")
        console.print(f"[red]usage error:[/] {escape(command)}: {escape(message)} (see "
                      f"{escape(command)} --help)", soft_wrap=True)
        code = 2
    except (click.exceptions.Abort, typer.Abort, KeyboardInterrupt):
        console.print("[red]terminated[/]" if terminated else "[red]interrupted[/]")
        code, printed = (143 if terminated else 130), True
    except RlanyError as e:
        if debug:
            raise
        label = "usage error" if e.exit_code == 2 else "error"
        console.print(f"[red]{label}:[/] {escape(e.one_line())}", soft_wrap=True)
        code = e.exit_code
    except SystemExit as e:
        if type(sys.stdout).__name__ != "PacifyFlushWrapper":
            raise
        # click's answer to a closed pipe on stdout (`rlany ... | head`): it exits 1
        # silently; say it in one line like every other failure
        console.print("[red]error:[/] <stdout>: the reader of the output closed the pipe",
                      soft_wrap=True)
        code = e.code
    except OSError as e:  # the machine's state or a path the user gave: never a bug report
        if debug:
            raise
        if e.filename is None and e.errno is not None:  # a write to stdout (a full device)
            _quiet_stdout()
        console.print(f"[red]error:[/] {escape(os_error_line(e))}", soft_wrap=True)
        code = 1
    except Exception as e:  # a bug: one line unless asked, never a wall of text
        if debug:
            raise
        name = next(iter(argv or sys.argv[1:]), "")  # the role decides what to lower
        role = "loop" if name == "loop" else next((c.engine for c in COMMANDS
                                                   if c.name == name), None)
        label, line, code = unexpected_line(e, role)
        console.print(f"[red]{label}:[/] {escape(line)}", soft_wrap=True)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if code == 130 and not printed:  # typer turns an interrupt into its exit code 130
        console.print("[red]terminated[/]" if terminated else "[red]interrupted[/]")
        code = 143 if terminated else 130
    if code in (130, 143):
        _stop_now(code)
    sys.exit(code if isinstance(code, int) else 0)


def _stop_now(code: int) -> None:
    """Exit after an interrupt: exit handlers run (temp copies of stdin removed), but
    worker threads still blocked on a server or a file are not waited for."""
    import atexit

    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
    atexit._run_exitfuncs()
    os._exit(code)
