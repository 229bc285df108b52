"""`score --step-credit gigpo`: step credit without a judge, from the states rollouts share.

GiGPO (group-in-group policy optimization; Feng et al., arXiv 2505.10978, shipped in
verl-agent as `gigpo/core_gigpo.py`). For one task q with N trajectories that ran (an
errored one takes no part: `rlany.stages.episode_errors`), trajectory i has steps
t = 0..T_i-1, step t taken in the state the observation obs_it shows:

    e_it   = the env's reward on GiGPO's scale (`--outcome`, `env_reward.outcome_rewards`):
             success: 1 at the last step of an episode that succeeded, else 0;
             return: the step's info.reward; final-reward: the last step's, at the last step
    R_i    = Σ_t e_it                                    the episode's return       (N,)
    A^E_i  = (R_i - mean_i R) / std_i R                  episode advantage (Eq. 3)  (N,)
    r_it   = e_it + λ · S̄_it                             step reward                (T_i,)
    G_it   = Σ_{k>=t} γ^(k-t) · r_ik                     discounted return (Eq. 5)  (T_i,)
    U_it   = {(j, k) : key_jk = key_it}                  anchor group (Eq. 6)
    A^S_it = (G_it - mean_U G) / std_U G                 step advantage (Eq. 7)
    A_it   = A^E_i + w · A^S_it                          the step's advantage (Eq. 8)

with γ = `--gamma` (0.95), w = `--gigpo-weight` (1) and λ = `--lam`. key_it is the step's
`state` (rollout's digest of the env's `state_key(obs)`: household and miniwob leave out
the feedback line on the last action), else the digest of the whole observation: anchor
states are matched exactly. U_it holds every step of the task's trajectories that met the
state, a trajectory that revisits it once per visit (verl-agent's convention); a group of
one gives A^S = 0, so such a step keeps the episode advantage alone.

S̄_it is the step score of `rlany.stages.score` (the judge's mean verdict, or the env's
label or step reward under `--step-scores`; 0 without judgments): the judge's verdicts
add to every step's reward, the outcome arrives at the end, and A^S compares the
discounted sums. A^E stays on the env's return alone. The paper's R = O + λ·S̄ (O = ±1)
is still every scored step's `reward`: the reward model's consistency feedback reads it.

Choices, where verl-agent's defaults differ:
* `--gigpo-norm std` (default) divides by the population std; a std below 1e-8 gives 0
  (`rlany.stages.advantages`, as everywhere in score). verl-agent divides by the sample
  std + 1e-6 and defaults to its mean-only mode, which `--gigpo-norm mean` gives (for
  A^E and A^S both).
* A^E is normalized over the N trajectories (the paper's Eq. 3); verl-agent's default
  pools it over their steps, which weighs a long trajectory more.
* A task with one trajectory that ran follows `--lone-step`: raw gives A^E = R_i
  (verl-agent's), zero gives 0.
* `--uniform-tasks` keeps its meaning: a task whose rollouts all fail has R = 0 and, with
  no step scores, G = 0 everywhere: no advantage anywhere, dropped. One whose rollouts all
  succeed has A^E = 0 but A^S still favours the steps nearer the goal: `separated` keeps it
  when some A^S differs from 0, `drop` drops it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from rlany.envs import state_hash
from rlany.errors import RlanyError
from rlany.files.records import Step
from rlany.options import opt
from rlany.stages.advantages import Credit, centered, standardize
from rlany.stages.env_reward import Group, outcome_rewards

STEP_CREDITS = ("step-index", "gigpo")
NORMS = ("std", "mean")
PANEL = "Step credit"


@dataclass(frozen=True, kw_only=True)
class StepCreditFields:
    """`score`'s step-credit options: a mixin of fields only (the math is this module's)."""

    step_credit: str = opt("step-index", "Each step's advantage: R standardized across the "
                           "trajectories that reach step index t (step-index, the paper), or "
                           "GiGPO's episode advantage plus w x the advantage of the step's "
                           "discounted return among the steps that met the same state "
                           "(gigpo: no judge needed).", choices=STEP_CREDITS, panel=PANEL)
    gigpo_weight: float = opt(1.0, "w in GiGPO's A = A^E + w * A^S.", min=0, panel=PANEL)
    gamma: float = opt(0.95, "GiGPO's discount of the return from each step.", min=0, max=1,
                       panel=PANEL)
    gigpo_norm: str = opt("std", "GiGPO's normalization within an episode or anchor group: "
                          "mean and std (std) or the mean only (mean).", choices=NORMS,
                          panel=PANEL)

    def check_step_credit(self, name) -> None:
        """GiGPO's own flags are refused without `--step-credit gigpo` (they would do
        nothing)."""
        if self.step_credit == "gigpo":
            return
        for key, default in (("gigpo_weight", 1.0), ("gamma", 0.95), ("gigpo_norm", "std")):
            if getattr(self, key) != default:
                raise RlanyError(f"{name(key)} is GiGPO's: it goes with "
                                 f"{name('step_credit')} gigpo")


class CreditOptions(Protocol):
    """What `gigpo_credit` reads of score's options (`rlany.stages.score.ScoreOptions`):
    this mixin's fields and the outcome, lambda and lone-step settings they combine with."""

    gigpo_norm: str
    gigpo_weight: float
    gamma: float
    outcome: str
    lam: float
    lone_step: str


