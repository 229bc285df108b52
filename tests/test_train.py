"""Training: the loss by hand, and the loop on a tiny local model."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from conftest import make_judgment, make_traj, write_jsonl
from rlany.errors import RlanyError
from rlany.logprobs import token_logprobs
from rlany.stages.score import ScoreOptions, score_group
from rlany.stages.train_policy import TrainOptions
from rlany.training.fields import lr_at
from rlany.training.losses import ppo_clip_loss
from rlany.training.model import load_model
from rlany.training.samples import Sample, tokenize
from rlany.training.trainer import plan_steps, train


def test_ppo_clip_loss_by_hand():
    # two sequences, three token slots; the last slot of sequence 2 is padding
    logp = torch.log(torch.tensor([[0.5, 0.5, 0.5], [0.5, 0.5, 0.5]]))
    old = torch.log(torch.tensor([[0.25, 0.5, 0.45], [0.25, 0.5, 0.9]]))
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv = torch.tensor([1.0, -1.0])
    parts = ppo_clip_loss(logp, old, None, adv, mask, clip_eps=0.2)
    # ratios: seq1 [2, 1, 1.111], seq2 [2, 1, (pad)]
    # A>0: pg = max(-r, -clip(r)) = -min(r, clip(r)): [-1.2, -1, -1.1111]
    # A<0: pg = max(r, clip(r)): [2, 1]
    seq1 = (-1.2 - 1.0 - 0.5 / 0.45) / 3
    seq2 = (2.0 + 1.0) / 2
    assert parts.loss.item() == pytest.approx((seq1 + seq2) / 2, rel=1e-6)
    # clipped branch taken at seq1 token 0 only (ratio 2 > 1.2 with A > 0); seq2 token 0
    # has ratio 2 with A < 0: unclipped -A*r = 2 > clipped 1.2, so not clipped
    assert parts.clip_frac == pytest.approx(1 / 5)
    assert parts.tokens == 5
    # the normalizer divides once: the same sum over 4 sequences' worth
    half = ppo_clip_loss(logp, old, None, adv, mask, clip_eps=0.2, normalizer=4)
    assert half.loss.item() == pytest.approx(parts.loss.item() / 2)


def test_k3_kl_is_zero_at_the_snapshot_and_positive_away():
    logp = torch.log(torch.tensor([[0.5, 0.2]]))
    mask = torch.ones(1, 2)
    adv = torch.zeros(1)
    at = ppo_clip_loss(logp, logp, logp, adv, mask, kl_beta=0.1)
    assert at.kl == 0.0 and at.loss.item() == 0.0
    ref = torch.log(torch.tensor([[0.25, 0.2]]))
    away = ppo_clip_loss(logp, logp, ref, adv, mask, kl_beta=0.1)
    d = math.log(0.25 / 0.5)
    assert away.kl == pytest.approx((math.exp(d) - d - 1) / 2)
    assert away.loss.item() == pytest.approx(0.1 * away.kl)


def test_token_logprobs_matches_log_softmax():
    logits = torch.randn(2, 5, 7)
    ids = torch.randint(0, 7, (2, 5))
    want = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
    assert torch.allclose(token_logprobs(logits, ids), want, atol=1e-6)


def test_token_logprobs_in_chunks_are_the_same_numbers_and_gradients(monkeypatch):
    """Long responses are taken in chunks of positions, each recomputed in the backward
    pass: the values and the gradients are bit for bit those of one pass."""
    import rlany.logprobs

    logits = torch.randn(2, 50, 37, dtype=torch.bfloat16, requires_grad=True)
    ids = torch.randint(0, 37, (2, 50))
    whole = token_logprobs(logits, ids)
    (grad_whole,) = torch.autograd.grad(whole.sum(), logits)
    monkeypatch.setattr(rlany.logprobs, "CHUNK_ELEMENTS", 2 * 37 * 6)  # 6 positions a chunk
    calls = []
    real = rlany.logprobs._chunk
    monkeypatch.setattr(rlany.logprobs, "_chunk", lambda *a: calls.append(1) or real(*a))
    chunked = token_logprobs(logits, ids)
    (grad_chunked,) = torch.autograd.grad(chunked.sum(), logits)
    assert torch.equal(whole, chunked) and torch.equal(grad_whole, grad_chunked)
    assert len(calls) == 2 * 9  # 9 chunks of 49 positions (the last of 1), each run again
    with torch.no_grad():  # no backward: each chunk once
        assert torch.equal(token_logprobs(logits, ids), whole) and len(calls) == 2 * 9 + 9


def test_response_logprobs_keep_only_response_logits_equals_full(tiny_model):
    from rlany.compat import accepts_logits_to_keep
    from rlany.training.trainer import collate, response_logprobs

    model, tok = load_model(tiny_model, None, TrainOptions(output="unused"))
    raw = [([{"role": "user", "content": "a much longer prompt " * k}], "answer 42", 1.0, True)
           for k in (1, 6, 3)]  # different prompt lengths: the kept window is the widest
    batch = collate(tokenize(tok, raw, max_len=512)[0], tok.eos_token_id)
    assert accepts_logits_to_keep(model)
    with torch.no_grad():
        full, full_mask, _ = response_logprobs(model, batch, "cpu", keep=False)
        kept, kept_mask, _ = response_logprobs(model, batch, "cpu", keep=True)
    assert kept.shape[1] < full.shape[1]
    assert torch.equal(full_mask[full_mask.any(dim=1)].sum(), kept_mask.sum())
    assert torch.allclose(full[full_mask], kept[kept_mask], atol=1e-5)


def _samples(tokenizer, n=8):
    raw = [([{"role": "user", "content": f"What is {i} + {i}?"}], f"It is {2 * i}.",
            (1.0 + i) if i % 2 else -0.5, True) for i in range(n)]  # loss != 0 at step 1
    return tokenize(tokenizer, raw, max_len=512)[0]


def _lora_params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def _train(tiny_model, tmp_path, name, samples=None, **kw):
    """fp32 unless told: the exactness tests compare runs to 1e-5, and `auto` is bf16 on a
    CPU with bf16 units."""
    opts = TrainOptions(output="unused", lr=1e-2, seed=0, **{"dtype": "float32", **kw})
    model, tok = load_model(tiny_model, None, opts)
    samples = samples if samples is not None else _samples(tok)
    logs = []
    train(samples, model, tok, opts, tmp_path / name, {"data_sha256": "x"}, logs.append)
    return model, logs


def test_eos_closes_each_response_and_long_samples_drop_whole(tiny_model):
    _, tok = load_model(tiny_model, None, TrainOptions(output="unused"))
    raw = [([{"role": "user", "content": "short"}], "ok", 0.5, True),
           ([{"role": "user", "content": "long " * 400}], "ok", -7.0, True),
           ([{"role": "user", "content": "cut"}], "partial", 0.25, False)]
    kept, dropped = tokenize(tok, raw, max_len=64)
    assert dropped == 1
    # the long prompt went away together with its own advantage: nothing shifted
    assert [s.advantage for s in kept] == [0.5, 0.25]
    assert kept[0].response_ids[-1] == tok.eos_token_id
    assert kept[1].response_ids[-1] != tok.eos_token_id   # truncated: no EOS taught


def test_a_step_changes_the_adapter_and_writes_a_loadable_checkpoint(tiny_model, tmp_path):
    opts = TrainOptions(output="unused", lr=1e-2, micro_batch=4, grad_accum=1, max_steps=1)
    model, tok = load_model(tiny_model, None, opts)
    before = _lora_params(model)
    logs = []
    train(_samples(tok), model, tok, opts, tmp_path / "ckpt", {"data_sha256": "x"}, logs.append)
    after = _lora_params(model)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert logs[-1]["step"] == 1 and logs[-1]["tokens"] > 0
    ckpt = tmp_path / "ckpt"
    assert (ckpt / "adapter_config.json").exists() and (ckpt / "rlany.json").exists()
    assert not (tmp_path / "ckpt.partial").exists() and not (tmp_path / "ckpt.tmp").exists()
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model), ckpt)


def test_the_progress_counts_every_token_a_sample_holds(tiny_model, tmp_path):
    _, tok = load_model(tiny_model, None, TrainOptions(output="unused"))
    samples = _samples(tok)
    _, logs = _train(tiny_model, tmp_path, "ckpt", samples, micro_batch=4, grad_accum=1)
    steps = [r for r in logs if "loss" in r]
    assert [r["of"] for r in steps] == [2, 2]  # 8 samples in steps of 4
    # the two steps hold the 8 samples between them: prompts and responses
    assert sum(r["sample_tokens"] for r in steps) == sum(s.length for s in samples)
    for r in steps:
        assert r["tokens"] < r["sample_tokens"]  # the response tokens alone are fewer
        # both rates over the same seconds: tokens per sample as the step holds them
        assert r["tokens_per_s"] / r["samples_per_s"] == pytest.approx(
            r["sample_tokens"] / 4, rel=0.01)


def test_batch_4_accum_1_equals_batch_1_accum_4(tiny_model, tmp_path):
    # Compared before the optimizer: Adam's first step is ~lr*sign(g), so parameters would
    # amplify float noise in near-zero gradients. Loss and gradient norm of the step are
    # what a double (or missing) division under accumulation would change.
    _, la = _train(tiny_model, tmp_path, "a", micro_batch=4, grad_accum=1, max_steps=1)
    _, lb = _train(tiny_model, tmp_path, "b", micro_batch=1, grad_accum=4, max_steps=1)
    assert la[0]["loss"] == pytest.approx(lb[0]["loss"], rel=1e-5, abs=1e-7)
    assert la[0]["grad_norm"] == pytest.approx(lb[0]["grad_norm"], rel=1e-4)
    assert la[0]["tokens"] == lb[0]["tokens"]
    _, lc = _train(tiny_model, tmp_path, "c", micro_batch=2, grad_accum=2, max_steps=1,
                   max_grad_norm=1e9)
    assert lc[0]["grad_norm"] == pytest.approx(la[0]["grad_norm"], rel=1e-4)


def test_grad_checkpointing_recomputes_the_layers_and_changes_no_number(tiny_model, tmp_path):
    def run(flag: bool, **kw):
        opts = TrainOptions(output="unused", lr=1e-2, seed=0, dtype="float32", micro_batch=4,
                            grad_accum=1, max_steps=2, grad_checkpointing=flag, **kw)
        model, tok = load_model(tiny_model, None, opts)
        net = model.base_model.model
        calls, mlp = [], net.model.layers[0].mlp
        forward = mlp.forward  # (a hook does not see the recompute: the method does)
        mlp.forward = lambda *a, **k: calls.append(1) or forward(*a, **k)
        logs = []
        summary = train(_samples(tok), model, tok, opts, tmp_path / f"ckpt-{flag}-{kw}",
                        {"data_sha256": "x"}, logs.append)
        # handed back as it came (the loop's trainers borrow the engine's network)
        assert not net.is_gradient_checkpointing
        assert getattr(net, "_require_grads_hook", None) is None
        return len(calls), logs, summary
    plain_calls, plain, _ = run(False, share_prefix=False)
    again_calls, again, _ = run(True, share_prefix=False)
    assert again_calls == plain_calls + 2  # each step's one micro-batch run again backward
    for a, b in zip(plain, again, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-7)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
    # the shared prefixes are a key-value cache the recompute cannot keep: off with it
    assert run(True)[2]["shared_prefix"] is False


def test_lr_schedules_by_hand():
    assert [lr_at(1.0, "constant", s, 4) for s in range(4)] == [1.0] * 4
    assert [lr_at(1.0, "linear", s, 4) for s in range(4)] == [1.0, 0.75, 0.5, 0.25]
    cos = [lr_at(1.0, "cosine", s, 4) for s in range(4)]
    assert cos == pytest.approx([1.0, 0.5 + 0.5 * math.cos(math.pi / 4), 0.5,
                                 0.5 + 0.5 * math.cos(3 * math.pi / 4)])
    assert lr_at(1.0, "linear", 0, 1) == 1.0  # one step: the full rate


def test_a_resume_whose_start_weights_were_rewritten_in_place_is_refused(tmp_path):
    """The resume key holds the base model and start adapter by content too: the same
    path holding other weights is another start, not the interrupted training's."""
    from rlany.training import state

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"one")
    meta = {"data_sha256": "x", "base_model": str(model), "init_adapter": None}
    opts = TrainOptions(output="unused", lr=1e-2)
    partial = tmp_path / "out.partial"
    partial.mkdir()
    (partial / "state.json").write_text(json.dumps(
        {"step": 2, "data_sha256": "x", "plan": None, "update": state.update_key(opts, meta)}))
    assert state.saved_step(partial, meta, None, state.update_key(opts, meta)) == 2
    (model / "model.safetensors").write_bytes(b"two")
    with pytest.raises(RlanyError, match="start's weights were rewritten in place"):
        state.saved_step(partial, meta, None, state.update_key(opts, meta))


