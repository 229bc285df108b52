"""`--shard I/N` on rollout, judge and eval (`rlany.shards`), through the real entry point.

The shards' outputs, concatenated in shard order, are the unsharded output byte for byte
(eval: its trajectories concatenate, its summaries join with `--join` to the unsharded
numbers); each shard makes exactly the unsharded run's generate calls (so an engine whose
samples depend on the batch gives the same bytes too); a malformed spec is a usage error;
a killed shard resumes on its own output."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from conftest import read_jsonl, write_jsonl
from rlany.envs.reasoning import make_tasks

ROOT = Path(__file__).resolve().parent.parent
HOUSE = ROOT / "examples" / "household" / "tasks.jsonl"  # 8 multi-turn tasks, step labels


def rlany(*argv: str, stdin: str | None = None) -> tuple[int, str, str]:
    """`rlany ARGV` in-process (`rlany.cli.main`): (exit code, stdout, stderr)."""
    from rlany.cli import main

    code: Any = 0
    with CliRunner().isolation(input=stdin, env={"RLANY_DEBUG": None}) as (out, err, _):
        try:
            main(list(argv))
        except SystemExit as e:
            code = e.code
    code = 0 if code is None else code if isinstance(code, int) else 1
    return code, out.getvalue().decode(), err.getvalue().decode()


def ok(*argv: str, stdin: str | None = None) -> str:
    code, out, err = rlany(*argv, stdin=stdin)
    assert code == 0, err
    return err + out


@pytest.fixture
def files(tmp_path) -> dict[str, str]:
    """7 reasoning tasks and a candidate one; a scripted policy (and judge) that gets some
    right; the household tasks for multi-turn episodes."""
    tasks = make_tasks(8, seed=3)
    tasks[5] = replace(tasks[5], extra={"candidate": {"parent_acc": 0.5, "proposed_iter": 0,
                                                      "critique": "none"}})
    write_jsonl(tmp_path / "tasks.jsonl", tasks)
    script = tmp_path / "fake.json"
    script.write_text(json.dumps({"rules": [
        {"match": "reviewer", "responses": ["ok \\boxed{+1}", "no \\boxed{-1}"]},
        {"responses": [f"\\boxed{{{tasks[0].spec['answer']}}}", "\\boxed{5}", "\\boxed{12}"]}]}))
    return {"tasks": str(tmp_path / "tasks.jsonl"), "house": str(HOUSE),
            "fake": str(script), "dir": str(tmp_path)}


def sharded(stage: str, inp: str, out: Path, n: int, *args: str) -> bytes:
    """Run shards 0..n-1 of `stage` (outputs out.0 ... out.n-1) and concatenate them."""
    data = b""
    for i in range(n):
        part = out.with_name(f"{out.stem}.{i}{out.suffix}")
        ok(stage, "-i", inp, "-o", str(part), *args, "--shard", f"{i}/{n}")
        meta = json.loads(part.with_suffix(".meta.json").read_text())
        assert meta["flags"]["shard"] == f"{i}/{n}" and meta["counts"]["shard"]["of"] == n
        data += part.read_bytes()
    return data


ROLLOUTS = {  # name -> (tasks, shards, flags)
    "n1": ("tasks", 2, ["--n", "1"]),
    "n3-batches-of-2": ("tasks", 3, ["--n", "3", "--batch-tasks", "2"]),
    "sample-tasks": ("tasks", 2, ["--n", "2", "--batch-tasks", "2", "--sample-tasks", "4",
                                  "--iteration", "1"]),
    "multi-turn": ("house", 2, ["--n", "2", "--max-steps", "3", "--constrain-actions",
                                "--batch-tasks", "3"]),
    "more-shards-than-batches": ("tasks", 4, ["--n", "2", "--batch-tasks", "3"]),
}


@pytest.mark.parametrize("name", list(ROLLOUTS))
def test_rollout_shards_concatenate_to_the_unsharded_output(files, name):
    kind, n, flags = ROLLOUTS[name]
    args = ["--engine", "fake", "--model", files["fake"], *flags]
    full = Path(files["dir"]) / "full.jsonl"
    ok("rollout", "-i", files[kind], "-o", str(full), *args)
    joined = sharded("rollout", files[kind], Path(files["dir"]) / "t.jsonl", n, *args)
    assert joined == full.read_bytes() and joined
    rows = read_jsonl(full)
    if name == "sample-tasks":  # the sample of the whole input, the candidate kept
        assert len({r["task_id"] for r in rows}) == 5 and any(r.get("candidate") for r in rows)
    if name == "more-shards-than-batches":  # 8 tasks are 3 batches: the 4th shard is empty
        assert (Path(files["dir"]) / "t.3.jsonl").read_bytes() == b""
        meta = json.loads((Path(files["dir"]) / "t.3.meta.json").read_text())
        assert meta["counts"]["shard"] == {"index": 3, "of": 4, "start": 8, "end": 8,
                                           "total": 8}


def test_judge_shards_and_judged_rollout_shards_concatenate_to_the_unsharded_judgments(files):
    d = Path(files["dir"])
    fake = ["--engine", "fake", "--model", files["fake"]]
    ok("rollout", "-i", files["tasks"], "-o", str(d / "t.jsonl"), *fake, "--n", "3")
    judge = [*fake, "--m", "2", "--batch-trajectories", "4"]
    ok("judge", "-i", str(d / "t.jsonl"), "-o", str(d / "j.jsonl"), *judge)
    full = (d / "j.jsonl").read_bytes()
    # --shard on the whole rollout's output
    assert sharded("judge", str(d / "t.jsonl"), d / "js.jsonl", 3, *judge) == full
    streams = [rlany("judge", "-i", str(d / "t.jsonl"), "-o", "-", *judge, "--shard", f"{i}/2")
               for i in range(2)]
    assert "".join(s[1] for s in streams) == rlany("judge", "-i", str(d / "t.jsonl"), "-o",
                                                   "-", *judge)[1]
    # or each rollout shard's output judged whole
    rollouts = sharded("rollout", files["tasks"], d / "ts.jsonl", 2, *fake, "--n", "3",
                       "--batch-tasks", "4")
    assert rollouts == (d / "t.jsonl").read_bytes()
    for i in range(2):
        ok("judge", "-i", str(d / f"ts.{i}.jsonl"), "-o", str(d / f"jr.{i}.jsonl"), *judge)
    assert (d / "jr.0.jsonl").read_bytes() + (d / "jr.1.jsonl").read_bytes() == full
    # ... but not cut again: its sidecar says it is a shard already
    code, _, err = rlany("judge", "-i", str(d / "ts.0.jsonl"), "-o", str(d / "x.jsonl"),
                         *judge, "--shard", "0/2")
    assert code == 2 and "already shard 0/2 of a rollout" in err
    assert not (d / "x.jsonl").exists()
    # the joined judgments pair with the joined trajectories
    (d / "jj.jsonl").write_bytes((d / "js.0.jsonl").read_bytes() + (d / "js.1.jsonl")
                                 .read_bytes() + (d / "js.2.jsonl").read_bytes())
    ok("score", "-i", str(d / "t.jsonl"), "-j", str(d / "jj.jsonl"), "-o", str(d / "s.jsonl"))


def _calls(stage: str, opts: Any) -> list[list[tuple]]:
    """The generate calls a stage run makes: each call's requests as (seed, n, prompt)."""
    from rlany.engines.fake import FakeEngine
    from rlany.stages import eval as eval_stage
    from rlany.stages import judge, rollout

    engine = FakeEngine.from_file(opts.model, seed=opts.seed)
    {"rollout": rollout, "judge": judge, "eval": eval_stage}[stage].run(opts, engine)
    return [[(r.sampling.seed, r.sampling.n, json.dumps(r.messages)) for r in call]
            for call in engine.calls]


