"""One frozen, hashable config per run, filled from each algorithm's reference tables
(mombo_jax/settings/references.py; docs/spec.md sections 4 and 6).

`make_config(env, algo, **overrides)` is the only way runs get their hyperparameters; absl flags in
`experiments/` only pass overrides. Magic numbers live here and nowhere else.
"""
from __future__ import annotations

import dataclasses
import math
import types
from typing import Optional, Tuple

from mombo_jax.core import algorithms
from mombo_jax.data.names import parse_name
from mombo_jax.settings import groups, references

ALGOS = ("mombo", "mobile", "mopo")      # the paper's, with reference tables; any registered name
                                        # (mombo_jax.core.algorithms) trains (the CLI's --algo)
TARGETS = ("lcb", "elite_spread", "mixture")
# A run's float32 matmul precision (Config.matmul_precision), by jax.default_matmul_precision's
# names: "float32" multiplies full float32 inputs, as the PyTorch references do; "tensorfloat32"
# rounds the inputs to TF32 (10 mantissa bits) first where the device has the units (a GPU's tensor
# cores since Ampere), faster and about 2^-11 relative per input less exact. XLA:CPU ignores it.
MATMUL_PRECISIONS = ("float32", "tensorfloat32")
# What a config.json written before runs recorded their precision (no "matmul_precision" key)
# reads as: float32. Those runs asked XLA for nothing, which is float32 exactly on a CPU (XLA:CPU
# ignores the precision), where all of them but the device records' throwaway runs trained; on a
# GPU it was TF32, which no record could tell, and resuming such a run at float32 moves it to the
# references' precision rather than on at one it never chose.
MATMUL_PRECISION_BEFORE_RECORDED = "float32"
# What a config.json written before runs recorded their moment mode (no "moments" key) reads as:
# the diagonal mode, the only one MOMBO's targets had then.
MOMENTS_BEFORE_RECORDED = algorithms.DEFAULT_MOMENTS


