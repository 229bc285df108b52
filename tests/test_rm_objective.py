"""train-rm's verdict objectives (rlany.training.verdict): the loss by hand, the branch token, the
class weights, score's rm_target, and a judge that must learn a separable toy set."""

from __future__ import annotations

import json
import math

import pytest
import torch

from conftest import make_judgment, make_traj, one_line, write_jsonl
from rlany.errors import RlanyError
from rlany.files.records import Scored, ScoredJudgeSample, ScoredStep
from rlany.stages.score import ScoreOptions, score_group
from rlany.training.verdict import branch, class_weights, verdict_loss


def test_verdict_losses_by_hand():
    q_pos = torch.tensor([0.8, 0.3])  # q(+1) of two steps
    logq = torch.log(torch.stack([q_pos, 1 - q_pos], -1))  # (2, C): choices +1, -1
    values = torch.tensor([1.0, -1.0])
    targets = torch.tensor([2.0, -1.0])  # R of each step
    weights = torch.tensor([1.0, 0.5])
    # expected: -w * R * (q+ - q-)
    parts = verdict_loss(logq, values, targets, weights, objective="expected")
    want = (-(1.0 * 2.0 * (0.8 - 0.2)) - (0.5 * -1.0 * (0.3 - 0.7))) / 2
    assert parts.loss.item() == pytest.approx(want, abs=1e-6)
    # logloss: -w * |R| * log q(verdict with R's sign)
    parts = verdict_loss(logq, values, targets, weights, objective="logloss")
    want = (-(1.0 * 2.0 * math.log(0.8)) - (0.5 * 1.0 * math.log(0.7))) / 2
    assert parts.loss.item() == pytest.approx(want, abs=1e-6)
    # a padding row (weight 0) adds nothing; the normalizer divides once
    padded = verdict_loss(torch.cat([logq, logq[:1]]), values,
                          torch.cat([targets, targets[:1]]),
                          torch.cat([weights, torch.zeros(1)]), objective="logloss",
                          normalizer=2)
    assert padded.loss.item() == pytest.approx(want, abs=1e-6)
    assert padded.sequences == 2


def test_the_gradient_moves_the_verdict_toward_the_target_only():
    """Both objectives raise q(+1) where R > 0 and lower it where R < 0; `expected` fades
    as the judge grows confident, `logloss` does not while it is wrong."""
    values = torch.tensor([1.0, -1.0])
    for objective in ("expected", "logloss"):
        z = torch.tensor([[0.0, 0.0], [0.0, 0.0]], requires_grad=True)
        verdict_loss(torch.log_softmax(z, -1), values, torch.tensor([1.0, -1.0]),
                     torch.ones(2), objective=objective).loss.backward()
        assert z.grad[0, 0] < 0 < z.grad[0, 1]  # descent raises z(+1) for R > 0
        assert z.grad[1, 1] < 0 < z.grad[1, 0]
    wrong = torch.tensor([[-8.0, 8.0]])  # confidently -1 where R = +1
    grads = {}
    for objective in ("expected", "logloss"):
        z = wrong.clone().requires_grad_(True)
        verdict_loss(torch.log_softmax(z, -1), values, torch.tensor([1.0]), torch.ones(1),
                     objective=objective).loss.backward()
        grads[objective] = abs(z.grad[0, 0].item())
    assert grads["logloss"] > 0.9 and grads["expected"] < 1e-5


def test_class_weights_balance_the_two_sides():
    w = class_weights([1.0, -1.0, -1.0, -1.0], True)
    assert w == [2.0, 2 / 3, 2 / 3, 2 / 3]
    assert sum(w[:1]) == pytest.approx(sum(w[1:]))
    assert class_weights([1.0, 1.0], True) == [1.0, 1.0]
    assert class_weights([1.0, -1.0, -1.0], False) == [1.0, 1.0, 1.0]


def test_branch_of_the_judge_choices_is_one_token(tiny_model):
    from transformers import AutoTokenizer

    from rlany.prompts import VERDICT_CHOICES

    tok = AutoTokenizer.from_pretrained(tiny_model)
    at = branch(tok, VERDICT_CHOICES, (1, -1))
    plus, minus = (tok(c, add_special_tokens=False)["input_ids"] for c in VERDICT_CHOICES)
    n = len(at.prefix)
    assert plus[:n] == minus[:n] == at.prefix and at.tokens == [plus[n], minus[n]]
    assert plus[n + 1:] == minus[n + 1:]  # forced again after the branch
    with pytest.raises(RlanyError, match="not decided at one token"):
        branch(tok, ("same", "same"), (1, -1))


