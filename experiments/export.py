r"""Export one seed's trained policy from a run as a single file that loads without the run.

  python -m experiments.export --run=runs/hopper-medium-replay/mombo-elite_spread/s0x4 --seed=2 \
      --out=hopper_s2.msgpack

The file (flax msgpack) holds the actor's parameters and what rebuilds it (env, dataset, dims,
hidden sizes, action bounds, seed, epoch, the run's config); read it back with
`mombo_jax.load_policy("hopper_s2.msgpack")`, or render it with experiments.render --policy.
"""
from absl import flags, logging

from experiments import _cli

FLAGS = flags.FLAGS


def define_flags():
  """Defined only when run as the program (absl flags are global)."""
  flags.DEFINE_string("run", None, "Run workdir of experiments.run (config.json + checkpoints).")
  flags.DEFINE_integer("seed", None, "Which seed of the run; default its first.")
  flags.DEFINE_string("out", "policy.msgpack", "File to write.")
  flags.DEFINE_integer("step", None, "Checkpoint step; default the newest valid one.")
  flags.DEFINE_bool("allow_diverged", False, "Export a seed that diverged in training (its "
                    "actor frozen at its last healthy state) instead of refusing it.")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)   # Orbax logs every restore at INFO
  if not FLAGS.run:
    raise _cli.UsageError("--run is required: the run workdir to export from, e.g. "
                          "--run=runs/hopper-random/mombo-elite_spread/s0x1.")
  from mombo_jax.analysis import policy as policy_lib
  policy = policy_lib.export_policy(FLAGS.run, FLAGS.seed, FLAGS.out, step=FLAGS.step,
                                    allow_diverged=FLAGS.allow_diverged)
  print(f"wrote {FLAGS.out}: {policy!r}")


if __name__ == "__main__":
  _cli.run(main, define_flags, flag_names={"path": "out", "workdir": "run"})
