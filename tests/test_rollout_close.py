"""rollout gives an env's resources back whatever happens: a reset that fails closes the env
(its tab or server session is free for the next episode), and an env whose close() fails
costs that episode nothing and the rollout goes on (said on stderr)."""

from __future__ import annotations

from rlany.engines.fake import FakeEngine
from rlany.envs import StepResult
from rlany.files.records import Task
from rlany.stages.rollout import RolloutOptions, rollout


class OneSeat:
    """Test env holding one shared seat from reset to close, as a 1-session server does;
    the task "broken" fails its reset after taking the seat, "sticky" fails to close."""

    name = "seat"
    taken: list[str] = []

    def reset(self, task):
        self.task = task
        if OneSeat.taken:
            raise RuntimeError(f"the seat is taken by {OneSeat.taken[0]}")
        OneSeat.taken.append(task.task_id)
        if task.task_id == "broken":
            raise RuntimeError("no action schema")
        return "sit"

    def step(self, response):
        return StepResult(obs="done", done=True, success=True, action=response)

    def close(self):
        if self.task.task_id == "sticky":
            raise ConnectionResetError("the server hung up")
        if OneSeat.taken == [self.task.task_id]:
            OneSeat.taken.clear()

    def describe(self, task):
        return "sit down"

    def validate(self, spec):
        return []


def play(ids: list[str], batch_tasks: int) -> list:
    OneSeat.taken = []
    tasks = [Task(task_id=i, env="seat", spec={}, prompt="") for i in ids]
    opts = RolloutOptions(n=1, max_steps=2, batch_tasks=batch_tasks)
    return [t for g in rollout(tasks, FakeEngine(lambda r, k: "sit"), lambda _: OneSeat(), opts)
            for t in g]


def test_a_failed_reset_closes_the_env_so_the_next_episode_gets_its_seat():
    broken, fine = play(["broken", "fine"], batch_tasks=2)
    assert broken.finish == "error" and "no action schema" in broken.extra["error"]
    assert fine.finish == "success" and "error" not in fine.extra


def test_an_env_whose_close_fails_costs_its_episode_nothing(capfd):
    sticky, fine = play(["sticky", "fine"], batch_tasks=1)
    assert sticky.finish == "success" and sticky.outcome == 1
    err = capfd.readouterr().err
    assert "sticky" in err and "ConnectionResetError: the server hung up" in err
    assert len(err.strip().splitlines()) == 1
    assert fine.finish == "error"  # the seat was never given back: its reset says so
    assert "taken by sticky" in fine.extra["error"]
