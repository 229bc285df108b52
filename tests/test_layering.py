"""The lab reaches the product only through its front doors; the product never reaches the lab.

research/*.py (the experiments) may use rlany as a user can: the CLI (a subprocess, as
`learning.py` runs `rlany loop` and `rlany report`) and the public names (no leading
underscore) of the PUBLIC modules:

    rlany                   the package (its version)
    rlany.cli               the CLI
    rlany.stages, .stages.* the stage layer: each command's options and function, and the
                            public helpers of its modules (`stages.eval.wilson_interval`)
    rlany.loop, .loop.*     the loop above them: its config and the commands it runs
    rlany.files.records     the records every stage reads and writes (the data contract)
    rlany.files.jsonl       their files
    rlany.envs              the env seam a user's env plugs into (the Protocol, the registry
                            and its entry points, `make_env`); not the built-in envs
                            (`rlany.envs.household`, ...)
    rlany.models            the model names of `rlany models` (`resolve_model`)
    rlany.stats             the statistics stages, report and research share (intervals,
                            balanced accuracy)

Everything else is below the stage layer (`rlany.training.*`, `rlany.engines.*`,
`rlany.prompts`, `rlany.chat`, `rlany.stageio`, `rlany.shared_prefix`, `rlany.options`,
`rlany.compat`, ...) or private (a module or name with a leading underscore). ALLOWED lists
the imports of those that research still makes, each with its reason: any other fails, and
so does an ALLOWED entry no longer imported (the list only shrinks). research/ reaches
benchmarks/ only for `benchmarks.common` (machine facts and the results file: one home).

The product (src/rlany) never imports research/ or benchmarks/ (nor their scripts by
module name, as a script on sys.path would be), and benchmarks/ never imports research/.

Pure `ast`: nothing here imports the code it checks."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
RESEARCH, BENCHMARKS = ROOT / "research", ROOT / "benchmarks"

PUBLIC = {"rlany", "rlany.cli", "rlany.stages", "rlany.loop", "rlany.files.records",
          "rlany.files.jsonl", "rlany.envs", "rlany.models", "rlany.stats"}
PUBLIC_TREES = ("rlany.stages.", "rlany.loop.")  # every module under these, too

# The judge investigation measures the judge as the product builds and trains it: its
# prompts, its verdict token and train-rm's loss are the object of study, so these scripts
# call the functions that make them rather than copies of them. A public seam for them
# belongs with the reward model's objective (training/verdict.py, issue 49 item 4).
ROLLOUT = ("judge_data.episodes plays seeded expert/random episodes through rollout's own "
           "episode code, so the judge's prompts are exactly the policy's; the seam it needs "
           "(a scripted policy for `rlany rollout`) belongs in stages/rollout.py")
PROMPT = "the judge's prompt for a step, built as `rlany judge` builds it"
VERDICT = ("the verdict scored as train-rm trains it: the chat-rendered prompt, then the "
           "branch token of the verdict choices")
ALLOWED = {
    ("judge_data.py", "rlany.stages.rollout._start"): ROLLOUT,
    ("judge_data.py", "rlany.stages.rollout._choices"): ROLLOUT,
    ("judge_data.py", "rlany.stages.rollout._advance"): ROLLOUT,
    ("judge_data.py", "rlany.stages.rollout._window"): ROLLOUT,
    ("judge_data.py", "rlany.stages.rollout._trajectory"): ROLLOUT,
    ("judge_data.py", "rlany.engines.base.Completion"): ROLLOUT + " (the scripted action, as an "
                                                   "engine's completion)",
    ("judge_data.py", "rlany.stageio.read_tasks"): ROLLOUT + " (its tasks, read and checked "
                                                   "as rollout reads them)",
    ("judge_data.py", "rlany.prompts.step_prompts"): PROMPT,
    ("judge_data.py", "rlany.prompts.VERDICT_CHOICES"): VERDICT,
    ("judge_data.py", "rlany.prompts.parse_verdict"): VERDICT,
    ("judge_data.py", "rlany.chat.render"): VERDICT,
    ("judge_data.py", "rlany.training.verdict.branch"): VERDICT,
    ("judge_threshold.py", "rlany.prompts.VERDICT_CHOICES"): VERDICT,
    ("judge_threshold.py", "rlany.prompts.parse_verdict"): VERDICT,
    ("judge_threshold.py", "rlany.chat.render"): VERDICT,
    ("judge_threshold.py", "rlany.training.verdict.branch"): VERDICT,
    ("judge_threshold.py", "rlany.training.verdict.verdict_samples"):
        "train-rm's own (prompt, target) samples of a run's scored.jsonl",
    ("judge_heldout.py", "rlany.training.verdict.choice_logprobs"):
        "a trained judge's q(+1) on held-out steps, by the trainer's own function",
    ("judge_top.py", "rlany.training.verdict.class_weights"):
        "the top layers fine-tuned with train-rm's own class weights and loss, so the "
        "capacity bound is the trainer's",
    ("judge_top.py", "rlany.training.verdict.verdict_loss"):
        "the top layers fine-tuned with train-rm's own class weights and loss, so the "
        "capacity bound is the trainer's",
}


def scripts(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.py"))


def stems(folder: Path) -> set[str]:
    """The module names a folder's scripts import each other by (the folder on sys.path)."""
    return {p.stem for p in scripts(folder)}


