"""Outside faults are exit 1 with one line, never "internal error" (exit 70): an adapter of
another base model (trainers' --adapter and --kl-ref), an OpenEnv server's non-finite reward
or lone surrogates, a served model's body that is not JSON or has no message, a damaged
resumable training state, a metrics line whose interval is not one, and the env README's own
`make-tasks` command lines (issue 50, item 4)."""

from __future__ import annotations

import json
import re
import shlex
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import make_traj, one_line, read_jsonl, write_jsonl
from rlany.errors import RlanyError

# -- 1. an adapter made for another base model ----------------------------------------------


def _lora(model: str, path: Path, targets=("q_proj", "v_proj")) -> str:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    net = AutoModelForCausalLM.from_pretrained(model)
    get_peft_model(net, LoraConfig(r=8, lora_alpha=16, init_lora_weights=False,
                                   target_modules=list(targets))).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def other_models(tmp_path_factory):
    """LoRA adapters of two other tiny base models: a wider one (hidden 192, 3 layers) and
    a deeper one of the same width (3 layers: every shape fits, a layer is too many)."""
    from rlany.models import make_tiny

    root = tmp_path_factory.mktemp("other")
    wide = make_tiny(root / "wide", hidden=192, layers=3)
    deep = make_tiny(root / "deep", layers=3)
    return {"wide": _lora(str(wide), root / "wide_lora"),
            "deep": _lora(str(deep), root / "deep_lora", targets=("q_proj",))}


@pytest.mark.parametrize("stage, flag", [("train-policy", "--adapter"),
                                         ("train-policy", "--kl-ref"),
                                         ("sft", "--adapter"), ("train-rm", "--adapter")])
def test_an_adapter_of_another_base_model_is_one_line_before_anything_is_written(
        tiny_model, other_models, tmp_path, cli, stage, flag):
    from rlany.stages.score import ScoreOptions, score_group
    from test_rm_objective import _toy

    trajs = [make_traj("q", i, +1 if i < 2 else -1, n_steps=1) for i in range(4)]
    if stage == "sft":
        data = write_jsonl(tmp_path / "trajs.jsonl", trajs)
    elif stage == "train-rm":
        data = write_jsonl(tmp_path / "scored.jsonl", _toy(4))
    else:
        scored, _ = score_group([(f"x:{i}", t, None) for i, t in enumerate(trajs)],
                                ScoreOptions())
        data = write_jsonl(tmp_path / "scored.jsonl", scored)
    out = tmp_path / "out"
    r = cli(stage, "-i", str(data), "-o", str(out), "--model", tiny_model, flag,
            other_models["wide"])
    line = one_line(r, 1)
    assert f"{flag}: made for another base model than" in line
    assert "has input size 192, the model's model.layers.0.self_attn.q_proj has 128" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == [data.name]  # nothing written


def test_check_adapter_fits_names_the_first_misfit(tiny_model, tiny_lora, other_models,
                                                   tmp_path):
    from rlany.adapters import check_adapter_fits

    check_adapter_fits(tiny_lora, tiny_model)  # its own base model: fits
    check_adapter_fits(None, tiny_model)
    # every shape fits, but a layer the model does not have (PEFT loads it without a word)
    with pytest.raises(RlanyError, match=r"it adapts model\.layers\.2\.self_attn\.q_proj, "
                                         r"which the model does not have") as e:
        check_adapter_fits(other_models["deep"], tiny_model, "init_policy")
    assert e.value.one_line().startswith(f"{other_models['deep']}: init_policy: made for")
    assert "names base model" in e.value.one_line()
    # pickled weights: only the config's target modules can be checked
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    config = json.loads(Path(tiny_lora, "adapter_config.json").read_text())
    (pickled / "adapter_config.json").write_text(json.dumps(
        {**config, "target_modules": ["c_attn"]}))
    (pickled / "adapter_model.bin").write_bytes(b"")
    with pytest.raises(RlanyError, match=r"target_modules \['c_attn'\] match no module"):
        check_adapter_fits(str(pickled), tiny_model)


# -- 2. an OpenEnv server's non-finite reward, lone surrogates ------------------------------


@pytest.fixture(scope="module")
def bad_server():
    """The tests' guessing-game server, answering with what `BadGame.mode` says."""
    pytest.importorskip("websockets")
    import openenv_server

    class BadGame(openenv_server.Game):
        mode = "nan"

        def _obs(self, message, reward, done):
            data = super()._obs(message, reward, done)
            if reward is not None and BadGame.mode in ("nan", "inf", "-inf"):
                data["reward"] = float(BadGame.mode)
            if BadGame.mode == "surrogate":
                data["observation"]["message"] = message + " \ud800!"
                data["observation"]["legal_actions"] = [1, 2, 3, 4, 5, "\udfff"]
            return data

    original, openenv_server.Game = openenv_server.Game, BadGame
    server = openenv_server.serve(0)
    yield BadGame, f"http://127.0.0.1:{server.socket.getsockname()[1]}"
    server.shutdown()
    openenv_server.Game = original


