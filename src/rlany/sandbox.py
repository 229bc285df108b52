"""Run model-written programs, which are hostile until proven otherwise.

Reward hacking by reading the grader is what RL finds first, so the program must not see
the hidden tests' expected outputs anywhere: they never leave this process (only inputs
are sent), and the program's filesystem holds nothing of the host's task or run files.

Every program runs in a separate process tree built by `_jail.py`, in the strongest mode
this machine allows (probed once; `isolation()` says which and why):
  * `bwrap` (root + bubblewrap): new mount, PID, IPC, UTS, network and cgroup namespaces;
    a minimal read-only root (/usr, the interpreter and its stdlib, no site-packages);
    private tmpfs at /tmp and /dev/shm; a fresh unprivileged uid per run. Nothing of the
    checkout, run directories, /run/lock, /var/tmp or $HOME is there; SysV IPC objects
    and every process die with the namespaces.
  * `bwrap-userns` (not root, unprivileged user namespaces): the same, inside a user
    namespace, without the fresh uid.
  * `unshare` (root, no bwrap): network, mount, IPC, UTS namespaces, private tmpfs over
    /tmp, /var/tmp, /dev/shm, /run/lock and a fresh uid, but the rest of the host's
    filesystem stays readable where its modes allow (world-readable task files too).
  * `none`: rlimits, a clean environment and a throwaway directory only.
In every mode: rlimits (CPU seconds, address space, file size, processes, open files, no
core), a clean environment, a wall-clock limit per test, capped output, and every process
of the run killed afterwards.

Many tests of one program run in one sandboxed process (`HARNESS`): the program is exec'd
once per test in a fresh globals dict with stdin/stdout redirected, and only its outputs
come back. The wall clock restarts at each result, so a hung test costs `wall_s`; after a
timeout the remaining tests are `skipped` (`fail_fast`), and results return as soon as
they are all in. If the shared process dies, the tests it did not finish are re-run one
process per test. `run_tests` returns one `TestResult` per input.
"""

from __future__ import annotations

import itertools
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

from rlany import _jail
from rlany.errors import RlanyError

JAIL = Path(_jail.__file__)


@dataclass(frozen=True)
class Limits:
    cpu_s: float = 2.0  # CPU seconds per test
    wall_s: float = 10.0  # wall seconds per test, at least (2 x cpu_s when larger)
    memory_mb: int = 512
    file_mb: int = 8
    nproc: int = 16
    open_files: int = 64
    output_kb: int = 256  # stdout kept per test (and the cap on what a process may send)


class SandboxFailed(RlanyError):
    """The jail itself did not start (bwrap's setup, `_jail`'s namespaces, the interpreter):
    no program ran, so there is no verdict to give. An env's step raising it makes the
    episode an errored one, not a wrong program."""


@dataclass
class TestResult:
    status: str  # ok | error | timeout | killed | output_limit | skipped
    stdout: str
    stderr: str = ""
    seconds: float = 0.0


HARNESS = r"""
import io, json, os, signal, sys, time
cfg = json.loads(sys.stdin.read())
out = os.fdopen(os.dup(1), "w")
devnull = os.open(os.devnull, os.O_RDWR)
os.dup2(devnull, 0); os.dup2(devnull, 1)
def report(status, stdout="", stderr="", seconds=0.0):
    out.write(json.dumps({"status": status, "stdout": stdout, "stderr": stderr,
                          "seconds": seconds}) + "\n")
    out.flush()
try:
    code = compile(cfg["code"], "<program>", "exec")
except BaseException as e:
    for _ in cfg["inputs"]:
        report("error", "", type(e).__name__ + ": " + str(e)[:500])
    os._exit(0)
out.write("\n"); out.flush()  # ready: the caller's wall clock for test 1 starts now
cap = cfg["output_bytes"]
class Timeout(BaseException):
    pass
def alarm(*_):
    raise Timeout()
signal.signal(signal.SIGALRM, alarm)
signal.signal(signal.SIGPROF, alarm)
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
    report(status, text, err.getvalue()[-2000:], time.process_time() - start)
    if status == "timeout" and cfg["fail_fast"]:
        break
os._exit(0)  # a leftover thread must not keep the process (and the caller) waiting
"""

SINGLE = r"""
import json, sys
cfg = json.loads(sys.stdin.readline())
sys.argv = ["program"]
sys.stdout.write("\n"); sys.stdout.flush()  # ready: the jail started, the program runs now
exec(compile(cfg["code"], "<program>", "exec"), {"__name__": "__main__"})
"""

_MODE: dict | None = None  # the mode probed on first use (tests may set it)
_uids = itertools.count(1)