@pytest.mark.parametrize("schedule", ["constant", "linear"])
def test_resume_continues_from_the_saved_step(tiny_model, tmp_path, schedule):
    full, full_logs = _train(tiny_model, tmp_path, "full", micro_batch=2, grad_accum=1,
                             lr_schedule=schedule)
    assert len(full_logs) == 4
    want = [1e-2 * (1 if schedule == "constant" else (4 - s) / 4) for s in range(4)]
    assert [r["lr"] for r in full_logs] == pytest.approx(want)  # the rate each step used

    class Killed(Exception):
        pass

    opts = TrainOptions(output="unused", lr=1e-2, seed=0, micro_batch=2, grad_accum=1,
                        lr_schedule=schedule, dtype="float32")
    model, tok = load_model(tiny_model, None, opts)

    def die_after_two(record):
        if record.get("step") == 2:
            raise Killed

    with pytest.raises(Killed):
        train(_samples(tok), model, tok, opts, tmp_path / "resumed", {"data_sha256": "x"},
              die_after_two)
    assert (tmp_path / "resumed.partial" / "state.json").exists()
    assert not (tmp_path / "resumed").exists()          # no half checkpoint
    # other batching (here: another seed's sample order) must not continue that state
    other = TrainOptions(output="unused", lr=1e-2, seed=1, micro_batch=2, grad_accum=1,
                         lr_schedule=schedule, dtype="float32")
    model, tok = load_model(tiny_model, None, other)
    with pytest.raises(RlanyError, match="other samples or batching"):
        train(_samples(tok), model, tok, other, tmp_path / "resumed", {"data_sha256": "x"},
              lambda record: None)
    # another learning rate would go on from the old run's weights and optimizer: refused
    model, tok = load_model(tiny_model, None, dataclasses.replace(opts, lr=5e-3))
    with pytest.raises(RlanyError, match=r"other settings is in the way \(--lr 0.01 -> 0.005\)"):
        train(_samples(tok), model, tok, dataclasses.replace(opts, lr=5e-3),
              tmp_path / "resumed", {"data_sha256": "x"}, lambda record: None)
    model, tok = load_model(tiny_model, None, opts)
    logs = []
    train(_samples(tok), model, tok, opts, tmp_path / "resumed", {"data_sha256": "x"},
          logs.append)
    assert logs[0] == {"event": "resume", "step": 1}
    assert [r["step"] for r in logs[1:]] == [2, 3, 4]
    pf, pr = _lora_params(full), _lora_params(model)
    for k in pf:  # (a lost optimizer state or step moves weights by ~1e-3 at this rate;
        # AVX-512 kernels leave fp32 runs ~1e-5 apart, AVX2 kernels on one thread up to
        # 1.2e-4 on one tensor of the 40: measured with ATEN_CPU_CAPABILITY=avx2)
        torch.testing.assert_close(pr[k], pf[k], rtol=1e-4, atol=2.5e-4, msg=k)