@pytest.mark.parametrize("mode", ["nan", "inf", "-inf"])
def test_a_non_finite_reward_is_an_episode_error_naming_server_and_field(bad_server, mode):
    from rlany.envs.openenv import OpenenvEnv
    from rlany.files.records import Task

    game, url = bad_server
    game.mode = mode
    env = OpenenvEnv()
    env.reset(Task(task_id="t", env="openenv", prompt="", spec={"url": url,
                                                                "reset": {"target": 3}}))
    with pytest.raises(RlanyError, match=rf"the server at {url} answered a step with reward "
                                         rf"{mode}, not a finite number"):
        env.step("1")
    assert env.session is None  # the episode is over


def test_the_stage_fails_in_one_line_on_non_finite_rewards_and_repairs_surrogates(
        bad_server, tmp_path, cli):
    game, url = bad_server
    tasks, script = tmp_path / "tasks.jsonl", tmp_path / "policy.json"
    assert cli("envs", "make-tasks", "openenv", "--n", "2", "--knob", f"url={url}",
               "-o", str(tasks)).returncode == 0
    script.write_text(json.dumps(["1", "2", "3", "4", "5"]))
    game.mode = "nan"
    r = cli("rollout", "-i", str(tasks), "-o", str(tmp_path / "t.jsonl"), "--engine", "fake",
            "--model", str(script), "--n", "2", "--max-steps", "3")
    assert "4 of 4 episodes errored" in one_line(r, 1)
    assert "reward nan, not a finite number" in r.stderr
    game.mode = "surrogate"
    out = tmp_path / "s.jsonl"
    r = cli("rollout", "-i", str(tasks), "-o", str(out), "--engine", "fake", "--model",
            str(script), "--n", "2", "--max-steps", "3")
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("lone surrogates") == 1 and "replaced by U+FFFD" in r.stderr
    first = read_jsonl(out)[0]["steps"][0]
    assert first["obs"].startswith("Guess a number from 1 to 5. \ufffd!")
    assert "\ufffd" in first["obs"].splitlines()[-1]  # the admissible actions, repaired


# -- 3. a served model's body that is not JSON, or a choice with no message -----------------


class Served(BaseHTTPRequestHandler):
    mode = "html"

    def log_message(self, *args):
        pass

    def do_GET(self):  # /v1/models: it serves "m"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps({"data": [{"id": "m"}]}).encode())

    def do_POST(self):
        n = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["n"]
        body = {"html": "<html>502 Bad Gateway</html>", "cut": '{"choices": [',
                "list": "[1, 2]",
                "no-message": json.dumps({"choices": [{"index": k} for k in range(n)]}),
                "null-message": json.dumps({"choices": [{"index": k, "message": None}
                                                        for k in range(n)]}),
                "no-choices": json.dumps({"choices": []}),
                "bad-logprobs": json.dumps({"choices": [
                    {"index": k, "message": {"content": "x"},
                     "logprobs": {"content": [{"logprob": "low"}]}} for k in range(n)]}),
                }[Served.mode]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())


@pytest.fixture(scope="module")
def served():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Served)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()


@pytest.mark.parametrize("mode, says", [
    ("html", "the server's answer is not a JSON object: '<html>502 Bad Gateway</html>'"),
    ("cut", "the server's answer is not a JSON object"),
    ("list", "the server's answer is not a JSON object: '[1, 2]'"),
    ("no-message", "the server's choice 0 has no message with text content"),
    ("null-message", "the server's choice 0 has no message with text content"),
    ("no-choices", "the server answered 0 choices for n=2"),
    ("bad-logprobs", "the server's choice 0 has log-probs that are not finite numbers"),
])
def test_a_served_models_malformed_answer_is_one_line_naming_the_url(served, mode, says):
    from rlany.engines.base import EngineConfig, Request, Sampling
    from rlany.engines.openai import OpenAIEngine

    Served.mode = mode
    engine = OpenAIEngine(EngineConfig(kind="openai", model="m", base_url=served, retries=0,
                                       timeout_s=5))
    with pytest.raises(RlanyError) as e:
        engine.generate([Request([{"role": "user", "content": "hi"}],
                                 Sampling(n=2, logprobs=mode == "bad-logprobs"))])
    assert e.value.one_line().startswith(f"{served}/chat/completions: {says}")


