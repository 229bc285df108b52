"""The judge warm start, a recipe of public stages (docs/stages/loop.md, "A supervised
judge"): expert/random play with both step labels (`rollout --expert-p`), the env's labels
as the judge's verdicts (`judge --labels`), `score --rm-target label`, `train-rm --objective
logloss`; and a loop whose judge starts from that adapter (`init_rm`)."""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import pytest

from conftest import make_traj, read_jsonl, write_jsonl
from rlany.envs.household import make_tasks
from rlany.errors import RlanyError, UsageError

LEARN = "examples/household/learn_tasks.jsonl"
ROOT = Path(__file__).resolve().parent.parent


def _tasks(tmp_path, n=6):
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(open(LEARN).readlines()[:n]))
    return path


def test_expert_p_mixes_random_actions_with_both_labels(tmp_path, cli):
    tasks = _tasks(tmp_path)
    flags = ["--expert", "--expert-p", "0.5", "--n", "4", "--max-steps", "4",
             "--history-turns", "1", "--seed", "3"]
    r = cli("rollout", "-i", str(tasks), "-o", str(tmp_path / "a.jsonl"), *flags)
    assert r.returncode == 0, r.stderr
    trajs = read_jsonl(tmp_path / "a.jsonl")
    assert len(trajs) == 24
    labels = [s["info"]["label"] for t in trajs for s in t["steps"]]
    assert labels.count(1) >= 10 and labels.count(-1) >= 10
    assert {t["outcome"] for t in trajs} == {1, -1}
    # the 4 episodes of a task differ (each draws its own actions) ...
    by_task = {}
    for t in trajs:
        by_task.setdefault(t["task_id"], set()).add(tuple(s["response"] for s in t["steps"]))
    assert sum(len(v) > 1 for v in by_task.values()) >= 4
    # ... and are seeded: a rerun draws the same ones
    r = cli("rollout", "-i", str(tasks), "-o", str(tmp_path / "b.jsonl"), *flags)
    assert r.returncode == 0, r.stderr
    assert [t["steps"] for t in read_jsonl(tmp_path / "b.jsonl")] == [t["steps"] for t in trajs]
    # p = 1 is the expert alone (every step good), p = 0 never asks it for an action
    r = cli("rollout", "-i", str(tasks), "-o", str(tmp_path / "c.jsonl"), "--expert",
            "--expert-p", "1", "--n", "2", "--max-steps", "4")
    assert r.returncode == 0, r.stderr
    assert all(s["info"]["label"] == 1 for t in read_jsonl(tmp_path / "c.jsonl")
               for s in t["steps"])
    # --expert-p without --expert is a usage error; an env without listed actions fails at read
    r = cli("rollout", "-i", str(tasks), "-o", str(tmp_path / "d.jsonl"), "--expert-p", "0.5")
    assert r.returncode == 2 and "--expert" in r.stderr and not list(tmp_path.glob("d.jsonl*"))