def test_each_shard_makes_the_unsharded_runs_own_generate_calls(files):
    """Whole batches: a shard's calls are the unsharded run's, request for request, so an
    engine that seeds a batched call once (hf) or rounds by batch gives the same bytes."""
    from rlany.stages.eval import EvalOptions
    from rlany.stages.judge import JudgeOptions
    from rlany.stages.rollout import RolloutOptions

    d = Path(files["dir"])
    common = {"engine": "fake", "model": files["fake"]}
    episodes = {"n": 2, "max_steps": 3, "constrain_actions": True, "batch_tasks": 3}
    rollout = RolloutOptions(input=files["house"], output=str(d / "t.jsonl"), **common,
                             **episodes)
    judge = JudgeOptions(input=str(d / "t.jsonl"), output=str(d / "j.jsonl"), **common, m=2,
                         batch_trajectories=5)
    evaluate = EvalOptions(input=files["house"], output=str(d / "e.json"), **common,
                           **episodes, judge=True, m=2)
    for stage, opts in (("rollout", rollout), ("judge", judge), ("eval", evaluate)):
        whole = _calls(stage, opts)
        parts = [_calls(stage, replace(opts, shard=f"{i}/3",
                                       output=str(d / f"{stage}.{i}.out"))) for i in range(3)]
        joined = [c for p in parts for c in p]
        if stage == "eval":  # a run judges after its rollout: the shards interleave the two
            whole, joined = sorted(whole), sorted(joined)
        assert len(whole) > 3 and whole == joined, stage