def test_rollout_on_a_served_model_answering_html_fails_in_one_line(served, tmp_path, cli):
    Served.mode = "html"
    tasks = tmp_path / "tasks.jsonl"
    assert cli("envs", "make-tasks", "reasoning", "--n", "2", "-o", str(tasks)).returncode == 0
    r = cli("rollout", "-i", str(tasks), "-o", str(tmp_path / "t.jsonl"), "--engine",
            "openai", "--model", "m", "--base-url", served, "--n", "2")
    assert f"{served}/chat/completions: the server's answer is not a JSON" in one_line(r, 1)
    assert not (tmp_path / "t.jsonl").exists()


# -- 4. a damaged resumable training state ---------------------------------------------------


@pytest.mark.parametrize("text, says", [
    ("garbage{", "not JSON"), ("[1, 2]", "not a JSON object but list"),
    ('{"step": "x", "data_sha256": "d"}', "'step' must be an integer >= 1, got 'x'"),
    ('{"step": 0, "data_sha256": "d"}', "'step' must be an integer >= 1, got 0"),
    ('{"step": 2, "data_sha256": ["d"]}', "'data_sha256' must be a string"),
    (b"\xff\xfe", "not JSON"),
])
def test_a_damaged_state_json_is_one_line_naming_it(tmp_path, text, says):
    from rlany.training.state import saved_step

    partial = tmp_path / "ckpt.partial"
    partial.mkdir()
    state = partial / "state.json"
    state.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(RlanyError) as e:
        saved_step(partial, {"data_sha256": "d"})
    line = e.value.one_line()
    assert line.startswith(f"{state}: damaged resumable training state: ") and says in line
    assert f"delete {partial} to start the training over" in line
    state.unlink()
    state.mkdir()  # not even a file
    with pytest.raises(RlanyError, match="cannot read it"):
        saved_step(partial, {"data_sha256": "d"})


def test_train_policy_over_a_damaged_state_is_one_line(tiny_model, tmp_path, cli):
    from rlany.stages.score import ScoreOptions, score_group

    trajs = [make_traj("q", i, +1 if i < 2 else -1, n_steps=1) for i in range(4)]
    scored, _ = score_group([(f"x:{i}", t, None) for i, t in enumerate(trajs)],
                            ScoreOptions())
    data = write_jsonl(tmp_path / "scored.jsonl", scored)
    (tmp_path / "ckpt.partial").mkdir()
    (tmp_path / "ckpt.partial" / "state.json").write_text('{"step": 1, "data_')  # cut
    r = cli("train-policy", "-i", str(data), "-o", str(tmp_path / "ckpt"), "--model",
            tiny_model, "--dtype", "float32")
    line = one_line(r, 1)
    assert "ckpt.partial/state.json: damaged resumable training state: not JSON" in line
    assert not (tmp_path / "ckpt").exists()


# -- 5. a metrics line whose interval is not one -----------------------------------------------


@pytest.mark.parametrize("ci, says", [
    ('"wide"', 'an interval is [lo, hi], two finite numbers, not "wide"'),
    ("0.3", "two finite numbers, not 0.3"),
    ("[0.1]", "two finite numbers, not [0.1]"),
    ('[0.1, "x"]', "two finite numbers"),
    ("[0.1, NaN]", "two finite numbers, not [0.1, NaN]"),
    ("[0.9, 0.1]", "the interval [0.9, 0.1] does not hold eval_success 0.5"),
    ("[0.7, 0.9]", "the interval [0.7, 0.9] does not hold eval_success 0.5"),
])
def test_report_refuses_a_metrics_interval_that_is_not_one(tmp_path, ci, says):
    from rlany.stages.report import load_run

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(
        '{"iteration": 0, "eval_success": 0.4, "eval_success_ci95": [0.1, 0.8]}\n'
        f'{{"iteration": 1, "eval_success": 0.5, "eval_success_ci95": {ci}}}\n')
    with pytest.raises(RlanyError) as e:
        load_run(run)
    line = e.value.one_line()
    assert line.startswith(f"{run}/metrics.jsonl:2: eval_success_ci95: ") and says in line


def test_rlany_report_on_a_bad_interval_is_one_line(tmp_path, cli):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(
        '{"iteration": 0, "eval_success": 0.5, "eval_success_ci95": 0.3}\n')
    r = cli("report", str(run))
    assert one_line(r, 1).startswith(f"error: {run}/metrics.jsonl:1: eval_success_ci95: ")
    assert not (run / "report").exists()


# -- 6. the env README's own command lines ---------------------------------------------------

ENVS_README = Path(__file__).resolve().parent.parent / "src" / "rlany" / "envs" / "README.md"


def readme_commands() -> list[list[str]]:
    """Every `rlany ...` command line in the env README's bash blocks (continuations
    joined, comments dropped)."""
    blocks = re.findall(r"```bash\n(.*?)```", ENVS_README.read_text(), re.S)
    lines = [ln for b in blocks for ln in b.replace("\\\n", " ").splitlines()]
    return [w for w in (shlex.split(ln, comments=True) for ln in lines) if w[:1] == ["rlany"]]


