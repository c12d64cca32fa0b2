"""Everything a launch of experiments.run can check before any data or model work: the flags'
ranges, the seeds against the devices, the dataset against --env, and that the folders can be
written. Errors are errors.UserError naming the flag (InvalidValue: a value no launch takes)."""
import os
import tempfile

import jax

from mombo_jax.core import placement
from mombo_jax.data import names, provenance
from mombo_jax.errors import InvalidValue, UserError
from mombo_jax.settings import environment


def _check_dir(path: str, flag: str):
  """`path` is a writable folder, or one that can be created (its nearest existing parent is a
  writable folder); else UserError. Creates nothing: a refused launch leaves no empty folder."""
  if os.path.exists(path) and not os.path.isdir(path):
    raise UserError(f"{flag}={path} is a file, not a folder; pass another `{flag}`.",
                    params=(flag,))
  parent = os.path.abspath(path)
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    raise UserError(f"{flag}={path} cannot be created: {parent} is a file; pass another "
                    f"`{flag}`.", params=(flag,))
  try:
    with tempfile.TemporaryFile(dir=parent):
      pass
  except OSError as e:
    raise UserError(f"{flag}={path} cannot be "
                    f"{'written' if parent == os.path.abspath(path) else 'created'} "
                    f"({e.strerror or e}: {parent}); pass a writable `{flag}`.",
                    params=(flag,)) from None


def check_dataset_env(dataset: str, config):
  """Refuses a dataset of another environment than --env's (by name, or by its local metadata)."""
  try:
    names.resolve(dataset)
  except ValueError as e:
    raise UserError(f"`dataset`: {e}", params=("dataset",)) from None
  found = provenance.dataset_env(dataset)
  if found is not None and found != config.env_name:
    raise UserError(f"dataset={dataset} holds {found} data, but env={config.env} trains and "
                    f"evaluates in {config.env_name}: pass a {config.env_name} dataset, or an "
                    f"`env` of {found}.", params=("dataset", "env"))


def check_seeds_fit_devices(num_seeds: int):
  """The seed axis is sharded over all devices (of every process): --seeds must be a multiple of
  their count."""
  n = jax.device_count()
  try:
    placement.check_cell_count(num_seeds, fix=(
        f"pass `num_seeds` a multiple of {n}, or make fewer devices visible (e.g. "
        "CUDA_VISIBLE_DEVICES=0, or XLA_FLAGS=--xla_force_host_platform_device_count on CPU)"))
  except ValueError as e:
    raise UserError(f"num_seeds={num_seeds}: {e}", params=("num_seeds",)) from None


def validate(config, dataset, workdir, dynamics_dir=None, keep=3, stop_after=None,
             build_steps=None, num_cells=None):
  """Everything checkable before any data or model work; raises UserError naming the flag.
  num_cells: how many cells the launch trains in one program (default config.num_seeds)."""
  # A bad MOMBO_JAX_CPU_DOTS / CELLS / PREDICT_ROWS / CRITIC_MATMUL is refused here, not when a
  # program is built.
  environment.cpu_dots()
  environment.cells()
  environment.predict_rows()
  environment.critic_matmul()
  if keep is None or keep < 1:
    raise InvalidValue(f"`keep` must be >= 1, got {keep}.", params=("keep",))
  if stop_after is not None and stop_after < 1:
    raise InvalidValue(f"`stop_after` must be >= 1 (or None), got {stop_after}.",
                       params=("stop_after",))
  if build_steps is not None and build_steps < 1:
    raise InvalidValue(f"`build_steps` must be >= 1, got {build_steps}.",
                       params=("build_steps",))
  if config.agent.moments == "full":
    raise InvalidValue("moments=full is for the analyses (experiments.uncertainty, "
                       "experiments.mm_vs_mc): its critic moments cost ~1,000x the plain network "
                       "(benchmarks/bench_propagate.txt), too slow to train with. Train with "
                       "--moments=lowrank (correlated, benchmarks/bench_lowrank.txt) or diagonal.",
                       params=("moments",))
  check_seeds_fit_devices(config.num_seeds if num_cells is None else num_cells)
  check_dataset_env(dataset, config)
  _check_dir(workdir, "workdir")
  if dynamics_dir is not None:
    _check_dir(dynamics_dir, "dynamics_dir")
