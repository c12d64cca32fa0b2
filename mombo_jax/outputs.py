"""A run's outputs, written and read in one place: metrics.csv (one row per seed per evaluation),
summary.json (final normalised score and AULC per seed, mean and std over the healthy seeds, the
diverged seeds, the critics' mean Q against the return bound) and learning_curve.png.
`experiments.run` writes them; reports read them back.

Overestimation watch: no policy's return can exceed max|r| / (1 - gamma) (r: the real dataset's
rewards), so critics whose mean Q passes that bound have overestimated. `return_bound` computes it,
`QWatch` tracks each seed's epoch-mean Q against it and flags a seed once (not a divergence: the run
goes on).
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
  """Atomically (temp file + rename) writes metrics.csv; the columns are every row's keys in order
  of first appearance (rows of an older run, resumed, lack newer columns: "nan" there)."""
  tmp = path + ".tmp"
  with open(tmp, "w", newline="") as f:
    if rows:
      fields = list(dict.fromkeys(k for row in rows for k in row))
      writer = csv.DictWriter(f, fieldnames=fields, restval="nan")
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


def summarise(rows: Sequence[dict], seeds: Sequence[int], diverged: Sequence[dict] = (),
              q: Optional["QWatch"] = None) -> dict:
  """summary.json: per-seed final score and AULC (mean normalised score over all evaluations), and
  their mean / std over the seeds that did not diverge (None when none is left); with `q` (the
  run's QWatch) also its fields (QWatch.summary)."""
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
              diverged=list(diverged), **({} if q is None else q.summary(seeds)))


def return_bound(rewards, gamma: float):
  """max|r| / (1 - gamma) over the last axis of `rewards`, NaN ignored (the padding of datasets
  stacked by buffer.stack): a float for [N], an array [D] for stacked [D, N]. No return, and so
  no true Q, of a policy on rewards within max|r| lies beyond it. inf for gamma >= 1; NaN for a
  dataset with no reward at all."""
  r = np.abs(np.asarray(rewards, np.float64))
  finite = ~np.isnan(r)
  top = np.where(finite.any(axis=-1), np.max(np.where(finite, r, -np.inf), axis=-1), np.nan)
  bound = top / (1.0 - gamma) if gamma < 1 else np.where(np.isnan(top), np.nan, np.inf)
  return float(bound) if np.ndim(bound) == 0 else bound


def overestimates(q_mean, bound) -> bool:
  """The flag: a finite mean Q above the return bound."""
  return bool(np.isfinite(q_mean) and q_mean > bound)


class QWatch:
  """Per seed: the last and the largest epoch-mean Q of the critics, the return bound of its
  dataset and the first epoch whose mean Q passed it. `records` (JSON-ready dicts) is saved in
  the checkpoint's metadata, so a resumed run keeps what it saw."""

  def __init__(self, seeds: Sequence[int], bound: float, records: Sequence[dict] = ()):
    self.bound = float(bound)
    old = {int(d["seed"]): d for d in records}
    self.records = {}
    for s in seeds:
      d = old.get(int(s), {})
      self.records[int(s)] = dict(seed=int(s), q_mean_last=d.get("q_mean_last"),
                                  q_mean_max=d.get("q_mean_max"),
                                  overestimated_epoch=d.get("overestimated_epoch"))

  @classmethod
  def from_rows(cls, seeds, bound, rows: Sequence[dict]) -> "QWatch":
    """A watch rebuilt from metrics.csv rows (their evaluation epochs' q_mean): for a checkpoint
    saved before the watch existed."""
    watch = cls(seeds, bound)
    for row in sorted(rows, key=lambda r: r["epoch"]):
      if int(row["seed"]) in watch.records and "q_mean" in row:
        watch.update(int(row["seed"]), row["epoch"], row["q_mean"])
    return watch

  def update(self, seed: int, epoch: int, q_mean: float) -> bool:
    """Records seed's mean Q of `epoch`; True when it passes the bound for the first time."""
    d = self.records[int(seed)]
    q_mean = float(q_mean)
    if not np.isfinite(q_mean):
      return False
    d["q_mean_last"] = q_mean
    d["q_mean_max"] = q_mean if d["q_mean_max"] is None else max(d["q_mean_max"], q_mean)
    if d["overestimated_epoch"] is None and overestimates(q_mean, self.bound):
      d["overestimated_epoch"] = int(epoch)
      return True
    return False

  def flagged(self) -> List[int]:
    return [s for s, d in self.records.items() if d["overestimated_epoch"] is not None]

  def summary(self, seeds: Sequence[int]) -> dict:
    """summary.json fields, lists per seed: q_mean_last, q_mean_max (None: never measured),
    overestimated (bool), overestimated_epoch (None: never); q_bound (one number: the seeds of a
    workdir share a dataset)."""
    recs = [self.records[int(s)] for s in seeds]
    return dict(q_bound=self.bound if np.isfinite(self.bound) else None,
                q_mean_last=[d["q_mean_last"] for d in recs],
                q_mean_max=[d["q_mean_max"] for d in recs],
                overestimated=[d["overestimated_epoch"] is not None for d in recs],
                overestimated_epoch=[d["overestimated_epoch"] for d in recs])


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
