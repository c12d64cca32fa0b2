r"""Moment matching vs Monte Carlo estimates of the next-state value of a trained run (the paper's
Figure 1 and its appendix experiment).

  python -m experiments.mm_vs_mc --run=runs/hopper-medium/mombo-elite_spread/s0x4
  python -m experiments.mm_vs_mc --run=DIR --num_states=8 --repeats=100 --n_samples=2,10,100
  python -m experiments.mm_vs_mc --run=DIR --moments=lowrank --out=DIR/mm_vs_mc_lowrank

States come from the run's dataset, actions from its policy, the next-state Gaussian from its best
elite, the critics are its target critics. Writes mm_vs_mc.png, mm_vs_mc.csv (per state and
estimator: mean / std of the estimates over repeats, error vs MM, seconds per call) and
mm_vs_mc_estimates.csv (every estimate) into --out (default: the run folder); the figure's title
and the first line printed name the run (its algorithm as the reports label it, MOMBO with its
target; dataset, seed, epoch), the second defines the "spread" the lines after it report (the std
of a state's repeated MC estimates, averaged over the states). A run whose dataset was rebuilt or
replaced since it trained is refused, naming the change (as training refuses it). The experiment
is mombo_jax.analysis.mm_vs_mc's; this program only parses the flags.
"""
from absl import flags, logging

from experiments import _cli
from mombo_jax.core import algorithms

FLAGS = flags.FLAGS


def define_flags():
  """Defined only when run as the program (absl flags are global)."""
  flags.DEFINE_string("run", None, "Run workdir (config.json + checkpoints/ of experiments.run).")
  flags.DEFINE_integer("num_states", 4, "Dataset states to estimate at.")
  flags.DEFINE_integer("repeats", 50, "Independent Monte Carlo estimates per N.")
  flags.DEFINE_list("n_samples", ["2", "10", "100", "1000", "10000"], "Monte Carlo sample sizes N.")
  flags.DEFINE_integer("seed_index", 0, "Which seed of the run (0 = its first seed).")
  flags.DEFINE_integer("elite_rank", 0, "Which elite's Gaussian (0 = best holdout loss).")
  flags.DEFINE_integer("seed", 0, "PRNG seed of the states, actions and samples.")
  flags.DEFINE_string("moments", None, "MM's moment mode (diagonal, lowrank, lowrank<k>, full; "
                      "docs/moment_matching.md); default: the run's own (config.json's "
                      "`moments`).")
  flags.DEFINE_string("out", None, "Output folder (default: the run folder).")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  if not FLAGS.run:
    raise _cli.UsageError("--run is required (a workdir of experiments.run).")
  try:
    ns = sorted({int(n) for n in FLAGS.n_samples})
  except ValueError:
    raise _cli.UsageError(f"--n_samples must be integers, got {','.join(FLAGS.n_samples)}.") \
        from None
  if ns[0] < 1:
    raise _cli.UsageError("--n_samples must be integers >= 1.")
  for name in ("num_states", "repeats"):
    if getattr(FLAGS, name) < 1:
      raise _cli.UsageError(f"--{name} must be >= 1, got {getattr(FLAGS, name)}.")
  if FLAGS.moments is not None:
    try:
      algorithms.parse_moments(FLAGS.moments)
    except ValueError as e:
      raise _cli.UsageError(f"--moments: {e}") from None
  from mombo_jax.analysis import mm_vs_mc  # jax: imported once the flags are known to be good
  trained, transitions = mm_vs_mc.load_seed(FLAGS.run, FLAGS.seed_index, FLAGS.elite_rank)
  out = FLAGS.out or FLAGS.run
  result = mm_vs_mc.run_experiment(trained, transitions, out, ns, mm_vs_mc.Protocol(
      FLAGS.num_states, FLAGS.repeats, FLAGS.seed_index, FLAGS.elite_rank, FLAGS.seed,
      FLAGS.moments))
  for line in mm_vs_mc.summary_lines(result, out):
    print(line)


if __name__ == "__main__":
  _cli.run(main, define_flags)
