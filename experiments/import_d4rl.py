r"""Import one of D4RL's own hdf5 files as a real Minari dataset.

  python -m experiments.import_d4rl --file=hopper_medium_replay-v2.hdf5 --env=hopper-medium-replay
  python -m experiments.run --env=hopper-medium-replay --dataset=d4rl/hopper/medium-replay-v2

The rows come back from `mombo_jax.data.load_transitions` exactly as D4RL's qlearning_dataset gives
them (see mombo_jax/d4rl.py). The dataset's metadata holds D4RL's reference returns, the gymnasium
v5 evaluation env, the file's `metadata/*` values and its provenance. The last line printed is the
Minari id written.
"""
import os
import sys

import numpy as np
from absl import app, flags, logging

FLAGS = flags.FLAGS


def define_flags():
  """Defined only when run as the program (absl flags are global; tests import this module)."""
  flags.DEFINE_string("file", None, "Path of a D4RL hdf5 file (e.g. hopper_medium_replay-v2.hdf5).")
  flags.DEFINE_string("env", None, "Short name of what the file holds, e.g. hopper-medium-replay.")
  flags.DEFINE_string("dataset_id", None, "Minari id to write (default d4rl/<env>/<quality>-v2).")
  flags.DEFINE_bool("overwrite", False, "Replace an existing dataset of that id.")
  flags.DEFINE_bool("drop_nonfinite", False, "Drop rows holding NaN/inf (refused by default).")


class UserError(Exception):
  """A problem the user can fix; printed as one `error:` line."""


def default_id(name: str) -> str:
  env, _, quality = name.partition("-")
  return f"d4rl/{env}/{quality}-v2"


def import_file(path: str, name: str, dataset_id=None, overwrite=False, drop_nonfinite=False,
                log_fn=print) -> str:
  """Reads D4RL's file at `path` for the short name `name` and writes it; returns the Minari id."""
  from mombo_jax import minari_io
  from mombo_jax import config as config_lib
  from mombo_jax import d4rl, data
  try:
    env, quality = config_lib.parse_name(name)
  except ValueError as e:
    raise UserError(str(e)) from None
  dataset_id = dataset_id or default_id(name)
  try:
    data._resolve(dataset_id)
  except ValueError as e:
    raise UserError(f"--dataset_id: {e}") from None
  if not os.path.isfile(path):
    raise UserError(f"--file={path} does not exist. D4RL's files are at {d4rl.url(name)} "
                    "(download it once on a machine with network access).")
  if data.exists_locally(dataset_id) and not overwrite:
    raise UserError(f"Dataset {dataset_id} already exists; pass --overwrite to replace it.")
  try:
    arrays = d4rl.read_hdf5(path)
    n = d4rl.check(arrays, env)
  except d4rl.D4RLFormatError as e:
    raise UserError(str(e)) from None
  bad = d4rl.nonfinite_rows(arrays)
  if bad.any() and not drop_nonfinite:
    raise UserError(f"{path} has {int(bad.sum())} row(s) holding NaN/inf (first at row "
                    f"{int(np.argmax(bad))}); pass --drop_nonfinite to drop them.")
  if bad.any():
    log_fn(f"Dropping {int(bad.sum())} row(s) holding NaN/inf (--drop_nonfinite).")
  episodes = d4rl.to_episodes(arrays, keep=~bad)
  if not episodes:
    raise UserError(f"{path} holds no complete transition.")
  steps = sum(len(ep["rewards"]) for ep in episodes)
  has_next = "next_observations" in arrays
  log_fn(f"{path}: {n} rows -> {steps} transitions in {len(episodes)} episodes "
         f"({'the file' if has_next else 'the next row'}'s next observations).")
  file_meta = {k.split("/", 1)[1]: _jsonable(v) for k, v in arrays.items()
               if k.startswith("metadata/")}
  provenance = {"recipe": "d4rl-import", "steps": int(steps), "recipe_steps": None,
                "command": f"python -m experiments.import_d4rl --file={os.path.abspath(path)} "
                           f"--env={name} --overwrite", "source_file": os.path.abspath(path)}
  try:
    written = minari_io.write_dataset(
        dataset_id, episodes, f"D4RL's {name}-v2 file ({os.path.basename(path)}), imported with "
        "experiments/import_d4rl.py.", "D4RL", overwrite=overwrite, provenance=provenance,
        ref_scores=data.D4RL_REF_SCORES[env], env_name=env,
        extra_metadata={"d4rl_metadata": file_meta} if file_meta else None)
  except minari_io.UserError as e:
    raise UserError(str(e)) from None
  return written


def _jsonable(value):
  value = np.asarray(value)
  if value.dtype.kind in "SO":
    flat = [v.decode() if isinstance(v, bytes) else str(v) for v in value.ravel().tolist()]
    return flat[0] if value.ndim == 0 else flat
  return value.tolist()


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  if not FLAGS.file or not FLAGS.env:
    sys.exit("error: --file and --env are required, e.g. --file=hopper_medium_replay-v2.hdf5 "
             "--env=hopper-medium-replay.")
  try:
    dataset_id = import_file(FLAGS.file, FLAGS.env, FLAGS.dataset_id, FLAGS.overwrite,
                             FLAGS.drop_nonfinite)
  except UserError as e:
    sys.exit(f"error: {e}")
  print(f"Train on it with: python -m experiments.run --env={FLAGS.env} --dataset={dataset_id}")
  print(dataset_id)


if __name__ == "__main__":
  define_flags()
  app.run(main)
