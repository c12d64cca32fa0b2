"""What a launch trains: its RunSpecs (one run each: one workdir of a dataset, a beta, its seeds),
planned from the --datasets x --betas flags and checked to share one compiled program.
mombo_jax.run.launch trains them.

Words: a run is one workdir's training (what experiments.report reads back); a launch trains one
or more runs in one compiled program; a cell is one seed of one run (train.Cell), the program's
cell axis holding every run's cells side by side.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Optional

from mombo_jax.core import train as train_lib
from mombo_jax.core.epoch_settings import epoch_settings
from mombo_jax.data import names
from mombo_jax.errors import InvalidValue, UserError
from mombo_jax.records.workdir import grid_dynamics_dir, run_dir
from mombo_jax.settings import config as config_lib


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """One run of a launch, one workdir: config.num_seeds seeds (from config.seed) of one dataset at
  config.beta. dynamics_dir: where its ensembles are saved / reused (default <workdir>/dynamics)."""
  config: config_lib.Config
  dataset: str
  workdir: str
  dynamics_dir: Optional[str] = None

  def label(self) -> str:
    c = self.config
    return f"{self.dataset} beta={c.beta:g} seeds {c.seed}..{c.seed + c.num_seeds - 1}"


def describe_algorithm(config, betas=None) -> str:
  """One line naming the algorithm and, for MOMBO, which target (the variant matters: see
  docs/algorithms.md, "Which MOMBO"); betas: the launch's betas (a --betas grid), default
  config.beta."""
  values = ", ".join(f"{b:g}" for b in (betas or [config.beta]))
  alg = config.algorithm
  coef = alg.coefficient + ("s" if betas and len(betas) > 1 else "")
  if alg.variant:
    origin = f" ({alg.origin})" if alg.origin else ""
    # The moment mode where it is not the paper's diagonal (docs/moment_matching.md).
    moments = ("" if config.agent.moments == config_lib.MOMENTS_BEFORE_RECORDED else
               f", moments {config.agent.moments}")
    return f"{alg.name.upper()}, target {alg.variant}{origin}{moments}, {coef} {values}"
  return f"{alg.name.upper()}, {coef} {values}"


def plan_runs(env, algo, preset, overrides, datasets=None, betas=None, root="runs",
                dynamics_dir=None):
  """The RunSpecs of a --datasets x --betas launch (datasets default [env], betas default each
  dataset's own paper beta or overrides["beta"]). A short dataset name brings its own paper
  settings (config.make_config); a Minari id trains with env's. Workdirs: run_dir under root.
  With betas, a dataset's runs share their dynamics (workdir.grid_dynamics_dir; without, each
  workdir keeps its own, as a plain run does). Raises InvalidValue for a bad name or value."""
  if (datasets is not None and not list(datasets)) or (betas is not None and not list(betas)):
    raise InvalidValue("`datasets` / `betas` given empty; pass at least one value, or None.",
                       params=("datasets", "betas"))
  datasets = list(datasets or [env])
  if len(set(datasets)) != len(datasets) or (betas and len(set(betas)) != len(betas)):
    raise InvalidValue("`datasets` and `betas` must not repeat a value.",
                       params=("datasets", "betas"))
  specs = []
  for dataset in datasets:
    task = dataset if dataset in names.valid_names() else env
    for beta in (betas or [None]):
      values = dict(overrides) if beta is None else dict(overrides, beta=beta)
      try:
        config = config_lib.make_config(task, algo, preset, **values)
      except ValueError as e:
        raise InvalidValue(f"{dataset}: {e}") from None
      workdir = run_dir(root, dataset, algo, config.target, config.seed, config.num_seeds,
                        None if not betas else beta, config.reference, config.agent.moments)
      dyn = grid_dynamics_dir(root, dataset, dynamics_dir) if betas else None
      specs.append(RunSpec(config, dataset, workdir, dyn))
  return specs


# Config fields the launch's host loop reads once for all runs (Launch.train_epochs: the first
# run's).
_LOOP = ("epochs", "eval_every")


def _shared_settings(c) -> dict:
  """{flat setting name: value} of what runs of one program must share (check_runs), named as
  the flags are, so that a refusal names one."""
  settings = epoch_settings(c.replace(rollout_length=1), tuple(train_lib.CELL_SETTINGS))
  out = {}
  for f in dataclasses.fields(settings):
    value = getattr(settings, f.name)
    out.update(dataclasses.asdict(value) if f.name in config_lib.GROUPS else {f.name: value})
  out["algorithm"] = settings.algorithm.label
  values = c.settings()
  return dict(out, **{k: values[k] for k in _LOOP})


def check_runs(specs):
  """Refuses runs that cannot share one compiled epoch (their epoch_settings.EpochSettings differ
  beyond the settings each cell carries: beta and train.CELL_SETTINGS (rollout_length,
  real_ratio, auto_alpha; the program's rollout scan and ring take the longest rollout_length,
  program.program_config)), or one host loop (_LOOP), or one folder."""
  if not specs:
    raise UserError("Nothing to train: no dataset / beta given.")
  dirs = [os.path.abspath(g.workdir) for g in specs]
  if len(set(dirs)) != len(dirs):
    raise UserError(f"Two runs of this launch would share a workdir ({', '.join(dirs)}); give "
                    "each (dataset, beta) its own.")
  first = _shared_settings(specs[0].config)
  envs = {g.config.env_name for g in specs}
  if len(envs) > 1:
    raise UserError(f"`datasets` of one launch must share an environment, got {sorted(envs)}: "
                    "launch one per environment.", params=("datasets",))
  for g in specs[1:]:
    other = _shared_settings(g.config)
    diff = {k: (first[k], v) for k, v in other.items() if first[k] != v}
    if diff:
      what = ", ".join(f"{k}: {a!r} for {specs[0].dataset} vs {b!r} for {g.dataset}"
                       for k, (a, b) in sorted(diff.items()))
      raise UserError(f"{specs[0].dataset} and {g.dataset} cannot train in one program: their "
                      "settings differ beyond those each cell carries (the dataset, "
                      f"beta, {', '.join(train_lib.CELL_SETTINGS)}) ({what}). Pass flags that "
                      "set these fields for all, or launch them apart.")
