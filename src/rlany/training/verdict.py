"""The reward model's verdict objectives (`train-rm --objective expected | logloss`).

A judge run with `--max-tokens 0` answers each step with a verdict v in {+1, -1} decoded
constrained: the engine walks the choices' token trie (`\\boxed{+1}`, `\\boxed{-1}`), so the
choices share a forced prefix (`\\boxed{`), differ at one token (`+` / `-`), and are forced
again after it. The verdict's distribution is therefore the softmax of the model's logits at
that one branch position, restricted to the choices' branch tokens:

    q(c | x) = softmax_c( z_c(x) )            z_c: the logit of choice c's branch token
                                              x:   the judge prompt + the forced prefix

Consistency feedback (the paper's reward model target, no labels): a verdict v on step
(i, t) earns r = R_it · v, with R_it = O_i + λ·S̄_it from `rlany score`. The sampled
estimator (`--objective pg`, the reference implementation's) draws m verdicts,
standardizes R·v within them and runs PPO on every sampled token; it trains only where the
m verdicts differ, where |S̄_it| < 1 and so (λ <= 1) sign R_it = O_i: it pushes the verdict
toward the outcome's sign. For a verdict-only judge the same objective can be computed
exactly, with no sampling, toward R = `rm_target` on the scored step, which is O_i by
default (R_it itself would hold the judge's own S̄: one that says +1 everywhere gets
R = 0 on every failure, is never corrected, and collapsed that way in the loop):

    expected:  J_it = E_{v~q}[R_it · v] = R_it · Σ_c q_c v_c       loss = -w · J
    logloss:   loss = -w · |R_it| · log q(c* )      c* = the choice with sign(v) = sign(R_it)

`expected` is the paper's objective itself: its gradient is R·2q₊q₋·∇(z₊ - z₋), which fades
as the judge grows confident, right or wrong. `logloss` has the same fixed point for a step
whose R has one sign (the verdict matching it) but its gradient (1 - q(c*)) does not fade
while the judge is wrong, and over steps that look alike it makes q₊ the R-weighted share
of those with R > 0 (a calibrated verdict, where `expected` pushes q to 0 or 1). R is a
noisy label for a step (a good step in a failed episode has R < 0): for one round of training
the bounded `expected` loss measured the more robust under such noise
(held-out step accuracy from the outcome alone: 0.673 / 0.690 at lr 3e-4 / 1e-3, against
logloss's 0.593 / 0.703; docs/stages/train-rm.md), but over the loop's rounds its fading
gradient leaves a drifted verdict bias where it fell (docs/stages/train-rm.md), hence
`train-rm --objective auto`'s choice, `logloss`.

Against the sampled estimator both: (1) train only the one token the judge chose between
(the forced prefix and suffix carry no gradient); (2) keep steps whose m verdicts agree
(a confidently wrong judge still gets a gradient); (3) use one sample per step, not m, so
every step fits in the budget of the m-sample estimator's quarter; (4) balance the classes
(`w`): the steps with R > 0 and those with R < 0 weigh the same in total, so a bias toward
the majority verdict cannot meet the objective. A step with R = 0 carries no information
and is not a sample.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from rlany.errors import RlanyError
from rlany.stats import side_weights


@dataclass(frozen=True)
class Branch:
    """Where a set of constrained choices is decided: after `prefix` (forced tokens shared
    by every choice), one token per choice (`tokens`, all different), then forced again."""

    prefix: list[int]
    tokens: list[int]
    values: list[float]  # each choice's verdict score, e.g. +1 / -1


def branch(tokenizer, choices: tuple[str, ...], values: tuple[float, ...]) -> Branch:
    """The branch of `choices` as the engine decodes them (each choice's own tokenization,
    `add_special_tokens=False`, then EOS); an error where they are not decided at one
    token (a trie with several branch points needs the sampled estimator)."""
    eos = tokenizer.eos_token_id
    seqs = [tokenizer(c, add_special_tokens=False)["input_ids"] + [eos] for c in choices]
    n = 0
    while all(len(s) > n for s in seqs) and len({s[n] for s in seqs}) == 1:
        n += 1
    at = [s[n] if len(s) > n else None for s in seqs]
    if None in at or len(set(at)) != len(at):
        raise RlanyError(f"the verdict choices {choices} are not decided at one token by "
                         "this tokenizer", hint="use --objective pg")
    return Branch(prefix=seqs[0][:n], tokens=at, values=[float(v) for v in values])


class RawVerdict(NamedTuple):
    messages: list[dict]  # the judge prompt
    target: float  # R_it (or the env label under `score --rm-target label`)


def verdict_samples(scored: Iterable, choices: tuple[str, ...]) -> Iterator[RawVerdict]:
    """One sample per scored step that gives reward-model data (`rm_target` set, not 0).
    The step's judge samples must be verdicts alone (a judge run with --max-tokens 0)."""
    for traj in scored:
        for step in traj.steps:
            target = getattr(step, "rm_target", None)
            if target is None or target == 0 or not step.judge_messages:
                continue
            for sample in step.judge:
                if sample.text not in choices:
                    raise RlanyError(
                        f"step {step.step} of trajectory '{traj.traj_id}' has a judge "
                        f"sample with reasoning ({sample.text[:40]!r}...): --objective "
                        "expected/logloss train the verdict of a judge run with "
                        "--max-tokens 0", hint="use --objective pg")
            yield RawVerdict(step.judge_messages, float(target))


