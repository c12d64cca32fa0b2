"""Across-task aggregates of the report, computed with rliable (google-research/rliable: Agarwal
et al., "Deep Reinforcement Learning at the Edge of the Statistical Precipice", NeurIPS 2021), the
library offline-RL code bases (CORL and others) report with.

Input: per column (an algorithm and setup of the report), a score matrix [R, T] of normalised
scores, R runs (seeds) by T tasks, the same T tasks in the same order for every column. Output:
- IQM, mean, median and optimality gap over runs and tasks (rliable.metrics: the IQM is the 25 %
  trimmed mean of all R * T scores; mean and median are of the per-task means; the optimality gap
  is GAMMA - mean(min(score, GAMMA)) with GAMMA = 100, the expert's normalised score), each with a
  95 % stratified-bootstrap percentile interval (rliable.library.get_interval_estimates: runs
  resampled with replacement within each task, tasks kept);
- the probability of improvement P(X > Y) of every column over every other (rliable.metrics:
  Mann-Whitney U / (R_x * R_y) per task, ties counting half, averaged over tasks), with the same
  kind of interval, runs of X and Y resampled independently;
- performance profiles (rliable.library.create_performance_profile: the fraction of all runs and
  tasks whose score exceeds tau) with their intervals, drawn into a PNG (rliable.plot_utils).

rliable and its dependencies (arch, pandas, seaborn, statsmodels) are the optional extra `report`
(setup.cfg): without them `require_rliable` raises MissingRliable, one line naming the install.

Reproducibility: rliable 1.2.0's bootstraps draw their indices from numpy's global RNG
(rliable/library.py, StratifiedBootstrap.update_indices: np.random.choice; its `random_state`
argument does not reach those draws). Every bootstrap here (one per column, one per pair of
columns) runs inside `_seeded`, which seeds the global RNG with SEED and restores its previous state
afterwards: the same runs give the same report, a column's numbers do not depend on the report's
other columns, and the caller's global RNG is left as it was (not thread-safe: do not run two
reports in threads of one process).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
from importlib import metadata
from typing import Dict, List, Optional, Tuple

import numpy as np

from mombo_jax.errors import UserError
from mombo_jax.report.results import ENV_ORDER, TYPE_ORDER, dataset_type
from mombo_jax.report.tables import as_printed
from mombo_jax.storage import atomic

# rliable.metrics.aggregate_optimality_gap's threshold on this package's scale: D4RL normalised
# scores are percentages (100 = the expert's return), rliable's examples use fractions (gamma = 1).
GAMMA = 100.0
LEVEL = 0.95
# Resamples of the aggregate and improvement intervals (as many as the per-task interval's,
# results.N_BOOTSTRAP) and of the profiles' (rliable.library.create_performance_profile's default).
REPS = 10_000
PROFILE_REPS = 2_000
SEED = 0
# Thresholds tau of the performance profiles.
N_TAUS = 101
AGGREGATES = ("IQM", "Median", "Mean", "Optimality gap")
PROFILE_FILE = "performance_profile.png"
# Fewer runs than this per task and column, and the runs cannot separate two columns: with 2 runs
# each, the most extreme ordering of one task's 4 scores still happens 1 time in 6 by chance (two-
# sided Mann-Whitney p = 1/3), so a P(X > Y) of 0.75 says nothing. The report says so instead.
MIN_RUNS = 3
# The decimals the report's tables print scores with (tables.build_table's digits): runs whose
# scores are equal as printed are not told apart.
DIGITS = 1
INSTALL = "pip install 'mombo_jax[report]'"


class MissingRliable(UserError):
  """rliable (the optional extra `report`) is not importable."""


def require_rliable():
  """(rliable.library, rliable.metrics); MissingRliable (one line naming the install) when rliable
  or a dependency of it does not import (an arch 7 under pandas 3 fails at import, for one)."""
  try:
    # optional extra `report`; here, so that a test can hide it (sys.modules)
    from rliable import library, metrics, plot_utils  # noqa: F401 (plot_utils: seaborn too)
  except Exception as e:   # ImportError, or an incompatible dependency failing at import
    why = "" if isinstance(e, ImportError) else f" ({type(e).__name__}: {e})"
    raise MissingRliable(f"the across-task aggregates need rliable{why}: {INSTALL}; the per-task "
                         "tables are written without them") from None
  return library, metrics


@contextlib.contextmanager
def _seeded(seed: int):
  """numpy's global RNG seeded with `seed` inside, restored to its previous state on exit; absl's
  log held at WARNING (rliable logs a line per column at INFO, which experiments.report's absl app
  would print)."""
  from absl import logging as absl_logging  # with rliable only: the report loads just numpy
  state, verbosity = np.random.get_state(), absl_logging.get_verbosity()
  np.random.seed(seed)
  absl_logging.set_verbosity(absl_logging.WARNING)
  try:
    yield
  finally:
    np.random.set_state(state)
    absl_logging.set_verbosity(verbosity)


def _check(scores: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
  """float64 copies of scores {column: [R, T]}; ValueError (one line) on an empty dict, a matrix
  that is not 2-D, holds no run, has a non-finite score, or whose T differs between columns."""
  if not scores:
    raise ValueError("no columns to aggregate: pass {column: scores [runs, tasks]}")
  out = {}
  for name, x in scores.items():
    x = np.asarray(x, np.float64)
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 1:
      raise ValueError(f"{name}: scores must be [runs, tasks] with at least one of each, got "
                       f"shape {x.shape}")
    if not np.all(np.isfinite(x)):
      raise ValueError(f"{name}: non-finite scores; leave those runs out first (score_matrices)")
    out[name] = x
  tasks = {x.shape[1] for x in out.values()}
  if len(tasks) > 1:
    raise ValueError(f"columns cover different numbers of tasks {sorted(tasks)}: every column "
                     "must have the same tasks, in the same order")
  return out


def _fixed(x: np.ndarray) -> bool:
  """Whether every run of x [R, T] has the same scores (one run, say): then every stratified
  resample is x itself and its interval is the point, found without resampling."""
  return bool(np.all(x == x[:1]))


def aggregate_fn(metrics):
  """scores [R, T] -> [4]: rliable.metrics' IQM, median, mean, optimality gap (AGGREGATES)."""
  def fn(x):
    return np.array([metrics.aggregate_iqm(x), metrics.aggregate_median(x),
                     metrics.aggregate_mean(x), metrics.aggregate_optimality_gap(x, GAMMA)])
  return fn