@dataclasses.dataclass(frozen=True)
class Config:
  """Every hyperparameter of one run (all seeds share it): what runs, its seeds and length, then
  the groups of settings (settings/groups.py) that the compiled epoch, the dynamics ensemble and
  the evaluation each read whole. Built by make_config; Config().replace(**settings) builds one by
  hand, by the settings' flat names (config.json's keys)."""
  # What runs.
  env: str = "hopper-random"          # short dataset name, e.g. walker2d-medium-replay
  algo: str = "mombo"                 # mombo | mobile | mopo, or a registered name (algorithms)
  # MOMBO's target. elite_spread (default): the released code (adinlab/MOMBO policies/mombo.py),
  # which produced the paper's numbers and for which the per-task betas were tuned; lcb: the
  # paper's written eq. (1); mixture: both uncertainties by the law of total variance (targets.py).
  # The per-task betas are elite_spread's: lcb penalises less at them (hopper-medium-replay: 2.7x
  # less, matched beta ~0.45 vs 0.15; benchmarks/learning/README.md), so lcb needs its own --beta.
  # None for an algorithm without variants (MOBILE, MOPO, most of your own): the Config sets it so
  # whatever it is given, and config.json records null (plain_target).
  target: Optional[str] = "elite_spread"
  # Whose settings the per-task values follow (mombo_jax/settings/references.py): mombo authors;
  # mobile offlinerl_kit (the paper's MOBILE column) or authors; mopo offlinerl_kit. make_config
  # fills the algorithm's default; None: a Config built by hand from no reference table.
  reference: Optional[str] = None
  beta: float = 1.0                   # MOMBO beta / MOBILE beta / MOPO lambda, per algo
  seed: int = 0                       # first seed; seeds are seed .. seed + num_seeds - 1
  num_seeds: int = 1

  # How long: the offline loop.
  epochs: int = 3000                  # when the run stops
  # What the actor's cosine schedule spans, apart from the stop: the paper preset fixes it to the
  # paper's 3000 epochs, so `--epochs=300` trains the first tenth of the paper's run. None:
  # --epochs.
  schedule_epochs: Optional[int] = None
  steps_per_epoch: int = 1000
  dyn_checkpoint_every_s: float = 60.0     # seconds between checkpoints of dynamics training

  # How it computes: every compiled program of the run (the epoch: rollouts, critic and actor
  # updates; the dynamics training) multiplies its float32 matrices at this precision
  # (MATMUL_PRECISIONS), applied where the programs are traced (train.make_epoch,
  # dynamics_training). float32 (default): the references' full float32 on every backend, what the
  # paper's numbers were computed with (adinlab/MOMBO and OfflineRL-Kit run PyTorch, whose float32
  # matmuls are full float32 unless torch.backends.cuda.matmul.allow_tf32 is set; docs/spec.md);
  # tensorfloat32: TF32 inputs on a GPU that has them, a named speed choice. The run's own, not
  # a group's: it concerns every program, as the groups each concern one.
  matmul_precision: str = "float32"

  # The groups (settings/groups.py).
  agent: groups.AgentConfig = groups.AgentConfig()
  rollout: groups.RolloutConfig = groups.RolloutConfig()
  evaluation: groups.EvaluationConfig = groups.EvaluationConfig()
  dynamics: groups.DynamicsConfig = groups.DynamicsConfig()
  dynamics_training: groups.DynamicsTrainingConfig = groups.DynamicsTrainingConfig()

  def __post_init__(self):
    object.__setattr__(self, "target", plain_target(self.algo, self.target))
    _validate(self)

  @classmethod
  def setting_names(cls) -> Tuple[str, ...]:
    """Every setting's flat name (its config.json key, make_config's override): the run's own
    fields, then each group's."""
    return tuple(_GROUP_OF)

  def settings(self) -> dict:
    """{flat name: value} of every setting, in setting_names' order (config.json's content)."""
    return {name: (getattr(self, name) if group is None else
                   getattr(getattr(self, group), name)) for name, group in _GROUP_OF.items()}

  def replace(self, **settings) -> "Config":
    """A copy with `settings` (flat names, as make_config's overrides; or whole groups by their
    field name) changed, each in its group; checked like any Config. ValueError naming unknown
    names."""
    unknown = sorted(set(settings) - set(_GROUP_OF) - set(GROUPS))
    if unknown:
      raise ValueError(f"Unknown config field(s) {unknown}; valid fields: "
                       f"{sorted(_GROUP_OF)}.")
    top = {k: v for k, v in settings.items() if k in GROUPS or _GROUP_OF[k] is None}
    for group in GROUPS:
      own = {k: v for k, v in settings.items() if _GROUP_OF.get(k) == group}
      if own:
        top[group] = dataclasses.replace(top.get(group, getattr(self, group)), **own)
    return dataclasses.replace(self, **top)

  @property
  def env_name(self) -> str:
    """The environment part of the dataset name: halfcheetah | hopper | walker2d."""
    return parse_name(self.env)[0]

  @property
  def algorithm(self) -> algorithms.Algorithm:
    """The record of algo (and, for MOMBO, target): what the training core reads."""
    return algorithms.get(self.algo, self.target)

  @property
  def moments_mode(self):
    """(kind, rank) of agent.moments (algorithms.parse_moments): what MOMBO's targets read."""
    return algorithms.parse_moments(self.agent.moments)

  @property
  def schedule_steps(self) -> int:
    """Gradient steps the actor's cosine schedule spans."""
    return (self.schedule_epochs or self.epochs) * self.steps_per_epoch


# The groups' field names on Config, and each setting's group (None: a field of Config itself).
GROUPS = ("agent", "rollout", "evaluation", "dynamics", "dynamics_training")
_GROUP_OF = {f.name: None for f in dataclasses.fields(Config) if f.name not in GROUPS}
for _group in GROUPS:
  _GROUP_OF.update({name: _group for name in groups.fields(getattr(Config, _group))})


_POSITIVE_INTS = ("num_seeds", "batch_size", "num_critics", "epochs", "steps_per_epoch",
                  "rollout_batch_size", "rollout_length", "buffer_retain_epochs",
                  "mobile_num_samples", "eval_every", "eval_episodes", "dyn_members", "dyn_elites",
                  "dyn_batch_size", "dyn_max_holdout", "dyn_patience")
_POSITIVE_FLOATS = ("gamma", "actor_lr", "critic_lr", "alpha_lr", "dyn_lr", "max_abs_loss")
_NONNEG_FLOATS = ("tau", "alpha", "beta", "dyn_improvement", "dyn_logvar_coef",
                  "dyn_checkpoint_every_s")
_FINITE_FLOATS = ("log_alpha_init", "log_std_min", "log_std_max", "dyn_max_logvar_init",
                  "dyn_min_logvar_init")