@pytest.mark.parametrize("order", ["shuffled", "grouped", "stratified"])
def test_plan_covers_every_sample_once_per_epoch(order):
    samples = [Sample([1, i % 3], [2], (-1.0) ** (i // 3)) for i in range(10)]
    opts = TrainOptions(output="unused", micro_batch=2, grad_accum=2, epochs=2,
                        batch_order=order)
    steps = plan_steps(samples, opts, world=1)
    flat = [i for s in steps for i in s]
    assert sorted(flat) == sorted(list(range(10)) * 2) and len(steps) == 6


def test_grouped_steps_hold_a_prompts_samples_together():
    # 4 tasks x 4 rollouts, interleaved as a rollout file would not be
    samples = [Sample([7, task, 9], [i], 0.0) for i in range(4) for task in range(4)]
    orders = []
    for seed in range(4):
        opts = TrainOptions(output="unused", micro_batch=4, grad_accum=1, seed=seed,
                            batch_order="grouped")
        steps = plan_steps(samples, opts, world=1)
        assert all(len({samples[i].prompt_ids[1] for i in st}) == 1 for st in steps)
        orders.append([samples[st[0]].prompt_ids[1] for st in steps])
    assert len({tuple(o) for o in orders}) > 1  # the steps' order is still drawn


def test_stratified_steps_hold_both_classes_in_proportion_and_few_prompts():
    # 8 tasks x 6 steps; a task's steps all one outcome, 16 of 48 positive (a verdict's
    # target), interleaved as a scored file would not be
    samples = [Sample([7, task, k], [], 1.0, target=1.0 if task < 3 else -1.0)
               for k in range(6) for task in range(8)]
    samples = [s for s in samples if not (s.prompt_ids[1] == 2 and s.prompt_ids[2] > 3)]
    # 3 tasks positive: 16 of 46 samples
    for order, seed in (("stratified", 0), ("stratified", 1), ("grouped", 0)):
        opts = TrainOptions(output="unused", micro_batch=6, grad_accum=1, seed=seed,
                            batch_order=order)
        steps = plan_steps(samples, opts, world=1)
        assert sorted(i for st in steps for i in st) == list(range(len(samples)))
        pos = [sum(samples[i].target > 0 for i in st) for st in steps]
        tasks = [len({samples[i].prompt_ids[1] for i in st}) for st in steps]
        if order == "grouped":  # the failure stratified mends: steps of one outcome
            assert min(pos) == 0 and max(pos) == 6
            continue
        # every step 2 of ~6 positive (16/46 of it), and each class a run of <= 2 tasks
        assert all(len(st) in (5, 6) for st in steps) and set(pos) == {2}
        assert max(tasks) <= 4 and sum(tasks) / len(steps) < 3.5
    # the class of a sample without a target is its advantage's sign
    policy = [Sample([7, i], [1], a) for i, a in enumerate([0.5, -0.5, 0.2, -0.1])]
    opts = TrainOptions(output="unused", micro_batch=2, grad_accum=1,
                        batch_order="stratified")
    assert all(sorted(policy[i].advantage > 0 for i in st) == [False, True]
               for st in plan_steps(policy, opts, world=1))


def test_grouped_steps_share_whole_prompts_with_the_same_losses(tiny_model, tmp_path):
    """Grouped steps are where sharing goes deepest (identical prompts, only the responses
    apart): the losses equal the plain padded batch's."""
    _, tok = load_model(tiny_model, None, TrainOptions(output="unused"))
    raw = [([{"role": "user", "content": f"What is {t} + {t}? Think."}], f"It is {r}.",
            (r - 0.5) * (1 + t), True) for r in range(4) for t in range(2)]
    samples = tokenize(tok, raw, max_len=512)[0]
    runs = {share: [r["loss"] for r in _train(tiny_model, tmp_path, f"s{share}", samples,
                                              micro_batch=4, grad_accum=1,
                                              batch_order="grouped",
                                              share_prefix=share)[1] if "loss" in r]
            for share in (True, False)}
    assert len(runs[True]) == 2 and all(abs(x) > 0 for x in runs[True])
    assert runs[True] == pytest.approx(runs[False], rel=1e-4, abs=1e-6)


def test_cli_train_policy_then_train_rm(tiny_model, tmp_path, cli):
    trajs = [make_traj("q", i, +1 if i < 2 else -1, n_steps=2) for i in range(4)]
    scores = [[[1, -1, 1], [1, 1, -1]], [[1, 1, 1], [-1, 1, 1]],
              [[-1, -1, 1], [-1, 1, -1]], [[1, -1, -1], [-1, -1, -1]]]
    scored, _ = score_group([(f"x:{i}", t, make_judgment(t, s))
                             for i, (t, s) in enumerate(zip(trajs, scores))], ScoreOptions())
    data = write_jsonl(tmp_path / "scored.jsonl", scored)
    r = cli("train-policy", "-i", str(data), "-o", str(tmp_path / "policy"), "--model",
            tiny_model, "--micro-batch", "2", "--grad-accum", "2")
    assert r.returncode == 0, r.stderr
    meta = json.loads((tmp_path / "policy" / "rlany.json").read_text())
    assert meta["kind"] == "policy" and meta["samples"] == 8 and meta["metrics"]["steps"] == 2
    assert len((tmp_path / "policy.metrics.jsonl").read_text().splitlines()) == 2
    r = cli("train-rm", "-i", str(data), "-o", str(tmp_path / "rm"), "--model", tiny_model)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "rm" / "rlany.json").read_text())["kind"] == "rm"
    # a finished checkpoint is never overwritten
    r = cli("train-rm", "-i", str(data), "-o", str(tmp_path / "rm"), "--model", tiny_model)
    assert r.returncode == 1 and "already exists" in r.stderr


@pytest.mark.parametrize("kl", [False, True], ids=["pre-update", "kl-ref-adapter"])
def test_two_process_ddp_equals_one_process_with_accumulation(tiny_model, tiny_lora, tmp_path,
                                                              kl):
    """accelerate on 2 CPU processes (gloo DDP) vs 1 process, same global batch: each
    step's gradient norm is the same, so the loss is scaled exactly once across processes.
    With --kl-ref ADAPTER each process loads the reference beside the trained adapter
    under DDP and reads its samples' log-probs: the KL of every step is the same too.
    11 samples in steps of 4: the last step's 3 leave rank 1 one short; it runs a padded
    row that carries no loss, so both ranks run the same collectives (no hang). float32:
    under bf16 autocast (dtype auto on a CPU with bf16) the two runs differ by rounding
    (~1e-3 relative), which hides what the test compares; the tiny model's tokenizer is
    trained on this package's sources, so which tokens round how changes with any edit."""
    import os
    import subprocess
    import sys

    kl = ["--kl-ref", tiny_lora, "--kl-beta", "0.5"] if kl else []
    lines = open("tests/golden/score/out.jsonl").read().splitlines()
    one_step = next(line for line in lines
                    if sum(s["keep"] for s in json.loads(line)["steps"]) == 1)
    extra = json.loads(one_step)
    extra["traj_id"] += "-copy"
    data = str(tmp_path / "eleven.jsonl")
    with open(data, "w") as f:
        f.write("\n".join([*lines, json.dumps(extra)]) + "\n")
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "RLANY_DEBUG": "1"}
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                          "-m", "rlany", "train-policy", "-i", data, "-o", str(tmp_path / "ddp"),
                          "--model", tiny_model, "--micro-batch", "2", "--grad-accum", "1",
                          "--dtype", "float32", *kl],
                         capture_output=True, text=True, env=env, timeout=300)
    assert ddp.returncode == 0, ddp.stderr[-2000:]
    one = subprocess.run([sys.executable, "-m", "rlany", "train-policy", "-i", data, "-o",
                          str(tmp_path / "one"), "--model", tiny_model, "--micro-batch", "2",
                          "--grad-accum", "2", "--dtype", "float32", *kl], capture_output=True,
                         text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-2000:]
    a = [json.loads(x) for x in (tmp_path / "ddp.metrics.jsonl").read_text().splitlines()]
    b = [json.loads(x) for x in (tmp_path / "one.metrics.jsonl").read_text().splitlines()]
    assert len(a) == len(b) == 3                      # one writer: no duplicate lines
    for x, y in zip(a, b):
        assert x["grad_norm"] == pytest.approx(y["grad_norm"], rel=1e-4)
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-4, abs=1e-6)
        assert x["tokens"] == y["tokens"]
        assert x["kl"] == pytest.approx(y["kl"], rel=1e-4, abs=1e-9)
    if kl:  # the fresh adapter starts at the base model, away from the reference
        assert min(x["kl"] for x in a) > 1e-4


