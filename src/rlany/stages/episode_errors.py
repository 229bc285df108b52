"""Episodes that could not run: counted apart, never scored as a zero.

An episode ends with finish "error" when its env raised: at reset (it never began: no
browser, a URL the env cannot use, a server whose schema names no action field) or at a
step, for a failure of its own whatever the action (the browser died, the server's
connection broke or it answered garbage, the sandbox's jail did not start). Its outcome -1
says nothing about the policy, so `eval` counts it in no success rate (`errored` instead)
and `score` trains on none of it and leaves it out of the task's acc. What the policy's
text makes fail is never an env error: an env reads the text in one guarded call
(`rlany.envs.read_action`), answers an unreadable action "Error: ...", and the episode
goes on or fails as the policy's, counted in every rate.

`rollout` and `eval` count errors as task groups complete (`watched`) and fail in one line
(exit 1), before their output is written, when
* the env cannot start: every episode of the first batch (`--batch-tasks` tasks x `--n`)
  failed at reset. That batch is held back until this is known, so nothing of it is
  written, and a broken env costs one batch of resets, not a run;
* more than `--max-error-share` of the output's episodes errored: raised as soon as that
  is certain (errors > share x the episodes the output will hold), so a run that cannot
  pass stops early;
* no episode ran at all (possible only with `--max-error-share 1`).
The line says how many of how many episodes errored and the first error: task and reason.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rlany.errors import RlanyError
from rlany.files.records import Trajectory

MAX_ERROR_SHARE = 0.5  # above it, a rate over the rest measures the env more than the policy
HINT = "fix the environment (its server, browser or spec) and rerun"


class EnvFailed(RlanyError):
    """The env failed too many episodes (or could not start): the stage writes nothing."""


# why the judge leaves an errored episode unjudged (its record's `skipped`), in any mode
ERRORED = "episode errored: score trains on none of it"


def errored(traj: Trajectory) -> bool:
    return traj.finish == "error"


def _why(task_id: object, error: object, steps: list) -> str:
    """`task 'ID': REASON`: the reset error (the trajectory's `error` column), else its last
    step's `info.error`; clipped, so a server's page of text stays one short line."""
    last = steps[-1] if steps else None
    info = (last.info if hasattr(last, "info") else (last or {}).get("info")) or {}
    return f"task '{task_id}': {str(error or info.get('error') or 'no reason recorded')[:300]}"


def reason(traj: Trajectory) -> str:
    return _why(traj.task_id, traj.extra.get("error"), traj.steps)


@dataclass
class ErrorBudget:
    """The running count of one stage's episodes and errors (the module doc's rules)."""

    max_share: float
    expected: int  # episodes the finished output will hold (a resumed part included)
    first_batch: int = 0  # groups in this run's first batch; 0: no start check
    env_of: dict[str, str] = field(default_factory=dict)  # task_id -> env name
    total: int = 0
    errors: int = 0
    first: str | None = None  # the first error: task and reason
    groups: int = 0  # groups of this run seen
    started: bool = False  # an episode of this run got past reset
    batch_episodes: int = 0  # episodes of this run's first batch
    first_here: str | None = None  # this run's first error
    resumed_errors: int = 0  # errors of a resumed partial output

    def add(self, group: list[Trajectory]) -> None:
        self.groups += 1
        self.total += len(group)
        for t in group:
            self.started |= bool(t.steps) or not errored(t)
            if errored(t):
                self.errors += 1
                self.first = self.first or reason(t)
                self.first_here = self.first_here or reason(t)
        if self.groups <= self.first_batch:
            self.batch_episodes += len(group)
        if self.groups < self.first_batch:
            return  # the first batch is judged whole (it was played whole anyway)
        if self.groups == self.first_batch and not self.started:
            env = self.env_of.get(group[0].task_id, "")
            raise EnvFailed(f"the {env + ' ' if env else ''}environment could not start: all "
                            f"{self.batch_episodes} episodes of the first {self.groups} tasks "
                            f"failed at reset; the first: {self.first_here}", hint=HINT)
        if self.errors / max(self.expected, 1) > self.max_share:  # division: 29/100 is 0.29
            raise EnvFailed(self._too_many(), hint=HINT + ", or allow more with "
                            "--max-error-share")

    def resumed(self, path: str | Path) -> None:
        """Count the episodes a partial output already holds (a resumed rollout)."""
        with open(path, encoding="utf-8") as f:
            for line in f:
                rec = json.loads(line)
                self.total += 1
                if rec.get("finish") == "error":
                    self.errors += 1
                    self.resumed_errors += 1
                    self.first = self.first or _why(rec.get("task_id"), rec.get("error"),
                                                    rec.get("steps") or [])

    def finish(self) -> None:
        """The final rules, once every group is in."""
        if self.total and self.errors == self.total:
            raise EnvFailed(f"no episode ran: all {self.total} errored; the first: "
                            f"{self.first}", hint=HINT)
        if self.errors / max(self.total, 1) > self.max_share:
            raise EnvFailed(self._too_many(), hint=HINT + ", or allow more with "
                            "--max-error-share")

    def _too_many(self) -> str:
        played = "" if self.total >= self.expected else \
            f" (stopped after {self.total} of {self.expected}: the share cannot come back)"
        return (f"{self.errors} of {max(self.expected, self.total)} episodes errored, more "
                f"than --max-error-share {self.max_share:g} of them{played}; the first: "
                f"{self.first}")


def watched(groups: Iterable[list[Trajectory]], budget: ErrorBudget
            ) -> Iterator[list[Trajectory]]:
    """The task groups, counted by `budget`: the first batch is held back until some
    episode of it has started, and the final rules are checked after the last group."""
    held: list[list[Trajectory]] = []
    for group in groups:
        budget.add(group)
        held.append(group)
        if budget.groups >= budget.first_batch:
            yield from held
            held = []
    yield from held
    budget.finish()