def test_eval_shards_join_to_the_unsharded_summary(files):
    d = Path(files["dir"])
    args = ["--engine", "fake", "--model", files["fake"], "--n", "2", "--k", "1", "--k", "2",
            "--max-steps", "3", "--constrain-actions", "--batch-tasks", "3", "--judge",
            "--m", "2"]
    ok("eval", "-i", files["house"], "-o", str(d / "e.json"), *args,
       "--trajectories", str(d / "t.jsonl"))
    for i in range(3):
        ok("eval", "-i", files["house"], "-o", str(d / f"e.{i}.json"), *args,
           "--trajectories", str(d / f"t.{i}.jsonl"), "--shard", f"{i}/3")
    trajs = b"".join((d / f"t.{i}.jsonl").read_bytes() for i in range(3))
    assert trajs == (d / "t.jsonl").read_bytes()
    # concatenated in any order: each summary says which shard it is
    cat = "".join((d / f"e.{i}.json").read_text() for i in (2, 0, 1))
    ok("eval", "--join", "-", "-o", str(d / "joined.json"), stdin=cat)
    whole, joined = (json.loads((d / name).read_text()) for name in ("e.json", "joined.json"))
    assert whole["judge_step_accuracy"] is not None and whole["on_plan_share"] is not None
    for key in ("wall_time_s", "generate_seconds", "prefill_seconds", "generate_calls"):
        whole.pop(key), joined.pop(key)  # times, and calls: each process batches its own
    assert json.dumps(joined) == json.dumps(whole)  # every number and key, in order
    meta = json.loads((d / "joined.meta.json").read_text())
    assert meta["counts"]["shards"] == 3 and meta["flags"]["shard"] is None
    assert meta["flags"]["n"] == 2 and meta["flags"]["join"] == "-"
    # its first input is the tasks the shards ran, as the unsharded one's: `report` reads a
    # gain across a sharded and an unsharded evaluation by it
    tasks = json.loads((d / "e.meta.json").read_text())["inputs"][0]
    assert {k: meta["inputs"][0][k] for k in ("path", "sha256")} == {
        k: tasks[k] for k in ("path", "sha256")}
    from rlany.stages.report_read import _same_tasks
    _same_tasks(d / "e.json", d / "joined.json")
    # a file of the concatenated summaries does too; -o - prints the summary
    (d / "all.json").write_text(cat)
    out = rlany("eval", "--join", str(d / "all.json"), "-o", "-")[1]
    assert json.loads(out)["per_task"] == whole["per_task"]