def test_an_adapter_that_does_not_reach_the_engine_is_caught(tiny_model, tmp_path):
    """The trainer saves a probe (rlany.json); the hf engine scores it when it loads the
    adapter: the trained adapter passes, the same adapter with zeroed weights (the base
    model in disguise) and an adapter whose probe came from another model are refused."""
    import shutil

    from safetensors.torch import load_file, save_file

    from rlany.engines.base import EngineConfig, Request, Sampling
    from rlany.engines.hf import HfEngine
    from rlany.errors import RlanyError

    _train(tiny_model, tmp_path, "good", micro_batch=2, grad_accum=1)
    good = tmp_path / "good"
    probe = json.loads((good / "rlany.json").read_text())["probe"]
    assert len(probe["logprobs"]) == len(probe["response_ids"]) > 3
    request = Request([{"role": "user", "content": "hi"}], Sampling(max_tokens=2),
                      adapter=str(good))
    engine = HfEngine(EngineConfig(kind="hf", model=tiny_model, dtype="float32"))
    engine.generate([request])
    (checked,) = engine.probes.checks
    assert checked["status"] == "ok" and checked["to_trained"] < 1e-2, checked

    zeroed = tmp_path / "zeroed"
    shutil.copytree(good, zeroed)
    weights = load_file(zeroed / "adapter_model.safetensors")
    save_file({k: v * 0 for k, v in weights.items()}, zeroed / "adapter_model.safetensors")
    for _ in range(2):  # refused again on the next use, not silently kept
        with pytest.raises(RlanyError, match="did not reach the engine"):
            engine.generate([Request(request.messages, request.sampling, adapter=str(zeroed))])
    engine.generate([request])   # the good one still serves

    other = tmp_path / "other"
    shutil.copytree(good, other)
    meta = json.loads((other / "rlany.json").read_text())
    meta["probe"]["logprobs"] = [x - 1.0 for x in meta["probe"]["logprobs"]]
    (other / "rlany.json").write_text(json.dumps(meta))
    with pytest.raises(RlanyError, match="did not reach the engine"):
        engine.generate([Request(request.messages, request.sampling, adapter=str(other))])


