"""A run's outputs, written and read in one place: metrics.csv (one row per seed per evaluation),
summary.json (final normalised score and AULC per seed, mean and std over every seed - a diverged
one counted at its frozen policy - and over the seeds that did not diverge, the diverged seeds, the
critics' mean Q against the return bound, the reporting protocol it follows) and
learning_curve.png. `experiments.run` writes them; reports read them back.

Every file is written whole or not at all (mombo_jax.storage.atomic: a refused write is a one-line
WriteError).

Protocol: `PROTOCOL` names the definitions summary.json's numbers follow (docs/protocol.md: what
"final" is, what AULC averages, std with ddof = 0 over every seed, ...); `summarise` writes it into
every summary. The report reads READABLE_PROTOCOLS (protocol/1's per-seed numbers are protocol/2's;
only its means left diverged seeds out, and the report recomputes them) and refuses any other.

The overestimation watch whose fields summary.json carries: mombo_jax.run.overestimation (the
records sit below run/, so `summarise` takes it without importing it).
"""
import csv
import os
from typing import List, Optional, Sequence

import numpy as np

from mombo_jax.storage.atomic import atomic_write, save_figure

_INT_COLUMNS = ("epoch", "step", "seed")
# metrics.csv columns of older runs, read under today's names: the rollouts' reward penalty was
# logged as MOPO's for every algorithm that penalises the reward (core/rollout.py).
RENAMED_COLUMNS = {"rollout/mopo_penalty": "rollout/penalty"}
# The reporting protocol summary.json follows (docs/protocol.md). A change of what any number in
# summary.json means (the final score, AULC, the std, which seeds count) is a new version.
# 2: every seed counts (a diverged seed at its frozen policy); 1: means over the healthy seeds.
PROTOCOL = "mombo_jax.protocol/2"
PROTOCOL_1 = "mombo_jax.protocol/1"
# The versions a report reads: protocol/1's per-seed scores (summary.json's lists, metrics.csv)
# are defined as protocol/2's, diverged seeds included; only its means and stds left them out,
# and the report computes its own from the per-seed scores.
READABLE_PROTOCOLS = (PROTOCOL_1, PROTOCOL)
PROTOCOL_DOC = "docs/protocol.md"


def read_rows(path: str, max_epoch: Optional[int] = None) -> List[dict]:
  """metrics.csv as dicts (epoch/step/seed int, the rest float; an older run's columns under
  today's names, RENAMED_COLUMNS); rows past max_epoch dropped (a run killed before its next
  checkpoint wrote them)."""
  if not os.path.exists(path):
    return []
  with open(path) as f:
    rows = [{RENAMED_COLUMNS.get(k, k): (int(v) if k in _INT_COLUMNS else float(v))
             for k, v in r.items()} for r in csv.DictReader(f)]
  return rows if max_epoch is None else [r for r in rows if r["epoch"] <= max_epoch]


def write_rows(path: str, rows: Sequence[dict], fields: Optional[Sequence[str]] = None):
  """Atomically (atomic_write) writes a CSV such as metrics.csv; the columns are `fields`, by
  default every row's keys in order of first appearance (rows of an older run, resumed, lack
  newer columns: "nan" there). WriteError when the OS refuses."""
  def write(f):
    columns = list(fields) if fields is not None else list(
        dict.fromkeys(k for row in rows for k in row))
    if columns:
      writer = csv.DictWriter(f, fieldnames=columns, restval="nan")
      writer.writeheader()
      writer.writerows(rows)
  atomic_write(path, write)


def score_table(rows: Sequence[dict], seeds: Sequence[int], key: str = "epoch"):
  """(evaluation points [T], normalised scores [T, S]) from metrics rows."""
  points = sorted({r[key] for r in rows})
  lookup = {(r[key], r["seed"]): r["normalized_score"] for r in rows}
  return points, np.array([[lookup[(t, int(s))] for s in seeds] for t in points], np.float64)


