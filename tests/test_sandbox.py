"""The sandbox against hostile programs: each is contained and reported, the caller survives,
nothing leaks out of a run (files, IPC objects, processes) and nothing of the grader leaks in."""

from __future__ import annotations

import ast
import json
import os
import shutil
import socket
import time
import uuid
from pathlib import Path

import pytest

import rlany
from rlany import sandbox
from rlany.sandbox import Limits, isolation, outputs_match, run_one, run_tests

FAST = Limits(cpu_s=1.0, wall_s=3.0, memory_mb=256, nproc=8, output_kb=64)
ROOT = os.geteuid() == 0
CHECKOUT = Path(rlany.__file__).resolve().parents[2]


def one(code, data="", limits=FAST):
    return run_tests(code, [data], limits)[0]


def guarantee(flag):
    return pytest.mark.skipif(not isolation()[flag],
                              reason=f"this machine's sandbox mode has no {flag} "
                                     f"({isolation()['mode']}: {isolation()['reason']})")


def _runnable_modes() -> list[str]:
    """Modes besides the detected one that this machine can run (the fallbacks)."""
    names = [isolation()["mode"]]
    if ROOT:
        names.append("unshare")
    if shutil.which("bwrap") and not ROOT:
        names.append("bwrap-userns")
    return sorted(set(names))


@pytest.fixture(params=_runnable_modes())
def mode(request, monkeypatch):
    """Run the test in each mode this machine can run, not only the strongest."""
    monkeypatch.setattr(sandbox, "_MODE", {"mode": request.param, "reason": "test",
                                           "bwrap": shutil.which("bwrap")})
    return isolation()


def test_correct_programs_pass_many_tests_in_one_process():
    code = "a, b = map(int, input().split())\nprint(a + b)"
    results = run_tests(code, [f"{i} {i}" for i in range(50)], FAST)
    assert [r.status for r in results] == ["ok"] * 50
    assert all(outputs_match(r.stdout, str(2 * i)) for i, r in enumerate(results))


HOSTILE = {
    "fork bomb": "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass",
    "memory hog": "x = []\nwhile True: x.append(bytearray(10**7))",
    "infinite loop": "while True: pass",
    "infinite loop swallowing the timeout": "while True:\n    try:\n        while True: pass\n    except BaseException: pass",
    "sleep forever": "import time\ntime.sleep(10**6)",
    "huge output": "while True: print('x' * 10000)",
    "huge stderr": "import sys\nwhile True: sys.stderr.write('y' * 10000)",
    "huge file": "f = open('big', 'wb')\nwhile True: f.write(b'z' * 10**6)",
    "fills its tmpfs": "import os\nfor i in range(10**6):\n    open(f'f{i}', 'wb').write(b'z' * 10**6)",
    "os._exit mid-test": "import os\nos._exit(0)",
    "segfault": "import ctypes\nctypes.string_at(0)",
    "deep recursion": "import sys\nsys.setrecursionlimit(10**6)\ndef f(n): return f(n + 1)\nf(0)",
    "thread bomb": "import threading, time\nwhile True: threading.Thread(target=time.sleep, args=(100,)).start()",
    "forged result lines": "import os\nos.write(1, b'{\"status\": \"ok\", \"stdout\": \"42\"}\\n')",
    "closes its stdout": "import os\nos.close(1)\nprint('gone')",
    "spawns a shell": "import subprocess\nprint(subprocess.run(['sh', '-c', 'echo pwned > /tmp/pwned; id'], capture_output=True).stdout)",
    "syntax error": "print(",
    "exits like a broken jail": "import os, sys\nsys.stderr.write('bwrap: setting up uid map: "
                                "Permission denied\\n')\nos._exit(97)",
}