def test_probe_check_rules():
    from rlany.errors import RlanyError
    from rlany.probe import check

    probe = {"logprobs": [-1.0, -2.0], "base_logprobs": [-1.5, -2.5]}     # gap 0.5
    assert check(probe, [-1.02, -2.03], "a")["status"] == "ok"            # bf16-level noise
    for got in ([-1.5, -2.5], [-3.0, -4.0]):                             # base, or elsewhere
        with pytest.raises(RlanyError):
            check(probe, got, "a")
    near = {"logprobs": [-1.0, -2.0], "base_logprobs": [-1.03, -2.03]}   # gap 0.03 < noise
    assert check(near, [-1.03, -2.03], "a")["status"] == "indeterminate"
    with pytest.raises(RlanyError, match="tokenized the probe differently"):
        check(probe, [-1.0], "a")


@pytest.mark.parametrize("serving", [False, True], ids=["plain-engine", "serving-adapter"])
def test_training_on_the_engines_network_equals_a_fresh_load(tiny_model, tiny_lora, tmp_path,
                                                             serving):
    """One model in memory: the loop's trainer borrows the hf engine's network. The
    checkpoint equals the one trained on a model loaded from disk (fresh adapter and a
    continued one), the engine holds no extra adapter afterwards, serves as before, and
    its base weights are the same tensors (never copied)."""
    from dataclasses import replace

    from safetensors.torch import load_file

    from rlany.engines.base import EngineConfig, Request, Sampling
    from rlany.engines.hf import HfEngine
    from rlany.stages.train_policy import run

    trajs = [make_traj("q", i, +1 if i < 2 else -1, n_steps=2) for i in range(4)]
    scores = [[[1, -1, 1], [1, 1, -1]], [[1, 1, 1], [-1, 1, 1]],
              [[-1, -1, 1], [-1, 1, -1]], [[1, -1, -1], [-1, -1, -1]]]
    scored, _ = score_group([(f"x:{i}", t, make_judgment(t, s))
                             for i, (t, s) in enumerate(zip(trajs, scores))], ScoreOptions())
    data = str(write_jsonl(tmp_path / "scored.jsonl", scored))
    eng = HfEngine(EngineConfig(kind="hf", model=tiny_model, dtype="float32"))
    ask = [Request([{"role": "user", "content": "hello"}], Sampling(max_tokens=6,
                                                                    temperature=0))]
    ask_lora = [Request(ask[0].messages, ask[0].sampling, adapter=tiny_lora)]
    if serving:
        eng.generate(ask_lora)
    before = (eng.generate(ask)[0].completions[0].token_ids,
              eng.generate(ask_lora)[0].completions[0].token_ids)
    base_ids = {p.data_ptr() for n, p in eng.net.named_parameters() if "lora_" not in n}
    for name, adapter in (("fresh", None), ("continued", tiny_lora)):
        opts = TrainOptions(input=data, output="unused", model=tiny_model, dtype="float32",
                            lr=1e-2, micro_batch=2, adapter=adapter, seed=3)
        run(replace(opts, output=str(tmp_path / f"{name}-disk")), say=lambda s: None)
        run(replace(opts, output=str(tmp_path / f"{name}-engine")),
            say=lambda s: None, engine=eng)
        got = load_file(tmp_path / f"{name}-engine" / "adapter_model.safetensors")
        want = load_file(tmp_path / f"{name}-disk" / "adapter_model.safetensors")
        assert got.keys() == want.keys() and got
        for k in want:
            torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-6)
        meta = json.loads((tmp_path / f"{name}-engine" / "rlany.json").read_text())
        assert meta["base_from"] == "engine"
        assert json.loads((tmp_path / f"{name}-disk" / "rlany.json").read_text())[
            "base_from"] == "disk"
    assert not any(p.requires_grad for p in eng.net.parameters())
    assert "default" not in getattr(eng.net, "peft_config", {})
    # the same base tensors (PEFT may leave empty LoRA wrappers around them: names change)
    assert {p.data_ptr() for n, p in eng.net.named_parameters() if "lora_" not in n} == base_ids
    after = (eng.generate(ask)[0].completions[0].token_ids,
             eng.generate(ask_lora)[0].completions[0].token_ids)
    assert after == before
    # the trained checkpoint is what the engine serves next
    trained = [Request(ask[0].messages, ask[0].sampling, adapter=str(tmp_path / "fresh-engine"))]
    assert eng.generate(trained)[0].completions


