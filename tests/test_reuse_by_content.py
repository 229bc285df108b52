"""What sibling runs share (the base evaluation, the warm start, its evaluation) is keyed by
the content it was made from, not by names and paths: a model directory's weights or fake
script changed in place, an OpenEnv server behind the same URL, a warm start's base model
changed since: nothing is shared, the run evaluates (or trains) afresh and says why in one
line; with nothing changed the sharing still happens (`rlany.loop.eval_reuse`,
`rlany.loop.warm_reuse`)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from conftest import write_jsonl
from rlany.files.records import Task
from rlany.loop.loop import Loop, load_config

QUESTION = {"question": "What is 2 + 3?", "answer": "5"}
PROMPT = "Solve the problem. Give the final answer as a number in \\boxed{}."


def _model(tmp_path: Path, tiny_model: str, answer: str) -> Path:
    """A copy of the tiny model whose directory also holds the fake engine's script."""
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    (model / "fake_script.json").write_text(json.dumps([f"\\boxed{{{answer}}}"]))
    return model


def _config(tmp_path: Path, model: Path, eval_tasks: list[Task] | None = None) -> str:
    pool = write_jsonl(tmp_path / "pool.jsonl", [Task(task_id="p", env="reasoning",
                                                      spec=QUESTION, prompt=PROMPT)])
    evals = write_jsonl(tmp_path / "eval.jsonl", eval_tasks or [
        Task(task_id="e", env="reasoning", spec=QUESTION, prompt=PROMPT, split="eval")])
    path = tmp_path / "loop.toml"
    path.write_text("\n".join([
        'name = "a"', f'runs_dir = "{tmp_path / "runs"}"', "iterations = 1",
        f'tasks = "{pool}"', f'eval_tasks = "{evals}"', f'model = "{model}"',
        'engine = "fake"', "[eval]", "n = 2"]) + "\n")
    return str(path)


def _next_stage(config: str, name: str) -> str | None:
    """Run `name`'s next incomplete stage, with the fake engine its model directory's script
    makes (as `rlany loop --one-stage` does); the command it ran."""
    return Loop(load_config(config, {"name": name}), config, one_stage=True).run()


def _meta(run: Path, name: str = "eval_base") -> dict:
    return json.loads((run / f"{name}.meta.json").read_text())


def _rewrite_in_place(path: Path, data: bytes) -> None:
    """New bytes in the same file (same inode, same size), its mtime then set back."""
    st = path.stat()
    with open(path, "r+b") as f:
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _change_weights(model: Path, name: str = "model.safetensors") -> None:
    weights = model / name
    data = weights.read_bytes()
    _rewrite_in_place(weights, data[:-4] + bytes(b ^ 0xFF for b in data[-4:]))


def test_a_base_evaluation_is_shared_only_while_the_weights_are_the_same(tmp_path,
                                                                         tiny_model, capsys):
    model = _model(tmp_path, tiny_model, "5")
    config = _config(tmp_path, model)
    runs = tmp_path / "runs"
    assert _next_stage(config, "a") == "eval"
    assert _next_stage(config, "b") == "rollout"  # nothing changed: shared, iteration 0 next
    assert _meta(runs / "b")["reused_from"] == str(runs / "a" / "eval_base.json")
    assert "base evaluation shared" in capsys.readouterr().err
    _change_weights(model)  # in place: the same path, size and mtime
    assert _next_stage(config, "c") == "eval"  # evaluated afresh
    assert "reused_from" not in _meta(runs / "c")
    err = capsys.readouterr().err
    assert "loop: base evaluation not shared: " in err and "model's files changed" in err
    assert _next_stage(config, "d") == "rollout"  # c's was made from these weights: shared
    assert _meta(runs / "d")["reused_from"] == str(runs / "c" / "eval_base.json")


def test_a_fake_script_changed_in_place_is_not_shared(tmp_path, tiny_model, capsys):
    model = _model(tmp_path, tiny_model, "5")
    config = _config(tmp_path, model)
    runs = tmp_path / "runs"
    assert _next_stage(config, "a") == "eval"
    assert json.loads((runs / "a" / "eval_base.json").read_text())["success_rate"] == 1.0
    _rewrite_in_place(model / "fake_script.json", json.dumps(["\\boxed{7}"]).encode())
    assert _next_stage(config, "b") == "eval"
    assert "reused_from" not in _meta(runs / "b")
    assert json.loads((runs / "b" / "eval_base.json").read_text())["success_rate"] == 0.0
    assert "loop: base evaluation not shared: " in capsys.readouterr().err


def test_an_openenv_evaluation_is_never_shared(tmp_path, tiny_model, capsys):
    """The server behind a URL can change while the tasks file stays the same, and it gives
    no fingerprint of itself: nothing to key a shared evaluation by."""
    pytest.importorskip("websockets", reason="needs websockets: pip install 'rlany[openenv]'")
    from openenv_server import serve

    server = serve(0)
    try:
        url = f"http://127.0.0.1:{server.socket.getsockname()[1]}"
        model = _model(tmp_path, tiny_model, "4")
        (model / "fake_script.json").write_text(json.dumps(["4"]))
        config = _config(tmp_path, model, [Task(task_id="o", env="openenv", prompt="",
                                                spec={"url": url, "reset": {"target": 4}},
                                                split="eval")])
        runs = tmp_path / "runs"
        assert _next_stage(config, "a") == "eval"
        assert _next_stage(config, "b") == "eval"
    finally:
        server.shutdown()
    assert "reused_from" not in _meta(runs / "b")
    assert not (runs / "a" / "eval_base.content.json").exists()
    err = capsys.readouterr().err
    assert "loop: base evaluation not shared: its tasks use env openenv" in err


