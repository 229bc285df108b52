"""The warm start: the env's expert as demonstrations (`rollout --expert`), supervised
fine-tuning on them (`rlany sft`), and a loop that starts from that adapter (`init_policy`)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from conftest import make_traj, read_jsonl, write_jsonl
from rlany.envs.household import HouseholdEnv
from rlany.errors import RlanyError
from rlany.files.records import Task
from rlany.training.losses import nll_loss

LEARN = "examples/household/learn_tasks.jsonl"


def test_nll_loss_by_hand():
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.9], [0.1, 0.5, 0.9]]))
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    weights = torch.tensor([1.0, 2.0])
    parts = nll_loss(logp, weights, mask)
    seq1 = -(math.log(0.5) + math.log(0.25)) / 2
    seq2 = -2 * (math.log(0.1) + math.log(0.5) + math.log(0.9)) / 3
    assert parts.loss.item() == pytest.approx((seq1 + seq2) / 2, rel=1e-6)
    assert parts.tokens == 5 and parts.clipped == 0 and parts.kl == 0.0
    assert nll_loss(logp, weights, mask, normalizer=4).loss.item() == \
        pytest.approx(parts.loss.item() / 2, rel=1e-6)


def test_household_expert_action_follows_a_shortest_plan():
    task = Task(**{k: v for k, v in json.loads(open(LEARN).readline()).items()
                   if k in ("task_id", "env", "spec", "prompt")})
    env = HouseholdEnv()
    env.reset(task)
    for _ in range(task.spec["max_steps"]):
        action = env.expert_action()
        assert action in env.choices()
        result = env.step(action)
        assert result.info["label"] == 1
        if result.done:
            break
    assert result.success
    assert env.expert_action() is None   # the goal holds: nothing left to do


def test_expert_rollout_writes_successful_demonstrations(tmp_path, cli):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(open(LEARN).readlines()[:6]))
    out = tmp_path / "demos.jsonl"
    r = cli("rollout", "-i", str(tasks), "-o", str(out), "--expert", "--n", "1",
            "--max-steps", "4", "--history-turns", "1")
    assert r.returncode == 0, r.stderr
    demos = read_jsonl(out)
    assert len(demos) == 6 and all(d["outcome"] == 1 for d in demos)
    assert all(s["info"]["label"] == 1 for d in demos for s in d["steps"])
    assert all(d["policy"]["model"] == "expert" for d in demos)
    # the prompts are the policy's: the task message, then at most one earlier exchange
    assert all(len(s["prompt_messages"]) <= 3 for d in demos for s in d["steps"])
    meta = json.loads((tmp_path / "demos.meta.json").read_text())
    assert meta["counts"]["success_rate"] == 1.0
    # --expert loads no model, so an adapter is a usage error; an env without an expert fails
    r = cli("rollout", "-i", str(tasks), "-o", str(tmp_path / "x.jsonl"), "--expert",
            "--adapter", str(tmp_path))
    assert r.returncode == 2 and "--expert" in r.stderr
    sums = write_jsonl(tmp_path / "sums.jsonl", [Task(task_id="s", env="reasoning",
                       spec={"question": "What is 1 + 1?", "answer": "2"}, prompt="")])
    r = cli("rollout", "-i", str(sums), "-o", str(tmp_path / "y.jsonl"), "--expert", "--n", "1")
    assert r.returncode == 1 and f"{sums}:1: environment 'reasoning' has no expert" in r.stderr
    assert not list(tmp_path.glob("y.jsonl*"))   # refused at read: nothing written
    # the expert is deterministic: n copies of one plan would only repeat it
    r = cli("rollout", "-i", str(tasks), "-o", str(tmp_path / "z.jsonl"), "--expert")
    assert r.returncode == 2 and "--n 1" in r.stderr and not list(tmp_path.glob("z.jsonl*"))


def test_sft_trains_on_successful_steps_and_lowers_their_loss(tiny_model, tmp_path, cli):
    trajs = [make_traj("a", 0, +1, n_steps=2), make_traj("a", 1, -1, n_steps=3),
             make_traj("b", 0, +1, n_steps=2)]
    data = write_jsonl(tmp_path / "demos.jsonl", trajs)
    r = cli("sft", "-i", str(data), "-o", str(tmp_path / "sft"), "--model", tiny_model,
            "--epochs", "8", "--micro-batch", "4", "--lr", "3e-3", "--dtype", "float32")
    assert r.returncode == 0, r.stderr
    meta = json.loads((tmp_path / "sft" / "rlany.json").read_text())
    assert meta["kind"] == "sft" and meta["samples"] == 4   # the failed trajectory's 3: no
    assert meta["metrics"]["old_logprobs"] is None
    losses = [rec["loss"] for rec in read_jsonl(tmp_path / "sft.metrics.jsonl")]
    assert len(losses) == 8 and max(losses[-2:]) < 0.8 * losses[0]   # 6.30 -> 4.51 here
    assert all(rec["kl"] == 0 and rec["clip_frac"] == 0
               for rec in read_jsonl(tmp_path / "sft.metrics.jsonl"))
    r = cli("sft", "-i", str(data), "-o", str(tmp_path / "all"), "--model", tiny_model,
            "--all-outcomes", "--max-steps", "1")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "all" / "rlany.json").read_text())["samples"] == 7
    # an errored episode is no sample even with --all-outcomes (the env failed, not it)
    from dataclasses import replace

    from rlany.files.records import Trajectory, from_json
    from rlany.training.samples import sft_samples
    trajs = [from_json(Trajectory, t) for t in read_jsonl(data)]
    broken = [replace(t, finish="error") if t.outcome != 1 else t for t in trajs]
    assert len(list(sft_samples(broken, all_outcomes=True))) == 4
    failed = write_jsonl(tmp_path / "failed.jsonl", [make_traj("a", 1, -1)])
    r = cli("sft", "-i", str(failed), "-o", str(tmp_path / "none"), "--model", tiny_model)
    assert r.returncode == 1 and "no training samples" in r.stderr
    assert "no trajectory succeeded" in r.stderr and not (tmp_path / "none").exists()


def test_loop_starts_from_init_policy(tmp_path, tiny_model, tiny_lora):
    from test_loop import _config, _run

    config = _config(tmp_path, tiny_model, step_feedback=False, rm_training=False,
                     env_adaptation=False)
    loop = _run(config, init_policy=tiny_lora, iterations=1)
    it0 = loop.dir / "iter_000"
    assert read_jsonl(it0 / "trajectories.jsonl")[0]["policy"]["adapter"] == tiny_lora
    trained = json.loads((it0 / "policy" / "rlany.json").read_text())
    assert trained["init_adapter"] == tiny_lora
    assert json.loads((loop.dir / "eval_init.json").read_text())["policy"]["adapter"] == tiny_lora
    assert json.loads((loop.dir / "config.json").read_text())["init_policy"] == tiny_lora
    (tmp_path / "x").mkdir()
    with pytest.raises(RlanyError, match="init_policy .* is not a LoRA adapter") as e:
        _run(_config(tmp_path / "x", tiny_model), init_policy=str(tmp_path))
    # given as an override, the error names it (not the file); nothing is written
    assert e.value.where is None or e.value.where.endswith("loop.toml")
    assert not (tmp_path / "x" / "runs").exists()


def test_a_run_from_before_init_policy_still_resumes(tmp_path, tiny_model):
    from rlany.loop.loop import Loop, load_config
    from test_loop import _config

    config = _config(tmp_path, tiny_model)
    loop = Loop(load_config(config), config)
    loop._init_run_dir()
    echo = loop.dir / "config.json"
    older = json.loads(echo.read_text())
    del older["init_policy"]   # what a run started before the key existed wrote
    echo.write_text(json.dumps(older))
    Loop(load_config(config), config)._init_run_dir()   # the default: the same config
    (loop.dir / "iter_000").mkdir()   # a stage has run: another config is refused
    with pytest.raises(RlanyError, match="different config"):
        Loop(load_config(config, {"seed": 5}), config)._init_run_dir()


def test_vllm_serves_the_warm_start_adapters_rank(tmp_path, tiny_model, tiny_lora):
    from rlany.loop.loop import load_config
    from test_loop import _config

    config = _config(tmp_path, tiny_model)   # trains rank 4; tiny_lora has rank 8
    assert load_config(config).run["max_lora_rank"] == 4
    assert load_config(config, {"init_policy": tiny_lora}).run["max_lora_rank"] == 8


def _warm_config(tmp_path, tiny_model, tasks=LEARN, **extra):
    lines = ['name = "w"', f'runs_dir = "{tmp_path / "runs"}"', "iterations = 1",
             f'tasks = "{write_lines(tmp_path / "pool.jsonl", tasks, 6)}"',
             f'eval_tasks = "{write_lines(tmp_path / "eval.jsonl", LEARN, 2, skip=6)}"',
             f'model = "{tiny_model}"', 'engine = "fake"', "warm_start = true",
             "step_feedback = false", "rm_training = false", "env_adaptation = false"]
    lines += [f"{k} = {v}" for k, v in extra.items()]
    lines += ["[rollout]", "n = 4", "sample_tasks = 5", "max_steps = 4", "max_tokens = 8",
              "history_turns = 1", "[train_policy]", "micro_batch = 4", "grad_accum = 1",
              "lora_r = 4", 'target_modules = "q_proj,v_proj"', "dtype = \"float32\"",
              "[sft]", "epochs = 1", "micro_batch = 4", "[eval]", "n = 1", "max_steps = 4"]
    path = tmp_path / "loop.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def write_lines(path, src, n, skip=0):
    path.write_text("".join(open(src).readlines()[skip:skip + n]))
    return path


def _run_warm(config, **kw):
    from rlany.engines.fake import FakeEngine
    from rlany.loop.loop import Loop, load_config

    loop = Loop(load_config(config, kw), config)
    loop.executor.engine = FakeEngine.from_rules([{"responses": ["1", "2", "3", "4", "5"]}])
    loop.run()
    return loop


def test_loop_warm_start_makes_its_first_adapter(tmp_path, tiny_model):
    """warm_start = true: the expert plays every pool task once (whatever [rollout]'s n and
    sample_tasks), sft trains [train_policy]'s LoRA shape on it, eval_init evaluates it and
    iteration 0 starts from it; a rerun does nothing; bad combinations fail at the config."""
    config = _warm_config(tmp_path, tiny_model)
    loop = _run_warm(config)
    warm = loop.dir / "warm_start"
    demos = read_jsonl(warm / "demos.jsonl")
    assert len(demos) == 6 and all(d["outcome"] == 1 and d["sample"] == 0 for d in demos)
    assert {d["policy"]["model"] for d in demos} == {"expert"}
    sft = json.loads((warm / "sft" / "rlany.json").read_text())
    assert sft["kind"] == "sft" and sft["samples"] == sum(len(d["steps"]) for d in demos)
    shape = json.loads((warm / "sft" / "adapter_config.json").read_text())
    assert shape["r"] == 4 and set(shape["target_modules"]) == {"q_proj", "v_proj"}
    assert json.loads((loop.dir / "eval_init.json").read_text())["policy"]["adapter"] == \
        str(warm / "sft")
    it0 = loop.dir / "iter_000"
    assert read_jsonl(it0 / "trajectories.jsonl")[0]["policy"]["adapter"] == str(warm / "sft")
    assert json.loads((it0 / "policy" / "rlany.json").read_text())["init_adapter"] == \
        str(warm / "sft")
    assert _run_warm(config).executor.engine.stats.calls == 0   # complete: nothing reruns

    (tmp_path / "x").mkdir()
    with pytest.raises(RlanyError, match="set one of them"):
        _run_warm(_warm_config(tmp_path / "x", tiny_model, init_policy=f'"{warm / "sft"}"'))
    bad = Path(_warm_config(tmp_path / "x", tiny_model))
    bad.write_text(bad.read_text().replace("[sft]\n", "[sft]\nlora_r = 8\n"))
    with pytest.raises(RlanyError, match=r"\[sft\] lora_r: .*\[train_policy\]'s shape"):
        _run_warm(str(bad))
    assert not (tmp_path / "x" / "runs").exists()   # config errors: nothing written
    # an env without an expert fails at its line, before the base model is evaluated
    (tmp_path / "y").mkdir()
    sums = write_jsonl(tmp_path / "sums.jsonl", [Task(task_id="s", env="reasoning",
                       spec={"question": "What is 1 + 1?", "answer": "2"}, prompt="")])
    with pytest.raises(RlanyError, match="has no expert") as e:
        _run_warm(_warm_config(tmp_path / "y", tiny_model, tasks=sums))
    assert e.value.where == f"{tmp_path / 'y' / 'pool.jsonl'}:1"
    assert not (tmp_path / "y" / "runs" / "w" / "eval_base.json").exists()


def test_sibling_runs_share_an_identical_warm_start_and_its_evaluation(tmp_path, tiny_model):
    """A second run beside the first with the same warm-start settings copies warm_start/
    and eval_init.json (its own paths in them, `reused_from` saying whence); another seed
    or another sft setting makes its own."""
    from rlany.engines.fake import FakeEngine
    from rlany.loop.loop import Loop, load_config
    from rlany.models import resolve_model

    config = _warm_config(tmp_path, tiny_model)

    def run(name, **kw):
        loop = Loop(load_config(config, {"name": name, **kw}), config)
        loop.executor.engine = FakeEngine.from_rules([{"responses": ["1", "2", "3", "4", "5"]}],
                                             model=resolve_model(tiny_model))
        loop.run()
        return loop.dir

    a, b = run("a"), run("b")
    for rel in ("warm_start/demos.jsonl", "warm_start/sft/adapter_model.safetensors"):
        assert (b / rel).read_bytes() == (a / rel).read_bytes()
    sft = json.loads((b / "warm_start/sft/rlany.json").read_text())
    assert sft["reused_from"] == str(a / "warm_start")
    assert sft["options"]["output"] == str(b / "warm_start/sft")
    assert sft["data"] == str(b / "warm_start/demos.jsonl")
    demos_meta = json.loads((b / "warm_start/demos.meta.json").read_text())
    assert demos_meta["flags"]["output"] == str(b / "warm_start/demos.jsonl")
    init = json.loads((b / "eval_init.meta.json").read_text())
    assert init["reused_from"] == str(a / "eval_init.json")
    assert init["flags"]["adapter"] == str(b / "warm_start/sft")
    assert json.loads((b / "eval_init.json").read_text())["policy"]["adapter"] == \
        str(b / "warm_start/sft")
    assert json.loads((b / "iter_000/policy/rlany.json").read_text())["init_adapter"] == \
        str(b / "warm_start/sft")
    assert not list(b.glob(".*share-tmp"))
    c = run("c", seed=1)   # another seed: its own warm start and evaluation
    assert "reused_from" not in json.loads((c / "warm_start/sft/rlany.json").read_text())
    assert "reused_from" not in json.loads((c / "eval_init.meta.json").read_text())
    # a sibling whose weights are gone is not copied: this run makes its own
    (tmp_path / "runs" / "e").mkdir()
    for f in (c / "warm_start/sft").glob("*.safetensors"):
        f.rename(f.with_suffix(".moved"))
    run("e", seed=1)  # c is its only match, and c has no weights
    assert "reused_from" not in json.loads(
        (tmp_path / "runs/e/warm_start/sft/rlany.json").read_text())
    # the warm start shared but its weights changed since: the evaluation is not shared
    d = tmp_path / "runs" / "d"
    (d / "warm_start").mkdir(parents=True)
    shutil.copytree(a / "warm_start", d / "warm_start", dirs_exist_ok=True)
    weights = d / "warm_start/sft/adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-4] + b"\0\0\0\0")
    assert Path(run("d") / "eval_init.meta.json").exists()
    assert "reused_from" not in json.loads((d / "eval_init.meta.json").read_text())
