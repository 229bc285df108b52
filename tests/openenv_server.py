"""A tiny OpenEnv environment and a server for it, for `tests/test_openenv.py`.

The game: guess a number from 1 to 5 (drawn from the reset's `seed`, or `target`) in at most
3 guesses; reward 1.0 for the right guess (done), 0.0 for a wrong one (done at the third).
Reset options for the tests: `screen` (the observation carries a 2x2 PNG, base64),
`slow` (seconds each step sleeps), `garbage` (steps are answered with text that is not JSON),
`session_error` (a step is answered with SESSION_ERROR and the session closed, as openenv's
server does when a session fails outside a message), `raises` (a step is answered with
EXECUTION_ERROR, as openenv's server does when its env's step raises; the session goes on).

`serve(port, max_sessions)` serves it as openenv's `HTTPEnvServer` (openenv-core 0.3.0, and
the `openenv` 0.10 package) does on its WebSocket `/ws` (one session per connection;
CAPACITY_REACHED sent and the connection closed when `max_sessions` are open;
VALIDATION_ERROR for an action the schema refuses; "close" ends the session) and
`GET /health`, `GET /schema`, with `websockets` only: a stub that fails on demand. With
`--real` (a Python with openenv: tests/openenv_servers/.venv) the same game is served by
openenv's own `create_fastapi_app` and uvicorn, to check that both speak the same protocol:
    python tests/openenv_server.py --port 8011 [--max-sessions 4] [--real]
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import random
import threading
import time

ACTION_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["guess"],
                 "properties": {"metadata": {"type": "object"},
                                "guess": {"type": "integer", "title": "Guess"}}}


class Game:
    def reset(self, seed: int | None = None, target: int | None = None, screen: bool = False,
              slow: float = 0.0, garbage: bool = False, session_error: bool = False,
              raises: bool = False) -> dict:
        self.target = target or random.Random(seed).randint(1, 5)
        self.guesses, self.screen, self.slow, self.garbage = 0, screen, slow, garbage
        self.session_error, self.raises = session_error, raises
        return self._obs("Guess a number from 1 to 5.", None, False)

    def step(self, guess: int) -> dict:
        time.sleep(self.slow)
        self.guesses += 1
        if guess == self.target:
            return self._obs("Right.", 1.0, True)
        hint = "higher" if guess < self.target else "lower"
        return self._obs(f"Wrong: it is {hint}.", 0.0, self.guesses >= 3)

    def _obs(self, message: str, reward: float | None, done: bool) -> dict:
        obs = {"message": message, "legal_actions": [1, 2, 3, 4, 5]}
        if self.screen:
            obs["screen"] = png_base64(self.guesses)
        return {"observation": obs, "reward": reward, "done": done}


def png_base64(shade: int) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (2, 2), (40 * shade, 0, 0)).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def serve(port: int, max_sessions: int = 64):
    """Start the protocol server in a thread; returns the `websockets` server (`.shutdown()`)."""
    from http import HTTPStatus

    from websockets.exceptions import ConnectionClosed
    from websockets.sync.server import serve as ws_serve

    lock, open_sessions = threading.Lock(), [0]

    def http(connection, request):
        if request.path == "/health":
            return connection.respond(HTTPStatus.OK, json.dumps({"status": "healthy"}))
        if request.path == "/schema":
            return connection.respond(HTTPStatus.OK, json.dumps(
                {"action": ACTION_SCHEMA, "observation": {}, "state": {}}))
        if request.path != "/ws":
            return connection.respond(HTTPStatus.NOT_FOUND, "not found")
        return None

    def error(message: str, code: str, **extra) -> str:
        return json.dumps({"type": "error", "data": {"message": message, "code": code,
                                                     **extra}})

    def session(ws):
        with lock:
            full = open_sessions[0] >= max_sessions
            open_sessions[0] += 0 if full else 1
        if full:
            ws.send(error(f"Server at capacity: {max_sessions}/{max_sessions} sessions active",
                          "CAPACITY_REACHED", active_sessions=max_sessions,
                          max_sessions=max_sessions))
            ws.close()
            return
        game = Game()
        try:
            for raw in ws:
                try:
                    message = json.loads(raw)
                except ValueError as e:
                    ws.send(error(f"Invalid JSON: {e}", "INVALID_JSON"))
                    continue
                kind, data = message.get("type", ""), message.get("data", {})
                if kind == "close":
                    break
                if kind == "reset":
                    known = {"seed", "target", "screen", "slow", "garbage", "session_error",
                             "raises"}
                    answer = game.reset(**{k: v for k, v in data.items() if k in known})
                elif kind == "step" and getattr(game, "session_error", False):
                    ws.send(error("the session's env worker died", "SESSION_ERROR"))
                    break
                elif kind == "step" and getattr(game, "raises", False):  # env.step raised
                    ws.send(error("KeyError: 'board'", "EXECUTION_ERROR"))
                    continue
                elif kind == "step":
                    if set(data) - {"guess", "metadata"} or not isinstance(data.get("guess"),
                                                                            int):
                        ws.send(error("Invalid message", "VALIDATION_ERROR", errors=[]))
                        continue
                    answer = game.step(data["guess"])
                    if game.garbage:
                        ws.send("<html>502 Bad Gateway</html>")
                        continue
                else:
                    ws.send(error(f"Unknown message type: {kind}", "UNKNOWN_TYPE"))
                    continue
                ws.send(json.dumps({"type": "observation", "data": answer}))
        except ConnectionClosed:
            pass
        finally:
            with lock:
                open_sessions[0] -= 1

    server = ws_serve(session, "127.0.0.1", port, process_request=http)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def serve_real(port: int, max_sessions: int) -> None:  # pragma: no cover - needs openenv
    """The same game through openenv's own server (blocks)."""
    import uvicorn
    from openenv.core.env_server import Action, Environment, Observation, State, create_fastapi_app

    class GuessAction(Action):
        guess: int

    class GuessObservation(Observation):
        message: str
        legal_actions: list[int]
        screen: str | None = None

    class GuessEnv(Environment):
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self):
            super().__init__()
            self.game = Game()

        def reset(self, seed=None, episode_id=None, **kw):
            return self._typed(self.game.reset(seed=seed, **kw))

        def step(self, action, timeout_s=None, **kw):
            return self._typed(self.game.step(action.guess))

        @property
        def state(self):
            return State(step_count=self.game.guesses)

        def _typed(self, d):
            return GuessObservation(**d["observation"], reward=d["reward"], done=d["done"])

    app = create_fastapi_app(GuessEnv, GuessAction, GuessObservation,
                             max_concurrent_envs=max_sessions)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--max-sessions", type=int, default=64)
    parser.add_argument("--real", action="store_true")
    args = parser.parse_args()
    if args.real:
        serve_real(args.port, args.max_sessions)
    else:
        serve(args.port, args.max_sessions)
        threading.Event().wait()