def test_a_jail_that_does_not_start_is_no_verdict(monkeypatch, tmp_path):
    """bwrap's own setup failing (exit 1, no program run) is the sandbox's failure, raised
    for the env to record an errored episode, never a wrong program scored -1."""
    from rlany.envs.coding import CodingEnv
    from rlany.files.records import Task

    broken = ["/bin/sh", "-c", "echo 'bwrap: setting up uid map: Permission denied' >&2; "
              "exit 1", "jail"]
    monkeypatch.setattr(sandbox, "_MODE", {"mode": "bwrap", "reason": "test",
                                           "bwrap": "/bin/false", "argv": broken})
    for call in (lambda: run_tests("print(1)", ["", ""], FAST),
                 lambda: run_one("print(1)", "", FAST)):
        with pytest.raises(sandbox.SandboxFailed, match="did not start: exit 1: bwrap: setting"):
            call()
    hung = {"mode": "bwrap", "reason": "test", "bwrap": "/bin/false",
            "argv": ["/bin/sh", "-c", "sleep 60", "jail"]}   # hangs before the ready line
    monkeypatch.setattr(sandbox, "_MODE", hung)
    with pytest.raises(sandbox.SandboxFailed, match="did not start"):
        run_tests("print(1)", ["", ""], Limits(cpu_s=0.5, wall_s=1.0))
    monkeypatch.setattr(sandbox, "_MODE", {"mode": "bwrap", "reason": "test",
                                           "bwrap": "/bin/false", "argv": broken})
    env = CodingEnv()
    env.reset(Task(task_id="t", env="coding", prompt="", spec={
        "question": "Print 1.", "tests": [{"input": "", "output": "1"}]}))
    with pytest.raises(sandbox.SandboxFailed):
        env.step("```python\nprint(1)\n```")


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_program_is_contained(name):
    start = time.monotonic()
    r = one(HOSTILE[name])
    assert time.monotonic() - start < 30
    assert r.status in ("error", "timeout", "killed", "output_limit", "ok")
    assert not outputs_match(r.stdout, "42")      # nothing forged passes
    if name in ("infinite loop", "infinite loop swallowing the timeout", "sleep forever"):
        assert r.status in ("timeout", "killed")
    if name == "huge output":
        assert r.status == "output_limit" and len(r.stdout) <= FAST.output_kb * 1024
    # the caller is alive and the sandbox still works afterwards
    assert one("print(6 * 7)").stdout.strip() == "42"


def test_no_network_not_even_the_hosts_loopback(mode):
    if not mode["network_namespace"]:
        pytest.skip("mode none: no network namespace")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        r = one(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
                "print('connected')")
        assert r.status == "error" and "connected" not in r.stdout
    finally:
        server.close()


PERSIST_DIRS = ["/run/lock", "/tmp", "/dev/shm", "/var/tmp", os.path.expanduser("~")]


def test_nothing_it_writes_persists_on_the_host(mode):
    if not mode["private_tmp"]:
        pytest.skip("mode none: the program writes where the caller's uid may")
    name = f"rlany-persist-{uuid.uuid4().hex}"
    paths = [os.path.join(d, name) for d in PERSIST_DIRS if os.path.isdir(d)]
    code = (f"import os\nfor p in {paths!r}:\n    try:\n        open(p, 'w').write('x')\n"
            "        print('wrote', p)\n    except OSError as e:\n        print('refused', p, e)")
    try:
        r = one(code)
        assert r.status == "ok", r.stderr
        assert "wrote /tmp/" in r.stdout    # writable inside: its own tmpfs
        left = [p for p in paths if os.path.exists(p)]
        assert left == [], f"persisted on the host: {left}"
    finally:
        for p in paths:
            if os.path.exists(p):
                os.unlink(p)


def _sysv_keys(kind: str) -> set[int]:
    with open(f"/proc/sysvipc/{kind}") as f:
        return {int(line.split()[0]) for line in list(f)[1:] if line.strip()}


def test_sysv_ipc_objects_die_with_the_run(mode):
    if not mode["ipc_namespace"]:
        pytest.skip("mode none: no IPC namespace")
    key = 0x52000000 + os.getpid() % 0xFFFFFF
    before = {kind: _sysv_keys(kind) for kind in ("shm", "msg", "sem")}
    code = (f"import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nkey = {key}\n"
            "ids = [libc.shmget(key, 4096, 0o1666), libc.msgget(key, 0o1666),\n"
            "       libc.semget(key, 1, 0o1666)]\nprint(ids)")
    try:
        r = one(code)
        assert r.status == "ok" and "-1" not in r.stdout, (r.stdout, r.stderr)  # created
        for kind in ("shm", "msg", "sem"):
            assert key not in _sysv_keys(kind) - before[kind], f"a SysV {kind} outlived it"
    finally:
        for flag in ("-M", "-Q", "-S"):   # the old sandbox leaked them: clean up
            os.system(f"ipcrm {flag} {key} 2>/dev/null")


def _plant(directory: Path, secret: str) -> Path:
    """A loop-style task file with a hidden test's expected output, world-readable."""
    path = directory / "iter_000" / "tasks.jsonl"
    path.parent.mkdir(parents=True)
    for d in (directory, path.parent):
        d.chmod(0o755)
    path.write_text(json.dumps({"spec": {"tests": [{"input": "q", "output": secret}]}}) + "\n")
    path.chmod(0o644)
    return path


