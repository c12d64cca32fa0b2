r"""Print (and write) the card of a local dataset: size, return distribution, recipe (rebuild
command, saved actors it was recorded from, the SAC medium point), and how it compares with
D4RL's published file of the same name.

  python -m experiments.describe --dataset=hopper-medium-replay
  python -m experiments.describe --env=hopper-medium-replay \
      --out=benchmarks/datasets/hopper-medium-replay
  python -m experiments.describe --dataset=d4rl/hopper/medium-replay-v2 --out=benchmarks/datasets/x

Writes dataset_card.md and returns_hist.png next to the dataset (or into --out); --env is another
name for --dataset. The data is read from MINARI_DATASETS_PATH (default ~/.minari/datasets).
Cards are always regenerated this way from the data, never edited by hand.
"""
from absl import flags, logging

from experiments import _cli
from mombo_jax.errors import UserError

FLAGS = flags.FLAGS


def define_flags():
  """Defined only when run as the program (absl flags are global)."""
  flags.DEFINE_string("dataset", None, "Short name or Minari id of a local dataset.")
  flags.DEFINE_alias("env", "dataset")
  flags.DEFINE_string("out", None, "Folder for the card (default: next to the dataset).")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  from mombo_jax.collection import cards
  if not FLAGS.dataset:
    raise _cli.UsageError("--dataset is required, e.g. --dataset=hopper-medium-replay.")
  from mombo_jax.data import names
  with _cli.as_user_error(ValueError):     # an unknown name (exit 2): the valid ones listed
    names.resolve(FLAGS.dataset)
  try:
    path = cards.write_card(FLAGS.dataset, FLAGS.out)
  except ValueError as e:                  # what the dataset holds: exit 1
    raise UserError(str(e)) from None
  with open(path) as f:
    print(f.read())
  print(f"wrote {path}")


if __name__ == "__main__":
  _cli.run(main, define_flags)
