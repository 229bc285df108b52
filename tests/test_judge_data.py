"""The judge benchmarks' labelled steps (research/judge_data.py) follow the config's
horizon: judge_heldout.py --max-steps scores mid.toml's judges on 8-turn episodes."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "research"))

from judge_data import episodes, judged_steps  # noqa: E402

MID_EVAL = ROOT / "examples" / "household" / "mid_eval.jsonl"


def test_episodes_run_to_the_horizon_they_are_given():
    short = [len(t.steps) for t in episodes(MID_EVAL, 1, 1)]
    long = episodes(MID_EVAL, 1, 1, max_steps=8)
    assert max(short) == 4
    assert 4 < max(len(t.steps) for t in long) <= 8
    rows = judged_steps(long)
    assert len(rows) == sum(len(t.steps) for t in long)
    assert {r["label"] for r in rows} == {-1, 1}  # the env's own step labels, both seen
