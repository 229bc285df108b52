"""Everything checked before the work (issue #68, item 3), through the real CLI: every value a
flag, a `--set` or a config file gives is refused in one line before an engine starts or
anything is written (a flag or `--set`: exit 2; a config file: exit 1), never an internal
error (exit 70), never found after the base evaluation or the model load:

* base URLs: http(s) with a host (no `file://`, no scheme-less URL, no broken IPv6 host,
  no host beginning with `-`, which a plan's ssh line would read as an option) and no
  endpoint twice;
* integers: a seed within 63 bits, a shard count within `rlany.limits.MAX_SHARDS`, an
  integer too long for Python to parse;
* a loop's `init_policy`: not empty, its adapter_config.json readable, made for the base
  model (also where the engine does not load adapters: training continues it);
* `[train_rm] lora_r = "big"`; damaged shard summaries (`eval --join`);
* a warm run whose config writes the lr it trained at resumes (the same config)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from conftest import one_line, write_jsonl
from rlany.envs.reasoning import make_tasks

BIG = "9" * 5000  # past Python's 4,300 digits for int(str)


@pytest.fixture
def work(tmp_path) -> Path:
    write_jsonl(tmp_path / "tasks.jsonl", make_tasks(4, seed=1))
    (tmp_path / "fake.json").write_text(json.dumps(["\\boxed{7}"]))
    (tmp_path / "loop.toml").write_text(
        f'name = "x"\ntasks = "{tmp_path}/tasks.jsonl"\nruns_dir = "{tmp_path}/runs"\n'
        f'engine = "fake"\nmodel = "{tmp_path}/fake.json"\n')
    return tmp_path


def _made(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def _adapter(path: Path, config: str = '{"r": 4, "target_modules": ["q_proj"]}') -> str:
    path.mkdir()
    (path / "adapter_config.json").write_text(config)
    (path / "adapter_model.bin").write_bytes(b"weights")  # pickled: only loading reads it
    return str(path)


ROLLOUT = ("rollout", "-i", "{w}/tasks.jsonl", "-o", "{w}/out.jsonl", "--model",
           "{w}/fake.json")
OPENAI = ("--engine", "openai", "--base-url")


@pytest.mark.parametrize("more, says", [
    ((*OPENAI, "file:///etc/passwd"), "is not an http(s) URL (scheme 'file')"),
    ((*OPENAI, "127.0.0.1:8000/v1"), "has no scheme"),
    ((*OPENAI, "http://[::1/v1"), "is not a URL (Invalid IPv6 URL)"),
    ((*OPENAI, "http://-oProxyCommand=touch/v1"), "has a host that begins with '-'"),
    ((*OPENAI, "http://127.0.0.1:1/v1,http://127.0.0.1:1/v1"), "names an endpoint twice"),
    (("--engine", "fake", "--seed", str(2**64)), "--seed is out of range: more than 63 bits"),
    (("--engine", "fake", "--shard", f"0/{BIG}"), "--shard must be I/N"),
    (("--engine", "fake", "--shard", "0/100000000"), "at most 10,000 shards"),
])
def test_a_bad_flag_value_is_a_usage_error_before_the_engine_starts(work, cli, more, says):
    """Before: a repeated endpoint exited 1 after the engine started; a file:// URL was read
    as a server; a seed past 64 bits was found after the model loaded; a shard of
    thousands of digits was an internal error."""
    before = _made(work)
    r = cli(*(a.format(w=work) for a in ROLLOUT), *more)
    assert says in one_line(r, 2) and "starting engine" not in r.stderr
    assert _made(work) == before


@pytest.mark.parametrize("item, says", [
    (f"seed={BIG}", "seed is out of range: more than 63 bits"),
    (f"seed=0x{'f' * 4000}", "'seed' is out of range: more than 63 bits"),
    ("launch.shards=100000000", "'[launch] shards' must be 1 to 10,000"),
    ('train_rm.lora_r="big"', "'[train_rm] lora_r' must be int, got str"),
    ('base_url="http://-oProxyCommand=x:8000/v1"', "has a host that begins with '-'"),
    ('init_policy=""', "init_policy is empty"),
])
def test_a_bad_set_item_is_a_usage_error_before_anything_is_written(work, cli, item, says):
    """Before: integers of thousands of digits and lora_r = "big" were internal errors,
    [launch] shards = 10^8 grew to gigabytes, an empty init_policy counted as a warm start."""
    before = _made(work)
    line = one_line(cli("loop", str(work / "loop.toml"), "--print-plan", "--set", item), 2)
    assert line.startswith("usage error: --set ") and says in line and len(line) < 400
    assert _made(work) == before


@pytest.mark.parametrize("toml, says", [
    ("[launch]\nshards = 100000000\n", "'[launch] shards' must be 1 to 10,000"),
    (f"seed = {BIG}\n", "invalid TOML: Exceeds the limit"),
    ('[train_rm]\nlora_r = "big"\n', "'[train_rm] lora_r' must be int, got str"),
    ('engine = "openai"\nbase_url = "file:///tmp/x"\n', "is not an http(s) URL"),
])
def test_a_bad_config_value_is_one_line_before_anything_is_written(work, cli, toml, says):
    config = work / "loop.toml"
    text = config.read_text()
    if "engine = " in toml:
        text = text.replace('engine = "fake"\n', "")
    config.write_text(text + toml)
    before = _made(work)
    line = one_line(cli("loop", str(config), "--print-plan"), 1)
    assert line.startswith(f"error: {config}: ") and says in line
    assert _made(work) == before


def test_a_damaged_init_policy_is_refused_before_the_base_evaluation(work, cli):
    """Before: an adapter_config.json that is not JSON was found once the base evaluation
    had run (by eval_init)."""
    adapter = _adapter(work / "sft", config="{not json")
    write_jsonl(work / "eval.jsonl", make_tasks(2, seed=9))
    config = work / "loop.toml"
    config.write_text(config.read_text() + f'eval_tasks = "{work}/eval.jsonl"\n'
                      f'init_policy = "{adapter}"\n')
    r = cli("loop", str(config))
    assert "init_policy: adapter_config.json is not valid JSON" in one_line(r, 1)
    assert not (work / "runs").exists()  # no base evaluation, no run directory


def test_an_init_policy_of_another_base_model_is_refused_where_the_engine_loads_none(
        work, cli, tiny_lora):
    """The fake engine never loads the adapter, but train-policy continues it on the base
    model: before, the loop rolled out before that refusal."""
    from rlany.models import make_tiny

    model = make_tiny(work / "narrow", hidden=64)  # another width than tiny_lora's model
    (model / "fake_script.json").write_text(json.dumps(["\\boxed{7}"]))
    config = work / "loop.toml"
    config.write_text(config.read_text().replace(f"{work}/fake.json", str(model))
                      + f'init_policy = "{tiny_lora}"\n')
    line = one_line(cli("loop", str(config)), 1)
    assert "init_policy: made for another base model" in line
    assert not (work / "runs").exists()


@pytest.mark.parametrize("edit, says", [
    (lambda s: s["shard"].update(of=100_000_000), "shard 0/100000000 is not I/N"),
    (lambda s: s["shard"].update(input="x"), "its shard.input is not an object"),
    (lambda s: s["shard"].update(flags=[1]), "its shard.flags is not an object"),
    (lambda s: s.update({"pass@x": 0.5}), "its key 'pass@x' is not pass@K"),
    (lambda s: s.update(wall_time_s=float("nan")), "NaN is not valid JSON"),
    (lambda s: s["sums"]["policy"].update(trajectories=-5), "is not a count: -5"),
])
def test_a_damaged_shard_summary_is_one_line(work, cli, edit, says):
    """Before: internal errors (exit 70), a join that ran out of memory (of = 10^8), and a
    NaN wall time written into the joined summary."""
    for i in range(2):
        r = cli("eval", "-i", str(work / "tasks.jsonl"), "-o", str(work / f"e.{i}.json"),
                "--engine", "fake", "--model", str(work / "fake.json"), "--shard", f"{i}/2")
        assert r.returncode == 0, r.stderr
    first = json.loads((work / "e.0.json").read_text())
    edit(first)  # (not a .json file: conftest reads those strictly, and NaN is on purpose)
    (work / "all.txt").write_text(json.dumps(first) + (work / "e.1.json").read_text())
    r = cli("eval", "--join", str(work / "all.txt"), "-o", str(work / "joined.json"))
    assert says in one_line(r, 1) and not (work / "joined.json").exists()


def test_a_warm_run_whose_config_writes_the_lr_it_trained_at_resumes(work, cli):
    """A warm start left without [train_policy] lr trains at WARM_LR: writing that value is
    the same config (before: refused as changed); writing another lr is refused."""
    from rlany.loop.config import load_config
    from rlany.loop.tables import WARM_LR

    config = work / "loop.toml"
    config.write_text(config.read_text() + f'init_policy = "{_adapter(work / "sft")}"\n')
    cfg = load_config(str(config))  # the run began under it: its echo, as the loop writes it
    echo = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "path"}
    (cfg.run_dir / "iter_000").mkdir(parents=True)
    (cfg.run_dir / "config.json").write_text(json.dumps(echo, indent=2, sort_keys=True))
    same = cli("loop", str(config), "--print-plan", "--set", f"train_policy.lr={WARM_LR}")
    assert same.returncode == 0, same.stderr
    other = cli("loop", str(config), "--print-plan", "--set", "train_policy.lr=3e-4")
    assert "train_policy.lr was absent" in one_line(other, 1)


def test_a_task_servers_env_name_and_its_splits_are_read_as_data(tmp_path):
    """openenv's Task API read by `read_split`: an env name with a space (or a '/') is one
    path segment, and an answer to /splits that is not a list is one line, not a crash."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from rlany.envs.openenv_tasks import read_split
    from rlany.errors import RlanyError

    answers = {"/list_environments": ["my env/2"], "/my%20env%2F2/splits": {"not": "a list"},
               "/my%20env%2F2/num_tasks": {"num_tasks": 1},
               "/my%20env%2F2/task_range": {"tasks": [{"id": 1}]}}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _answer(self):
            if self.command == "POST":
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = json.dumps(answers.get(self.path, {"detail": "not found"})).encode()
            self.send_response(200 if self.path in answers else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with pytest.raises(RlanyError, match="not a list of splits"):
            read_split(url, "train", 1, 5.0)
        answers["/my%20env%2F2/splits"] = ["train"]
        assert read_split(url, "train", 1, 5.0) == [{"id": 1}]
    finally:
        server.shutdown()