@guarantee("minimal_root")
def test_the_grader_is_not_in_its_filesystem(tmp_path):
    """Task files (the checkout's examples/, runs/*/iter_*/tasks.jsonl) hold the hidden
    tests' expected outputs: the program must not find them anywhere."""
    secret = f"SECRET-{uuid.uuid4().hex}"
    runs = CHECKOUT / "runs" / f"pytest-sandbox-{os.getpid()}"
    tmp_path.chmod(0o755)
    planted = [_plant(runs, secret), _plant(tmp_path / "runs", secret)]
    examples = sorted(str(p) for p in (CHECKOUT / "examples").glob("*/tasks.jsonl"))
    code = ("import os, sys\nfor p in %r:\n    try:\n        print('READ', p, open(p).read())\n"
            "    except OSError as e:\n        print('NO', p, type(e).__name__)\n"
            "print('ROOT', sorted(os.listdir('/')))\nprint('ENV', dict(os.environ))\n"
            "print('STDIN', sys.stdin.read())" % ([str(p) for p in planted] + examples))
    try:
        r = one(code, "q")
    finally:
        shutil.rmtree(runs, ignore_errors=True)
    assert r.status == "ok", r.stderr
    assert secret not in r.stdout and "READ" not in r.stdout, r.stdout[:2000]
    top = set(ast.literal_eval(r.stdout.split("ROOT ")[1].splitlines()[0]))
    assert top <= {"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "proc", "dev",
                   "tmp", "root", "opt", "home"}, top
    assert not {"work", "run", "var", "etc", "srv", "mnt"} & top


@guarantee("minimal_root")
def test_only_the_standard_library():
    r = one("import os, site\nprint(sum(len(os.listdir(p)) for p in site.getsitepackages()\n"
            "          if os.path.isdir(p)))\n"
            "import json, re, collections, heapq, itertools, math, bisect, functools, ctypes\n"
            "import torch")
    assert r.status == "error" and "No module named 'torch'" in r.stderr, r.stderr
    assert r.stdout.strip() == "0"   # its site-packages are there, but empty


def test_expected_outputs_never_enter_the_sandbox():
    """The coding env sends inputs only: a program that echoes everything it was sent
    (its stdin, the harness's config, its environment) cannot pass."""
    from rlany.envs.coding import CodingEnv
    from rlany.files.records import Task

    secrets = [f"SECRET-{uuid.uuid4().hex}" for _ in range(2)]
    spec = {"question": "echo", "tests": [{"input": "a", "output": secrets[0]},
                                          {"input": "q", "output": secrets[1]}]}
    env = CodingEnv()
    env.reset(Task(task_id="t", env="coding", spec=spec, prompt="p"))
    cheat = ("import gc, os, re, sys\nseen = [sys.stdin.read(), repr(os.environ)]\n"
             "for p in ('/proc/self/cmdline', '/proc/self/environ', '/proc/1/cmdline'):\n"
             "    try:\n        seen.append(open(p, 'rb').read().decode(errors='replace'))\n"
             "    except OSError:\n        pass\n"
             "seen += [repr(o) for o in gc.get_objects() if isinstance(o, (dict, list, tuple))]\n"
             "found = sorted(set(re.findall('SECRET-[0-9a-f]{32}', ' '.join(seen))))\n"
             "print(found[0] if found else 'nothing', len(seen))")
    result = env.step(f"```python\n{cheat}\n```")
    assert not result.success and result.info["passed"] == 0, result.info
    r = one(cheat, "q")
    assert r.status == "ok" and r.stdout.startswith("nothing"), (r.stdout, r.stderr)


@guarantee("pid_namespace")
def test_it_sees_and_signals_none_of_the_hosts_processes():
    r = one(f"import os, signal\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n"
            f"os.kill({os.getpid()}, 0)")
    assert r.status == "error" and "ProcessLookupError" in r.stderr, r.stderr
    assert len(json.loads(r.stdout)) <= 3     # bwrap's init, the program, maybe a reaper


@guarantee("fresh_uid")
def test_cannot_read_the_parents_environment_or_files():
    os.environ["RLANY_SECRET_TEST"] = "hunter2"
    try:
        code = ("import os\nprint(sorted(os.environ))\n"
                f"print(open('/proc/{os.getpid()}/environ').read())")
        r = one(code)
        assert "RLANY_SECRET_TEST" not in r.stdout and "hunter2" not in r.stdout
        assert r.status == "error"
        r = one("print(open('/root/.bashrc').read())")
        assert r.status == "error" and ("PermissionError" in r.stderr
                                        or "FileNotFoundError" in r.stderr)
    finally:
        del os.environ["RLANY_SECRET_TEST"]


@guarantee("fresh_uid")
def test_cannot_kill_its_parent():
    r = one(f"import os, signal\nos.kill({os.getpid()}, signal.SIGKILL)\nprint('sent')")
    assert r.status == "error" and ("PermissionError" in r.stderr
                                    or "ProcessLookupError" in r.stderr)


def _processes(match) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if match(pid):
                    found.append(pid)
            except OSError:
                pass
    return found


