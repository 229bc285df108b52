"""The README's quick start runs: its commands are read from between the README's
`<!-- quickstart:begin -->` and `<!-- quickstart:end -->` markers (so the README and this
test cannot drift) and run in-process through the real entry point, pipes included, on the
tiny local model instead of SmolLM2 (`--model smollm2` -> the tiny model's directory with
the hf engine, and at most 16 new tokens a response, which a random model spends anyway;
`rlany models prepare smollm2` is skipped: it only caches SmolLM2)."""

import re
import shlex
from pathlib import Path
from typing import Any

import typer
from click.testing import CliRunner

from rlany.options import specs

README = Path(__file__).parent.parent / "README.md"


def quickstart() -> list[list[list[str]]]:
    """The quick start's command lines, each a pipeline of argv lists."""
    text = README.read_text()
    block = re.search(r"<!-- quickstart:begin -->\n```bash\n(.*?)```\n<!-- quickstart:end -->",
                      text, re.S)
    assert block, "README.md has no quickstart block"
    lines = block.group(1).replace("\\\n", " ").splitlines()
    pipelines = []
    for line in lines:
        words = shlex.split(line, comments=True)
        if not words:
            continue
        pipeline, argv = [], []
        for word in words + ["|"]:
            if word == "|":
                pipeline.append(argv)
                argv = []
            else:
                argv.append(word)
        pipelines.append(pipeline)
    return pipelines


def _options_class(argv: list[str]) -> Any:
    from rlany.cli import app

    cmd = typer.main.get_command(app)
    for name in argv:
        if not hasattr(cmd, "commands") or name not in cmd.commands:
            break
        cmd = cmd.commands[name]
    return getattr(cmd.callback, "options_class", None)


def _on_tiny(argv: list[str], tiny_model: str) -> list[str]:
    argv = [tiny_model if a == "smollm2" and i and argv[i - 1] == "--model" else a
            for i, a in enumerate(argv)]
    cls = _options_class(argv[1:])
    if cls is not None and "engine" in specs(cls) and "--engine" not in argv:
        argv += ["--engine", "hf"]
    if "--max-tokens" in argv:  # the last value of a flag wins
        argv += ["--max-tokens", "16"]
    return argv


def _run(argv: list[str], stdin: bytes | None) -> tuple[int, bytes, str]:
    from rlany.cli import main

    code: Any = 0
    with CliRunner().isolation(input=stdin, env={"RLANY_DEBUG": None}) as (out, err, _):
        try:
            main(argv)
        except SystemExit as e:
            code = e.code or 0
    return code, out.getvalue(), err.getvalue().decode("utf-8", "replace")


def test_quickstart_is_extracted():
    pipelines = quickstart()
    commands = [argv[1] for pipeline in pipelines for argv in pipeline]
    assert commands[:2] == ["models", "envs"] and "train-policy" in commands
    assert any(len(p) == 3 for p in pipelines)  # rollout | judge | score
    assert all(argv[0] == "rlany" for pipeline in pipelines for argv in pipeline)


def test_quickstart_runs_on_the_tiny_model(tiny_model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for pipeline in quickstart():
        if pipeline[0][1:3] == ["models", "prepare"]:
            continue
        data = None
        for argv in pipeline:
            code, data, err = _run(_on_tiny(argv, tiny_model)[1:], data)
            assert code == 0, f"{shlex.join(argv)}: exit {code}: {err}"
    assert len(Path("tasks.jsonl").read_text().splitlines()) == 8
    assert Path("scored.jsonl").stat().st_size > 0
    assert (Path("ckpt/policy-1") / "rlany.json").exists()