def anchor_key(step: Step) -> str:
    """key_it: rollout's digest of the env's state key, else the whole observation's."""
    return step.state or state_hash(step.obs)


def discounted(rewards: list[float], gamma: float) -> list[float]:
    """G_t = r_t + γ · G_{t+1}, G_T = 0."""
    out, g = [0.0] * len(rewards), 0.0
    for t in reversed(range(len(rewards))):
        g = rewards[t] + gamma * g
        out[t] = g
    return out


def gigpo_credit(group: Group, ran: list[bool], step_scores: list[list[float]],
                 opts: CreditOptions) -> Credit:
    """A_it = A^E_i + w · A^S_it for every step of one task's trajectories (module doc);
    an errored trajectory's steps get 0 and no `gigpo` record."""
    normalize = standardize if opts.gigpo_norm == "std" else centered
    trajs = [tr for _, tr, _ in group]
    e = outcome_rewards(group, opts.outcome)  # e_it
    members = [i for i, ok in enumerate(ran) if ok]
    episode = [0.0] * len(trajs)  # A^E_i  (N,)
    if len(members) == 1:
        episode[members[0]] = sum(e[members[0]], 0.0) if opts.lone_step == "raw" else 0.0
    elif members:
        for i, a in zip(members, normalize([sum(e[i], 0.0) for i in members])):
            episode[i] = a
    returns = [discounted([x + opts.lam * s for x, s in zip(e_i, s_i)], opts.gamma)
               for e_i, s_i in zip(e, step_scores)]  # G_it
    keys = [[anchor_key(step) for step in tr.steps] for tr in trajs]
    anchors: dict[str, list[tuple[int, int]]] = {}  # key -> the (i, t) that met it: U
    for i in members:
        for t, key in enumerate(keys[i]):
            anchors.setdefault(key, []).append((i, t))
    step_adv = [[0.0] * len(tr.steps) for tr in trajs]  # A^S_it
    for group_steps in anchors.values():
        for (i, t), a in zip(group_steps, normalize([returns[i][t] for i, t in group_steps])):
            step_adv[i][t] = a
    w = opts.gigpo_weight
    advantages = [[episode[i] + w * a if ran[i] else 0.0 for a in row]
                  for i, row in enumerate(step_adv)]
    steps = [[{"anchor": key, "anchor_size": len(anchors[key]), "return": returns[i][t],
               "episode_advantage": episode[i], "step_advantage": step_adv[i][t]}
              if ran[i] else None for t, key in enumerate(keys[i])] for i in range(len(trajs))]
    shared = sum(len(u) for u in anchors.values() if len(u) > 1)
    return Credit(advantages, separated=any(w * a != 0.0 for row in step_adv for a in row),
                  steps=steps, stats={"anchor_groups": len(anchors),
                                      "anchor_steps": sum(map(len, anchors.values())),
                                      "anchor_shared_steps": shared})


class AnchorCounts:
    """The pool's anchor groups over a score run: the sidecar's counts and the loop's
    metrics (the share of steps whose anchor group holds another step, and the mean
    group size, verl-agent's: steps per group)."""

    def __init__(self) -> None:
        self.groups = self.steps = self.shared = 0

    def add(self, task_extra: dict) -> None:
        self.groups += task_extra.get("anchor_groups", 0)
        self.steps += task_extra.get("anchor_steps", 0)
        self.shared += task_extra.get("anchor_shared_steps", 0)

    def counts(self) -> dict:
        return {"anchor_groups": self.groups, "anchor_steps": self.steps,
                "anchor_shared_share": self.shared / self.steps if self.steps else None,
                "anchor_group_mean": self.steps / self.groups if self.groups else None}