def interval_estimates(scores: Dict[str, np.ndarray], reps: int = REPS, seed: int = SEED,
                       level: float = LEVEL) -> Dict[str, np.ndarray]:
  """{column: [3, 4]}: rows point estimate, interval low, interval high; columns AGGREGATES (IQM,
  median, mean, optimality gap) of scores {column: [R, T]}, with rliable's stratified-bootstrap
  percentile intervals (`reps` resamples; the global RNG seeded with `seed` for each column)."""
  library, metrics = require_rliable()
  fn = aggregate_fn(metrics)
  out = {}
  for k, x in _check(scores).items():
    point = fn(x)
    if _fixed(x):
      out[k] = np.vstack([point, point, point])
      continue
    with _seeded(seed):
      _, cis = library.get_interval_estimates({k: x}, fn, reps=reps,
                                              confidence_interval_size=level)
    out[k] = np.vstack([point, cis[k]])
    # A plain shape check, not chex's: chex loads jax, which the report must not import
    # (tests/test_records.py).
    assert out[k].shape == (3, len(AGGREGATES)), out[k].shape
  return out


def _poi_fast(x: np.ndarray, y: np.ndarray) -> float:
  """rliable.metrics.probability_of_improvement's value for x [R_x, T], y [R_y, T], without its
  per-task scipy call (which makes a bootstrap of thousands of resamples take minutes):
  tests/test_aggregates.py checks that the two agree."""
  gt = (x[:, None, :] > y[None, :, :]).mean(axis=(0, 1))
  eq = (x[:, None, :] == y[None, :, :]).mean(axis=(0, 1))
  return float(np.mean(gt + 0.5 * eq))


