"""The dynamics ensembles trained ahead of the runs that reuse them: experiments.train_dynamics'
work (train_dynamics of a DynamicsJob: the dataset loaded, its seeds' ensembles trained in one
program and saved where experiments.run looks for them, default_dynamics_root unless told
otherwise).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Optional

from mombo_jax.data import minari_io, names, transitions as transitions_lib
from mombo_jax.dynamics import dynamics_store, reuse
from mombo_jax.errors import InvalidValue, UserError
from mombo_jax.records.workdir import DYNAMICS
from mombo_jax.settings import config as config_lib


def default_dynamics_root(dataset: str, root: str = "runs") -> str:
  """experiments.train_dynamics' default folder of saved ensembles: runs/dynamics/<dataset>."""
  return os.path.join(root, DYNAMICS, dataset.replace("/", "_"))


def dynamics_task(env, dataset):
  """(config env short name, dataset name or id, note for the log or None)."""
  if env is None and dataset is None:
    raise UserError("Pass env=<short name> (e.g. hopper-medium) or dataset=<Minari id>.",
                    params=("env", "dataset"))
  dataset = dataset or env
  if env is None:
    env = dataset if "/" not in dataset else names.short_name(dataset)
  note = None
  if env is None:
    # A foreign Minari id: the dynamics settings are the same for every task of an environment
    # (except walker2d-medium's epoch cap), so any short name of that environment gives them.
    env = f"{minari_io.env_name(dataset)}-random"
    note = f"{dataset} is not one of the project's datasets: using {env}'s dynamics settings."
  names.parse_name(env)   # ValueError listing the valid names
  return env, dataset, note


@dataclasses.dataclass(frozen=True)
class DynamicsJob:
  """Which ensembles experiments.train_dynamics trains: on `dataset` (a name or Minari id;
  default: env's), `seeds` seeds from `seed`, with `algo`'s dynamics settings for `env` (a short
  name; default: the dataset's) under `preset` from the source `reference` (config.make_config;
  None: the algorithm's default; the references differ, e.g. in walker2d-medium's epoch cap),
  max_epochs (None: the settings' cap) and matmul_precision (Config.matmul_precision: a run reuses
  the ensembles of its own). Refuses seeds or max_epochs below 1 (InvalidValue)."""
  env: Optional[str] = None
  dataset: Optional[str] = None
  seeds: int = 4
  seed: int = 0
  max_epochs: Optional[int] = None
  preset: str = "paper"
  algo: str = "mombo"
  reference: Optional[str] = None
  matmul_precision: str = "float32"

  def __post_init__(self):
    if self.seeds < 1:
      raise InvalidValue(f"`seeds` must be >= 1, got {self.seeds}.", params=("seeds",))
    if self.max_epochs is not None and self.max_epochs < 1:
      raise InvalidValue(f"`max_epochs` must be >= 1, got {self.max_epochs}.",
                         params=("max_epochs",))


def _job_config(job: DynamicsJob, log_fn):
  """(config, env, dataset) of the job (its note logged); UserError naming a bad name."""
  try:
    env, dataset, note = dynamics_task(job.env, job.dataset)
  except ValueError as e:                  # unknown names: the message lists the valid ones
    raise UserError(str(e)) from None
  if note:
    log_fn(note)
  overrides = dict(seed=job.seed, num_seeds=job.seeds, reference=job.reference,
                   matmul_precision=job.matmul_precision)
  if job.max_epochs is not None:
    overrides["dyn_max_epochs"] = job.max_epochs
  try:
    return config_lib.make_config(env, job.algo, job.preset, **overrides), env, dataset
  except ValueError as e:
    raise UserError(str(e)) from None


def train_dynamics(job: DynamicsJob, workdir: Optional[str] = None, overwrite: bool = False,
                   log_fn=print, should_stop=None) -> str:
  """experiments.train_dynamics: loads the job's dataset, trains its seeds' ensembles in one
  program (dynamics_store.get_dynamics: the key scheme and the saved layout experiments.run
  reuses) and saves them under `workdir` (default_dynamics_root); returns the saved path. The
  ensembles are reused by runs of the algorithms whose dynamics settings agree. UserError for
  what the user can fix."""
  config, env, dataset = _job_config(job, log_fn)
  workdir = workdir or default_dynamics_root(dataset)
  dynamics_store.check_legacy_dynamics(workdir, config)
  path = reuse.dynamics_path(workdir, config)
  if os.path.exists(path) and not overwrite:
    raise UserError(f"{path} already exists; pass overwrite=True to replace it, or another "
                    "`workdir`.", params=("overwrite", "workdir"))
  with dynamics_store.dynamics_lock(workdir, config):       # before any work: one writer
    try:
      transitions = transitions_lib.load_transitions(dataset)
    except FileNotFoundError as e:         # DatasetNotFoundError names the collector command
      raise UserError(str(e)) from None
    log_fn(f"{dataset}: {len(transitions.rewards)} transitions, obs dim "
           f"{transitions.observations.shape[1]}, action dim {transitions.actions.shape[1]}.")
    dynamics_store.get_dynamics(config, transitions, dataset, workdir, should_stop=should_stop,
                                overwrite=overwrite, console=dynamics_store.Console(log_fn))
  log_fn(f"Saved to {path} (dynamics settings: {reuse.describe_settings(config)}; "
         f"reused by runs with the same, e.g. python -m experiments.run --env={env} "
         f"--algo={job.algo} --reference={config.reference} --preset={job.preset} "
         f"--seed={job.seed} --seeds={job.seeds} "
         + ("" if job.matmul_precision == config_lib.Config.matmul_precision
            else f"--matmul_precision={job.matmul_precision} ")
         + f"--dynamics_dir={workdir}).")
  return path
