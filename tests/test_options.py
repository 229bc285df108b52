"""One options class per stage: the CLI, the loop config and the printed command agree."""

import dataclasses
import json
import shlex
import shutil

import pytest

from rlany.cli import app
from rlany.errors import RlanyError
from rlany.loop.config import load_config
from rlany.options import flag, specs, to_argv
from rlany.stages import BY_TABLE

TABLES = BY_TABLE


def _parse(argv: list[str], monkeypatch) -> object:
    """Run argv through the real CLI with the stage's driver replaced by a recorder."""
    seen = []
    command = argv[1]
    module = next(c.module for c in TABLES.values() if c.name == command)
    monkeypatch.setattr(module, "run", lambda opts, **kw: seen.append(opts))
    app(args=argv[1:], standalone_mode=False)
    (opts,) = seen
    return opts


VALID = {"allow_edits": "goal kind"}  # string options whose values an env names


def _nondefault(hint, default, spec):
    """A valid value different from the default, for every kind of field."""
    if spec.choices:
        return next(c for c in spec.choices if c != default)
    text = str(hint)
    if "bool" in text:
        return not default
    if "tuple" in text:
        return (1, 2)
    if "float" in text:
        return 0.5 if default != 0.5 else 0.25
    if "int" in text:
        return (default or 1) + 2
    return "/tmp/x-value"


@pytest.mark.parametrize("table", list(TABLES))
def test_printed_command_round_trips_through_the_cli(table, monkeypatch):
    command, cls = TABLES[table].name, TABLES[table].options
    values = {k: _nondefault(h, d, s) for k, (h, d, s) in specs(cls).items()}
    values.update({k: v for k, v in VALID.items() if k in values})
    if table == "adapt_tasks":  # --history is what learnability estimates from
        values.update(rewrite="learnability", summary="extract")
    if table == "eval":
        values.update(n=4, k=(1, 2))
    if table == "judge":  # --labels needs --max-tokens 0, which the other non-defaults exclude
        values.update(labels=False)
    if table in ("score", "adapt_tasks"):  # 0 <= low <= high <= 1
        values.update(rm_acc_min=0.1, rm_acc_max=0.9) if table == "score" else \
            values.update(alpha_low=0.1, alpha_high=0.9)
    if "base_url" in values:  # a server's URL
        values.update(base_url="http://127.0.0.1:8000/v1")
    if "kl_ref" in values:  # a fixed KL reference is LoRA's: --full stays off
        values.update(full=False)
    values.update({k: f"/tmp/{k}.jsonl" for k, (h, _d, s) in specs(cls).items()
                   if s.scope == "io" and "str" in str(h)})
    opts = cls(**values)
    argv = to_argv(command, opts)
    assert _parse(shlex.split(shlex.join(argv)), monkeypatch) == opts
    default = cls(**{k: v for k, v in values.items()
                     if specs(cls)[k][1] is dataclasses.MISSING})
    assert _parse(to_argv(command, default), monkeypatch) == default


def test_flag_field_and_toml_key_are_one_name(tmp_path):
    for table, stage in TABLES.items():
        command, cls = stage.name, stage.options
        result = _help(command)
        for key, (_, _, spec) in specs(cls).items():
            assert flag(key) in result, (command, key)
            if spec.scope == "stage":  # a key of the stage's table in a loop config
                value = '"base"' if key == "kl_ref" else _toml(VALID.get(key) or _nondefault(
                    *specs(cls)[key]))
                text = f"[{table}]\n{key} = {value}\n"  # kl_ref: a path is checked at load
                if key == "full" and table in ("train_policy", "train_rm"):
                    with pytest.raises(RlanyError, match="full = true"):  # LoRA-only engine
                        _config(tmp_path, text)
                    continue
                if key == "last_step_only" and table == "judge":  # score needs every step
                    with pytest.raises(RlanyError, match="last_step_only = true"):
                        _config(tmp_path, text)
                    continue
                if key in ("gigpo_weight", "gamma", "gigpo_norm"):  # GiGPO's own
                    with pytest.raises(RlanyError, match=f"{key} is GiGPO's"):
                        _config(tmp_path, text)
                    text += 'step_credit = "gigpo"\n'
                cfg = _config(tmp_path, text)
                assert cfg.options(table, **_io(cls)).__getattribute__(key) is not None


def _help(command: str) -> str:
    """Every flag spelling of the command, as click parses them."""
    import typer

    click_cmd = typer.main.get_command(app).commands[command]
    return " ".join(o for p in click_cmd.params for o in (*p.opts, *p.secondary_opts))


def _toml(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, tuple):
        return "[" + ", ".join(map(str, value)) + "]"
    return repr(value)


def _io(cls) -> dict:
    return {f.name: "-" for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING}