def test_lora_on_the_top_layers_only(tiny_model, tmp_path):
    """--lora-layers N: the adapter holds the top N layers' LoRA only, and training moves
    them (the backward stops above the lower layers)."""
    from safetensors.torch import load_file

    from rlany.stages.train_policy import TrainOptions
    from rlany.training.model import load_model
    from rlany.training.trainer import train
    from test_shared_prefix import _samples
    opts = TrainOptions(output="x", micro_batch=4, grad_accum=1, max_steps=2, lr=1e-2,
                        target_modules="q_proj,v_proj", lora_layers=1, dtype="float32")
    model, tok = load_model(tiny_model, None, opts)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".layers.1." in n for n in trainable)
    train(_samples(4, 12), model, tok, opts, tmp_path / "a", {"data_sha256": "t"},
          lambda r: None)
    weights = load_file(tmp_path / "a" / "adapter_model.safetensors")
    assert weights and all(".layers.1." in n for n in weights)
    assert any(w.abs().sum() > 0 for n, w in weights.items() if "lora_B" in n)


def test_full_fine_tuning_in_bf16_keeps_fp32_master_weights(tiny_model, tmp_path):
    """At full fine-tuning's lr ~1e-6 bf16 weights round most updates away (a bf16 weight's
    spacing is 2^-8 of its size): the weights and AdamW's state stay fp32, the forward runs
    under bf16 autocast, the checkpoint holds the fp32 weights."""
    opts = TrainOptions(output="unused", lr=1e-6, full=True, dtype="bfloat16", micro_batch=4,
                        grad_accum=1, max_steps=2)
    model, tok = load_model(tiny_model, None, opts)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    before = {n: p.detach().clone() for n, p in model.named_parameters()}

    def changed(net) -> float:  # the share of the attention and MLP weights that moved
        moved = [(p.detach().cpu() != before[n]).float().mean().item()
                 for n, p in net.named_parameters() if "proj" in n]
        return sum(moved) / len(moved)

    seen = set()  # the dtype a linear layer computes in: bf16 under the autocast
    linear = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
    hook = linear.register_forward_hook(lambda m, i, out: seen.add(out.dtype))
    train(_samples(tok), model, tok, opts, tmp_path / "ckpt", {"data_sha256": "x"},
          lambda r: None)
    hook.remove()
    assert seen == {torch.bfloat16}
    assert changed(model) > 0.9
    saved = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert saved.get("dtype", saved.get("torch_dtype")) == "float32"
    # the same two steps on bf16 weights (what --full in bf16 did before): nearly all lost
    low = tmp_path / "low"
    model, tok = load_model(tiny_model, None, TrainOptions(output="unused", full=True,
                                                           dtype="float32"))
    model.to(torch.bfloat16)
    before = {n: p.detach().float().clone() for n, p in model.named_parameters()}
    train(_samples(tok), model, tok, opts, low, {"data_sha256": "x"}, lambda r: None)
    assert changed(model) < 0.5