def imports(path: Path) -> Iterator[tuple[int, str, str | None]]:
    """(line, module, name) of every absolute import in `path`, wherever it stands (inside
    functions too): name None for `import module`."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, None
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                yield node.lineno, node.module, alias.name


def is_module(dotted: str) -> bool:
    path = SRC.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def public(module: str) -> bool:
    return ((module in PUBLIC or module.startswith(PUBLIC_TREES))
            and not any(part.startswith("_") for part in module.split(".")))


def rlany_uses(path: Path) -> Iterator[tuple[int, str, bool]]:
    """(line, what, allowed by the rule) of each rlany import in `path`; `what` is the module
    (`import rlany.x`, `from rlany import x` where x is a module) or module.name."""
    for line, module, name in imports(path):
        if module != "rlany" and not module.startswith("rlany."):
            continue
        if name is not None and is_module(f"{module}.{name}"):
            module, name = f"{module}.{name}", None
        if name is None:
            yield line, module, public(module)
        else:
            yield line, f"{module}.{name}", public(module) and not name.startswith("_")


def test_the_rule_has_something_to_check():
    """research/ holds the scripts, and most public modules are real (a rename would leave
    the rule allowing nothing it names; rlany.stats is the statistics home issue 49 item 2
    creates)."""
    assert any(p.name == "learning.py" for p in scripts(RESEARCH))
    missing = sorted(m for m in PUBLIC if not is_module(m))
    assert not missing, f"PUBLIC names modules that do not exist: {missing}"


def test_research_imports_only_the_public_api():
    bad = [f"research/{p.name}:{line}: {what}"
           for p in scripts(RESEARCH) for line, what, ok in rlany_uses(p)
           if not ok and (p.name, what) not in ALLOWED]
    assert not bad, ("research/ imports a private name or a module below the stage layer "
                     "(use the CLI or a public module: see this file's docstring; a new "
                     "exception goes into ALLOWED with its reason):\n" + "\n".join(bad))


def test_every_allowed_exception_is_still_used():
    used = {(p.name, what) for p in scripts(RESEARCH) for _, what, ok in rlany_uses(p)
            if not ok}
    stale = sorted(set(ALLOWED) - used)
    assert not stale, f"ALLOWED entries no longer imported (remove them): {stale}"


def test_research_reaches_benchmarks_only_for_common():
    bench_scripts = stems(BENCHMARKS)
    bad = []
    for p in scripts(RESEARCH):
        for line, module, name in imports(p):
            top = module.split(".")[0]
            common = module == "benchmarks.common" or (module, name) == ("benchmarks", "common")
            if top == "benchmarks" and not common:
                bad.append(f"research/{p.name}:{line}: {module}")
            elif top in bench_scripts:  # a benchmarks/ script by its bare name
                bad.append(f"research/{p.name}:{line}: {module} (benchmarks/{top}.py)")
    assert not bad, "research/ imports benchmarks/ beyond benchmarks.common:\n" + "\n".join(bad)


def test_product_never_imports_research_or_benchmarks():
    lab = {"research", "benchmarks"} | stems(RESEARCH) | stems(BENCHMARKS)
    bad = [f"{p.relative_to(ROOT)}:{line}: {module}"
           for p in sorted((SRC / "rlany").rglob("*.py")) for line, module, _ in imports(p)
           if module.split(".")[0] in lab]
    assert not bad, "the product imports the lab or the benchmarks:\n" + "\n".join(bad)


def test_benchmarks_never_import_research():
    lab = {"research"} | stems(RESEARCH)
    bad = [f"benchmarks/{p.name}:{line}: {module}"
           for p in scripts(BENCHMARKS) for line, module, _ in imports(p)
           if module.split(".")[0] in lab]
    assert not bad, "benchmarks/ imports research/:\n" + "\n".join(bad)


def test_the_rule_catches_what_it_should(tmp_path):
    """The checker itself, on a file of known imports."""
    f = tmp_path / "x.py"
    f.write_text("import json\nimport rlany.training.trainer\nfrom rlany import stages\nfrom rlany.files import jsonl\n"
                 "from rlany.stages.rollout import RolloutOptions, _advance\n"
                 "from rlany.envs.household import Household\nfrom rlany.envs import make_env\n"
                 "def f():\n    from rlany.engines.hf import HfEngine\n")
    assert [(what, ok) for _, what, ok in rlany_uses(f)] == [
        ("rlany.training.trainer", False), ("rlany.stages", True), ("rlany.files.jsonl", True),
        ("rlany.stages.rollout.RolloutOptions", True), ("rlany.stages.rollout._advance", False),
        ("rlany.envs.household.Household", False), ("rlany.envs.make_env", True),
        ("rlany.engines.hf.HfEngine", False)]