def test_score_sets_rm_target_on_every_judged_step_of_a_kept_task():
    """rm_target = O_i (default) or R_it (`integrated`) on each judged step of a task within
    the rm range, agreeing verdicts included (the sampled estimator drops those); None
    outside the range. The sampled estimator's consistency reward is R_it · S either way."""
    trajs = [make_traj("t", i, 1 if i == 0 else -1, n_steps=2) for i in range(4)]
    scores = [[[1, 1], [1, -1]], [[-1, -1], [1, 1]], [[1, -1], [-1, -1]], [[1, 1], [1, 1]]]
    group = [("f:1", tr, make_judgment(tr, s)) for tr, s in zip(trajs, scores)]
    scored, _ = score_group(group, ScoreOptions())
    integrated, _ = score_group(group, ScoreOptions(rm_target="integrated"))
    for tr, tr_r in zip(scored, integrated, strict=True):
        for step, step_r in zip(tr.steps, tr_r.steps, strict=True):
            assert step.rm_target == tr.outcome
            assert step_r.rm_target == pytest.approx(step_r.reward)
            assert [j.reward for j in step.judge] == [j.reward for j in step_r.judge]
    # a judge that says +1 to a failed trajectory's step: R = -1 + 1 = 0, no correction
    # under `integrated`; the outcome target still says -1
    assert integrated[3].steps[0].rm_target == 0.0 and scored[3].steps[0].rm_target == -1
    assert scored[1].steps[0].judge and not any(j.keep for j in scored[1].steps[0].judge)
    outside, _ = score_group(group, ScoreOptions(rm_acc_min=0.5))
    assert all(step.rm_target is None for tr in outside for step in tr.steps)
    label, _ = score_group([("f:1", tr, make_judgment(tr, s)) for tr, s in zip(
        [make_traj("t", 0, 1)], [[[1, 1]]])], ScoreOptions(rm_acc_max=1.0,
                                                          rm_target="integrated"))
    assert label[0].steps[0].rm_target == 2.0


def _toy(n: int) -> list[Scored]:
    """A separable toy: the step is good iff its prompt ends with 'yes yes yes'; 3 of 4 are
    bad (and end with 'no no no')."""
    out = []
    for i in range(n):
        good = i % 4 == 0
        word = "yes yes yes" if good else "no no no"
        judge_messages = [{"role": "user", "content": f"Step {i}: {word}"}]
        out.append(Scored(
            traj_id=f"toy/0/{i}", task_id="toy", iteration=0, sample=i,
            outcome=1 if good else -1, task_acc=0.5, steps=[ScoredStep(
                step=0, prompt_messages=[{"role": "user", "content": "x"}], response="y",
                step_score=0.0, reward=0.0, advantage=0.0, keep=False,
                judge_messages=judge_messages, rm_target=1.0 if good else -1.0,
                judge=[ScoredJudgeSample(text="\\boxed{+1}", score=1, reward=0.0,
                                         advantage=0.0, keep=False)])]))
    return out


def _accuracy(model_path: str, adapter: str | None, scored: list[Scored]) -> float:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlany.training.verdict import RawVerdict, choice_logprobs, tokenize_verdicts

    tok = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    if adapter:
        model = PeftModel.from_pretrained(model, adapter)
    model.eval()
    raw = [RawVerdict(s.steps[0].judge_messages, s.steps[0].rm_target) for s in scored]
    samples, _ = tokenize_verdicts(tok, raw, 4096, False)
    with torch.no_grad():
        logq = choice_logprobs(model, [s.prompt_ids for s in samples], samples[0].choice_ids,
                               tok.pad_token_id or 0, "cpu")
    right = [(lq[0] > lq[1]) == (s.target > 0) for lq, s in zip(logq, samples)]
    per = [sum(r for r, s in zip(right, samples) if (s.target > 0) == c) /
           sum((s.target > 0) == c for s in samples) for c in (True, False)]
    return sum(per) / 2


@pytest.mark.parametrize("objective,seen,unseen", [("expected", 1.0, 1.0),
                                                   ("logloss", 0.9, 0.7)])
