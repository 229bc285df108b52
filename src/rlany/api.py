"""rlany's Python API: what a script beside the CLI may import, each name from here.

The CLI (`rlany COMMAND`) is the main interface. A script that reads runs, plays episodes
or measures the judge (research/, a user's notebook) imports from `rlany.api` only:
everything else in the package is internal and may move or change between versions
(tests/test_layering.py holds research/ and what it reaches to this).

    from rlany.api import JsonlReader, Trajectory, wilson_interval

Importing it imports neither torch nor vllm (the functions that need them import them).
"""

from __future__ import annotations

from rlany import __version__
from rlany.chat import render
from rlany.compat import cpu_capability, cpu_model, machine_profile
from rlany.engines.base import NoModel
from rlany.envs import make_env
from rlany.files.jsonl import JsonlReader, meta_path
from rlany.files.records import (
    JudgeSample,
    Judgment,
    Lineage,
    Scored,
    Task,
    Trajectory,
    from_json,
    to_json,
    traj_id,
)
from rlany.loop.config import load_config
from rlany.loop.launch import command_line
from rlany.models import resolve_model
from rlany.prompts import VERDICT_CHOICES, parse_verdict, step_prompts
from rlany.stageio import read_tasks
from rlany.stages import BY_TABLE
from rlany.stages.eval import judge_metrics, on_plan_share
from rlany.stages.report import arm_line, draw_panel
from rlany.stages.rollout import RolloutOptions, rollout
from rlany.stats import gain_interval, t_interval, wilson_interval
from rlany.training.verdict import (
    branch,
    choice_logprobs,
    class_weights,
    verdict_loss,
    verdict_samples,
)

__all__ = [
    "__version__",
    # the records every stage reads and writes, and their files
    "Task", "Trajectory", "Judgment", "JudgeSample", "Scored", "Lineage",
    "from_json", "to_json", "traj_id", "JsonlReader", "meta_path", "read_tasks",
    # environments and models, by name
    "make_env", "resolve_model",
    # episodes without a model: `rollout` with the env's expert (`RolloutOptions(expert=True,
    # expert_p=P)`) and `NoModel` for its engine
    "rollout", "RolloutOptions", "NoModel",
    # the loop's config and each stage's command line in it
    "load_config", "command_line", "BY_TABLE",
    # evaluation and its statistics; report's plot lines and painter
    "judge_metrics", "on_plan_share", "wilson_interval", "t_interval", "gain_interval",
    "arm_line", "draw_panel",
    # the judge: its step prompts, its verdicts, and the reward model's objective on them
    # (the verdict's branch token, its log-probs, train-rm's samples, weights and loss)
    "step_prompts", "render", "VERDICT_CHOICES", "parse_verdict", "branch",
    "choice_logprobs", "verdict_samples", "class_weights", "verdict_loss",
    # the machine facts every sidecar records
    "machine_profile", "cpu_model", "cpu_capability",
]
