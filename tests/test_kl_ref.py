"""--kl-ref: the KL against a fixed reference policy (the base model or an adapter, e.g. a
warm start) instead of the pre-update snapshot, on a tiny local model."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from conftest import make_traj, one_line, write_jsonl
from rlany.stages.score import ScoreOptions, score_group
from rlany.stages.train_policy import TrainOptions
from rlany.training.model import REFERENCE, TRAINED, load_model
from rlany.training.samples import tokenize
from rlany.training.trainer import collate, response_logprobs, train


def _samples(tok, advantage=None):
    raw = [([{"role": "user", "content": f"What is {i} + {i}?"}], f"It is {2 * i}.",
            advantage if advantage is not None else ((1.0 + i) if i % 2 else -0.5), True)
           for i in range(8)]
    return tokenize(tok, raw, max_len=512)[0]


def _logprobs(base: str, adapter: str | None, samples):
    """Each sample's response log-probs under base (+ adapter), computed apart."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    net = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    if adapter:
        net = PeftModel.from_pretrained(net, adapter)
    net.eval()
    with torch.no_grad():
        logp, resp, _ = response_logprobs(net, collate(samples, 0), "cpu", keep=False)
    return [logp[r][resp[r]] for r in range(len(samples))]


def _k3_mean(cur, ref) -> float:
    """The trainer's reported KL of a step: mean over sequences of the token-mean k3."""
    per = [(torch.exp(r - c) - (r - c) - 1).mean().item() for c, r in zip(cur, ref)]
    return sum(per) / len(per)


def _train(tiny_model, tmp_path, name, adapter=None, samples=None, **kw):
    opts = TrainOptions(output="unused", lr=1e-2, seed=0, dtype="float32", micro_batch=8,
                        grad_accum=1, adapter=adapter, **kw)
    model, tok = load_model(tiny_model, adapter, opts)
    samples = samples or _samples(tok)
    logs = []
    train(samples, model, tok, opts, tmp_path / name, {"data_sha256": "x"}, logs.append)
    return model, tok, samples, [r for r in logs if "loss" in r]


def test_the_first_steps_kl_is_the_reference_adapters_to_the_current_policy(
        tiny_model, tiny_lora, tmp_path):
    # starting from tiny_lora: against the base model the first step's KL is the k3
    # between tiny_lora's and the base model's log-probs, computed apart; against the
    # pre-update policy (the default) or against tiny_lora itself it is 0
    model, tok, samples, logs = _train(tiny_model, tmp_path, "base", adapter=tiny_lora,
                                       kl_ref="base", max_steps=1)
    want = _k3_mean(_logprobs(tiny_model, tiny_lora, samples), _logprobs(tiny_model, None,
                                                                         samples))
    assert want > 1e-3
    assert logs[0]["kl"] == pytest.approx(want, rel=1e-3)
    for ref in ("pre-update", tiny_lora):
        _, _, _, same = _train(tiny_model, tmp_path, f"same-{len(ref)}", adapter=tiny_lora,
                               kl_ref=ref, max_steps=1)
        assert same[0]["kl"] == pytest.approx(0.0, abs=1e-7)


def test_the_reference_leaves_only_the_trained_adapter(tiny_model, tiny_lora, tmp_path):
    model, *_ = _train(tiny_model, tmp_path, "ckpt", kl_ref=tiny_lora, max_steps=1)
    assert REFERENCE not in model.peft_config and model.active_adapter == TRAINED
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(f".{TRAINED}." in n and "lora_" in n for n in trainable)
    saved = json.loads((tmp_path / "ckpt" / "rlany.json").read_text())
    assert saved["metrics"]["kl_ref"] == tiny_lora


def test_a_fixed_reference_pulls_the_policy_back(tiny_model, tiny_lora, tmp_path):
    # no advantage, only the KL: from the base model's fresh adapter toward tiny_lora the
    # KL falls over the steps; against the pre-update policy there is nothing to pull to
    _, tok, _, _ = _train(tiny_model, tmp_path, "probe", max_steps=1)
    flat = _samples(tok, advantage=0.0)
    _, _, _, logs = _train(tiny_model, tmp_path, "pull", samples=flat, kl_ref=tiny_lora,
                           kl_beta=1.0, epochs=6)
    kls = [r["kl"] for r in logs]
    assert kls[0] > 1e-3 and kls[-1] < 0.5 * kls[0]