def probability_of_improvement(scores: Dict[str, np.ndarray], reps: int = REPS,
                               seed: int = SEED, level: float = LEVEL
                               ) -> Dict[Tuple[str, str], np.ndarray]:
  """{(x, y): [3]} for every ordered pair of different columns of scores {column: [R, T]}: the
  point estimate of P(X > Y) (rliable.metrics.probability_of_improvement) and its stratified
  bootstrap percentile interval (runs of x and y resampled independently within each task,
  rliable.library's StratifiedIndependentBootstrap; seeded as interval_estimates)."""
  library, metrics = require_rliable()
  scores = _check(scores)
  names = list(scores)
  out = {}
  for i, a in enumerate(names):
    for b in names[i + 1:]:
      p = float(metrics.probability_of_improvement(scores[a], scores[b]))
      if _fixed(scores[a]) and _fixed(scores[b]):
        lo = hi = p
      else:
        with _seeded(seed):
          _, cis = library.get_interval_estimates({"xy": [scores[a], scores[b]]}, _poi_fast,
                                                  reps=reps, confidence_interval_size=level)
        lo, hi = np.ravel(cis["xy"])
      out[(a, b)] = np.array([p, lo, hi])
      # P(Y > X) = 1 - P(X > Y) (ties count half for both), on every resample alike.
      out[(b, a)] = np.array([1.0 - p, 1.0 - hi, 1.0 - lo])
  return out


def inseparable(scores: Dict[str, np.ndarray], digits: int = DIGITS,
                min_runs: int = MIN_RUNS) -> Dict[Tuple[str, str], str]:
  """{(x, y): why} for every ordered pair of columns of scores {column: [R, T]} that the runs
  cannot separate: "equal as printed" (on every task the two columns' runs print, with `digits`
  decimals, as the same numbers), or "too few runs" (fewer than min_runs runs of either column
  per task). Pairs that can be separated are absent."""
  out = {}
  names = list(scores)
  for i, a in enumerate(names):
    for b in names[i + 1:]:
      x, y = as_printed(scores[a], digits), as_printed(scores[b], digits)
      if x.shape == y.shape and np.array_equal(np.sort(x, axis=0), np.sort(y, axis=0)):
        why = f"equal as printed with {digits} decimal{'s' if digits != 1 else ''}"
      elif min(x.shape[0], y.shape[0]) < min_runs:
        why = (f"too few runs: {x.shape[0]} and {y.shape[0]} per task, {min_runs} each needed")
      else:
        continue
      out[(a, b)] = out[(b, a)] = why
  return out


def taus_for(scores: Dict[str, np.ndarray], n: int = N_TAUS) -> np.ndarray:
  """[n] thresholds from min(0, lowest score) to max(GAMMA, highest score)."""
  allx = np.concatenate([np.ravel(x) for x in scores.values()])
  return np.linspace(min(0.0, float(np.floor(allx.min()))),
                     max(GAMMA, float(np.ceil(allx.max()))), n)


def performance_profiles(scores: Dict[str, np.ndarray], taus: Optional[np.ndarray] = None,
                         reps: int = PROFILE_REPS, seed: int = SEED, level: float = LEVEL
                         ) -> Tuple[np.ndarray, Dict[str, np.ndarray]]:
  """(taus [N], {column: [3, N]}: the fraction of runs x tasks with score > tau, then its interval
  low and high), by rliable.library.create_performance_profile (seeded as interval_estimates)."""
  library, _ = require_rliable()
  scores = _check(scores)
  taus = taus_for(scores) if taus is None else np.asarray(taus, np.float64)
  out = {}
  for k, x in scores.items():
    point = library.score_distributions(x, taus)
    if _fixed(x):
      out[k] = np.vstack([point, point, point])
      continue
    with _seeded(seed):
      _, cis = library.create_performance_profile({k: x}, taus, reps=reps,
                                                  confidence_interval_size=level)
    out[k] = np.vstack([point, cis[k]])
  return taus, out


