"""`[launch] train`: the loop runs its trainers under a launcher, in processes of their own
(a plain python, or torch's launcher with 2 gloo processes on the CPU)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import read_jsonl
from rlany.errors import RlanyError
from rlany.loop.config import load_config
from test_plan import rlany, setup_run

# outcome only, no judge, no adaptation, no evaluation: rollout, score, train-policy
LEAN = """step_feedback = false
rm_training = false
env_adaptation = false
[rollout]
n = 4
[train_policy]
lora_r = 4
lr = 1e-2
dtype = "float32"
"""


@pytest.mark.parametrize("launch,message", [
    ('train = 3', "'[launch] train' must be str"),
    ('trian = "torchrun"', "unknown key 'trian' in [launch]"),
    ('train = "deepspeed --num_gpus 8"', "'deepspeed' is not a launcher the loop knows"),
    ('train = "accelerate --num_processes 2"', "accelerate needs its `launch` command"),
    ('train = "torchrun --nproc_per_node 2 -m rlany"', "names a program of its own ('-m')"),
    ('train = "torchrun train.py"', "names a program of its own ('train.py')"),
    ('train = "torchrun --rdzv_id rlany train.py"', "names a program of its own ('train.py')"),
    ('train = "accelerate launch --num_processes 2 rlany"',
     "names a program of its own ('rlany')"),
    ('train = "torchrun --nproc-per-nod 2 --bogus"', "has options torchrun refuses"),
    ('train = "python -u"', "takes no arguments here"),
    ('train = "torchrun \'2"', "cannot be split into words"),
    ('train = "/nowhere/torchrun"', "is not on this machine"),
    ('shards = 0', "'[launch] shards' must be 1 to 10,000"),
    ('serve = "vllm serve"', "starts the servers of an openai engine"),
])
def test_a_bad_launch_table_fails_at_load_with_one_line(tmp_path, tiny_model, launch,
                                                        message):
    run = setup_run(tmp_path, tiny_model, body=LEAN, launch=launch)
    with pytest.raises(RlanyError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")) as e:
        load_config(str(run / "loop.toml"))
    assert e.value.where == str(run / "loop.toml")


def test_launch_table_is_read_and_set_from_the_command_line(tmp_path, tiny_model,
                                                             monkeypatch):
    run = setup_run(tmp_path, tiny_model, body=LEAN)
    monkeypatch.chdir(run)
    cfg = load_config(str(run / "loop.toml"),
                      sets=[f"launch.train={sys.executable} -m torch.distributed.run "
                            "--nproc_per_node 2", "launch.shards=4"])
    assert cfg.launch.train.endswith("--nproc_per_node 2") and cfg.launch.shards == 4
    two = 'engine = "openai"\nbase_url = "http://127.0.0.1:8000/v1,http://127.0.0.1:8001/v1"'
    bad = setup_run(tmp_path / "x", tiny_model, body=LEAN, keys=two, launch="shards = 3")
    with pytest.raises(RlanyError, match="one shard per endpoint"):
        load_config(str(bad / "loop.toml"))


ROOT = Path(__file__).resolve().parents[1]


def _readme_launch_tables() -> list[str]:
    """The `[launch]` tables of docs/stages/loop.md's recipes (its toml blocks)."""
    text = (ROOT / "docs" / "stages" / "loop.md").read_text()
    blocks = [b.split("```", 1)[0] for b in text.split("```toml\n")[1:]]
    return [b.split("[launch]\n", 1)[1] for b in blocks if "[launch]\n" in b]


def test_the_readmes_launch_recipes_load(tmp_path, tiny_model, monkeypatch):
    """Every `[launch]` table the loop's README recommends loads (the two-node one's
    `--rdzv_id rlany` is torchrun's option value, not a program), with `srun` and the
    launchers on PATH; its train line is the one a trainer runs under."""
    tables = _readme_launch_tables()
    assert len(tables) >= 2 and any("srun " in t for t in tables)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexec \"$@\"\n")
    (bin_dir / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}"
                       f"{os.pathsep}{os.environ['PATH']}")
    keys = 'engine = "openai"\nbase_url = "http://127.0.0.1:8000/v1"'
    for k, table in enumerate(tables):
        run = setup_run(tmp_path / str(k), tiny_model, body=LEAN, keys=keys, launch=table)
        monkeypatch.chdir(run)
        cfg = load_config("loop.toml")
        assert cfg.launch.train and cfg.launch.train in table


