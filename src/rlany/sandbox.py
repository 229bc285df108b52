"""Run model-written programs, which are hostile until proven otherwise.

Every program runs in a separate process started through `_jail.py` (a fresh, single-
threaded interpreter, so no fork-after-threads hazards in the caller), which before it execs
the program's interpreter:
  * when run as root: enters new network and mount namespaces (no network at all; private
    tmpfs over /tmp, /var/tmp and /dev/shm, so nothing written there survives), and drops
    to a fresh unprivileged uid/gid per run (it cannot read root-only files, another
    process's environment, or signal the caller); without root these steps are skipped and
    `isolation()` says so;
  * sets rlimits: CPU seconds, address space, file size, process count, open files, no core;
  * starts a new session, works in a throwaway directory, with a clean environment.
The caller enforces a wall-clock timeout, caps captured output, and afterwards kills every
process left in the run's session and uid.

Many tests of one program run in one sandboxed process (`harness`): the program is
exec'd once per test in a fresh namespace with stdin/stdout redirected, and only its
outputs come back; expected outputs never enter the sandbox, so a program can't forge a
pass. If the shared process dies or times out, the tests it did not finish are re-run one
process per test. `run_tests` returns one `TestResult` per input.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

JAIL = Path(__file__).with_name("_jail.py")


@dataclass(frozen=True)
class Limits:
    cpu_s: float = 2.0  # CPU seconds per test
    wall_s: float = 10.0  # wall seconds per sandboxed process, at least
    memory_mb: int = 512
    file_mb: int = 8
    nproc: int = 16
    open_files: int = 64
    output_kb: int = 256  # stdout kept per test (and the cap on what a process may send)


@dataclass
class TestResult:
    status: str  # ok | error | timeout | killed | output_limit
    stdout: str
    stderr: str = ""
    seconds: float = 0.0


HARNESS = r"""
import io, json, os, signal, sys, time
cfg = json.loads(sys.stdin.read())
out = os.fdopen(os.dup(1), "w")
devnull = os.open(os.devnull, os.O_RDWR)
os.dup2(devnull, 0); os.dup2(devnull, 1)
code = compile(cfg["code"], "<program>", "exec")
cap = cfg["output_bytes"]
class Timeout(BaseException):
    pass
def alarm(*_):
    raise Timeout()
signal.signal(signal.SIGALRM, alarm)
for data in cfg["inputs"]:
    sys.stdin = io.StringIO(data)
    buf, err = io.StringIO(), io.StringIO()
    sys.stdout, sys.stderr = buf, err
    status, start = "ok", time.process_time()
    signal.setitimer(signal.ITIMER_PROF, cfg["cpu_s"])
    try:
        exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit as e:
        if e.code not in (None, 0):
            status = "error"
    except Timeout:
        status = "timeout"
    except BaseException as e:
        status = "error"
        err.write(type(e).__name__ + ": " + str(e)[:500])
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
    text = buf.getvalue()
    if len(text) > cap:
        status, text = "output_limit", text[:cap]
    out.write(json.dumps({"status": status, "stdout": text, "stderr": err.getvalue()[-2000:],
                          "seconds": time.process_time() - start}) + "\n")
    out.flush()
"""

SINGLE = r"""
import json, sys
cfg = json.loads(sys.stdin.readline())
sys.argv = ["program"]
exec(compile(cfg["code"], "<program>", "exec"), {"__name__": "__main__"})
"""


def interpreter() -> str:
    """A Python the sandbox uid can execute: this one if every parent dir is world-
    searchable (a venv under a 0700 home is not), else the system's."""
    exe = Path(sys.executable).resolve()
    if os.geteuid() != 0 or all(os.stat(p).st_mode & 0o001 for p in exe.parents):
        return str(exe)
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(candidate):
            return candidate
    return str(exe)


def isolation() -> dict:
    """What this machine's sandbox enforces (rlimits always; the rest needs root)."""
    root = os.geteuid() == 0
    return {"rlimits": True, "fresh_uid": root, "network_namespace": root,
            "private_tmp": root, "clean_env": True, "interpreter": interpreter()}


_uid_counter = [0]


def _fresh_uid() -> int:
    _uid_counter[0] += 1
    return 200_000 + (os.getpid() % 10_000) * 100 + _uid_counter[0] % 100