def _is_int(v) -> bool:
  return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
  return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _validate(config: "Config"):
  """Every setting checked once, here, so a bad flag is refused before any data or model work.
  Each message names the setting (= the flag where one exists) and what it must be. By kind: the
  names (what runs), the numbers by range, the numbers against each other, the networks' shapes."""
  c = types.SimpleNamespace(**config.settings())      # by flat name, whatever the group
  algorithm = _check_names(c)
  _check_ranges(c)
  _check_relations(c)
  _check_shapes(c, algorithm)


def _check_names(c) -> algorithms.Algorithm:
  """What runs: the algorithm (and its variant), its settings' source, the dataset, the
  precision. -> the algorithm's record."""
  algorithm = algorithms.get(c.algo, c.target)      # ValueError naming the registered ones
  if c.reference is not None:
    _reference(c.algo, c.reference)
  parse_name(c.env)
  if c.matmul_precision not in MATMUL_PRECISIONS:
    raise ValueError(f"matmul_precision must be one of {', '.join(MATMUL_PRECISIONS)} (float32: "
                     f"full float32, the references'; tensorfloat32: TF32 inputs on a GPU), got "
                     f"{c.matmul_precision!r}.")
  algorithms.parse_moments(c.moments)                     # ValueError naming the choices
  if c.moments != algorithms.DEFAULT_MOMENTS and not algorithm.moment_matching:
    raise ValueError(f"moments={c.moments!r} sets how MOMBO's targets moment-match the critic; "
                     f"{algorithm.label} does not moment-match: leave moments at "
                     f"{algorithms.DEFAULT_MOMENTS!r}.")
  return algorithm


def _check_ranges(c):
  """Each number on its own: the tables above, then the optional ones."""
  for name in _POSITIVE_INTS:
    v = getattr(c, name)
    if not _is_int(v) or v < 1:
      raise ValueError(f"{name} must be a positive integer, got {v!r}.")
  if not _is_int(c.seed) or c.seed < 0:
    raise ValueError(f"seed must be a non-negative integer, got {c.seed!r}.")
  for names, test, what in ((_POSITIVE_FLOATS, lambda v: v > 0, "a finite number > 0"),
                            (_NONNEG_FLOATS, lambda v: v >= 0, "a finite number >= 0"),
                            (_FINITE_FLOATS, lambda v: True, "a finite number")):
    for name in names:
      v = getattr(c, name)
      if not _is_num(v) or not test(v):
        raise ValueError(f"{name} must be {what}, got {v!r}.")
  for name in ("alpha_max", "target_entropy", "clip_target_min", "rollout_obs_limit"):
    v = getattr(c, name)
    if v is not None and not _is_num(v):
      raise ValueError(f"{name} must be a finite number or None, got {v!r}.")
  if c.rollout_obs_limit is not None and c.rollout_obs_limit <= 0:
    raise ValueError(f"rollout_obs_limit must be > 0 or None, got {c.rollout_obs_limit}.")
  if c.alpha_max is not None and c.alpha_max <= 0:
    raise ValueError(f"alpha_max must be > 0 or None, got {c.alpha_max}.")
  if c.schedule_epochs is not None and (not _is_int(c.schedule_epochs)
                                        or c.schedule_epochs < 1):
    raise ValueError(f"schedule_epochs must be a positive integer or None, got "
                     f"{c.schedule_epochs!r}.")
  if c.dyn_max_epochs is not None and (not _is_int(c.dyn_max_epochs) or c.dyn_max_epochs < 1):
    raise ValueError(f"dyn_max_epochs must be a positive integer or None, "
                     f"got {c.dyn_max_epochs!r}.")


def _check_relations(c):
  """Numbers in their intervals and against each other."""
  if not c.gamma <= 1.0:
    raise ValueError(f"gamma must lie in (0, 1], got {c.gamma}.")
  if not c.tau <= 1.0:
    raise ValueError(f"tau must lie in [0, 1], got {c.tau}.")
  if not (_is_num(c.real_ratio) and 0.0 <= c.real_ratio <= 1.0):
    raise ValueError(f"real_ratio must lie in [0, 1], got {c.real_ratio!r}.")
  if not (_is_num(c.dyn_holdout_ratio) and 0.0 < c.dyn_holdout_ratio < 1.0):
    raise ValueError(f"dyn_holdout_ratio must lie in (0, 1), got {c.dyn_holdout_ratio!r}.")
  if c.log_std_min >= c.log_std_max:
    raise ValueError(f"log_std_min ({c.log_std_min}) must be < log_std_max ({c.log_std_max}).")
  if c.dyn_min_logvar_init >= c.dyn_max_logvar_init:
    raise ValueError(f"dyn_min_logvar_init ({c.dyn_min_logvar_init}) must be < "
                     f"dyn_max_logvar_init ({c.dyn_max_logvar_init}).")
  if (c.schedule_epochs is not None and c.actor_cosine_schedule
          and c.epochs > c.schedule_epochs):
    raise ValueError(f"epochs ({c.epochs}) > schedule_epochs ({c.schedule_epochs}): the actor's "
                     "learning rate would be 0 after epoch schedule_epochs. Pass "
                     f"--schedule_epochs >= {c.epochs} (or 0 to span --epochs).")


