"""The settings groups a Config is made of, one per thing they set (config.py assembles them).

A setting has one name everywhere: its key in config.json, its make_config override and its
attribute in its group (`dyn_lr` is `config.dynamics_training.dyn_lr`), and its flag where it has
one (experiments/run.py's FLAG_NAMES lists the flags named otherwise). Config.replace(**settings)
and make_config(**overrides) take those names flat and put each in its group.

What reads which group, whole (never a list of names):
- the compiled epoch (core/epoch_settings.EpochSettings): AgentConfig, RolloutConfig and the
  ensemble's shape DynamicsConfig, beside the run's algorithm, beta and schedule;
- a saved dynamics ensemble's module (dynamics/saved_dynamics): DynamicsConfig;
- its reuse key and folder name: DynamicsConfig and DynamicsTrainingConfig;
- the evaluation loop: EvaluationConfig.
The run's matmul_precision is Config's own field, not a group's: every compiled program reads it
(the epoch through EpochSettings, the dynamics training, and its reuse key unless float32).

No checks here: Config checks every setting at once (config._validate), so one message names the
flag whatever group it sits in, and the epoch's per-cell copies may hold None.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Tuple


@dataclasses.dataclass(frozen=True)
class AgentConfig:
  """SAC's networks, optimisers, temperature and Bellman targets (docs/spec.md section 6), and the
  penalty's sample count and divergence guard the update applies."""
  gamma: float = 0.99
  tau: float = 0.005
  batch_size: int = 256
  actor_hidden: Tuple[int, ...] = (256, 256)
  critic_hidden: Tuple[int, ...] = (256, 256)
  num_critics: int = 2
  actor_lr: float = 1e-4
  critic_lr: float = 3e-4
  alpha_lr: float = 1e-4
  auto_alpha: bool = True
  alpha_max: Optional[float] = 1.0    # the MOMBO, MOBILE and MOPO references clamp alpha <= 1;
                                      # None: uncapped
  alpha: float = 0.2                  # the fixed alpha when auto_alpha is False
  log_alpha_init: float = 0.0
  target_entropy: Optional[float] = None   # None -> -dim(A)
  log_std_min: float = -5.0
  log_std_max: float = 2.0
  # Cosine-anneal the actor lr to 0 over the run's schedule_epochs (references:
  # CosineAnnealingLR(actor_optim, args.epoch) in adinlab/MOMBO train.py; stepped per epoch there,
  # per gradient step here).
  actor_cosine_schedule: bool = True
  deterministic_backup: bool = True   # no entropy term in the target (MOMBO, MOBILE); MOPO: False
  clip_target_min: Optional[float] = 0.0   # reference code clamps targets at >= 0; None disables
  mobile_num_samples: int = 10        # MOBILE's next-state samples per penalty
  # How MOMBO's targets moment-match the target critic (core/algorithms.py): diagonal (default:
  # the paper's Algorithm 1, the released code's), lowrank / lowrank<k> (the next state's low-rank
  # covariance carried through the critic, moment_matching/lowrank.py) or full (propagate's full
  # covariance: the analyses only, refused for training). The actor loss's moment-matched Q stays
  # diagonal in every mode; the dynamics do not see it.
  moments: str = "diagonal"
  # A seed whose loss leaves [-max_abs_loss, max_abs_loss] (or turns non-finite) counts as diverged:
  # a finite but exploding run (e.g. beta=1e18 gives critic losses ~1e37) must not run on silently.
  max_abs_loss: float = 1e12


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
  """The model rollouts, the ring buffer that keeps them, and their share of each batch. The ring's
  capacity: core/train.capacity (retain epochs x rollout batch x rollout length)."""
  real_ratio: float = 0.05            # real rows' share of each SAC batch
  rollout_batch_size: int = 50_000
  rollout_length: int = 5
  buffer_retain_epochs: int = 5
  # Model rule beside the gymnasium-faithful termination functions (termination.model_done): a
  # model next state with any |x| >= this is terminal, in rollouts (the branch ends with a terminal
  # row) and in MOMBO's per-elite targets, as in the references' termination code for all three
  # envs (adinlab/MOMBO utils/termination_fns.py). Real envs never get there; a runaway model does.
  rollout_obs_limit: Optional[float] = 100.0


@dataclasses.dataclass(frozen=True)
class EvaluationConfig:
  """How often and how long the policy is evaluated in the real environment."""
  eval_every: int = 10                # epochs between evaluations
  eval_episodes: int = 10


@dataclasses.dataclass(frozen=True)
class DynamicsConfig:
  """The dynamics ensemble's shape (docs/spec.md section 5): what builds its module
  (core/dynamics.make_module) and its saved arrays' template."""
  dyn_members: int = 7
  dyn_elites: int = 5
  dyn_hidden: Tuple[int, ...] = (200, 200, 200, 200)
  dyn_max_logvar_init: float = 0.5
  dyn_min_logvar_init: float = -10.0


@dataclasses.dataclass(frozen=True)
class DynamicsTrainingConfig:
  """How the ensemble is trained (dynamics/dynamics_training.py): with DynamicsConfig, everything
  that changes what training makes of the same data and keys, so both key an ensemble's reuse."""
  dyn_weight_decay: Tuple[float, ...] = (2.5e-5, 5e-5, 7.5e-5, 7.5e-5, 1e-4)  # one per layer
  dyn_lr: float = 1e-3
  dyn_batch_size: int = 256
  dyn_holdout_ratio: float = 0.2
  dyn_max_holdout: int = 1000
  dyn_improvement: float = 0.01       # a snapshot is kept on > 1% relative improvement
  dyn_patience: int = 5               # epochs without improvement before stopping
  dyn_max_epochs: Optional[int] = None     # None: train until patience runs out
  dyn_logvar_coef: float = 0.01


def fields(group) -> Tuple[str, ...]:
  """The setting names of a group (class or instance), in their order."""
  return tuple(f.name for f in dataclasses.fields(group))


def to_json(group) -> dict:
  """{name: value} of a group in JSON types, normalised so that equal settings give equal dicts
  however they were written (1 and 1.0, tuples and lists): each value as its default's type
  (float settings as float, tuples as lists of their first default element's type)."""
  out = {}
  for f in dataclasses.fields(group):
    value = getattr(group, f.name)
    if isinstance(f.default, tuple):
      value = [type(f.default[0])(v) for v in value]
    elif isinstance(f.default, float) and value is not None:
      value = float(value)
    out[f.name] = value
  return out