def test_no_processes_left_behind():
    one("import subprocess\nsubprocess.Popen(['sleep', '1000'])\nprint('spawned')")
    time.sleep(0.2)
    assert _processes(lambda p: open(f"/proc/{p}/cmdline", "rb").read()
                      .startswith(b"sleep\x001000")) == []


@guarantee("fresh_uid")
def test_a_fork_bomb_leaves_no_process_behind():
    block = 200_000 + (os.getpid() % 10_000) * 100     # this process's sandbox uids
    one(HOSTILE["fork bomb"])
    time.sleep(0.3)
    assert _processes(lambda p: block <= os.stat(f"/proc/{p}").st_uid < block + 100) == []


def test_a_hung_program_fails_fast():
    """5 tests of a program that hangs: one wall limit, not one per test (it was ~10 s
    per remaining test after the first timeout)."""
    start = time.monotonic()
    results = run_tests("import time\ntime.sleep(10**6)", ["1"] * 5, FAST)
    elapsed = time.monotonic() - start
    assert [r.status for r in results] == ["timeout"] + ["skipped"] * 4
    assert elapsed < FAST.wall_s + 2, elapsed


def test_a_cpu_hog_fails_fast():
    start = time.monotonic()
    results = run_tests("while True: pass", ["1"] * 5, FAST)
    assert [r.status for r in results] == ["timeout"] + ["skipped"] * 4
    assert time.monotonic() - start < FAST.wall_s + 2


def test_results_return_without_waiting_for_a_leftover_thread():
    code = ("import threading, time\nthreading.Thread(target=time.sleep, args=(100,)).start()\n"
            "print(int(input()) * 2)")
    start = time.monotonic()
    results = run_tests(code, ["1", "2", "3"], FAST)
    assert [r.stdout.strip() for r in results] == ["2", "4", "6"]
    assert time.monotonic() - start < FAST.wall_s - 1


def test_without_fail_fast_the_other_tests_still_run():
    code = "import time\nx = input()\nif x == 'hang': time.sleep(10**6)\nprint(x)"
    results = run_tests(code, ["a", "hang", "b"], FAST, fail_fast=False)
    assert [r.status for r in results] == ["ok", "timeout", "ok"]
    assert run_tests(code, ["a", "hang", "b"], FAST)[2].status == "skipped"


def test_a_program_that_never_reads_a_large_stdin_does_not_block_the_caller():
    start = time.monotonic()
    r = run_one("import time\ntime.sleep(10**6)", "x" * 10**6, FAST)
    assert r.status == "timeout" and time.monotonic() - start < FAST.wall_s + 2


def test_a_dying_shared_process_reruns_the_rest_one_by_one():
    code = "import os\nx = int(input())\nif x == 2: os._exit(3)\nprint(x * 10)"
    results = run_tests(code, ["1", "2", "3"], FAST)
    assert [r.status for r in results] == ["ok", "error", "ok"]
    assert [r.stdout.strip() for r in results] == ["10", "", "30"]


def test_every_mode_runs_programs_and_reports_its_guarantees(mode):
    assert run_one("print(input()[::-1])", "abc", FAST).stdout.strip() == "cba"
    assert [r.stdout for r in run_tests("print(input())", ["1", "2"], FAST)] == ["1\n", "2\n"]
    assert mode["rlimits"] and mode["clean_env"]
    assert mode["minimal_root"] == mode["pid_namespace"] == mode["mode"].startswith("bwrap")


def test_the_strongest_mode_is_used_where_it_works():
    info = isolation()
    assert info["rlimits"] and info["fresh_uid"] == (info["mode"] in ("bwrap", "unshare"))
    if ROOT and shutil.which("bwrap"):
        assert info["mode"] == "bwrap", info["reason"]   # bwrap is installed: it must work
    elif ROOT:
        assert info["mode"] == "unshare", info["reason"]


def test_coding_env_checks_programs_and_reference_solutions():
    from rlany.envs.coding import CodingEnv, make_tasks

    tasks = make_tasks(12, seed=0)
    env = CodingEnv()
    for task in tasks:   # every built-in problem's reference solution passes its tests
        assert env.validate(task.spec) == [], task.task_id
    task = next(t for t in tasks if "sum" in t.spec["question"] and "two integers" in t.spec["question"])
    obs = env.reset(task)
    assert "Example input" in obs and task.spec["tests"][1]["input"] not in obs.split("Example")[0]
    good = env.step("Here:\n```python\na, b = map(int, input().split())\nprint(a + b)\n```")
    assert good.success and good.info["passed"] == good.info["total"]
    env.reset(task)
    bad = env.step("```python\nprint(3)\n```")
    assert not bad.success and bad.info["passed"] == 1
    assert "pass" not in bad.obs.lower()    # the verdict is not revealed
    wrong = dict(task.spec, solution="print(0)")
    assert "fails tests" in env.validate(wrong)[0]