def _config(tmp_path, body: str, top: str = ""):
    tasks = tmp_path / "tasks.jsonl"  # a loop config's paths are checked when it loads
    if not tasks.exists():
        shutil.copy("examples/reasoning/tasks.jsonl", tasks)
    path = tmp_path / "loop.toml"
    path.write_text(f'name = "t"\ntasks = "{tasks}"\n{top}{body}')
    return load_config(str(path))


def test_loop_and_cli_defaults_are_the_same(tmp_path):
    cfg = _config(tmp_path, "")
    for table, stage in TABLES.items():
        cls = stage.options
        io = _io(cls)
        from_loop = cfg.options(table, **io)
        from_cli = cls(**io, max_lora_rank=from_loop.max_lora_rank) \
            if "max_lora_rank" in specs(cls) else cls(**io)
        assert from_loop == from_cli, table


@pytest.mark.parametrize("body, message", [
    ("[rollout]\nn = 0\n", "[rollout] n must be >= 1, got 0"),
    ("[eval]\nn = 2\nk = [1, 4]\n", "every [eval] k must be <= [eval] n 2"),
    ("[judge]\nm = -2\n", "[judge] m must be >= 1"),
    ("[judge]\nmode = \"tests\"\n", "[judge] mode must be one of steps, unit-tests"),
    ("[score]\nrm_acc_min = 0.9\nrm_acc_max = 0.1\n", "need [score] rm_acc_min <= [score] rm_acc_max"),
    ("[train_policy]\nmicro_batch = \"4\"\n", "'[train_policy] micro_batch' must be int"),
    ("[rollout]\nmax_tokenz = 4\n", "unknown key 'max_tokenz' in [rollout]"),
    ("[adapt]\nsamples = 1\n", "unknown key 'adapt'"),
    ("[train_policy]\nlr = nan\n", "[train_policy] lr must be a finite number, got nan"),
    ("[rollout]\ntemperature = inf\n", "[rollout] temperature must be a finite number"),
])
def test_a_bad_loop_config_fails_at_load_with_one_line(tmp_path, body, message):
    with pytest.raises(RlanyError) as e:
        _config(tmp_path, body)
    assert message in e.value.one_line() and "\n" not in e.value.one_line()
    assert e.value.where and e.value.where.endswith("loop.toml")


def test_eval_takes_the_judges_settings_unless_it_sets_its_own(tmp_path):
    cfg = _config(tmp_path, "[judge]\nm = 2\nmax_tokens = 40\nhistory_steps = 1\n"
                  "[eval]\njudge = true\nm = 5\n")
    ev = cfg.options("eval", input="-")
    assert (ev.m, ev.judge_max_tokens, ev.history_steps) == (5, 40, 1)
    assert ev.judge_options().history_steps == 1


def test_no_step_feedback_is_lambda_zero_in_the_printed_score_command(tmp_path):
    cfg = _config(tmp_path, "", top="step_feedback = false\n")
    opts = cfg.options("score", input="t.jsonl")
    assert opts.lam == 0.0 and "--lam 0.0" in shlex.join(to_argv("score", opts))
    with pytest.raises(RlanyError, match="lambda = 0"):
        _config(tmp_path, "[score]\nlam = 1.0\n", top="step_feedback = false\n")