def plot_profiles(taus: np.ndarray, profiles: Dict[str, np.ndarray], path: str, title: str):
  """The performance profiles {column: [3, N]} over taus [N] as a PNG at `path`
  (rliable.plot_utils.plot_performance_profiles, shaded intervals)."""
  # matplotlib and rliable (optional extra) only when profiles are drawn
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # after the backend is set
  from rliable import plot_utils

  fig, ax = plt.subplots(figsize=(6.4, 4.2))
  try:
    plot_utils.plot_performance_profiles(
        {k: v[0] for k, v in profiles.items()}, taus,
        performance_profile_cis={k: v[1:] for k, v in profiles.items()}, ax=ax,
        colors={k: f"C{i}" for i, k in enumerate(profiles)},
        xlabel=r"normalised score $\tau$", ylabel=r"fraction of runs with score $> \tau$",
        labelsize="medium", ticklabelsize="small")
    ax.legend(fontsize=8, loc="upper right")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    atomic.save_figure(fig, path, dpi=100)
  finally:
    plt.close(fig)


# ------------------------------------------------------------------------------- the report

def _task_key(task: Tuple[str, str]):
  """The report's row order: dataset type, then environment (results.TYPE_ORDER, ENV_ORDER)."""
  env, dataset = task
  dtype = dataset_type(dataset)
  return (TYPE_ORDER.index(dtype) if dtype in TYPE_ORDER else len(TYPE_ORDER),
          ENV_ORDER.index(env) if env in ENV_ORDER else len(ENV_ORDER), env, dataset)


@dataclasses.dataclass
class Matrices:
  """The report's groups as rliable's input. tasks: (env, dataset) [T]; scores {column: [R, T]}
  (the columns that have every task); notes: what was left out and why (one line each)."""
  tasks: List[Tuple[str, str]]
  scores: Dict[str, np.ndarray]
  notes: List[str]


def score_matrices(groups: dict, what: str = "final", order=None) -> Matrices:
  """groups {(env, dataset, column): anything with .values(what) -> [S] and .seeds [S]} (the
  report's Pools) -> Matrices. Only columns with a finite score on every task of the report take
  part (an aggregate over other tasks would not compare); rliable needs as many runs per task, so a
  column keeps on every task its R lowest seed ids, R its fewest seeds on any task. order: sort key
  of column labels (labels.label_key)."""
  tasks = sorted({(e, d) for (e, d, _) in groups}, key=_task_key)
  columns = sorted({c for (_, _, c) in groups}, key=order)
  scores, notes = {}, []
  for c in columns:
    have = sum((e, d, c) in groups for e, d in tasks)
    if have < len(tasks):
      notes.append(f"{c}: left out (on {have} of the {len(tasks)} tasks)")
      continue
    per_task = []
    for e, d in tasks:
      g = groups[(e, d, c)]
      x = np.asarray(g.values(what), np.float64)
      # Pool.seeds [S] is aligned with its values; without it, the order given.
      seeds = np.asarray(getattr(g, "seeds", range(len(x))))
      seeds = seeds if len(seeds) == len(x) else np.arange(len(x))
      keep = np.isfinite(x)
      if not keep.all():
        notes.append(f"{c} on {d}: {int((~keep).sum())} non-finite score(s) left out")
      if not keep.any():
        break
      per_task.append(x[keep][np.argsort(seeds[keep], kind="stable")])
    if len(per_task) < len(tasks):
      notes.append(f"{c}: left out (no finite score on {d})")
      continue
    r = min(len(x) for x in per_task)
    cut = [d for (_, d), x in zip(tasks, per_task) if len(x) > r]
    if cut:
      notes.append(f"{c}: {r} run(s) per task (its fewest), the lowest seed ids kept on "
                   + ", ".join(cut))
    scores[c] = np.stack([x[:r] for x in per_task], axis=1)
    assert scores[c].shape == (r, len(tasks)), scores[c].shape   # no chex: it loads jax
  return Matrices(tasks=tasks, scores=scores, notes=notes)


def _cell(v: np.ndarray, digits: int) -> str:
  """[3] (point, low, high) -> 'p [lo, hi]'."""
  return f"{v[0]:.{digits}f} [{v[1]:.{digits}f}, {v[2]:.{digits}f}]"