def summarise(rows: Sequence[dict], seeds: Sequence[int], diverged: Sequence[dict] = (),
              q=None) -> dict:
  """summary.json: per-seed final score (the last evaluation's) and AULC (mean normalised score
  over all evaluations, equally weighted), and their mean / std (np.std: ddof = 0) over EVERY seed
  (a diverged seed is frozen at its last healthy policy, and that policy's evaluations count:
  docs/protocol.md); `*_healthy`: the same over the seeds that did not diverge (None when none is
  left); `num_seeds`, `num_diverged`; `protocol`: PROTOCOL; with `q` (the run's
  OverestimationWatch, mombo_jax.run.overestimation) also its fields (OverestimationWatch.summary).
  A statistic over values of which one is not finite is None (never NaN in the file): the per-seed
  lists show which."""
  epochs, table = score_table(rows, seeds)
  final, aulc = table[-1], table.mean(axis=0)
  bad = {int(d["seed"]) for d in diverged}
  healthy = np.array([int(s) not in bad for s in seeds])
  every = np.ones(len(seeds), bool)

  def stat(fn, x, keep):
    x = x[keep]
    return float(fn(x)) if x.size and np.all(np.isfinite(x)) else None

  return dict(protocol=PROTOCOL, seeds=[int(s) for s in seeds], epochs=epochs,
              num_seeds=len(seeds), num_diverged=int((~healthy).sum()),
              final_normalized_score=final.tolist(), aulc=aulc.tolist(),
              final_normalized_score_mean=stat(np.mean, final, every),
              final_normalized_score_std=stat(np.std, final, every),
              aulc_mean=stat(np.mean, aulc, every), aulc_std=stat(np.std, aulc, every),
              final_normalized_score_mean_healthy=stat(np.mean, final, healthy),
              final_normalized_score_std_healthy=stat(np.std, final, healthy),
              aulc_mean_healthy=stat(np.mean, aulc, healthy),
              aulc_std_healthy=stat(np.std, aulc, healthy),
              diverged=list(diverged), **({} if q is None else q.summary(seeds)))


_SEED_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">")


def plot_curve(rows: Sequence[dict], seeds: Sequence[int], path: str, title: str,
               diverged: Sequence[int] = (), dataset_score: Optional[float] = None,
               note: Optional[str] = None):
  """learning_curve.png at `path`: curve_figure's figure."""
  # matplotlib only when a figure is drawn: the records are read without it
  import matplotlib.pyplot as plt
  fig = curve_figure(rows, seeds, title, diverged, dataset_score, note)
  try:
    save_figure(fig, path, dpi=100)
  finally:
    plt.close(fig)


def curve_figure(rows: Sequence[dict], seeds: Sequence[int], title: str,
                 diverged: Sequence[int] = (), dataset_score: Optional[float] = None,
                 note: Optional[str] = None):
  """The learning curve's matplotlib figure: every seed thin with its evaluation points marked
  (diverged ones dashed: their frozen policy's scores), the mean over every seed thick
  (summary.json's) with a band of +- the std over the seeds (ddof 0, as summary.json's; said in the
  legend), and the dataset's own episodes' mean normalised return as a labelled line (dataset_score,
  where given); `note` (a run below the paper's budget: workdir.budget_note) under the title."""
  # matplotlib only when a figure is drawn: the records are read without it
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # after the backend is set
  steps, table = score_table(rows, seeds, key="step")
  bad = {int(s) for s in diverged}
  fig, ax = plt.subplots(figsize=(6, 4))
  for i, s in enumerate(seeds):
    # Each seed its own hollow marker, drawn over the mean: seeds at the same score (or at the
    # mean) stay visible.
    ax.plot(steps, table[:, i], lw=0.8, alpha=0.8, marker=_SEED_MARKERS[i % len(_SEED_MARKERS)],
            ms=5, mfc="none", zorder=3, ls="--" if int(s) in bad else "-",
            label=f"seed {s}" + (" (diverged, frozen)" if int(s) in bad else ""))
  if len(seeds):
    mean, std = table.mean(1), table.std(1)
    ax.fill_between(steps, mean - std, mean + std, color="k", alpha=0.12, lw=0,
                    label=f"± std over the {len(seeds)} seeds")
    ax.plot(steps, mean, lw=2, color="k", marker="o", ms=4,
            label=f"mean of {len(seeds)} seeds" + (f" ({len(bad)} diverged)" if bad else ""))
  if dataset_score is not None and np.isfinite(dataset_score):
    ax.axhline(dataset_score, color="C3", lw=1, ls=":",
               label=f"dataset's own episodes (mean {dataset_score:.1f})")
  ax.set(xlabel="gradient steps per seed", ylabel="D4RL-normalised score (0 random, 100 expert)")
  ax.set_title(title if note is None else f"{title}\n{note}",
               fontsize=None if note is None else 10)
  ax.legend(fontsize=7)
  fig.tight_layout()
  return fig