def test_rollout_judge_score_pipe_equals_the_file_route(tmp_path):
    """`rollout -o - | judge -i - -o - | score -i -` (judge passes each task's trajectories
    through before their judgments) writes exactly what the stage-by-stage files give."""
    import shutil
    import subprocess
    import sys

    tasks = tmp_path / "tasks.jsonl"
    shutil.copy("examples/reasoning/tasks.jsonl", tasks)
    tasks.write_text("".join(tasks.read_text().splitlines(True)[:3]))
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"rules": [
        {"match": "reviewer", "responses": ["ok \\boxed{+1}", "no \\boxed{-1}"]},
        {"responses": ["\\boxed{12}", "\\boxed{5}"]}]}))
    rl = f"{sys.executable} -m rlany"
    fake = f"--engine fake --model {script}"
    piped = subprocess.run(
        f"{rl} rollout -i {tasks} -o - {fake} --n 2 | {rl} judge -i - -o - {fake} --m 2 | "
        f"{rl} score -i - -o {tmp_path / 'piped.jsonl'}", shell=True, capture_output=True,
        text=True)
    assert piped.returncode == 0, piped.stderr
    for cmd in (f"rollout -i {tasks} -o {tmp_path / 't.jsonl'} {fake} --n 2",
                f"judge -i {tmp_path / 't.jsonl'} -o {tmp_path / 'j.jsonl'} {fake} --m 2",
                f"score -i {tmp_path / 't.jsonl'} --judgments {tmp_path / 'j.jsonl'} "
                f"-o {tmp_path / 'files.jsonl'}"):
        r = subprocess.run(f"{rl} {cmd}", shell=True, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    piped_out = (tmp_path / "piped.jsonl").read_bytes()
    assert piped_out and piped_out == (tmp_path / "files.jsonl").read_bytes()
    # a judgments stream out of order is one line naming the place, exit 1
    lines = (tmp_path / "j.jsonl").read_text().splitlines(True)
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(lines[0] + (tmp_path / "t.jsonl").read_text())
    r = subprocess.run(f"{rl} score -i {mixed} -o {tmp_path / 'x.jsonl'}", shell=True,
                       capture_output=True, text=True)
    assert r.returncode == 1 and f"{mixed}:1: judgment for" in r.stderr
    assert not (tmp_path / "x.jsonl").exists()


FAKE_SCRIPT = {"rules": [
    {"match": "edit's number", "responses": ["1", "2"]},
    {"match": "reviewer", "responses": ["looks right \\boxed{+1}", "wrong \\boxed{-1}"]},
    {"responses": ["\\boxed{12}", "\\boxed{5}", "\\boxed{9}", "\\boxed{100}"]}]}


def _untimed(summary: dict) -> dict:
    """A summary without its timings; PEFT writes target_modules from a set (its order
    follows the process's hash seed), so that list is compared as a set."""
    out = {k: v for k, v in summary.items() if not k.endswith(("_s", "seconds"))}
    if isinstance(out.get("target_modules"), list):
        out["target_modules"] = sorted(out["target_modules"])
    return out


def test_the_commands_the_loop_prints_reproduce_its_iteration(tmp_path, tiny_model):
    """Run one loop iteration (fake engine, tiny model for training), then run the commands
    it printed, by hand, into another directory: every output is byte-identical."""
    import shutil
    import subprocess
    import sys

    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    (model / "fake_script.json").write_text(json.dumps(FAKE_SCRIPT))
    for name, n in (("tasks", 6), ("eval", 2)):
        src = f"examples/reasoning/{name}.jsonl"
        (tmp_path / f"{name}.jsonl").write_text("".join(open(src).readlines()[:n]))
    (tmp_path / "loop.toml").write_text(f"""name = "a"
runs_dir = "{tmp_path / 'runs'}"
iterations = 1
tasks = "{tmp_path / 'tasks.jsonl'}"
eval_tasks = "{tmp_path / 'eval.jsonl'}"
model = "{model}"
engine = "fake"
[rollout]
n = 4
[judge]
m = 2
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
""")
    r = subprocess.run([sys.executable, "-m", "rlany", "loop", str(tmp_path / "loop.toml")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    printed = [line.split("loop: $ ", 1)[1] for line in r.stderr.splitlines()
               if line.startswith("loop: $ ")]
    stages = [c.split()[1] if c.startswith("rlany ") else "cat" for c in printed]
    assert stages == ["eval", "cat", "cat", "rollout", "judge", "score", "train-policy",
                      "train-rm", "adapt-tasks", "eval"]
    loop_dir, hand_dir = tmp_path / "runs" / "a", tmp_path / "hand"
    (hand_dir / "iter_000").mkdir(parents=True)
    for command in printed:
        command = command.replace(str(loop_dir), str(hand_dir))
        if command.startswith("rlany "):
            command = f"{shlex.quote(sys.executable)} -m rlany {command[6:]}"
        done = subprocess.run(command, shell=True, capture_output=True, text=True)
        assert done.returncode == 0, (command, done.stderr[-2000:])
    compared = 0
    for path in sorted(loop_dir.rglob("*")):
        rel = path.relative_to(loop_dir)
        # the loop's own bookkeeping: sidecars, metrics, and what a sibling run may share
        # (*.content.json: the digests eval_reuse / warm_reuse compare)
        skip = (path.is_dir() or path.name.endswith((".meta.json", "metrics.jsonl",
                                                      ".content.json"))
                or path.name in ("done.json", "rlany.json", "config.json"))
        if skip or rel.parts[0] in ("report",):
            continue
        mine = (hand_dir / rel)
        assert mine.exists(), f"the printed commands did not write {rel}"
        if path.suffix in (".json", ".jsonl"):
            a = path.read_text().replace(str(loop_dir), "RUN")
            b = mine.read_text().replace(str(hand_dir), "RUN")
            if path.suffix == ".json":  # a summary: equal but for its timings
                a, b = _untimed(json.loads(a)), _untimed(json.loads(b))
            assert a == b, rel
        else:
            assert path.read_bytes() == mine.read_bytes(), rel
        compared += 1
    assert compared >= 15