def test_the_env_readmes_offline_commands_run(tmp_path, cli):
    """The ones that need nothing outside this machine: every `envs make-tasks` but a
    server's own split (rollouts need a browser, a served env or SmolLM2, and the loop an
    hour; tests/test_openenv_package.py reads a split from a real server)."""
    offline = [argv for argv in readme_commands() if argv[1:3] == ["envs", "make-tasks"]
               and not any(a.startswith("server_split=") for a in argv)]  # asks a server
    assert any("spec=" in " ".join(argv) for argv in offline)  # the one that exited 70
    assert len(offline) >= 4
    for argv in offline:
        r = cli(*argv[1:], cwd=tmp_path)
        assert r.returncode == 0, (argv, r.stderr)
        out = tmp_path / argv[argv.index("-o") + 1]
        tasks = read_jsonl(out)
        assert len(tasks) == int(argv[argv.index("--n") + 1]), argv
        if "spec=" in " ".join(argv):
            knob = next(a for a in argv if a.startswith("spec="))
            extra = json.loads(knob[len("spec="):])
            assert all(t["spec"].items() >= extra.items() for t in tasks)
        out.unlink()


def test_rollout_and_a_loops_init_policy_refuse_another_models_adapter(
        tiny_model, other_models, tmp_path, cli):
    """The generating stages (rollout, judge, eval, adapt-tasks) and a loop's init_policy
    and init_rm check the adapter against the model before any work: one line, exit 1, nothing written
    (it was PEFT's size-mismatch error, exit 70, and a partial output)."""
    from rlany.envs.reasoning import make_tasks

    tasks = write_jsonl(tmp_path / "tasks.jsonl", make_tasks(2, seed=0))
    r = cli("rollout", "-i", str(tasks), "-o", str(tmp_path / "t.jsonl"), "--model",
            tiny_model, "--engine", "hf", "--adapter", other_models["wide"])
    assert "--adapter: made for another base model than" in one_line(r, 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tasks.jsonl"]
    config = tmp_path / "loop.toml"
    config.write_text(f'name = "x"\nruns_dir = "{tmp_path / "runs"}"\ntasks = "{tasks}"\n'
                      f'model = "{tiny_model}"\nengine = "hf"\n'
                      f'init_policy = "{other_models["wide"]}"\n')
    r = cli("loop", str(config))
    assert "init_policy: made for another base model than" in one_line(r, 1)
    assert not (tmp_path / "runs").exists()
    config.write_text(config.read_text().replace("init_policy", "init_rm"))  # the judge's
    r = cli("loop", str(config))
    assert "init_rm: made for another base model than" in one_line(r, 1)
    assert not (tmp_path / "runs").exists()


def test_out_of_gpu_memory_is_an_outside_fault_with_what_to_lower():
    """torch's OutOfMemoryError (an 80 GB GPU at a 16k-token response before log-probs were
    taken in chunks: benchmarks/README.md "On a GPU") is the device's limit, not a bug."""
    import torch

    from rlany.errors import unexpected_line

    e = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB. GPU 0 has a "
                               "total capacity of 79.18 GiB of which 1.53 GiB is free. "
                               "Process 835 has 2.02 GiB memory in use. Including ...")
    label, line, code = unexpected_line(e, "borrows")  # a trainer
    assert (label, code) == ("error", 1)
    assert line.startswith("out of GPU memory (CUDA out of memory. Tried to allocate 9.00 GiB"
                           ". GPU 0 has a total capacity of 79.18 GiB of which 1.53 GiB is "
                           "free): lower --micro-batch") and "--grad-checkpointing" in line
    assert "Process 835" not in line
    # what to lower is the command's own: generation has no --micro-batch
    assert unexpected_line(e, "generates")[1].endswith(
        "lower --engine-batch (hf), --max-model-len (vllm) or --max-tokens")
    assert "[train_policy] micro_batch" in unexpected_line(e, "loop")[1]
    assert unexpected_line(ValueError("x"))[::2] == ("internal error", 70)


def test_the_cli_ends_an_out_of_memory_in_that_line_with_exit_1(monkeypatch, capsys):
    import torch

    import rlany.cli

    def out_of_memory(**_):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 "
                                     "has a total capacity of 79.18 GiB of which 1.00 GiB is "
                                     "free. Including ...")
    monkeypatch.setattr(rlany.cli, "app", out_of_memory)
    monkeypatch.delenv("RLANY_DEBUG", raising=False)
    with pytest.raises(SystemExit) as done:
        rlany.cli.main(["sft", "-i", "x.jsonl"])
    err = capsys.readouterr().err.strip().splitlines()
    assert done.value.code == 1 and len(err) == 1
    assert err[0].startswith("error: out of GPU memory (CUDA out of memory. Tried to allocate "
                             "2.00 GiB") and "--grad-checkpointing" in err[0]