def test_joined_adapter_checks_are_the_unsharded_served_runs():
    """Shards each sending to an endpoint of its own check each adapter there; joined, the
    checks are those of one run on all the endpoints (rlany.engines.endpoints): each naming
    its endpoint, adapter by adapter, each on the endpoints in order. One endpoint shared
    by every shard (a router): the checks as the shards wrote them."""
    from rlany.stages.eval_join import joined_checks

    def check(adapter):
        return {"adapter": adapter, "to_trained": 0.001, "status": "ok"}

    urls = ["http://a:1/v1", "http://b:2/v1"]
    parts = [[check("policy"), check("rm")], [check("policy"), check("rm")]]
    assert joined_checks(parts, urls) == [
        {**check(x), "endpoint": url} for x in ("policy", "rm") for url in urls]
    assert joined_checks(parts, [urls[0]] * 2) == [*parts[0], *parts[1]]
    assert joined_checks(parts, [None, None]) == [*parts[0], *parts[1]]


def test_eval_join_refuses_shards_that_do_not_make_one_run(files):
    d = Path(files["dir"])
    args = ["--engine", "fake", "--model", files["fake"], "--n", "2"]
    for i in range(3):
        ok("eval", "-i", files["tasks"], "-o", str(d / f"e.{i}.json"), *args,
           "--shard", f"{i}/3")
    ok("eval", "-i", files["tasks"], "-o", str(d / "other.json"), "--engine", "fake",
       "--model", files["fake"], "--n", "3", "--shard", "2/3")
    ok("eval", "-i", files["tasks"], "-o", str(d / "whole.json"), *args)
    text = {name: (d / name).read_text() for name in
            ("e.0.json", "e.1.json", "e.2.json", "other.json", "whole.json")}
    cases = [(["e.0.json", "e.1.json"], 1, "missing 2/3"),
             (["e.0.json", "e.1.json", "e.1.json", "e.2.json"], 1, "shard 1/3 appears twice"),
             (["e.0.json", "e.1.json", "other.json"], 1, "shards of different runs"),
             (["whole.json"], 1, "not the summary of a shard"),
             (["e.0.json"], 1, "missing 1/3, 2/3")]
    for names, code, message in cases:
        got, _, err = rlany("eval", "--join", "-", "-o", str(d / "j.json"),
                            stdin="".join(text[n] for n in names))
        assert got == code and message in err, (names, err)
        assert len(err.strip().splitlines()) == 1 and not (d / "j.json").exists()
    # a shard's rows edited after it wrote them; shards whose tasks leave a gap
    edited = json.loads(text["e.0.json"])
    edited["per_task"][0]["successes"] += 1
    moved = json.loads(text["e.1.json"])
    moved["shard"]["start"] += 1
    for parts, message in (([json.dumps(edited), text["e.1.json"]],
                            "shard 0/3's rows and counts are not the ones it wrote"),
                           ([text["e.0.json"], json.dumps(moved)],
                            "not the ones after shard 0's")):
        got, _, err = rlany("eval", "--join", "-", "-o", str(d / "j.json"),
                            stdin="".join([*parts, text["e.2.json"]]))
        assert got == 1 and message in err and len(err.strip().splitlines()) == 1, err
        assert not (d / "j.json").exists()
    got, _, err = rlany("eval", "--join", "-", "-o", str(d / "j.json"), "--n", "2",
                        stdin=text["e.0.json"])
    assert got == 2 and "--n does not go with it" in err


@pytest.mark.parametrize("stage", ["rollout", "judge", "eval"])
@pytest.mark.parametrize("spec", ["2/2", "a/b", "0/0", "-1/2", "1/2/3", "1", " 0/2", "0/2.0"])
def test_a_malformed_shard_is_a_usage_error(files, stage, spec):
    d = Path(files["dir"])
    inp = files["tasks"]
    if stage == "judge":
        write_jsonl(d / "t.jsonl", [])  # never read: the spec is refused first
        inp = str(d / "t.jsonl")
    out = d / ("out.json" if stage == "eval" else "out.jsonl")
    code, _, err = rlany(stage, "-i", inp, "-o", str(out), "--engine", "fake", "--model",
                         files["fake"], "--shard", spec)
    assert code == 2 and err.strip().splitlines() == [err.strip()], err
    assert err.startswith("usage error: --shard must be I/N") and not out.exists()