def test_judge_labels_writes_the_env_labels_as_verdicts(tmp_path, cli):
    tasks = _tasks(tmp_path, 4)
    steps = tmp_path / "steps.jsonl"
    r = cli("rollout", "-i", str(tasks), "-o", str(steps), "--expert", "--expert-p", "0.5",
            "--n", "3", "--max-steps", "4", "--history-turns", "1")
    assert r.returncode == 0, r.stderr
    out = tmp_path / "judgments.jsonl"
    (tmp_path / "labels" / "sub").mkdir(parents=True)  # a folder named as the no-model is
    r = cli("judge", "-i", str(steps), "-o", str(out), "--labels", "--m", "1",  # not it
            "--max-tokens", "0", "--history-steps", "1", "--obs-lines", "1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    trajs, judgments = read_jsonl(steps), read_jsonl(out)
    assert [j["traj_id"] for j in judgments] == [t["traj_id"] for t in trajs]
    for t, j in zip(trajs, judgments):
        assert [s["step"] for s in j["steps"]] == list(range(len(t["steps"])))
        for s in j["steps"]:
            assert len(s["samples"]) == 1 and s["judge_messages"]
            assert s["samples"][0]["score"] == t["steps"][s["step"]]["info"]["label"]
            assert s["samples"][0]["text"] in ("\\boxed{+1}", "\\boxed{-1}")
    meta = json.loads((tmp_path / "judgments.meta.json").read_text())
    assert meta["counts"]["label_accuracy"] == 1.0
    assert meta["flags"]["engine_resolved"]["engine"] == "labels"
    assert meta["flags"]["content"] == {}  # no weights: nothing named by content
    # the judge's prompts are the model judge's (same flags, same messages)
    from rlany.files.records import Trajectory, from_json
    from rlany.prompts import step_prompts
    first = from_json(Trajectory, trajs[0])
    assert [s["judge_messages"] for s in judgments[0]["steps"]] == step_prompts(first, 1, 1)
    # a step without a label (an env that gives none) fails at its line, nothing written
    plain = write_jsonl(tmp_path / "plain.jsonl", [make_traj("a", 0, 1)])
    r = cli("judge", "-i", str(plain), "-o", str(tmp_path / "x.jsonl"), "--labels",
            "--max-tokens", "0")
    assert r.returncode == 1 and f"{plain}:1:" in r.stderr and "label" in r.stderr
    assert not list(tmp_path.glob("x.jsonl*"))
    # an episode the env broke (its last step has no label) is not judged in any mode: a
    # record that says so, and the rest of the file judged
    broken = dict(trajs[0], finish="error", outcome=-1,
                  steps=[*trajs[0]["steps"][:-1], {**trajs[0]["steps"][-1],
                                                   "info": {"error": "step: RuntimeError: x"}}])
    with_error = write_jsonl(tmp_path / "broken.jsonl", [broken, *trajs[1:]])
    r = cli("judge", "-i", str(with_error), "-o", str(tmp_path / "z.jsonl"), "--labels",
            "--m", "1", "--max-tokens", "0", "--history-steps", "1", "--obs-lines", "1")
    assert r.returncode == 0, r.stderr
    again = read_jsonl(tmp_path / "z.jsonl")
    assert again[0]["skipped"].startswith("episode errored") and again[0]["steps"] == []
    assert again[1:] == judgments[1:]
    # --labels calls no model: an adapter or a reasoning judge is a usage error
    r = cli("judge", "-i", str(steps), "-o", str(tmp_path / "y.jsonl"), "--labels",
            "--max-tokens", "16")
    assert r.returncode == 2 and "--labels" in r.stderr


def recipe() -> list[list[str]]:
    """The recipe's command lines, read from docs/stages/loop.md between its
    `<!-- judge-recipe:begin -->` and `<!-- judge-recipe:end -->` markers."""
    text = (ROOT / "docs" / "stages" / "loop.md").read_text()
    block = re.search(r"<!-- judge-recipe:begin -->\n```bash\n(.*?)```\n"
                      r"<!-- judge-recipe:end -->", text, re.S)
    assert block, "docs/stages/loop.md has no judge-recipe block"
    lines = block.group(1).replace("\\\n", " ").splitlines()
    return [words for line in lines if (words := shlex.split(line, comments=True))]


def test_the_recipe_is_four_public_commands():
    from rlany.options import specs
    from rlany.stages import COMMANDS

    commands = recipe()
    assert [argv[1] for argv in commands] == ["rollout", "judge", "score", "train-rm"]
    assert all(argv[0] == "rlany" for argv in commands)
    by_name = {c.name: c.options for c in COMMANDS}
    for argv in commands:  # every flag it uses is one of the command's options
        known = {f"--{p}{k.replace('_', '-')}" for k in specs(by_name[argv[1]])
                 for p in ("", "no-")}
        assert {a.split("=")[0] for a in argv if a.startswith("--")} <= known, argv


@pytest.fixture(scope="module")
def warm_judge(tmp_path_factory, tiny_model):
    """The README's recipe run as it is written, from a directory holding its inputs: 6
    of learn.toml's pool tasks, the tiny model for smollm2, 2 optimizer steps."""
    from conftest import run_cli

    where = tmp_path_factory.mktemp("recipe")
    tasks = where / LEARN
    tasks.parent.mkdir(parents=True)
    tasks.write_text("".join(open(LEARN).readlines()[:6]))
    for argv in recipe():
        argv = [tiny_model if a == "smollm2" and argv[i - 1] == "--model" else a
                for i, a in enumerate(argv)]
        if argv[1] == "train-rm":
            argv += ["--max-steps", "2"]
        r = run_cli(*argv[1:], cwd=where)
        assert r.returncode == 0, (argv, r.stderr)
    return where / "judge"


def test_the_recipe_makes_a_supervised_judge(warm_judge):
    # supervised: every judged step of every task has its label as the target
    scored = read_jsonl(warm_judge / "scored.jsonl")
    targets = [s["rm_target"] for t in scored for s in t["steps"]]
    trajs = read_jsonl(warm_judge / "steps.jsonl")
    labels = [s["info"]["label"] for t in trajs for s in t["steps"]]
    assert targets == labels and set(labels) == {1, -1}
    meta = json.loads((warm_judge / "rm" / "rlany.json").read_text())
    assert meta["kind"] == "rm" and meta["objective"] == "logloss"
    assert meta["samples"] == len(targets)


def _config(tmp_path, tiny_model, **switches):
    tasks = write_jsonl(tmp_path / "tasks.jsonl", make_tasks(4, seed=5))
    evals = write_jsonl(tmp_path / "eval.jsonl", make_tasks(2, seed=6, split="eval"))
    lines = ['name = "jw"', f'runs_dir = "{tmp_path / "runs"}"', "iterations = 1",
             f'tasks = "{tasks}"', f'eval_tasks = "{evals}"', f'model = "{tiny_model}"',
             'engine = "fake"', "keep_last = 1", "env_adaptation = false"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in switches.items()]
    lines += ["[rollout]", "n = 4", "max_steps = 3", "history_turns = 1",
              "[judge]", "m = 3", "max_tokens = 0", "history_steps = 1",
              "[train_policy]", "micro_batch = 4", "grad_accum = 1", "lora_r = 4",
              "[train_rm]", "micro_batch = 8", "grad_accum = 1", "lora_r = 4", "max_steps = 1",
              "[eval]", "n = 2"]
    path = tmp_path / "loop.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _responder(request, k):
    """A fake household policy (one fixed admissible action) and a judge that disagrees
    with itself, so the reward model has data."""
    if "## The agent's response" in request.messages[-1]["content"]:
        return ["\\boxed{+1}", "\\boxed{-1}"][k % 2]
    return "look" if k % 2 else "inventory"


def _run(config, **kw):
    from rlany.engines.fake import FakeEngine
    from rlany.loop.loop import Loop, load_config

    cfg = load_config(config, kw)
    loop = Loop(cfg, config)
    loop.executor.engine = FakeEngine(_responder, model="fake")
    loop.run()
    return loop


def test_a_loop_judges_from_init_rm(tmp_path, tiny_model, warm_judge):
    rm = str(warm_judge / "rm")
    loop = _run(_config(tmp_path, tiny_model, init_rm=rm))
    assert json.loads((loop.dir / "config.json").read_text())["init_rm"] == rm
    assert loop.cfg.run["max_lora_rank"] == 16  # the recipe's rank, over the loop's 4
    # iteration 0 judged with it (its train-rm, skipped here for want of data, continues it)
    it0 = loop.dir / "iter_000"
    assert read_jsonl(it0 / "judgments.jsonl")[0]["judge"]["adapter"] == rm
    assert json.loads((it0 / "judgments.meta.json").read_text())["flags"]["adapter"] == rm
    assert loop.latest("rm", 0) == rm
    assert json.loads((it0 / "eval.meta.json").read_text())["flags"]["judge_adapter"] == rm
    # a judge that is not trained stays it (the eval's judge included)
    loop2 = _run(_config(tmp_path, tiny_model, init_rm=rm, rm_training=False), name="fixed")
    it0 = loop2.dir / "iter_000"
    assert read_jsonl(it0 / "judgments.jsonl")[0]["judge"]["adapter"] == rm
    assert not (it0 / "rm").exists()


def test_init_rm_and_the_retired_keys_are_checked_at_load(tmp_path, tiny_model):
    from rlany.loop.config import load_config

    config = _config(tmp_path, tiny_model)
    with pytest.raises(RlanyError, match="init_rm .* is not a LoRA adapter") as e:
        load_config(config, {"init_rm": str(tmp_path)})
    assert "train-rm" in e.value.hint and not (tmp_path / "runs").exists()
    # an older config's judge warm start: one line saying what replaces it
    old = Path(config).read_text().replace("[rollout]", "judge_warm_start = true\n[rollout]")
    Path(config).write_text(old)
    with pytest.raises(RlanyError, match="'judge_warm_start' is no longer a loop key") as e:
        load_config(config)
    assert "init_rm" in e.value.hint and "docs/stages/loop.md" in e.value.hint
    # an older example's [judge_sft] beside no warm start: it did nothing; remove it
    inert = Path(_config(tmp_path, tiny_model))
    inert.write_text(inert.read_text() + "\n[judge_sft]\nlr = 1e-3\n")
    with pytest.raises(RlanyError, match=r"\[judge_sft\] is no longer a loop table: remove it"):
        load_config(str(inert))
    with pytest.raises(UsageError, match=r"no table \[judge_sft\]") as e:
        load_config(_config(tmp_path, tiny_model), sets=["judge_sft.lr=1e-3"])
    assert "init_rm" in e.value.hint


def test_a_run_from_before_the_recipe_still_resumes(tmp_path, tiny_model):
    """A run directory begun when the loop had judge_warm_start (false, with a [judge_sft]
    table that made nothing) resumes; one whose judge warm start ran is refused."""
    from rlany.loop.loop import Loop, load_config

    config = _config(tmp_path, tiny_model)
    loop = Loop(load_config(config), config)
    loop._init_run_dir()
    echo = loop.dir / "config.json"
    older = json.loads(echo.read_text())
    del older["init_rm"]
    older["judge_warm_start"] = False
    older["tables"]["judge_sft"] = {"lr": 1e-3}
    echo.write_text(json.dumps(older))
    (loop.dir / "iter_000").mkdir()  # a stage has run: a different config is refused
    Loop(load_config(config), config)._init_run_dir()
    echo.write_text(json.dumps({**older, "judge_warm_start": True}))
    with pytest.raises(RlanyError, match="different config"):
        Loop(load_config(config), config)._init_run_dir()
    # killed during that judge warm start, before any iteration: refused all the same
    shutil.rmtree(loop.dir / "iter_000")
    (loop.dir / "judge_warm_start").mkdir()
    with pytest.raises(RlanyError, match="different config"):
        Loop(load_config(config), config)._init_run_dir()