def tokenize_verdicts(tokenizer, raw: Iterable[RawVerdict], max_len: int, balance: bool):
    """(samples, dropped): each step's rendered judge prompt + the choices' forced prefix,
    with its target and class weight (`rlany.training.samples.Sample`, no response); a
    prompt longer than `max_len` is dropped."""
    from rlany.chat import render
    from rlany.prompts import VERDICT_CHOICES, parse_verdict
    from rlany.training.samples import Sample

    at = branch(tokenizer, VERDICT_CHOICES, tuple(parse_verdict(c) for c in VERDICT_CHOICES))
    kept, dropped = [], 0
    for r in raw:
        prompt = render(tokenizer, r.messages) + at.prefix
        if len(prompt) > max_len:
            dropped += 1
            continue
        kept.append(Sample(prompt_ids=prompt, response_ids=[], advantage=1.0,
                           target=r.target, choice_ids=at.tokens, choice_values=at.values))
    for s, w in zip(kept, class_weights([s.target for s in kept], balance)):
        s.advantage = w
    return kept, dropped


def class_weights(targets: list[float], balance: bool) -> list[float]:
    """w per sample: `rlany.stats.side_weights` with `balance`, else 1 for all."""
    return side_weights(targets) if balance else [1.0] * len(targets)


def choice_logprobs(model, prompts: list[list[int]], tokens: list[int], pad_id: int, device,
                    share: bool = False, one_pass: bool = False):
    """log q(c | x) for each prompt (left-padded, one forward, the LM head at the last
    position only): (B, C). With `share`, the prompts' shared prefixes run once
    (`rlany.shared_prefix`: the same numbers; `one_pass` as there)."""
    import torch

    from rlany.compat import accepts_logits_to_keep
    if share:
        from rlany.shared_prefix import shared_logits
        last = [len(p) - 1 for p in prompts]
        z = torch.stack([x[-1] for x in shared_logits(model, prompts, last, last, pad_id,
                                                       device, one_pass=one_pass)])
        return torch.log_softmax(z[:, tokens], -1)

    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts],
                        device=device)
    keep = {"logits_to_keep": 1} if accepts_logits_to_keep(model) else {}
    logits = model(input_ids=ids, attention_mask=mask,
                   position_ids=(mask.cumsum(-1) - 1).clamp(min=0), **keep).logits
    z = logits[:, -1].float()[:, tokens]  # (B, C)
    return torch.log_softmax(z, -1)


def verdict_loss(logq, values, targets, weights, *, objective: str,
                 normalizer: float | None = None):
    """logq: (B, C) log-probs of the choices; values: (C,) their verdict scores; targets,
    weights: (B,) (weight 0 for a padding row). Returns `rlany.training.losses.LossParts`:
    the sum of per-sample losses / normalizer (default B), like the other objectives."""
    import torch

    from rlany.training.losses import LossParts

    values, targets, weights = (t.to(logq.device, logq.dtype)
                                for t in (values, targets, weights))
    if objective == "expected":
        per = -weights * targets * (logq.exp() * values).sum(-1)  # (B,)
    elif objective == "logloss":
        want = torch.sign(targets)[:, None] * torch.sign(values)[None, :] > 0  # (B, C)
        per = -weights * targets.abs() * torch.where(want, logq, 0.0).sum(-1)  # (B,)
    else:
        raise RlanyError(f"unknown verdict objective {objective!r}")
    n = normalizer if normalizer is not None else logq.shape[0]
    real = int((weights != 0).sum().item())
    objective_sum = per.detach().sum().item()
    return LossParts(loss=per.sum() / n, objective=objective_sum, pg=objective_sum, kl=0.0,
                     clipped=0, tokens=real, sequences=real)