@pytest.mark.parametrize("stage", ["rollout", "judge"])
def test_a_killed_shard_resumes_on_its_own(files, stage):
    """Shard 1/2 dies after its first batch (and half a line more); the rerun keeps what
    it wrote, finishes, and equals a clean run of the shard; the other shard's flags are
    refused on its partial output."""
    from rlany.stage_engine import start_engine
    from rlany.stages import judge, rollout

    d = Path(files["dir"])
    fake = ["--engine", "fake", "--model", files["fake"]]
    ok("rollout", "-i", files["tasks"], "-o", str(d / "t.jsonl"), *fake, "--n", "2")
    inp = files["tasks"] if stage == "rollout" else str(d / "t.jsonl")
    flags = ["--n", "2", "--batch-tasks", "1"] if stage == "rollout" else \
        ["--m", "2", "--batch-trajectories", "2"]
    clean = d / "clean.jsonl"
    ok(stage, "-i", inp, "-o", str(clean), *fake, *flags, "--shard", "1/2")
    module = rollout if stage == "rollout" else judge
    cls = module.RolloutOptions if stage == "rollout" else module.JudgeOptions
    out = d / "out.jsonl"
    opts = cls(input=inp, output=str(out), engine="fake", model=files["fake"], shard="1/2",
               **({"n": 2, "batch_tasks": 1} if stage == "rollout" else
                  {"m": 2, "batch_trajectories": 2}))
    engine = start_engine(opts)
    generate, partial = engine.generate, d / "out.jsonl.partial"

    def dies(requests):  # once a batch is written, the next one never comes back
        if partial.exists() and partial.stat().st_size:
            raise KeyboardInterrupt
        return generate(requests)
    engine.generate = dies
    with pytest.raises(KeyboardInterrupt):
        module.run(opts, engine)
    assert 0 < partial.stat().st_size < clean.stat().st_size and not out.exists()
    with open(partial, "ab") as f:
        f.write(b'{"traj_id": "torn')  # killed in the middle of a write
    code, _, err = rlany(stage, "-i", inp, "-o", str(out), *fake, *flags, "--shard", "0/2")
    assert code == 1 and "other flags" in err
    err = ok(stage, "-i", inp, "-o", str(out), *fake, *flags, "--shard", "1/2")
    assert "resuming" in err and out.read_bytes() == clean.read_bytes()
    assert not partial.exists()


def test_hf_shards_are_the_unsharded_bytes_though_its_samples_depend_on_the_batch(
        files, tiny_model):
    """The hf engine seeds a batched call once, so which tasks share a batch changes the
    samples (shown); shards of whole batches still give the unsharded run's bytes."""
    d = Path(files["dir"])
    tasks = d / "four.jsonl"
    tasks.write_text("".join(Path(files["tasks"]).read_text().splitlines(True)[:4]))
    hf = ["--engine", "hf", "--model", tiny_model]
    play = [*hf, "--n", "2", "--max-tokens", "4"]
    ok("rollout", "-i", str(tasks), "-o", str(d / "t.jsonl"), *play, "--batch-tasks", "2")
    ok("rollout", "-i", str(tasks), "-o", str(d / "one.jsonl"), *play, "--batch-tasks", "1")
    assert (d / "one.jsonl").read_bytes() != (d / "t.jsonl").read_bytes()  # batch-dependent
    assert sharded("rollout", str(tasks), d / "ts.jsonl", 2, *play, "--batch-tasks", "2") \
        == (d / "t.jsonl").read_bytes()
    judge = [*hf, "--m", "2", "--max-tokens", "2", "--batch-trajectories", "4"]
    ok("judge", "-i", str(d / "t.jsonl"), "-o", str(d / "j.jsonl"), *judge)
    assert sharded("judge", str(d / "t.jsonl"), d / "js.jsonl", 2, *judge) \
        == (d / "j.jsonl").read_bytes()