def isolation() -> dict:
    """What this machine's sandbox enforces: the mode, why not a stronger one, and each
    guarantee as a flag (see the module doc)."""
    mode = _mode()
    name, bwrap = mode["mode"], mode["mode"].startswith("bwrap")
    return {"mode": name, "reason": mode["reason"], "rlimits": True, "clean_env": True,
            "fresh_uid": name in ("bwrap", "unshare"), "network_namespace": name != "none",
            "ipc_namespace": name != "none", "uts_namespace": name != "none",
            "pid_namespace": bwrap, "minimal_root": bwrap, "private_tmp": name != "none",
            "interpreter": interpreter(name)}


def interpreter(mode: str | None = None) -> str:
    """The Python that runs programs: this one, unless the `unshare` mode's fresh uid can't
    reach it (a venv under a 0700 home), then the system's. bwrap mounts it reachable."""
    exe = Path(sys.executable).resolve()
    if (mode or _mode()["mode"]) != "unshare" or all(os.stat(p).st_mode & 0o001
                                                     for p in exe.parents):
        return str(exe)
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(candidate):
            return candidate
    return str(exe)


def _mode() -> dict:
    global _MODE
    if _MODE is None:
        _MODE = _detect()
    return _MODE


def _detect() -> dict:
    """The strongest mode whose probe runs a program correctly, and why not stronger."""
    root, bwrap = os.geteuid() == 0, shutil.which("bwrap")
    reasons, candidates = [], []
    if bwrap:
        candidates.append("bwrap" if root else "bwrap-userns")
    else:
        reasons.append("bwrap not found (apt-get install bubblewrap)")
    if root:
        candidates.append("unshare")
    else:
        reasons.append("not root: no fresh uid")
    for name in candidates:
        mode = {"mode": name, "reason": "", "bwrap": bwrap}
        probe = Limits(cpu_s=2.0, wall_s=10.0)
        rc, out, err, _ = _launch(mode, SINGLE, json.dumps({"code": "print(6 * 7)"}) + "\n",
                                  probe, 2.0, 10.0, 1024)
        if rc == 0 and out.strip() == b"42":
            return dict(mode, reason="; ".join(reasons))
        reasons.append(f"{name} failed (rc {rc}: {err.decode(errors='replace')[-200:]!r})")
    return {"mode": "none", "reason": "; ".join(reasons), "bwrap": bwrap}


def _launch(mode: dict, script: str, payload: str, limits: Limits, cpu_total: float,
            wall: float, max_bytes: int, lines: int | None = None
            ) -> tuple[int | None, bytes, bytes, bool]:
    """Run `script` in the jail with `payload` on stdin; returns (rc, out, err, timed_out),
    rc negative for a signal as in subprocess. With `lines`, reading stops at that many
    output lines and the wall clock restarts at each one."""
    name = mode["mode"]
    python = interpreter(name)
    uid = 200_000 + (os.getpid() % 10_000) * 100 + next(_uids) % 100 \
        if name in ("bwrap", "unshare") else None
    host_work = tempfile.mkdtemp(prefix="rlany-sbx-") if name == "none" else None
    cfg = {"uid": uid, "unshare": name == "unshare", "cpu_s": cpu_total,
           "memory_mb": limits.memory_mb, "file_mb": limits.file_mb, "nproc": limits.nproc,
           "open_files": limits.open_files, "argv": [python, "-I", "-S", "-c", script],
           "work": {"unshare": "/tmp/work", "none": host_work}.get(name, "/tmp")}
    if name.startswith("bwrap"):
        if "argv" not in mode:  # the mounts are the same for every run: build them once
            mode["argv"] = _jail.bwrap_argv(mode["bwrap"], python, name == "bwrap")
        argv = mode["argv"] + [python, "-I", "-S", "-c", JAIL.read_text(), json.dumps(cfg)]
    else:
        if host_work and uid is not None:
            os.chmod(host_work, 0o777)
        argv = [sys.executable, "-I", "-S", str(JAIL), json.dumps(cfg)]
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp"}
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, cwd="/", start_new_session=True)
    try:
        out, err, timed_out = _communicate(proc, payload.encode(), wall, max_bytes, lines)
    finally:
        _kill_all(proc, uid)
        if host_work:
            shutil.rmtree(host_work, ignore_errors=True)
    rc = proc.returncode
    if name.startswith("bwrap") and rc is not None and rc > 128:
        rc = 128 - rc  # bwrap reports a program killed by signal s as exit code 128 + s
    return rc, out, err, timed_out


