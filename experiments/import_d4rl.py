r"""Import one of D4RL's own hdf5 files as a real Minari dataset.

  python -m experiments.import_d4rl --file=hopper_medium_replay-v2.hdf5 --env=hopper-medium-replay
  python -m experiments.run --env=hopper-medium-replay --dataset=d4rl/hopper/medium-replay-v2

With the default --timeouts=drop the rows come back from
`mombo_jax.data.transitions.load_transitions` exactly as the paper's loader (adinlab/MOMBO
utils/load_dataset.py, qlearning_dataset) gives them: the timed-out last step of each episode and
the file's last row are skipped; --timeouts=keep keeps every row that has a next state (see
mombo_jax/collection/d4rl.py, which also says where D4RL's own qlearning_dataset differs). Before
writing, a sample of rows is replayed from the file's infos/qpos, infos/qvel in the named env, and a
file of another env is refused, naming the env it replays as (--nocheck_physics skips this; a file
without infos/qpos is imported with a line saying it could not be checked). The episodes' mean
return is compared with D4RL's published statistics for --env's name (mombo_jax/data/d4rl_stats.py),
and a file far from them (e.g. a random-policy file imported as hopper-medium) is imported with a
one-line warning naming both numbers (--nocheck_quality silences it). The dataset's metadata holds
D4RL's reference returns, the evaluation env (gymnasium v5 in the model the file's data was made in:
for walker2d the v2 model, right-foot friction 0.9; evaluation, Table 2 and rendering build it), the
file's `metadata/*` values and its provenance (every option that shaped the data: the id, the
timeout mode, --drop_nonfinite and the rows it dropped; the physics and quality checks; all shown on
its card, whose rebuild command makes the same dataset again). The last line printed is the Minari
id written. The import is mombo_jax.collection.d4rl's (import_file); this program only
parses the flags.
"""
from absl import flags, logging

from experiments import _cli
from mombo_jax.collection.d4rl import TIMEOUT_MODES, ImportOptions, import_file

FLAGS = flags.FLAGS


def define_flags():
  """Defined only when run as the program (absl flags are global)."""
  flags.DEFINE_string("file", None, "Path of a D4RL hdf5 file (e.g. hopper_medium_replay-v2.hdf5).")
  flags.DEFINE_string("env", None, "Short name of what the file holds, e.g. hopper-medium-replay.")
  flags.DEFINE_string("dataset_id", None, "Minari id to write (default d4rl/<env>/<quality>-v2).")
  flags.DEFINE_bool("overwrite", False, "Replace an existing dataset of that id.")
  flags.DEFINE_bool("drop_nonfinite", False, "Drop rows holding NaN/inf (refused by default).")
  flags.DEFINE_enum("timeouts", "drop", list(TIMEOUT_MODES),
                    "drop: skip timed-out rows and the file's last row, as the paper's loader "
                    "(and D4RL's qlearning_dataset) do; keep: keep every row with a next state.")
  flags.DEFINE_bool("check_physics", True,
                    "Replay a sample of rows from infos/qpos, infos/qvel in the named env and "
                    "refuse a file of another env (--nocheck_physics skips it).")
  flags.DEFINE_bool("check_quality", True,
                    "Compare the episodes' mean return with D4RL's published statistics for "
                    "--env's name and warn (one line, with the numbers) when they are far apart "
                    "(--nocheck_quality silences it).")


# import_file's parameters whose flag has another name (its errors speak Python).
FLAG_NAMES = {"path": "file", "name": "env"}


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  if not FLAGS.file or not FLAGS.env:
    raise _cli.UsageError("--file and --env are required, e.g. "
                          "--file=hopper_medium_replay-v2.hdf5 --env=hopper-medium-replay.")
  options = ImportOptions(overwrite=FLAGS.overwrite, drop_nonfinite=FLAGS.drop_nonfinite,
                          timeouts=FLAGS.timeouts, check_physics=FLAGS.check_physics,
                          check_quality=FLAGS.check_quality)
  dataset_id = import_file(FLAGS.file, FLAGS.env, FLAGS.dataset_id, options)
  print(f"Train on it with: python -m experiments.run --env={FLAGS.env} --dataset={dataset_id}")
  print(dataset_id)


if __name__ == "__main__":
  _cli.run(main, define_flags, flag_names=FLAG_NAMES)