def test_or_skipped_writes_in_one_process_whatever_rank_it_inherited(tmp_path, monkeypatch):
    """Nothing to learn from, in one process (the loop's own trainer, no launcher): the
    skipped file is written even where the process inherited RANK=1 from its environment
    (accelerate's view of the processes decides, not the variable)."""
    from types import SimpleNamespace

    from accelerate import PartialState

    from rlany.errors import NoSamples
    from rlany.stages.train_policy import or_skipped

    def nothing() -> dict:
        raise NoSamples("no training samples")
    fresh = not PartialState._shared_state
    monkeypatch.setenv("RANK", "1")
    try:
        skipped = tmp_path / "train_policy.skipped.json"
        said: list[str] = []
        out = or_skipped(SimpleNamespace(skipped=str(skipped)), nothing, said.append)
    finally:
        if fresh:  # leave accelerate's process state as the test found it
            PartialState._reset_state()
    assert out == {"skipped": "no training samples"} and "nothing to train" in said[0]
    assert json.loads(skipped.read_text()) == {"reason": "no training samples"}


def test_a_launched_trainer_dies_with_the_loop(tmp_path):
    """kill -9 of the process that launched a trainer (`run_launched`, as the loop does):
    the trainer gets SIGTERM from the kernel and ends, instead of holding its checkpoint's
    lock against the rerun."""
    import subprocess

    code = ("import sys\nfrom rlany.loop.launch import run_launched\n"
            "run_launched([sys.executable, '-c', 'import time; print(\"up\", flush=True); "
            "time.sleep(120)'], 'train-policy', sys.argv[1], lambda: True)\n")
    loop = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "policy")],
                            stdout=subprocess.PIPE, text=True)
    trainer = None
    try:
        assert loop.stdout.readline() == "up\n"
        (trainer,) = _children(loop.pid)
        os.kill(loop.pid, signal.SIGKILL)
        loop.wait(timeout=30)
        deadline = time.monotonic() + 30
        while _alive(trainer) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(trainer)
    finally:
        loop.kill()
        loop.wait()
        if trainer is not None and _alive(trainer):  # the failure's orphan, not left behind
            os.kill(trainer, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Running (a zombie waiting to be reaped is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_a_rerun_names_the_process_that_still_holds_the_trainers_lock(tmp_path):
    """A trainer that outlived its loop still holds its checkpoint's lock: the rerun
    starts no second trainer and says which process holds it, in one line."""
    from rlany.files.locks import output_lock
    from rlany.loop.launch import run_launched

    out, marker = tmp_path / "policy", tmp_path / "ran"
    argv = [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    with output_lock(out, new=True):
        with pytest.raises(RlanyError, match=f"still writing this checkpoint \\(it holds its "
                           f"lock, process {os.getpid()}\\)") as e:
            run_launched(argv, "train-policy", str(out), lambda: True)
    assert e.value.where == str(out) and "rerun the loop" in e.value.hint
    assert not marker.exists()
    run_launched(argv, "train-policy", str(out), lambda: True)  # released: it runs
    assert marker.exists()


def test_a_launched_trainer_with_nothing_to_learn_tells_the_loop(tmp_path, tiny_model):
    """Every rollout fails: train-policy has no sample. Launched (its own process), it
    writes the --skipped file the loop passed and exits 0; the loop goes on with the model
    as it was (iteration 1 rolls out with the base model) and closed its engine before the
    trainer ran. `--stop-after 0` stops after iteration 0; the same command without it
    goes on."""
    wrong = {"rules": [{"responses": ["\\boxed{100}"]}]}
    run = setup_run(tmp_path, tiny_model, body=LEAN, script=wrong, keys="iterations = 2",
                    launch=f'train = "{sys.executable}"')
    first = rlany(run, "loop", "loop.toml", "--stop-after", "0")
    it0, it1 = run / "runs" / "a" / "iter_000", run / "runs" / "a" / "iter_001"
    assert first.returncode == 0 and "stopped after iteration 0" in first.stderr
    assert (it0 / "done.json").exists() and not it1.exists()
    r = rlany(run, "loop", "loop.toml")  # the same command without it goes on
    assert r.returncode == 0, r.stderr[-3000:]
    err = first.stderr + r.stderr
    assert f"loop: $ {sys.executable} -m rlany train-policy" in err
    assert "loop: engine closed" in err
    reason = json.loads((it0 / "train_policy.skipped.json").read_text())["reason"]
    assert reason == "no training samples" and not (it0 / "policy").exists()
    assert all(t["policy"]["adapter"] is None for t in read_jsonl(it1 / "trajectories.jsonl"))
    assert [m["policy_loss"] for m in read_jsonl(run / "runs" / "a" / "metrics.jsonl")] == \
        [None, None]


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (Linux /proc)."""
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


@pytest.mark.slow  # 18 s; a killed trainer's resume is also in test_kill_resume.py
def test_kill_9_of_the_launched_trainer_then_the_same_loop_resumes(tmp_path, tiny_model):
    """SIGKILL the launched train-policy once it saved a step: the loop fails in one line
    naming the signal; the same command again resumes the trainer from its saved step."""
    import subprocess

    body = LEAN.replace("lr = 1e-2", "lr = 1e-2\nmicro_batch = 1\ngrad_accum = 1\n"
                        "save_every = 1")
    run = setup_run(tmp_path, tiny_model, body=body, launch=f'train = "{sys.executable}"')
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RLANY_DEBUG": ""}
    loop = subprocess.Popen([sys.executable, "-m", "rlany", "loop", "loop.toml"], cwd=run,
                            env=env, stderr=subprocess.PIPE, text=True)
    state = run / "runs" / "a" / "iter_000" / "policy.partial" / "state.json"
    deadline = time.monotonic() + 300
    while not state.exists() and loop.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    (trainer,) = _children(loop.pid)
    os.kill(trainer, signal.SIGKILL)
    _, err = loop.communicate(timeout=120)
    assert loop.returncode == 1 and not (state.parent.parent / "policy").exists()
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ") and "train-policy under [launch] train was killed by " \
        "SIGKILL" in last and "Traceback" not in err
    saved = json.loads(state.read_text())["step"]
    again = rlany(run, "loop", "loop.toml")
    assert again.returncode == 0, again.stderr[-3000:]
    logs = read_jsonl(state.parent.parent / "policy.metrics.jsonl")
    assert logs[0]["event"] == "resume" and logs[0]["step"] >= saved >= 1
    assert (state.parent.parent / "policy" / "rlany.json").exists()


@pytest.mark.slow
def test_two_launched_processes_train_as_one_does(tmp_path, tiny_model):
    """The loop with [launch] train = torch's launcher, 2 gloo processes on the CPU, 2
    sequences per process per step, against the loop training in its own process with 2
    micro-batches of 2 per step: the same global batch, so every step's loss and the
    adapter's weights agree (float32; tests/test_train.py's DDP test on the trainer)."""
    import torch
    from safetensors.torch import load_file

    body = LEAN.replace("lora_r = 4", "lora_r = 4\nmicro_batch = 2\ngrad_accum = {accum}")
    launcher = f"{sys.executable} -m torch.distributed.run --nproc_per_node 2"
    one = setup_run(tmp_path / "one", tiny_model, body=body.format(accum=2))
    two = setup_run(tmp_path / "two", tiny_model, body=body.format(accum=1),
                    launch=f'train = "{launcher}"')
    r1 = rlany(one, "loop", "loop.toml")
    assert r1.returncode == 0, r1.stderr[-3000:]
    r2 = rlany(two, "loop", "loop.toml", ACCELERATE_USE_CPU="true")
    assert r2.returncode == 0, r2.stderr[-3000:]
    # the loop states the world size the launcher's options give (rlany.training.world)
    assert f"loop: $ env RLANY_WORLD_SIZE=2 {launcher} -m rlany train-policy" in r2.stderr
    ckpt = [run / "runs" / "a" / "iter_000" / "policy" for run in (one, two)]
    assert [json.loads((c / "rlany.json").read_text())["world_size"] for c in ckpt] == [1, 2]
    logs = [read_jsonl(c.with_name("policy.metrics.jsonl")) for c in ckpt]
    assert len(logs[0]) == len(logs[1]) >= 2
    for x, y in zip(*logs):
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-4, abs=1e-6)
        assert x["grad_norm"] == pytest.approx(y["grad_norm"], rel=1e-4)
    a, b = (load_file(str(c / "adapter_model.safetensors")) for c in ckpt)
    assert a.keys() == b.keys()
    # Adam divides each coordinate's step by its gradient's size, so a coordinate whose
    # gradient is near zero moves by the summation order's noise (all-reduce against
    # accumulation: 2e-5 seen); a wrong global batch moves weights by the lr, 1e-2
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-3, atol=1e-4,
                                   msg=lambda m, key=key: f"{key}: {m}")


@pytest.mark.parametrize("line,world", [
    ("torchrun --nproc_per_node 2", 2), ("torchrun --nnodes 2 --nproc_per_node 8", 16),
    ("torchrun --nproc_per_node auto", None), ("torchrun --nnodes 1:4 --nproc_per_node 2", None),
    ("accelerate launch --cpu --num_processes 2", 2),
    ("accelerate launch --config_file examples/accelerate/multinode-2x8.yaml", 16),
    ("python", 1), ("python -m torch.distributed.run --nproc_per_node 2", 2)])
def test_the_world_size_is_read_from_the_launchers_own_options(line, world, monkeypatch):
    from rlany.loop.launch import world_size

    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}"
                       f"{os.environ['PATH']}")
    assert world_size(line.replace("python", sys.executable, 1) if line.startswith("python")
                      else line, "loop.toml") == world


def test_a_launch_that_forms_no_group_of_its_size_is_refused_in_one_line(tmp_path,
                                                                          tiny_model):
    """`accelerate launch --cpu --num_processes 2` starts one process: the loop tells the
    trainer the size its launcher was given (RLANY_WORLD_SIZE, in the printed line too),
    and a trainer whose group is smaller refuses in one line before it loads anything;
    torchrun's 2 processes without ACCELERATE_USE_CPU=true each see a group of 1 and
    refuse the same way (WORLD_SIZE)."""
    from conftest import one_line

    run = setup_run(tmp_path, tiny_model, body=LEAN,
                    launch='train = "accelerate launch --cpu --num_processes 2"')
    plan = rlany(run, "loop", "loop.toml", "--print-plan")
    assert plan.returncode == 0, plan.stderr[-2000:]
    assert "env RLANY_WORLD_SIZE=2 accelerate launch --cpu --num_processes 2 -m rlany " \
        "train-policy" in plan.stdout
    r = rlany(run, "train-policy", "-i", "none.jsonl", "-o", "ckpt", "--model", "model",
              RLANY_WORLD_SIZE="2")
    line = one_line(r, 1)
    assert "form a group of 1, but the launcher's options asked for 2" in line, line
    assert not (run / "ckpt").exists()
    two = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "rlany",
         "train-policy", "-i", "none.jsonl", "-o", "ckpt", "--model", "model"], cwd=run,
        capture_output=True, text=True, timeout=300,
        env={k: v for k, v in os.environ.items() if k != "ACCELERATE_USE_CPU"})
    assert two.returncode != 0
    assert two.stderr.count("form a group of 1, but torch's WORLD_SIZE asked for 2") == 2, \
        two.stderr[-3000:]
    assert not (run / "ckpt").exists()


def test_a_checkpoint_records_its_world_size(tmp_path, tiny_model):
    run = setup_run(tmp_path, tiny_model, body=LEAN)
    r = rlany(run, "loop", "loop.toml", "--stop-after", "0")
    assert r.returncode == 0, r.stderr[-3000:]
    info = json.loads((run / "runs" / "a" / "iter_000" / "policy" / "rlany.json").read_text())
    assert info["world_size"] == 1
