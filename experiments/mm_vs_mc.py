r"""Moment matching vs Monte Carlo estimates of the next-state value of a trained run (the paper's
Figure 1 and its appendix experiment).

  python -m experiments.mm_vs_mc --run=runs/hopper-medium/mombo-elite_spread/s0x4
  python -m experiments.mm_vs_mc --run=DIR --num_states=8 --repeats=100 --n_samples=2,10,100

States come from the run's dataset, actions from its policy, the next-state Gaussian from its best
elite, the critics are its target critics. Writes mm_vs_mc.png, mm_vs_mc.csv (per state and
estimator: mean / std of the estimates over repeats, error vs MM, seconds per call) and
mm_vs_mc_estimates.csv (every estimate) into --out (default: the run folder).
"""
import os
import sys

from absl import app, flags, logging

FLAGS = flags.FLAGS


def define_flags():
  """Defined only when run as the program (absl flags are global; tests import this module)."""
  flags.DEFINE_string("run", None, "Run workdir (config.json + checkpoints/ of experiments.run).")
  flags.DEFINE_integer("num_states", 4, "Dataset states to estimate at.")
  flags.DEFINE_integer("repeats", 50, "Independent Monte Carlo estimates per N.")
  flags.DEFINE_list("n_samples", ["2", "10", "100", "1000", "10000"], "Monte Carlo sample sizes N.")
  flags.DEFINE_integer("seed_index", 0, "Which seed of the run (0 = its first seed).")
  flags.DEFINE_integer("elite_rank", 0, "Which elite's Gaussian (0 = best holdout loss).")
  flags.DEFINE_integer("seed", 0, "PRNG seed of the states, actions and samples.")
  flags.DEFINE_string("out", None, "Output folder (default: the run folder).")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  if not FLAGS.run:
    sys.exit("error: --run is required (a workdir of experiments.run).")
  try:
    ns = sorted({int(n) for n in FLAGS.n_samples})
  except ValueError:
    sys.exit(f"error: --n_samples must be integers, got {','.join(FLAGS.n_samples)}.")
  if not ns or ns[0] < 1:
    sys.exit("error: --n_samples must be integers >= 1.")
  for name in ("num_states", "repeats"):
    if getattr(FLAGS, name) < 1:
      sys.exit(f"error: --{name} must be >= 1, got {getattr(FLAGS, name)}.")
  import jax
  import numpy as np
  from mombo_jax import data, mm_vs_mc, outputs
  from mombo_jax.trained import load_run
  try:
    trained = load_run(FLAGS.run)
    if not 0 <= FLAGS.seed_index < len(trained.nets):
      raise ValueError(f"--seed_index={FLAGS.seed_index}: the run has {len(trained.nets)} seed(s).")
    nets = trained.nets[FLAGS.seed_index]
    if not 0 <= FLAGS.elite_rank < int(nets.dyn.elites.shape[0]):
      raise ValueError(f"--elite_rank={FLAGS.elite_rank}: the model has "
                       f"{int(nets.dyn.elites.shape[0])} elites.")
    transitions = data.load_transitions(trained.dataset)
  except (ValueError, FileNotFoundError) as e:       # data.DatasetNotFoundError is one
    sys.exit(f"error: {e}")
  rng = np.random.default_rng(FLAGS.seed)
  idx = rng.choice(len(transitions.observations), FLAGS.num_states, replace=False)
  obs = np.asarray(transitions.observations[idx], np.float32)
  result = mm_vs_mc.mm_vs_mc(nets, obs, jax.random.PRNGKey(FLAGS.seed), ns, FLAGS.repeats,
                             FLAGS.elite_rank)
  out = FLAGS.out or FLAGS.run
  os.makedirs(out, exist_ok=True)
  summary, raw = mm_vs_mc.mm_vs_mc_rows(result)
  outputs.write_rows(os.path.join(out, "mm_vs_mc.csv"), summary)
  outputs.write_rows(os.path.join(out, "mm_vs_mc_estimates.csv"), raw)
  title = (f"{trained.config.algo} on {trained.dataset}, seed {trained.seeds[FLAGS.seed_index]}, "
           f"epoch {trained.epoch}")
  mm_vs_mc.plot_mm_vs_mc(result, os.path.join(out, "mm_vs_mc.png"), title)
  mm_ms = result["seconds"]["MM"] * 1e3
  for n in ns:
    est = result["estimates"][n]
    err = np.abs(est.mean(axis=0) - result["mm_mean"]).mean()
    print(f"N={n:>6}: spread of estimates {est.std(axis=0).mean():.4g}, |mean - MM| {err:.3g}, "
          f"{result['seconds'][n] * 1e3:.3g} ms per call "
          f"({result['seconds'][n] * 1e3 / mm_ms:.3g}x MM)")
  print(f"MM: {mm_ms:.3g} ms per call for {result['num_states']} states; wrote "
        f"{os.path.join(out, 'mm_vs_mc.png')}, mm_vs_mc.csv, mm_vs_mc_estimates.csv")


if __name__ == "__main__":
  define_flags()
  app.run(main)
