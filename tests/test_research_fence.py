"""No product path sets a research switch. A field with `opt(..., diagnostic=True)` is for
an experiment that asks for it (`--set`, a flag, research/); `rlany loop` and every command
line the product builds leave it at its default, so what a user runs is the method as
documented. Two checks: every Stage of the loop's tables (`rlany.loop.tables`), on a
config that turns on every stage the loop has, sets no research field (neither in its
`forced` values nor in the paths it sets, and the options it runs with hold each at its
default); and no module of src/rlany writes a research flag into a command line (a list or
tuple element) or passes a research field as a keyword (`replace(opts, lam_gate=...)`)."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

from rlany.options import specs
from rlany.stages import BY_TABLE, COMMANDS

SRC = Path(__file__).resolve().parent.parent / "src" / "rlany"


def research_fields(cls: type) -> set[str]:
    return {k for k, (_, _, spec) in specs(cls).items() if spec.diagnostic}


def stage_tables() -> list[tuple[str, object]]:
    """(name, Stage) of every Stage that rlany.loop.tables defines, alone or in a
    table, so a table added there is checked without a change here."""
    from rlany.loop import tables

    found = []
    for name, value in vars(tables).items():
        stages = value if isinstance(value, tuple) else (value,)
        if stages and all(isinstance(s, tables.Stage) for s in stages):
            found += [(f"{name}[{i}] {s.table}" if isinstance(value, tuple) else name, s)
                      for i, s in enumerate(stages)]
    return found


def research_set_by(loop, stage) -> list[str]:
    """The research fields `stage` sets in `loop` (its forced values, the paths it sets),
    and those its final options hold at another value than their default."""
    from rlany.loop.resume import _Planned

    cls = BY_TABLE[stage.table].options
    research = research_fields(cls)
    planned = _Planned(loop)  # the stage's paths without looking for any checkpoint
    d = loop.dir / "iter_000"
    io, forced = stage.io(planned, d, 0), stage.forced(planned)
    opts = dataclasses.replace(loop.cfg.options(stage.table, **io), **forced)  # as the loop
    changed = [k for k in research if getattr(opts, k) != specs(cls)[k][1]]
    return sorted({*(k for k in {**io, **forced} if k in research), *changed})


def _loop(tmp_path: Path):
    """A loop whose config runs every stage the tables have (warm start, a judge start,
    step feedback, judge training with a replay buffer, task adaptation, evaluations, KL
    anchors at the first models) and sets no research field itself."""
    from rlany.loop.loop import Loop, load_config

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(Path("examples/household/learn_tasks.jsonl").read_text())
    rm = tmp_path / "rm"
    rm.mkdir()
    # the engine is fake (nothing loads it), but an adapter is checked before any work
    (rm / "adapter_config.json").write_text(json.dumps({"r": 4, "target_modules": ["q_proj"]}))
    import torch
    from safetensors.torch import save_file
    key = "base_model.model.model.layers.0.self_attn.q_proj"  # SmolLM2's shapes (576)
    save_file({f"{key}.lora_A.weight": torch.zeros(4, 576),
               f"{key}.lora_B.weight": torch.zeros(576, 4)},
              str(rm / "adapter_model.safetensors"))
    config = tmp_path / "loop.toml"
    config.write_text("\n".join([
        'name = "fence"', f'runs_dir = "{tmp_path / "runs"}"', f'tasks = "{tasks}"',
        f'eval_tasks = "{tasks}"', 'engine = "fake"', "warm_start = true",
        f'init_rm = "{rm}"', "rm_buffer = 2", "[train_policy]", 'kl_ref = "init"', "[train_rm]", 'kl_ref = "init"', ""]))
    cfg = load_config(str(config))
    assert cfg.step_feedback and cfg.rm_training and cfg.env_adaptation
    for table, values in cfg.tables.items():  # nor does anything the loop resolves
        assert not research_fields(BY_TABLE[table].options) & set(values), table
    return Loop(cfg, str(config))


def test_no_loop_stage_sets_a_research_switch(tmp_path):
    loop = _loop(tmp_path)
    tables = stage_tables()
    names = {name.split("[")[0] for name, _ in tables}
    assert {"STAGES", "WARM_START", "EVAL"} <= names
    assert {s.table for _, s in tables} >= {"rollout", "judge", "score", "train_policy",
                                            "train_rm", "adapt_tasks", "eval", "sft"}
    bad = {name: fields for name, stage in tables if (fields := research_set_by(loop, stage))}
    assert not bad, ("a loop stage sets a research switch (diagnostic=True in its options): "
                     f"{bad}; make the flag public with honest help, or leave it to the lab")


def test_the_stage_check_catches_a_forced_research_switch(tmp_path):
    from rlany.loop.tables import STAGES, Stage

    loop = _loop(tmp_path)
    score = next(s for s in STAGES if s.table == "score")
    assert "lam_gate" in research_fields(BY_TABLE["score"].options)
    forced = Stage("score", score.done, score.io, forced=lambda lp: dict(lam_gate="agreement"))
    assert research_set_by(loop, forced) == ["lam_gate"]


def research_flags() -> set[str]:
    """Every spelling of every research field as a flag (`--x`, `--no-x`)."""
    names = {k.replace("_", "-") for c in COMMANDS for k in research_fields(c.options)}
    return {f"--{n}" for n in names} | {f"--no-{n}" for n in names}


def research_uses(path: Path, flags: set[str], fields: set[str]) -> list[str]:
    """`path:line: what` for each research flag in a list or tuple of strings (a command
    line being built) and each research field passed as a keyword."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, (ast.List, ast.Tuple)):
            found += [f"{path}:{node.lineno}: {e.value}" for e in node.elts
                      if isinstance(e, ast.Constant) and isinstance(e.value, str)
                      and e.value.split("=")[0] in flags]
        elif isinstance(node, ast.Call):
            found += [f"{path}:{node.lineno}: {kw.arg}=" for kw in node.keywords
                      if kw.arg in fields]
    return found


def test_no_product_module_builds_a_command_with_a_research_flag():
    flags = research_flags()
    fields = {k for c in COMMANDS for k in research_fields(c.options)}
    assert "--share-prefix" in flags and "--no-share-prefix" in flags and "rm_balance" in fields
    bad = [use for p in sorted(SRC.rglob("*.py")) for use in research_uses(p, flags, fields)]
    assert not bad, "the product sets a research switch:\n" + "\n".join(bad)


def test_the_module_check_catches_a_research_flag(tmp_path):
    f = tmp_path / "x.py"
    f.write_text('argv = ["rlany", "score", "--lam-gate", "agreement"]\n'
                 'more = ("--no-share-prefix",)\nok = ["--lam", "0"]\n'
                 'o = replace(opts, rm_balance=True)\nprint("--lam-gate is a research flag")\n')
    assert [u.split(": ", 1)[1] for u in research_uses(f, research_flags(), {"rm_balance"})] \
        == ["--lam-gate", "--no-share-prefix", "rm_balance="]