def _check_shapes(c, algorithm: algorithms.Algorithm):
  """The networks: hidden layers, the dynamics' weight decays per layer, members and elites."""
  for name in ("actor_hidden", "critic_hidden", "dyn_hidden"):
    v = getattr(c, name)
    if not v or not all(_is_int(h) and h > 0 for h in v):
      raise ValueError(f"{name} must be a non-empty tuple of positive integers, got {v!r}.")
  if not all(_is_num(w) and w >= 0 for w in c.dyn_weight_decay):
    raise ValueError(f"dyn_weight_decay entries must be finite numbers >= 0, "
                     f"got {c.dyn_weight_decay!r}.")
  if c.dyn_elites > c.dyn_members:
    raise ValueError(f"dyn_elites ({c.dyn_elites}) > dyn_members ({c.dyn_members}).")
  if c.dyn_elites < algorithm.min_elites:
    raise ValueError(f"{algorithm.label}'s penalty is a std over elites: dyn_elites must be >= "
                     f"{algorithm.min_elites}.")
  if len(c.dyn_weight_decay) != len(c.dyn_hidden) + 1:
    raise ValueError("dyn_weight_decay needs one entry per dynamics layer "
                     f"({len(c.dyn_hidden) + 1}), got {len(c.dyn_weight_decay)}.")


# Per-algorithm, per-task settings: each algorithm runs as its reference runs it, from the source
# `reference` names (mombo_jax/settings/references.py: every table and entry citing its file).
# TASKS: each algorithm's default source's table (the one the paper's numbers come from).
MOMBO_TASKS = references.MOMBO_AUTHORS
MOPO_TASKS = references.MOPO_OFFLINERL_KIT
TASKS = {algo: references.source(algo).tasks for algo in ALGOS}

# Mixed datasets (paper appendix): one setting for all.
_MIXED = dict(rollout_length=5, critic_hidden=(256, 256, 256), actor_hidden=(1024,) * 5,
              epochs=2000, buffer_retain_epochs=10)
_MIXED_BETA = 2.0

@dataclasses.dataclass(frozen=True)
class Preset:
  """A budget: Config overrides, and what a launch may do about its dataset."""
  overrides: dict
  build_missing: object        # False, "random" (random datasets only) or True (any short name)
  build_steps: int             # steps per recorded dataset when it builds one
  require_full: bool           # refuse a reduced build of the dataset's recipe


# paper: the paper's settings on the full datasets. quick / tiny: small budgets for smoke runs
# and the README quick start, same code path, fewer and smaller everything; they build a missing
# random dataset (fast, no online SAC run) at a reduced size.
PRESETS = {
    # The paper's protocol: 4 seeds per task (its Table 1: mean +- std over 4 seeds).
    "paper": Preset(dict(num_seeds=4), build_missing=False, build_steps=1_000_000,
                    require_full=True),
    # README command 1 within 5 minutes on a 2-core CPU, install included (issue #28; timed by
    # benchmarks/quickstart.py): 20k gradient steps per seed of 128x128 networks on batches of 64
    # (elite_spread's CPU time per step ~9x below 256x256 on 256), since hopper-random's score
    # only rose after 12k-15k steps in every budget tried; the paper's 7 x 4x200 ensemble, 2 epochs.
    "quick": Preset(dict(epochs=20, steps_per_epoch=1000, batch_size=64, actor_hidden=(128, 128),
                         critic_hidden=(128, 128), rollout_batch_size=5000, eval_every=5,
                         eval_episodes=5, dyn_max_epochs=2),
                    build_missing="random", build_steps=100_000, require_full=False),
    "tiny": Preset(dict(epochs=2, steps_per_epoch=20, rollout_batch_size=64, eval_every=1,
                        eval_episodes=1, batch_size=32, actor_hidden=(32, 32),
                        critic_hidden=(32, 32), dyn_hidden=(32, 32),
                        dyn_weight_decay=(2.5e-5, 5e-5, 1e-4), dyn_max_epochs=2, dyn_members=3,
                        dyn_elites=2, mobile_num_samples=2),
                   build_missing="random", build_steps=5_000, require_full=False),
}