def _launch(script: str, payload: str, limits: Limits, cpu_total: float, wall: float,
            max_bytes: int, lines: int | None = None) -> tuple[int | None, bytes, bytes, bool]:
    """Run `script` in the jail with `payload` on stdin; returns (rc, out, err, timed_out).
    Reading stops at `lines` complete output lines, when given."""
    uid = _fresh_uid()
    work = tempfile.mkdtemp(prefix="rlany-sbx-")
    cfg = {"uid": uid, "cpu_s": cpu_total, "memory_mb": limits.memory_mb,
           "file_mb": limits.file_mb, "nproc": limits.nproc, "open_files": limits.open_files,
           "work": work, "argv": [interpreter(), "-I", "-S", "-c", script]}
    os.chmod(work, 0o777)
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp"}
    proc = subprocess.Popen([sys.executable, "-I", "-S", str(JAIL), json.dumps(cfg)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, cwd=work, start_new_session=True)
    timed_out = False
    try:
        out, err = _communicate(proc, payload.encode(), wall, max_bytes, lines)
    except subprocess.TimeoutExpired:
        timed_out = True
        out, err = b"", b""
    finally:
        _kill_all(proc, uid)
        shutil.rmtree(work, ignore_errors=True)
    return proc.returncode, out, err, timed_out


def _communicate(proc: subprocess.Popen, data: bytes, wall: float, max_bytes: int,
                 lines: int | None) -> tuple[bytes, bytes]:
    """Like communicate(), but stops past `max_bytes` of output, after `lines` lines, or
    soon after the main process exits (a grandchild may hold the pipes open forever)."""
    import selectors

    proc.stdin.write(data)
    proc.stdin.close()
    out, err = bytearray(), bytearray()
    deadline = time.monotonic() + wall
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, out)
    sel.register(proc.stderr, selectors.EVENT_READ, err)
    exited_at = None
    while sel.get_map():
        now = time.monotonic()
        if now >= deadline:
            raise subprocess.TimeoutExpired(proc.args, wall)
        if exited_at is None and proc.poll() is not None:
            exited_at = now
        if exited_at is not None and now - exited_at > 0.2:
            break
        if lines is not None and out.count(b"\n") >= lines:
            break
        for key, _ in sel.select(timeout=min(deadline - now, 0.1)):
            chunk = os.read(key.fileobj.fileno(), 65536)
            if not chunk:
                sel.unregister(key.fileobj)
                continue
            key.data.extend(chunk)
            if len(out) > max_bytes or len(err) > 65536:
                return bytes(out[:max_bytes + 1]), bytes(err[-65536:])
    try:
        proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    return bytes(out), bytes(err)


def _kill_all(proc: subprocess.Popen, uid: int) -> None:
    """Kill the run's session and, when a uid was dropped to, every process of that uid."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if os.geteuid() == 0:
        for _ in range(3):  # a fork bomb may be forking while we look
            found = False
            for pid in os.listdir("/proc"):
                if not pid.isdigit():
                    continue
                try:
                    if os.stat(f"/proc/{pid}").st_uid == uid:
                        os.kill(int(pid), signal.SIGKILL)
                        found = True
                except (FileNotFoundError, ProcessLookupError, PermissionError):
                    pass
            if not found:
                break
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    for stream in (proc.stdout, proc.stderr):
        if stream:
            stream.close()


def run_tests(code: str, inputs: list[str], limits: Limits = Limits()) -> list[TestResult]:
    """Run `code` (a stdin/stdout Python program) on each input; one result per input."""
    cap = limits.output_kb * 1024
    payload = json.dumps({"code": code, "inputs": inputs, "cpu_s": limits.cpu_s,
                          "output_bytes": cap})
    wall = max(limits.wall_s, limits.cpu_s * len(inputs) * 2 + 2)
    rc, out, err, timed_out = _launch(HARNESS, payload, limits, limits.cpu_s * len(inputs) + 1,
                                      wall, cap * len(inputs) + 65536, lines=len(inputs))
    results: list[TestResult] = []
    for line in out.decode("utf-8", "replace").splitlines():
        try:
            r = json.loads(line)
            results.append(TestResult(r["status"], r["stdout"], r.get("stderr", ""),
                                      r.get("seconds", 0.0)))
        except (ValueError, KeyError, TypeError):
            break  # the program wrote to the result stream: trust nothing after it
        if len(results) == len(inputs):
            break
    if timed_out and len(results) < len(inputs):
        # the test that was running when the wall clock ran out hung: no second chance
        results.append(TestResult("timeout", "", err.decode("utf-8", "replace")[-2000:],
                                  wall))
    # the shared process died or was tampered with: the rest, one process each
    for data in inputs[len(results):]:
        results.append(run_one(code, data, limits))
    return results


def run_one(code: str, data: str, limits: Limits = Limits()) -> TestResult:
    """One test in its own sandboxed process (the program's real stdin/stdout)."""
    cap = limits.output_kb * 1024
    payload = json.dumps({"code": code}) + "\n" + data
    start = time.monotonic()
    rc, out, err, timed_out = _launch(SINGLE, payload, limits, limits.cpu_s + 0.5,
                                      max(limits.wall_s, limits.cpu_s * 3), cap)
    seconds = time.monotonic() - start
    stderr = err.decode("utf-8", "replace")[-2000:]
    if timed_out or rc == -signal.SIGXCPU or rc == -signal.SIGKILL and not out:
        return TestResult("timeout" if timed_out or rc == -signal.SIGXCPU else "killed",
                          "", stderr, seconds)
    text = out.decode("utf-8", "replace")
    if len(out) > cap:
        return TestResult("output_limit", text[:cap], stderr, seconds)
    return TestResult("ok" if rc == 0 else "error", text, stderr, seconds)


def outputs_match(got: str, want: str) -> bool:
    """Token-wise comparison, as judges of stdin/stdout problems do (whitespace-insensitive)."""
    return got.split() == want.split()
