"""A run's outputs, written and read in one place: metrics.csv (one row per seed per evaluation),
summary.json (final normalised score and AULC per seed, mean and std over the healthy seeds, the
diverged seeds) and learning_curve.png. `experiments.run` writes them; reports read them back.
"""
import csv
import json
import os
from typing import List, Optional, Sequence

import numpy as np

_INT_COLUMNS = ("epoch", "step", "seed")


def read_rows(path: str, max_epoch: Optional[int] = None) -> List[dict]:
  """metrics.csv as dicts (epoch/step/seed int, the rest float); rows past max_epoch dropped (a run
  killed before its next checkpoint wrote them)."""
  if not os.path.exists(path):
    return []
  with open(path) as f:
    rows = [{k: (int(v) if k in _INT_COLUMNS else float(v)) for k, v in r.items()}
            for r in csv.DictReader(f)]
  return rows if max_epoch is None else [r for r in rows if r["epoch"] <= max_epoch]


def write_rows(path: str, rows: Sequence[dict]):
  """Atomically (temp file + rename) writes metrics.csv; the columns are the first row's keys."""
  tmp = path + ".tmp"
  with open(tmp, "w", newline="") as f:
    if rows:
      writer = csv.DictWriter(f, fieldnames=list(rows[0]), restval="nan")
      writer.writeheader()
      writer.writerows(rows)
  os.replace(tmp, path)


def write_json(path: str, obj):
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=1)
  os.replace(tmp, path)


def score_table(rows: Sequence[dict], seeds: Sequence[int], key: str = "epoch"):
  """(evaluation points [T], normalised scores [T, S]) from metrics rows."""
  points = sorted({r[key] for r in rows})
  lookup = {(r[key], r["seed"]): r["normalized_score"] for r in rows}
  return points, np.array([[lookup[(t, int(s))] for s in seeds] for t in points], np.float64)


def summarise(rows: Sequence[dict], seeds: Sequence[int], diverged: Sequence[dict] = ()) -> dict:
  """summary.json: per-seed final score and AULC (mean normalised score over all evaluations), and
  their mean / std over the seeds that did not diverge (None when none is left)."""
  epochs, table = score_table(rows, seeds)
  final, aulc = table[-1], table.mean(axis=0)
  bad = {int(d["seed"]) for d in diverged}
  keep = np.array([int(s) not in bad for s in seeds])

  def stat(fn, x):
    return float(fn(x[keep])) if keep.any() else None

  return dict(seeds=[int(s) for s in seeds], epochs=epochs,
              final_normalized_score=final.tolist(), aulc=aulc.tolist(),
              final_normalized_score_mean=stat(np.mean, final),
              final_normalized_score_std=stat(np.std, final),
              aulc_mean=stat(np.mean, aulc), aulc_std=stat(np.std, aulc),
              diverged=list(diverged))


def plot_curve(rows: Sequence[dict], seeds: Sequence[int], path: str, title: str,
               diverged: Sequence[int] = ()):
  """learning_curve.png: every seed thin (diverged ones dashed), the healthy seeds' mean thick."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  steps, table = score_table(rows, seeds, key="step")
  bad = {int(s) for s in diverged}
  fig, ax = plt.subplots(figsize=(6, 4))
  for i, s in enumerate(seeds):
    ax.plot(steps, table[:, i], lw=0.8, alpha=0.5, ls="--" if int(s) in bad else "-",
            label=f"seed {s}" + (" (diverged)" if int(s) in bad else ""))
  keep = [i for i, s in enumerate(seeds) if int(s) not in bad]
  if keep:
    ax.plot(steps, table[:, keep].mean(1), lw=2, color="k", label="mean")
  ax.set(xlabel="gradient steps", ylabel="normalised score", title=title)
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
