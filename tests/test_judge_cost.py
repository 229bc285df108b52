"""research/judge_cost.py: the tokens the judge reads and trains on beside the policy's,
counted from a run's files with the model's chat template."""

import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "research"))

import judge_cost  # noqa: E402

from conftest import make_judgment, make_traj, write_jsonl  # noqa: E402
from rlany.files.records import to_json  # noqa: E402


def test_counts_what_each_stage_reads_and_trains(tmp_path, tiny_model, monkeypatch):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)

    def n(messages):
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return len(tok(text)["input_ids"])
    run = tmp_path / "run"
    it = run / "iter_000"
    it.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"run": {"model": tiny_model}}))
    (run / "metrics.jsonl").write_text(json.dumps(
        {"iteration": 0, "seconds": {"rollout": 10.0, "judge": 5.0, "score": 0.1,
                                     "train_policy": 10.0, "train_rm": 20.0}}) + "\n")
    trajs = [make_traj("t", i, +1 if i == 0 else -1, n_steps=2) for i in range(2)]
    trajs = [replace(tr, steps=[replace(s, token_ids=[1, 2, 3]) for s in tr.steps])
             for tr in trajs]
    judgments = [make_judgment(tr, [[1, -1], [1, 1]]) for tr in trajs]
    write_jsonl(it / "trajectories.jsonl", trajs)
    write_jsonl(it / "judgments.jsonl", judgments)
    scored = []
    for tr, j in zip(trajs, judgments):
        row = to_json(tr)
        for k, s in enumerate(row["steps"]):  # the first trajectory's steps train both
            s.update(keep=tr.sample == 0, judge_messages=j.steps[k].judge_messages,
                     rm_target=1.0 if tr.sample == 0 else None)
        scored.append(row)
    (it / "scored.jsonl").write_text("".join(json.dumps(r) + "\n" for r in scored))
    saved: dict = {}
    monkeypatch.setattr(judge_cost, "save", lambda name, result: saved.update(result))
    judge_cost.main([str(run)])
    got = saved["runs"][str(run)]["iterations"][0]
    steps = [s for tr in trajs for s in tr.steps]
    judged = [s for j in judgments for s in j.steps]
    assert got["policy_steps"] == 4 and got["judged_steps"] == 4 and got["train_rm_steps"] == 2
    assert got["rollout_prompt_tokens"] == sum(n(s.prompt_messages) for s in steps)
    assert got["response_tokens"] == 12
    assert got["train_policy_tokens"] == sum(n(s.prompt_messages) + 3 for s in trajs[0].steps)
    assert got["judge_prompt_tokens"] == sum(n(s.judge_messages) for s in judged)
    assert got["train_rm_tokens"] == sum(n(s.judge_messages) for s in judgments[0].steps)
    assert got["rm_over_policy_seconds"] == 2.0 and got["iteration_over_policy_stages"] == round(45.1 / 20.1, 3)