LEARN = "examples/household/learn_tasks.jsonl"


def _warm_config(tmp_path: Path, model: Path) -> str:
    lines = open(LEARN).readlines()
    (tmp_path / "pool.jsonl").write_text("".join(lines[:4]))
    (tmp_path / "eval.jsonl").write_text("".join(lines[6:7]))
    path = tmp_path / "loop.toml"
    path.write_text("\n".join([
        'name = "a"', f'runs_dir = "{tmp_path / "runs"}"', "iterations = 1",
        f'tasks = "{tmp_path / "pool.jsonl"}"', f'eval_tasks = "{tmp_path / "eval.jsonl"}"',
        f'model = "{model}"', 'engine = "fake"', "warm_start = true", "step_feedback = false",
        "rm_training = false", "env_adaptation = false", "[rollout]", "max_steps = 3",
        "max_tokens = 8", "history_turns = 1", "[train_policy]", "lora_r = 4",
        'target_modules = "q_proj,v_proj"', 'dtype = "float32"', "[sft]", "epochs = 1",
        "micro_batch = 4", "[eval]", "n = 1", "max_steps = 3"]) + "\n")
    return str(path)


def test_a_warm_start_and_its_evaluation_are_not_shared_after_the_base_changed(
        tmp_path, tiny_model, capsys):
    model = _model(tmp_path, tiny_model, "1")
    config = _warm_config(tmp_path, model)
    runs = tmp_path / "runs"
    ran = [_next_stage(config, "a") for _ in range(4)]
    assert ran == ["rollout", "sft", "eval", "eval"]  # the warm start, eval_base, eval_init
    assert _next_stage(config, "b") == "rollout"  # all three shared: iteration 0 next
    assert json.loads((runs / "b/warm_start/sft/rlany.json").read_text())["reused_from"] == \
        str(runs / "a" / "warm_start")
    assert _meta(runs / "b", "eval_init")["reused_from"] == str(runs / "a" / "eval_init.json")
    capsys.readouterr()

    _change_weights(model)
    assert _next_stage(config, "c") == "rollout"  # its own warm start: the expert's demos
    assert not (runs / "c/warm_start/sft").exists()
    err = capsys.readouterr().err
    assert "loop: warm start not shared: " in err and "base model's files changed" in err
    # a's warm start copied beside the changed base: its adapter is a's, the base is not
    d = runs / "d"
    shutil.copytree(runs / "a" / "warm_start", d / "warm_start")
    assert _next_stage(config, "d") == "eval"
    assert _next_stage(config, "d") == "eval"
    assert "reused_from" not in _meta(d, "eval_init")
    assert "loop: warm start's evaluation not shared: " in capsys.readouterr().err


def test_a_warm_start_whose_base_changed_while_it_was_made_is_never_shared(tmp_path,
                                                                           tiny_model, capsys):
    model = _model(tmp_path, tiny_model, "1")
    config = _warm_config(tmp_path, model)
    runs = tmp_path / "runs"
    assert _next_stage(config, "a") == "rollout"
    _change_weights(model)  # between its demos and its sft
    assert _next_stage(config, "a") == "sft"
    assert json.loads((runs / "a" / "warm_start.content.json").read_text())["base"] is None
    capsys.readouterr()
    assert _next_stage(config, "b") == "rollout"  # its own
    assert "records no digest of the base model" in capsys.readouterr().err


def test_large_file_digests_are_remembered_across_processes(tmp_path, monkeypatch):
    """A stage names its weights by content on every start (resume headers, sidecars), so a
    large file's digest is kept in the cache's digests.jsonl under what any write changes:
    a later process reads it back unhashed; a rewrite in place is hashed again."""
    from rlany import models
    from rlany.files import provenance

    monkeypatch.setenv("RLANY_CACHE", str(tmp_path / "cache"))
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"a" * (1 << 20))
    first = models.file_digest(weights)        # just written: a rewrite within the same
    assert not (tmp_path / "cache" / "digests.jsonl").exists()  # timestamp tick keeps the
    assert str(weights.resolve()) not in {k[0] for k in models._DIGESTS}  # key: not kept
    monkeypatch.setattr(models, "_SETTLED_NS", 0)
    assert models.file_digest(weights) == first   # as if written 2 s ago: kept
    assert len((tmp_path / "cache" / "digests.jsonl").read_text().splitlines()) == 1
    monkeypatch.setattr(models, "_DIGESTS", {})          # as a fresh process
    monkeypatch.setattr(models, "_LOADED", [])

    def no_hashing(path):
        raise AssertionError(f"hashed {path} again")
    monkeypatch.setattr(provenance, "sha256_file", no_hashing)
    assert models.file_digest(weights) == first
    monkeypatch.undo()
    monkeypatch.setenv("RLANY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(models, "_SETTLED_NS", 0)
    weights.write_bytes(b"b" * (1 << 20))
    assert models.file_digest(weights) != first
