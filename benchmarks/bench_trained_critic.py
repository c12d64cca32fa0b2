"""Moment matching against Monte Carlo on a trained critic, and the paper's two suboptimality
bounds there: the numbers and figures docs/moment_matching.md quotes, on the quick start's run
(README.md's command 1: hopper-random, --preset=quick, 2 seeds; train it first).

  python3 -m benchmarks.bench_trained_critic [--run=runs/hopper-random/mombo-elite_spread/s0x2]
      [--out=benchmarks/bench_trained_critic.txt] [--samples=100000] [--num_states=4]

Seed 0 of the run. Part 1 (analysis/critic_moments.py): at --num_states dataset states (drawn with
seed 0, as experiments.mm_vs_mc draws them), the next-state Gaussian of the best elite at a ~ pi(s),
a' = pi(mean), the distribution of each target critic's Q(s', a'): mean and std by `propagate`'s
diagonal mode (MOMBO's), its full-covariance mode and Monte Carlo (--samples draws); errors
|mean - MC mean| / MC std and std / MC std. Figure: docs/figures/critic_moments_quick.png.
Part 2: experiments.mm_vs_mc's experiment with its defaults (figure:
docs/figures/mm_vs_mc_quick.png).
Part 3: experiments.pevi_bounds's with its defaults.
"""
import argparse
import os
import shutil
import tempfile

import jax
import numpy as np

from benchmarks.common import Record, record_start
from mombo_jax.analysis import critic_moments, mm_vs_mc, pevi_bounds
from mombo_jax.report import labels

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIGURES = os.path.join(ROOT, "docs", "figures")


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--run", default="runs/hopper-random/mombo-elite_spread/s0x2")
  p.add_argument("--num_states", type=int, default=4)
  p.add_argument("--samples", type=int, default=100_000)
  p.add_argument("--out", default=None)
  args = p.parse_args()
  if not os.path.isfile(os.path.join(args.run, "config.json")):
    raise SystemExit(f"{args.run} is not a run folder: train the quick start first (README.md's "
                     "command 1: python3 -m experiments.run --env=hopper-random --preset=quick "
                     "--seeds=2) or pass --run.")
  out = Record(args.out)
  record_start(out, "bench_trained_critic", "moment matching vs Monte Carlo on a trained critic",
               args)
  trained, transitions = mm_vs_mc.load_seed(args.run, log=out)
  title = (f"{labels.algo_label(trained.config.settings())} on {trained.dataset}, seed "
           f"{trained.seeds[0]}, epoch {trained.epoch}")
  rng = np.random.default_rng(0)
  idx = rng.choice(len(transitions.observations), args.num_states, replace=False)
  obs = np.asarray(transitions.observations[idx], np.float32)
  r = critic_moments.moments_vs_mc(trained.nets[0], obs, jax.random.PRNGKey(0), args.samples)
  out("")
  out(f"Part 1: Q(s', a') of each target critic, {args.samples} Monte Carlo samples per state")
  out("| critic | state | MC mean | MC std | diag mean | diag std | full mean | full std | "
      "diag: mean err, std / MC | full: mean err, std / MC |")
  out("|---|---|---|---|---|---|---|---|---|---|")
  err = lambda mode: np.abs(r[f"{mode}_mean"] - r["mc_mean"]) / r["mc_std"]  # noqa: E731
  for e in range(r["mc_mean"].shape[0]):
    for b in range(r["mc_mean"].shape[1]):
      out(f"| {e} | {b} | {r['mc_mean'][e, b]:.4g} | {r['mc_std'][e, b]:.4g} | "
          f"{r['diag_mean'][e, b]:.4g} | {r['diag_std'][e, b]:.4g} | {r['full_mean'][e, b]:.4g} | "
          f"{r['full_std'][e, b]:.4g} | {err('diag')[e, b]:.3g}, "
          f"{r['diag_std'][e, b] / r['mc_std'][e, b]:.3g} | {err('full')[e, b]:.3g}, "
          f"{r['full_std'][e, b] / r['mc_std'][e, b]:.3g} |")
  for mode in ("diag", "full"):
    ratio = r[f"{mode}_std"] / r["mc_std"]
    out(f"{mode}: mean error (in MC stds) median {np.median(err(mode)):.3g}, max "
        f"{np.max(err(mode)):.3g}; std / MC std median {np.median(ratio):.3g} (range "
        f"{ratio.min():.3g}-{ratio.max():.3g})")
  figure = os.path.join(FIGURES, "critic_moments_quick.png")
  critic_moments.plot_moments(r, figure, title)
  out(f"wrote {os.path.relpath(figure, ROOT)}")
  work = tempfile.mkdtemp(prefix="bench_trained_critic_")
  try:
    out("")
    out("Part 2: experiments.mm_vs_mc (its defaults)")
    result = mm_vs_mc.run_experiment(trained, transitions, work, ns=(2, 10, 100, 1000, 10000))
    for line in mm_vs_mc.summary_lines(result, work):
      out(line)
    shutil.copy(os.path.join(work, "mm_vs_mc.png"), os.path.join(FIGURES, "mm_vs_mc_quick.png"))
    out("copied the figure to docs/figures/mm_vs_mc_quick.png")
    out("")
    out("Part 3: experiments.pevi_bounds (its defaults)")
    result = pevi_bounds.run_experiment(trained, transitions, work)
    for line in pevi_bounds.summary_lines(result, work):
      out(line)
  finally:
    shutil.rmtree(work)
  out(f"load at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
  main()