def plain_target(algo: str, target: Optional[str]) -> Optional[str]:
  """`target` where `algo` has variants (MOMBO's targets; None there: the default, Config.target
  where it is one of them, else the first registered) or is not registered (its record then
  refuses it); None for a registered algorithm without variants, whose runs have no target."""
  if algo not in algorithms.names():
    return target
  have = algorithms.variants(algo)
  if not have:
    return None
  if target is None:
    return Config.target if Config.target in have else have[0]
  return target


def upgrade_record(record: dict) -> dict:
  """A config.json record read as the version that wrote it meant it: its settings' source
  (references.upgrade_record); for an algorithm without variants no target (those written before
  plain_target recorded the flag's default, elite_spread); written before runs recorded their
  matmul precision, MATMUL_PRECISION_BEFORE_RECORDED (float32: see there why); before they
  recorded their moment mode, MOMENTS_BEFORE_RECORDED (diagonal). An algorithm of the user's own
  is registered first (algorithms.ensure), or its target stays as written."""
  record = references.upgrade_record(record)
  if record.get("target") is not None and plain_target(str(record.get("algo")), "x") is None:
    record = dict(record, target=None)
  if "matmul_precision" not in record:
    record = dict(record, matmul_precision=MATMUL_PRECISION_BEFORE_RECORDED)
  if "moments" not in record:
    record = dict(record, moments=MOMENTS_BEFORE_RECORDED)
  return record


def _reference(algo: str, reference: Optional[str]) -> Optional[str]:
  """The source `reference` of algo's tables checked (None: their default); None for an
  algorithm without tables (ValueError if one is named)."""
  tables = algorithms.tables(algo)
  if tables is None:
    if reference is not None:
      raise ValueError(f"{algo} has no reference settings tables; leave reference unset, got "
                       f"{reference!r}.")
    return None
  return references.check(tables, reference)


def task_overrides(env: str, algo: str, reference: Optional[str] = None) -> dict:
  """The settings of `algo` on `env` (a short name) from the source `reference` (None: the
  algorithm's default, references.DEFAULT) of its tables (algorithms.Algorithm.references; none:
  {}): the source's row for env (the mixed datasets: the paper's one setting), then the source's
  settings for every task and its evaluation cadence."""
  parse_name(env)
  if _reference(algo, reference) is None:
    return {}
  src = references.source(algorithms.tables(algo), reference)
  out = dict(src.tasks[env]) if env in src.tasks else dict(_MIXED, beta=_MIXED_BETA)
  out.update(src.settings, eval_every=src.eval_every)
  return out


def make_config(env: str = "hopper-random", algo: str = "mombo", preset: str = "paper",
                **overrides) -> Config:
  """Config for `env` and `algo` (a registered name, mombo_jax.core.algorithms) from the per-task
  table of the source overrides["reference"] names (default: the algorithm's, references.DEFAULT;
  recorded in the Config; none for an algorithm without tables), then a preset, then explicit
  overrides. ValueError for a source the algorithm does not have."""
  algorithms.get(algo, overrides.get("target", Config.target))   # ValueError: unknown names
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r}; choose one of {', '.join(PRESETS)}.")
  fields = set(Config.setting_names())
  unknown = sorted(set(overrides) - fields)
  if unknown:
    raise ValueError(f"Unknown config field(s) {unknown}; valid fields: {sorted(fields)}.")
  reference = _reference(algo, overrides.pop("reference", None))
  values = dict(env=env, algo=algo, reference=reference)
  values.update(task_overrides(env, algo, reference))
  if preset == "paper":
    # The actor's cosine schedule spans the paper's run whatever --epochs says, so a shorter run
    # is the prefix of the paper's (3000 epochs; the mixed datasets' 2000).
    values["schedule_epochs"] = values.get("epochs", Config.epochs)
  values.update(PRESETS[preset].overrides)
  values.update(overrides)
  return Config().replace(**values)