def test_the_loop_resolves_init_to_the_runs_first_model():
    from rlany.loop.tables import _kl_init

    def lp(tables, policy=None, rm=None):
        return SimpleNamespace(cfg=SimpleNamespace(tables=tables), init_policy=policy,
                               init_rm=rm)

    init = {"train_policy": {"kl_ref": "init"}, "train_rm": {"kl_ref": "init"}}
    assert _kl_init(lp(init, policy="runs/x/warm_start/sft"), "train_policy") == {
        "kl_ref": "runs/x/warm_start/sft"}
    assert _kl_init(lp(init), "train_policy") == {"kl_ref": "base"}
    assert _kl_init(lp(init, rm="runs/x/judge_warm_start/rm"), "train_rm") == {
        "kl_ref": "runs/x/judge_warm_start/rm"}
    assert _kl_init(lp({"train_policy": {"kl_ref": "base"}}), "train_policy") == {}
    assert _kl_init(lp({}), "train_policy") == {}


def test_a_warm_policy_trains_at_the_warm_lr_unless_its_config_gives_one():
    from rlany.loop.tables import WARM_LR, _train_policy_forced

    def lp(table, policy="runs/x/warm_start/sft"):
        return SimpleNamespace(cfg=SimpleNamespace(tables={"train_policy": table}),
                               init_policy=policy, init_rm=None)

    assert WARM_LR < TrainOptions(input="-", output="-").lr
    assert _train_policy_forced(lp({})) == {"lr": WARM_LR}
    assert _train_policy_forced(lp({"kl_ref": "init"})) == {
        "lr": WARM_LR, "kl_ref": "runs/x/warm_start/sft"}
    assert _train_policy_forced(lp({"lr": 3e-4})) == {}       # the config's own lr
    assert _train_policy_forced(lp({"full": True})) == {}     # full fine-tuning: its own
    assert _train_policy_forced(lp({}, policy=None)) == {}    # from the base model


@pytest.mark.parametrize("flags, code, says", [
    (["--kl-ref", "init"], 2, "--kl-ref init names a loop run's first policy"),
    (["--kl-ref", "no/such/dir"], 1, "--kl-ref: not a LoRA adapter directory"),
    (["--kl-ref", "base", "--full"], 2, "needs a LoRA policy"),
])
def test_cli_kl_ref_mistakes_are_one_line(tiny_model, tmp_path, cli, flags, code, says):
    trajs = [make_traj("q", i, +1 if i < 2 else -1, n_steps=1) for i in range(4)]
    scored, _ = score_group([(f"x:{i}", t, None) for i, t in enumerate(trajs)],
                            ScoreOptions())
    data = write_jsonl(tmp_path / "scored.jsonl", scored)
    r = cli("train-policy", "-i", str(data), "-o", str(tmp_path / "ckpt"), "--model",
            tiny_model, *flags)
    assert says in one_line(r, code)
    assert not (tmp_path / "ckpt").exists()


def test_loop_kl_ref_init_anchors_every_iteration_to_the_warm_start(tmp_path, tiny_model):
    from pathlib import Path

    from rlany.loop.tables import WARM_LR
    from test_sft import _run_warm, _warm_config

    config = Path(_warm_config(tmp_path, tiny_model))
    config.write_text(config.read_text().replace("[train_policy]\n",
                                                 '[train_policy]\nkl_ref = "init"\n'))
    loop = _run_warm(str(config), iterations=2)
    warm = str(loop.dir / "warm_start" / "sft")
    for it in ("iter_000", "iter_001"):
        meta = json.loads((loop.dir / it / "policy" / "rlany.json").read_text())
        assert meta["metrics"]["kl_ref"] == warm and meta["options"]["kl_ref"] == warm
        assert meta["options"]["lr"] == WARM_LR   # no [train_policy] lr: a warm start's


def test_loop_checks_a_kl_ref_adapter_at_load(tmp_path, tiny_model):
    from pathlib import Path

    from rlany.errors import RlanyError
    from rlany.loop.loop import load_config
    from test_sft import _warm_config

    config = Path(_warm_config(tmp_path, tiny_model))
    config.write_text(config.read_text().replace("[train_policy]\n",
                                                 '[train_policy]\nkl_ref = "no/such/dir"\n'))
    with pytest.raises(RlanyError, match=r"\[train_policy\] kl_ref: not a LoRA adapter"):
        load_config(str(config))
    assert not (tmp_path / "runs").exists()   # before anything runs
