"""The dynamics ensembles trained ahead of the runs that reuse them: experiments.train_dynamics'
work (train_dynamics: the dataset loaded, its seeds' ensembles trained in one program and saved
where experiments.run looks for them, default_dynamics_root unless told otherwise).
"""
from __future__ import annotations

import os

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


def train_dynamics(env=None, dataset=None, seeds=4, seed=0, max_epochs=None, preset="paper",
                   workdir=None, overwrite=False, log_fn=print, should_stop=None, algo="mombo",
                   reference=None, matmul_precision="float32"):
  """experiments.train_dynamics: loads the dataset, trains `seeds` ensembles in one vmapped run
  (dynamics_store.get_dynamics: the key scheme and the saved layout experiments.run reuses) and
  saves them; returns the saved path. The dynamics settings are `algo`'s for `env` under
  `preset` from the source `reference` (config.make_config; None: the algorithm's default; the
  references differ, e.g. in walker2d-medium's epoch cap), so the ensembles are reused by runs of
  the algorithms whose settings agree; matmul_precision: Config.matmul_precision (a run reuses the
  ensembles of its own). UserError for what the user can fix."""
  try:
    env, dataset, note = dynamics_task(env, dataset)
  except ValueError as e:                  # unknown names: the message lists the valid ones
    raise UserError(str(e)) from None
  if note:
    log_fn(note)
  if seeds < 1:
    raise InvalidValue(f"`seeds` must be >= 1, got {seeds}.", params=("seeds",))
  overrides = dict(seed=seed, num_seeds=seeds, reference=reference,
                   matmul_precision=matmul_precision)
  if max_epochs is not None:
    if max_epochs < 1:
      raise InvalidValue(f"`max_epochs` must be >= 1, got {max_epochs}.", params=("max_epochs",))
    overrides["dyn_max_epochs"] = max_epochs
  try:
    config = config_lib.make_config(env, algo, preset, **overrides)
  except ValueError as e:
    raise UserError(str(e)) from None
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
                 overwrite=overwrite, log=log_fn)
  log_fn(f"Saved to {path} (dynamics settings: {reuse.describe_settings(config)}; "
         f"reused by runs with the same, e.g. python -m experiments.run --env={env} --algo={algo} "
         f"--reference={config.reference} --preset={preset} --seed={seed} --seeds={seeds} "
         + ("" if matmul_precision == config_lib.Config.matmul_precision
            else f"--matmul_precision={matmul_precision} ")
         + f"--dynamics_dir={workdir}).")
  return path
