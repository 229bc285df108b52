"""The sandbox against hostile programs: each is contained and reported, the caller survives."""

from __future__ import annotations

import os
import time

import pytest

from rlany.sandbox import Limits, isolation, outputs_match, run_one, run_tests

FAST = Limits(cpu_s=1.0, wall_s=3.0, memory_mb=256, nproc=8, output_kb=64)
ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="namespaces and uid drop need root")


def one(code, data="", limits=FAST):
    return run_tests(code, [data], limits)[0]


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
    "os._exit mid-test": "import os\nos._exit(0)",
    "segfault": "import ctypes\nctypes.string_at(0)",
    "deep recursion": "import sys\nsys.setrecursionlimit(10**6)\ndef f(n): return f(n + 1)\nf(0)",
    "thread bomb": "import threading, time\nwhile True: threading.Thread(target=time.sleep, args=(100,)).start()",
    "forged result lines": "import os\nos.write(1, b'{\"status\": \"ok\", \"stdout\": \"42\"}\\n')",
    "closes its stdout": "import os\nos.close(1)\nprint('gone')",
    "spawns a shell": "import subprocess\nprint(subprocess.run(['sh', '-c', 'echo pwned > /tmp/pwned; id'], capture_output=True).stdout)",
}


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


@needs_root
def test_no_network():
    r = one("import socket\ns = socket.create_connection(('127.0.0.1', 22), timeout=1)\nprint('connected')")
    assert r.status == "error" and "connected" not in r.stdout


@needs_root
def test_writing_outside_its_directory_is_refused_or_thrown_away(tmp_path):
    marker = f"/tmp/rlany-escape-{os.getpid()}"
    r = one(f"open('{marker}', 'w').write('x')\nopen('/root/escape', 'w').write('x')")
    assert r.status == "error" and "PermissionError" in r.stderr
    assert not os.path.exists(marker) and not os.path.exists("/root/escape")


@needs_root
def test_cannot_read_the_parents_environment_or_files():
    os.environ["RLANY_SECRET_TEST"] = "hunter2"
    try:
        code = ("import os\nprint(sorted(os.environ))\n"
                f"print(open('/proc/{os.getpid()}/environ').read())")
        r = one(code)
        assert "RLANY_SECRET_TEST" not in r.stdout and "hunter2" not in r.stdout
        assert r.status == "error"
        r = one("print(open('/root/.bashrc').read())")
        assert r.status == "error" and "PermissionError" in r.stderr
    finally:
        del os.environ["RLANY_SECRET_TEST"]


@needs_root
def test_cannot_kill_its_parent():
    r = one(f"import os, signal\nos.kill({os.getpid()}, signal.SIGKILL)\nprint('sent')")
    assert r.status == "error" and "PermissionError" in r.stderr


def test_no_processes_left_behind():
    one("import subprocess\nsubprocess.Popen(['sleep', '1000'])\nprint('spawned')")
    time.sleep(0.2)
    leftovers = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if open(f"/proc/{pid}/cmdline", "rb").read().startswith(b"sleep\x001000"):
                    leftovers.append(pid)
            except OSError:
                pass
    assert leftovers == []


def test_a_dying_shared_process_reruns_the_rest_one_by_one():
    code = "import os\nx = int(input())\nif x == 2: os._exit(3)\nprint(x * 10)"
    results = run_tests(code, ["1", "2", "3"], FAST)
    assert [r.status for r in results] == ["ok", "error", "ok"]
    assert [r.stdout.strip() for r in results] == ["10", "", "30"]


def test_single_process_runner_and_isolation_report():
    assert run_one("print(input()[::-1])", "abc", FAST).stdout.strip() == "cba"
    info = isolation()
    assert info["rlimits"] and info["fresh_uid"] == ROOT


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