def _communicate(proc: subprocess.Popen, data: bytes, wall: float, max_bytes: int,
                 lines: int | None) -> tuple[bytes, bytes, bool]:
    """Like communicate() with a timeout, but never blocks on a program that won't read its
    stdin, stops past `max_bytes` of output or at `lines` lines (the wall clock restarting
    at each), and soon after the main process exits (a grandchild may hold the pipes)."""
    import selectors

    out, err = bytearray(), bytearray()
    os.set_blocking(proc.stdin.fileno(), False)
    sel = selectors.DefaultSelector()
    sel.register(proc.stdin, selectors.EVENT_WRITE)
    sel.register(proc.stdout, selectors.EVENT_READ, out)
    sel.register(proc.stderr, selectors.EVENT_READ, err)
    sent, seen, readers, exited_at = 0, 0, 2, None
    deadline = time.monotonic() + wall
    while readers:
        now = time.monotonic()
        if lines is not None and seen >= lines:
            return bytes(out), bytes(err), False
        if now >= deadline:
            return bytes(out), bytes(err), True
        if exited_at is None and proc.poll() is not None:
            exited_at = now
        if exited_at is not None and now - exited_at > 0.2:
            break
        for key, _ in sel.select(timeout=min(deadline - now, 0.1)):
            if key.fileobj is proc.stdin:
                try:
                    sent += os.write(proc.stdin.fileno(), data[sent:sent + 65536])
                except BlockingIOError:
                    continue
                except OSError:  # it closed its stdin: it will read no more
                    sent = len(data)
                if sent >= len(data):
                    sel.unregister(proc.stdin)
                    proc.stdin.close()
                continue
            chunk = os.read(key.fileobj.fileno(), 65536)
            if not chunk:
                sel.unregister(key.fileobj)
                readers -= 1
                continue
            key.data.extend(chunk)
            if key.data is out and b"\n" in chunk:
                seen += chunk.count(b"\n")
                deadline = time.monotonic() + wall
            if len(out) > max_bytes or len(err) > 65536:
                return bytes(out[:max_bytes + 1]), bytes(err[-65536:]), False
    try:
        proc.wait(timeout=max(0.0, min(deadline - time.monotonic(), 1.0)))
    except subprocess.TimeoutExpired:
        pass
    return bytes(out), bytes(err), False


def _kill_all(proc: subprocess.Popen, uid: int | None) -> None:
    """Kill the run's session (in the bwrap modes its PID namespace dies with it) and,
    when a uid was dropped to, every process of that uid."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for _ in range(3 if uid is not None else 0):  # a fork bomb may fork while we look
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
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream and not stream.closed:
            stream.close()


def run_tests(code: str, inputs: list[str], limits: Limits = Limits(), *,
              fail_fast: bool = True) -> list[TestResult]:
    """Run `code` (a stdin/stdout Python program) on each input; one result per input.
    With `fail_fast`, the tests after one that timed out are `skipped`, not run."""
    if not inputs:
        return []
    cap = limits.output_kb * 1024
    payload = json.dumps({"code": code, "inputs": inputs, "cpu_s": limits.cpu_s,
                          "output_bytes": cap, "fail_fast": fail_fast})
    wall = max(limits.wall_s, limits.cpu_s * 2)
    rc, out, err, timed_out = _launch(_mode(), HARNESS, payload, limits,
                                      limits.cpu_s * len(inputs) + 1, wall,
                                      cap * len(inputs) + 65536, lines=len(inputs) + 1)
    if not out:  # no ready line, no result (exited or hung): the harness never ran
        _jail_failed(rc, err.decode("utf-8", "replace"))
    results: list[TestResult] = []
    for k, line in enumerate(out.decode("utf-8", "replace").splitlines()):
        if k == 0 and not line:
            continue  # the harness's "ready" line
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
    for data in inputs[len(results):]:
        if fail_fast and results and results[-1].status in ("timeout", "skipped"):
            results.append(TestResult("skipped", "", "not run: an earlier test timed out"))
        else:  # the shared process died or was tampered with: the rest, one process each
            results.append(run_one(code, data, limits))
    return results


def run_one(code: str, data: str, limits: Limits = Limits()) -> TestResult:
    """One test in its own sandboxed process (the program's real stdin/stdout)."""
    cap = limits.output_kb * 1024
    payload = json.dumps({"code": code}) + "\n" + data
    start = time.monotonic()
    rc, out, err, timed_out = _launch(_mode(), SINGLE, payload, limits, limits.cpu_s + 0.5,
                                      max(limits.wall_s, limits.cpu_s * 2), cap + 1)
    seconds = time.monotonic() - start
    stderr = err.decode("utf-8", "replace")[-2000:]
    if not out.startswith(b"\n"):  # no ready line: the program never began
        _jail_failed(rc, stderr)
    out = out[1:]
    if timed_out or rc == -signal.SIGXCPU or rc == -signal.SIGKILL and not out:
        return TestResult("timeout" if timed_out or rc == -signal.SIGXCPU else "killed",
                          "", stderr, seconds)
    text = out.decode("utf-8", "replace")
    if len(out) > cap:
        return TestResult("output_limit", text[:cap], stderr, seconds)
    return TestResult("ok" if rc == 0 else "error", text, stderr, seconds)


def _jail_failed(rc: int | None, stderr: str) -> None:
    last = (stderr.strip().splitlines() or ["(no message)"])[-1][:300]
    raise SandboxFailed(f"the sandbox ({_mode()['mode']}) did not start: exit {rc}: {last}")


def outputs_match(got: str, want: str) -> bool:
    """Token-wise comparison, as judges of stdin/stdout problems do (whitespace-insensitive)."""
    return got.split() == want.split()
