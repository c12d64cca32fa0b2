r"""Train the dynamics ensembles of several seeds in one launch (vmapped) and save them with Orbax.

  python -m experiments.train_dynamics --env=hopper-medium --seeds=4
  python -m experiments.train_dynamics --dataset=mujoco/hopper/medium-v0 --max_epochs=30

The result lands in <workdir>/seed<seed>x<seeds>-<tag> (default workdir runs/dynamics/<dataset>;
<tag> names the dynamics settings: reuse.settings_tag), the layout
`experiments.run --dynamics_dir=<workdir>` reuses when its dynamics settings are the same (its
--algo's and --reference's settings for the dataset, its --preset and --dynamics_max_epochs); seed
i's key is the one run.py derives (fold_in(PRNGKey(seed + i), 0)), so both entry points train
identical models.
"""
from absl import flags, logging

from experiments import _cli

FLAGS = flags.FLAGS


def define_flags():
  """Defined only when run as the program (absl flags are global)."""
  flags.DEFINE_string("env", None, "Short dataset name, e.g. hopper-medium (selects the config: "
                      "walker2d-medium caps dynamics training at 30 epochs).")
  flags.DEFINE_string("dataset", None,
                      "Dataset to train on (short name or Minari id); default --env.")
  _cli.define_algo("algo", "mombo", "Whose dynamics settings for --env (mombo_jax/settings/"
                   "references.py: the references differ, e.g. in walker2d-medium's epoch cap); "
                   "runs of every algorithm with the same settings reuse the ensembles.")
  flags.DEFINE_string("reference", None, "The source of --algo's settings (as experiments.run's "
                      "--reference); default: the algorithm's.")
  flags.DEFINE_integer("seeds", 4, "Number of seeds, trained together (vmapped).")
  flags.DEFINE_integer("seed", 0, "First seed.")
  flags.DEFINE_integer("max_epochs", None, "Cap on training epochs (default: the config's, "
                       "usually none: early stopping decides).")
  flags.DEFINE_enum("preset", "paper", ["paper", "quick", "tiny"],
                    "Config preset (tiny: a 2 x 32 ensemble of 3 members, for smoke tests).")
  flags.DEFINE_string("workdir", None, "Output folder; default runs/dynamics/<dataset>.")
  flags.DEFINE_bool("overwrite", False, "Replace an existing saved ensemble.")
  flags.DEFINE_enum("matmul_precision", "float32", ["float32", "tensorfloat32"],
                    "Precision of the training's float32 matmuls, as experiments.run's "
                    "--matmul_precision (runs reuse the ensembles of their own precision).")


def main(argv):
  del argv
  if not FLAGS.env and not FLAGS.dataset:   # a missing required flag: usage, exit 2
    raise _cli.UsageError("--env is required, e.g. --env=hopper-medium (or --dataset=...).")
  logging.set_verbosity(logging.WARNING)   # Orbax logs every save at INFO
  from mombo_jax import signals
  from mombo_jax.dynamics import pretrain
  stop = signals.StopFlag()
  stop.install()
  job = pretrain.DynamicsJob(
      env=FLAGS.env, dataset=FLAGS.dataset, seeds=FLAGS.seeds, seed=FLAGS.seed,
      max_epochs=FLAGS.max_epochs, preset=FLAGS.preset, algo=FLAGS.algo,
      reference=FLAGS.reference, matmul_precision=FLAGS.matmul_precision)
  pretrain.train_dynamics(job, workdir=FLAGS.workdir, overwrite=FLAGS.overwrite,
                          log_fn=lambda s: print(s, flush=True), should_stop=stop)


if __name__ == "__main__":
  _cli.run(main, define_flags)