def report_section(groups: dict, out: str, log=print, order=None, what: str = "final",
                   reps: Optional[int] = None, profile_reps: Optional[int] = None
                   ) -> Tuple[str, List[str]]:
  """report.md's section *Across tasks (rliable)* over the report's groups (score_matrices) and
  the performance-profile PNG (PROFILE_FILE) in `out`. Returns (markdown, files written).
  Without rliable the section is the one MissingRliable line, also given to `log`. reps,
  profile_reps: resamples (default REPS, PROFILE_REPS, read at call time)."""
  reps = REPS if reps is None else reps
  profile_reps = PROFILE_REPS if profile_reps is None else profile_reps
  lines = ["", "## Across tasks (rliable)", ""]
  try:
    require_rliable()
  except MissingRliable as e:
    log(f"warning: {e}")
    return "\n".join(lines + [f"Not computed: {e}.", ""]), []
  m = score_matrices(groups, what, order)
  notes = [f"- {n}" for n in m.notes]
  if not m.scores:
    return "\n".join(lines + ["No column has a score on every task of the report: nothing to "
                               "aggregate.", ""] + notes + ([""] if notes else [])), []
  names = list(m.scores)
  runs = ", ".join(f"{k} {x.shape[0]}" for k, x in m.scores.items())
  lines += [
      f"Final normalised score of the columns that have every one of the report's {len(m.tasks)} "
      f"task(s) ({', '.join(d for _, d in m.tasks)}), aggregated over runs and tasks by rliable "
      f"{metadata.version('rliable')} (runs per task: {runs}). Each number has its "
      f"{LEVEL:.0%} stratified-bootstrap percentile interval (runs resampled with replacement "
      f"within each task, tasks kept; {reps:,} resamples, RNG seed {SEED}). IQM: the mean of the "
      "middle 50 % of all runs' scores; median and mean: of the per-task means over runs; "
      f"optimality gap: {GAMMA:g} − the mean of min(score, {GAMMA:g}) (lower is better). The "
      "paper's columns have no per-run scores and take no part (docs/protocol.md, *Across tasks "
      "(rliable)*).", "",
      "| Aggregate | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
  est = interval_estimates(m.scores, reps=reps)
  for i, name in enumerate(AGGREGATES):
    label = name + (" ↓" if name == "Optimality gap" else "")
    lines.append(f"| {label} | " + " | ".join(_cell(est[k][:, i], 1) for k in names) + " |")
  lines.append("")
  apart = inseparable(m.scores)
  if len(names) > 1:
    poi = probability_of_improvement(m.scores, reps=reps)
    lines += [
        "Probability of improvement P(row > column): the probability that a run of the row's "
        "column scores higher than a run of the column's on the same task (Mann-Whitney U over "
        "the pairs of runs, ties counting half, averaged over tasks), with its interval (runs of "
        "both resampled independently within each task). *Not separable*: the runs cannot tell "
        f"the two columns apart (fewer than {MIN_RUNS} runs of one per task, or scores equal as "
        "printed), so no probability is shown.", "",
        "| P(row > column) | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for a in names:
      lines.append(f"| {a} | " + " | ".join(
          "–" if a == b else (f"*not separable* ({apart[(a, b)]})" if (a, b) in apart
                              else _cell(poi[(a, b)], 2)) for b in names) + " |")
    lines.append("")
  taus, prof = performance_profiles(m.scores, reps=profile_reps)
  path = os.path.join(out, PROFILE_FILE)
  plot_profiles(taus, prof, path, f"Final normalised score, {len(m.tasks)} task(s)")
  lines += [f"![Performance profiles]({PROFILE_FILE})", "",
            "Performance profiles: the fraction of all runs and tasks whose final score exceeds "
            f"τ, with its interval ({profile_reps:,} resamples).", ""]
  pairs = sorted({tuple(sorted(k)) for k in apart})
  if pairs:
    lines += ["The runs cannot separate " + "; ".join(f"{a} and {b} ({apart[(a, b)]})"
                                                       for a, b in pairs)
              + ": the gap between their profiles is no evidence either way.", ""]
  if notes:
    lines += ["Notes:", ""] + notes + [""]
  return "\n".join(lines), [path]
