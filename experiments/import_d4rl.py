r"""Import one of D4RL's own hdf5 files as a real Minari dataset.

  python -m experiments.import_d4rl --file=hopper_medium_replay-v2.hdf5 --env=hopper-medium-replay
  python -m experiments.run --env=hopper-medium-replay --dataset=d4rl/hopper/medium-replay-v2

The rows come back from `mombo_jax.data.load_transitions` exactly as D4RL's qlearning_dataset gives
them (see mombo_jax/d4rl.py). The dataset's metadata holds D4RL's reference returns, the gymnasium
v5 evaluation env, the file's `metadata/*` values and its provenance. The last line printed is the
Minari id written. The import is mombo_jax.d4rl's (import_file); this program only parses the flags.
"""
import sys

from absl import app, flags, logging

from mombo_jax.d4rl import import_file
from mombo_jax.errors import UserError

FLAGS = flags.FLAGS


def define_flags():
  """Defined only when run as the program (absl flags are global)."""
  flags.DEFINE_string("file", None, "Path of a D4RL hdf5 file (e.g. hopper_medium_replay-v2.hdf5).")
  flags.DEFINE_string("env", None, "Short name of what the file holds, e.g. hopper-medium-replay.")
  flags.DEFINE_string("dataset_id", None, "Minari id to write (default d4rl/<env>/<quality>-v2).")
  flags.DEFINE_bool("overwrite", False, "Replace an existing dataset of that id.")
  flags.DEFINE_bool("drop_nonfinite", False, "Drop rows holding NaN/inf (refused by default).")


def main(argv):
  from mombo_jax.errors import stray_words
  if stray_words(argv):
    sys.exit(stray_words(argv))
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
