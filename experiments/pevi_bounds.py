r"""The paper's two suboptimality bounds on a trained run's critic: Theorem 2 "Suboptimality of
sampling-based PEVI" beside Theorem 3 "Suboptimality of moment matching-based PEVI algorithms"
(the paper's section 4 and numbering), at its dataset's states.

  python -m experiments.pevi_bounds --run=runs/hopper-random/mombo-elite_spread/s0x2
  python -m experiments.pevi_bounds --run=DIR --num_samples=10 --delta=0.05 --horizon=1000

States come from the run's dataset, actions from its policy, the next-state Gaussian from its best
elite, the critic is its target critic with the smaller moment-matched mean (as in
experiments.mm_vs_mc). R_max is the dataset's largest |reward|, gamma the run's. Prints the
settings, both bounds (median and max over the states) and their ratio, and Monte Carlo's W1 at a
few states as a yardstick; writes pevi_bounds.csv (one row per state: Lemma 3's W1 bound, Monte
Carlo's measured W1 where measured, both theorems' bounds and their ratio; the columns:
mombo_jax/analysis/pevi_bounds.py) into --out (default: the run folder). The computation is
mombo_jax.analysis.pevi_bounds's; this program only parses flags.
"""
from absl import flags, logging

from experiments import _cli

FLAGS = flags.FLAGS


def define_flags():
  """Defined only when run as the program (absl flags are global)."""
  flags.DEFINE_string("run", None, "Run workdir (config.json + checkpoints/ of experiments.run).")
  flags.DEFINE_integer("num_states", 1000, "Dataset states to evaluate at (all if fewer).")
  flags.DEFINE_integer("num_samples", 10, "N of the sampling-based theorem (MOBILE's 10).")
  flags.DEFINE_float("delta", 0.05, "Error tolerance of the sampling-based theorem, in (0, 1).")
  flags.DEFINE_integer("horizon", 1000, "H, the episode horizon (the MuJoCo tasks' 1000).")
  flags.DEFINE_enum("norm", "operator", ["operator", "entrywise"],
                    "The layers' L1 norm: operator (max row sum of |kernel|) or entrywise.")
  flags.DEFINE_integer("check_states", 4, "States at which Monte Carlo measures the true W1.")
  flags.DEFINE_integer("check_samples", 10000, "Monte Carlo samples per checked state.")
  flags.DEFINE_integer("seed_index", 0, "Which seed of the run (0 = its first seed).")
  flags.DEFINE_integer("seed", 0, "PRNG seed of the states, actions and samples.")
  flags.DEFINE_string("out", None, "Output folder (default: the run folder).")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  if not FLAGS.run:
    raise _cli.UsageError("--run is required (a workdir of experiments.run).")
  if FLAGS.num_samples < 2:
    raise _cli.UsageError(f"--num_samples must be >= 2 (the theorem needs floor(N/2) >= 1), got "
                          f"{FLAGS.num_samples}.")
  if not 0 < FLAGS.delta < 1:
    raise _cli.UsageError(f"--delta must lie in (0, 1), got {FLAGS.delta}.")
  for name in ("num_states", "horizon", "check_samples"):
    if getattr(FLAGS, name) < 1:
      raise _cli.UsageError(f"--{name} must be >= 1, got {getattr(FLAGS, name)}.")
  if FLAGS.check_states < 0:
    raise _cli.UsageError(f"--check_states must be >= 0, got {FLAGS.check_states}.")
  # jax: imported once the flags are known to be good
  from mombo_jax.analysis import mm_vs_mc, pevi_bounds
  trained, transitions = mm_vs_mc.load_seed(FLAGS.run, FLAGS.seed_index)
  out = FLAGS.out or FLAGS.run
  result = pevi_bounds.run_experiment(
      trained, transitions, out, FLAGS.num_states, FLAGS.seed_index, FLAGS.seed,
      pevi_bounds.Theorems(num_samples=FLAGS.num_samples, delta=FLAGS.delta,
                           horizon=FLAGS.horizon, norm=FLAGS.norm),
      pevi_bounds.MonteCarloCheck(states=FLAGS.check_states, samples=FLAGS.check_samples))
  for line in pevi_bounds.summary_lines(result, out):
    print(line)


if __name__ == "__main__":
  _cli.run(main, define_flags)
