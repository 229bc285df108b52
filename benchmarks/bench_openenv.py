"""openenv: what the `openenv` env adds to a step, against real servers written with the
`openenv` 0.10 package (tests/openenv_servers/games.py, from its own virtualenv: `make
openenv-test-servers`) on 127.0.0.1. Per env: the median over EPISODES episodes of opening a
session and resetting (`OpenenvEnv.reset`), of one step, and of closing the session; the
server's own work in these games is microseconds, so the figures are the client's and the
wire's. `/guess` is a plain env, `/hangman` an MCP tool env (a step is a decoded tool call)."""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import save  # noqa: E402

from rlany.envs import openenv_wire as wire  # noqa: E402
from rlany.envs.openenv import OpenenvEnv  # noqa: E402
from rlany.files.records import Task  # noqa: E402

SERVERS = Path(__file__).parent.parent / "tests" / "openenv_servers"
VENV_PY = SERVERS / ".venv" / "bin" / "python"
EPISODES = 30
ENVS = {  # app: (reset kwargs, the one step timed)
    "guess": ({"seed": 1}, "3"),
    "hangman": ({"word": "cat"}, 'guess_letter(letter="a")'),
}


def serve() -> str:
    """games.py on a free port, through the env's own server start (`openenv_wire`: polled
    on /health, stopped when this process exits); its URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return wire.start_server([str(VENV_PY), str(SERVERS / "games.py"), "--port", str(port)],
                             port, 180)


def time_env(url: str, reset: dict, action: str) -> dict:
    spec = {"url": url, "reset": reset}
    task = Task(task_id="t", env="openenv", prompt="", spec=spec)
    ms: dict[str, list[float]] = {"reset": [], "step": [], "close": []}
    for i in range(EPISODES + 1):  # the first episode warms the connection and is not counted
        env = OpenenvEnv()
        t0 = time.perf_counter()
        env.reset(task)
        t1 = time.perf_counter()
        step = env.step(action)
        t2 = time.perf_counter()
        if step.action is None or step.info.get("rejected") or step.info.get("reward") is None:
            sys.exit(f"bench_openenv: {url} did not take {action!r}: {step.obs[:200]!r}")
        env.close()
        t3 = time.perf_counter()
        if i:
            for key, dt in (("reset", t1 - t0), ("step", t2 - t1), ("close", t3 - t2)):
                ms[key].append(dt * 1000)
    return {f"{k}_ms_median": round(statistics.median(v), 2) for k, v in ms.items()}


def main() -> dict:
    if not VENV_PY.exists():
        sys.exit("bench_openenv: needs tests/openenv_servers/.venv: make openenv-test-servers")
    url = serve()
    per_env = {app: time_env(f"{url}/{app}", *ENVS[app]) for app in ENVS}
    version = subprocess.run([str(VENV_PY), "-c", "import importlib.metadata as m; "
                              "print(m.version('openenv'))"], capture_output=True, text=True)
    result = {"metric": "ms per session open + reset, per step and per close, medians of "
                        f"{EPISODES} episodes, client and server on 127.0.0.1",
              "server": f"openenv {version.stdout.strip()} (tests/openenv_servers/games.py)",
              "episodes": EPISODES, "envs": per_env}
    save("openenv", result)
    return result


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