def test_autocast_is_for_full_bf16_anywhere_and_for_lora_bf16_on_a_gpu(tiny_model, tmp_path,
                                                                       monkeypatch):
    """LoRA's fp32 adapters on a bf16 base: under autocast on a GPU (PEFT's casts to fp32
    cost ~25% there), as measured on a CPU (every learning result), never under DeepSpeed;
    the checkpoint says which."""
    from rlany.training.model import autocast_bf16

    lora, full = (TrainOptions(output="unused", dtype="bfloat16", full=f) for f in (0, 1))
    fp32 = TrainOptions(output="unused", dtype="float32")
    assert autocast_bf16(lora, "cuda") and autocast_bf16(full, "cpu")
    assert not autocast_bf16(lora, "cpu") and not autocast_bf16(fp32, "cuda")
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    assert not autocast_bf16(lora, "cuda") and not autocast_bf16(full, "cuda")
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED")
    opts = TrainOptions(output="unused", micro_batch=4, grad_accum=1, max_steps=1, lora_r=4,
                        dtype="float32")
    model, tok = load_model(tiny_model, None, opts)
    train(_samples(tok), model, tok, opts, tmp_path / "ckpt", {"data_sha256": "x"},
          lambda r: None)
    saved = json.loads((tmp_path / "ckpt" / "rlany.json").read_text())
    assert saved["autocast"] is None and saved["metrics"]["shared_prefix"] is True