def test_train_rm_verdict_objective_learns_a_separable_toy_set(tiny_model, tmp_path, cli,
                                                               objective, seen, unseen):
    """A random tiny judge learns 'yes = good' from the CLI in 64 steps: balanced accuracy
    from 0.5 to at least `seen` on its training prompts and `unseen` on new ones
    (`logloss` is slower on this toy). A gradient on the wrong position or token, or a
    wrong sign, leaves it at 0.5 or below."""
    data = write_jsonl(tmp_path / "scored.jsonl", _toy(32))
    held = _toy(48)[32:]
    assert _accuracy(tiny_model, None, held) < 0.9
    r = cli("train-rm", "-i", str(data), "-o", str(tmp_path / "rm"), "--model", tiny_model,
            "--objective", objective, "--lr", "1e-2", "--epochs", "16", "--micro-batch", "8",
            "--grad-accum", "1", "--dtype", "float32")
    assert r.returncode == 0, r.stderr
    assert f"train-rm ({objective})" in r.stderr
    meta = json.loads((tmp_path / "rm" / "rlany.json").read_text())
    assert meta["samples"] == 32 and meta["metrics"]["steps"] == 64
    assert _accuracy(tiny_model, str(tmp_path / "rm"), _toy(32)) >= seen
    assert _accuracy(tiny_model, str(tmp_path / "rm"), held) >= unseen


def test_verdict_objective_refuses_reasoning_and_old_records(tiny_model, tmp_path, cli):
    toy = _toy(4)
    reasoning = [Scored(**{**t.__dict__, "steps": [ScoredStep(**{
        **t.steps[0].__dict__, "judge": [ScoredJudgeSample(
            text="It is fine. \\boxed{+1}", score=1, reward=0.0, advantage=0.0, keep=False)]})]})
        for t in toy]
    data = write_jsonl(tmp_path / "r.jsonl", reasoning)
    r = cli("train-rm", "-i", str(data), "-o", str(tmp_path / "rm"), "--model", tiny_model,
            "--objective", "logloss")
    assert r.returncode == 1 and "--max-tokens 0" in r.stderr and "Traceback" not in r.stderr
    assert one_line(r, 1).startswith(f"error: {data}:1: step ")  # the file and line
    old = [Scored(**{**t.__dict__, "steps": [ScoredStep(**{
        **t.steps[0].__dict__, "rm_target": None})]}) for t in toy]
    data = write_jsonl(tmp_path / "old.jsonl", old)
    r = cli("train-rm", "-i", str(data), "-o", str(tmp_path / "rm"), "--model", tiny_model,
            "--objective", "expected")
    assert r.returncode == 1 and "no training samples" in r.stderr
    assert not (tmp_path / "rm").exists()


def test_auto_objective_is_logloss_for_bare_verdicts_and_pg_for_reasoning(tmp_path):
    from rlany.stages.train_rm import _auto_objective

    toy = _toy(4)
    bare = write_jsonl(tmp_path / "bare.jsonl", toy)
    assert _auto_objective(bare, "bare.jsonl") == "logloss"
    reasoning = [Scored(**{**t.__dict__, "steps": [ScoredStep(**{
        **t.steps[0].__dict__, "judge": [ScoredJudgeSample(
            text="Fine. \\boxed{+1}", score=1, reward=0.0, advantage=0.0, keep=True)]})]})
        for t in toy]
    assert _auto_objective(write_jsonl(tmp_path / "r.jsonl", reasoning), "r") == "pg"
    old = [Scored(**{**t.__dict__, "steps": [ScoredStep(**{
        **t.steps[0].__dict__, "rm_target": None})]}) for t in toy]
    assert _auto_objective(write_jsonl(tmp_path / "o.jsonl", old), "o") == "pg"


def test_train_rm_balances_verdicts_with_the_side_weights():
    """train-rm's verdict weights are rlany.stats' side weights: a target of 0 keeps weight
    1 and does not count on either side."""
    from rlany.stats import side_weights

    assert side_weights([1.0, 0.0, -1.0, -2.0]) == [1.5, 1.0, 0.75, 0.75]
    assert class_weights([1.0, 0.0, -1.0, -2.0], True) == side_weights([1.0, 0.0, -1.0, -2.0])
    assert side_weights([0.0, 2.0]) == [1.0, 1.0]


def test_objectives_are_objects_the_trainer_asks():
    """The trainer never branches on a name: every objective says what its forward returns
    and owns its loss; train-rm's exact objectives are the ones over choices."""
    from rlany.errors import RlanyError
    from rlany.training.objectives import OBJECTIVES, objective
    from rlany.training.objectives import VERDICT_OBJECTIVES as VERDICT

    assert VERDICT == ("expected", "logloss")
    assert [n for n, o in OBJECTIVES.items() if o.clips] == ["ppo"]
    with pytest.raises(RlanyError, match="unknown training objective"):
        objective("dpo")
    from pathlib import Path

    src = (Path(__file__).parents[1] / "src/rlany/training/trainer.py").read_text()
    assert "objective ==" not in src and "objective in" not in src
