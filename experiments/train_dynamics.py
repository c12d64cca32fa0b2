r"""Train the dynamics ensembles of several seeds in one launch (vmapped) and save them with Orbax.

  python -m experiments.train_dynamics --env=hopper-medium --seeds=4
  python -m experiments.train_dynamics --dataset=mujoco/hopper/medium-v0 --max_epochs=30

The result lands in <workdir>/seed<seed>x<seeds> (default workdir runs/dynamics/<dataset>), the
layout `experiments.run --dynamics_dir=<workdir>` reuses; seed i's key is the one run.py derives
(fold_in(PRNGKey(seed + i), 0)), so both entry points train identical models.
"""
import os
import shutil
import sys
import time

from absl import app, flags, logging

FLAGS = flags.FLAGS


def define_flags():
  """Defined only when run as the program (absl flags are global; tests import this module)."""
  flags.DEFINE_string("env", None, "Short dataset name, e.g. hopper-medium (selects the config: "
                      "walker2d-medium caps dynamics training at 30 epochs).")
  flags.DEFINE_string("dataset", None,
                      "Dataset to train on (short name or Minari id); default --env.")
  flags.DEFINE_integer("seeds", 4, "Number of seeds, trained together (vmapped).")
  flags.DEFINE_integer("seed", 0, "First seed.")
  flags.DEFINE_integer("max_epochs", None, "Cap on training epochs (default: the config's, "
                       "usually none: early stopping decides).")
  flags.DEFINE_enum("preset", "paper", ["paper", "quick", "tiny"],
                    "Config preset (tiny: a 2 x 32 ensemble of 3 members, for smoke tests).")
  flags.DEFINE_string("workdir", None, "Output folder; default runs/dynamics/<dataset>.")
  flags.DEFINE_bool("overwrite", False, "Replace an existing saved ensemble.")


class UserError(Exception):
  """A problem the user can fix; printed without a traceback."""


def resolve(env, dataset):
  """(config env short name, dataset name or id, note for the log or None)."""
  from mombo_jax import config as config_lib
  from mombo_jax import data
  if env is None and dataset is None:
    raise UserError("Pass --env=<short name> (e.g. hopper-medium) or --dataset=<Minari id>.")
  dataset = dataset or env
  if env is None:
    env = dataset if "/" not in dataset else data.short_name(dataset)
  note = None
  if env is None:
    # A foreign Minari id: the dynamics settings are the same for every task of an environment
    # (except walker2d-medium's epoch cap), so any short name of that environment gives them.
    env = f"{data.env_name(dataset)}-random"
    note = f"{dataset} is not one of the project's datasets: using {env}'s dynamics settings."
  config_lib.parse_name(env)   # ValueError listing the valid names
  return env, dataset, note


class Stopped(Exception):
  """SIGINT / SIGTERM stopped the training at a safe point (after checkpointing)."""


def train_and_save(env=None, dataset=None, seeds=4, seed=0, max_epochs=None, preset="paper",
                   workdir=None, overwrite=False, log_fn=print, should_stop=None):
  """Loads the dataset, trains `seeds` ensembles in one vmapped run, saves them -> saved path."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  from mombo_jax import checkpoint, data, dynamics
  from mombo_jax import config as config_lib

  try:
    env, dataset, note = resolve(env, dataset)
  except ValueError as e:                  # unknown names: the message lists the valid ones
    raise UserError(str(e)) from None
  if note:
    log_fn(note)
  if seeds < 1:
    raise UserError(f"--seeds must be >= 1, got {seeds}.")
  overrides = dict(seed=seed, num_seeds=seeds)
  if max_epochs is not None:
    if max_epochs < 1:
      raise UserError(f"--max_epochs must be >= 1, got {max_epochs}.")
    overrides["dyn_max_epochs"] = max_epochs
  try:
    config = config_lib.make_config(env, "mombo", preset, **overrides)
  except ValueError as e:
    raise UserError(str(e)) from None
  workdir = workdir or os.path.join("runs", "dynamics", dataset.replace("/", "_"))
  path = os.path.join(workdir, f"seed{seed}x{seeds}")
  if os.path.exists(path) and not overwrite:
    raise UserError(f"{path} already exists; pass --overwrite to replace it, or another --workdir.")

  try:
    transitions = data.load_transitions(dataset)
  except FileNotFoundError as e:           # data.DatasetNotFoundError names the collector command
    raise UserError(str(e)) from None
  log_fn(f"{dataset}: {len(transitions.rewards)} transitions, obs dim "
         f"{transitions.observations.shape[1]}, action dim {transitions.actions.shape[1]}.")
  log_fn(f"Training {seeds} ensemble(s) of {config.dyn_members} members "
         f"({'x'.join(map(str, config.dyn_hidden))}), {config.dyn_elites} elites each; "
         f"max epochs {config.dyn_max_epochs or 'none (early stopping)'}.")
  seed_keys = jax.vmap(jax.random.PRNGKey)(jnp.arange(seed, seed + seeds))
  dyn_keys = jax.vmap(lambda k: jax.random.fold_in(k, 0))(seed_keys)   # as experiments/run.py
  t0 = time.time()
  ident = dynamics.identity(config, transitions, data.dataset_identity(dataset, transitions))
  partial = path + ".partial"
  try:
    dyn = dynamics.train_seeds(dyn_keys, transitions, config, log_fn=log_fn,
                               checkpoint_dir=partial, should_stop=should_stop, identity=ident)
  except dynamics.Interrupted as e:
    raise Stopped(f"Stopped after dynamics epoch {e.epoch}; the same command resumes from "
                  f"{partial}.") from None
  except checkpoint.CheckpointError as e:
    raise UserError(str(e)) from None
  log_fn(f"Trained in {time.time() - t0:.0f} s; elites per seed: "
         f"{np.asarray(dyn.elites).tolist()}.")
  # The identity experiments.run checks before reusing these ensembles.
  dynamics.save(path, dyn, config, overwrite=overwrite, identity=ident)
  shutil.rmtree(partial, ignore_errors=True)
  log_fn(f"Saved to {path} (reuse with: python -m experiments.run --env={env} --seed={seed} "
         f"--seeds={seeds} --dynamics_dir={workdir}).")
  return path


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)   # Orbax logs every save at INFO
  from experiments.run import StopFlag
  stop = StopFlag()
  stop.install()
  try:
    train_and_save(env=FLAGS.env, dataset=FLAGS.dataset, seeds=FLAGS.seeds, seed=FLAGS.seed,
                   max_epochs=FLAGS.max_epochs, preset=FLAGS.preset, workdir=FLAGS.workdir,
                   overwrite=FLAGS.overwrite, log_fn=lambda s: print(s, flush=True),
                   should_stop=stop)
  except UserError as e:
    sys.exit(f"error: {e}")
  except Stopped as e:
    print(str(e), file=sys.stderr, flush=True)
    sys.exit(128 + (stop.signum or 2))


if __name__ == "__main__":
  define_flags()
  app.run(main)
