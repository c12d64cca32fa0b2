"""The overestimation watch: no policy's return can exceed max|r| / (1 - gamma) (r: the real
dataset's rewards), so critics whose mean Q passes that bound have overestimated. `return_bound`
computes the bound; `OverestimationWatch` tracks each seed's epoch-mean Q against it and flags a
seed once (not a divergence: the run goes on); its fields go into summary.json and its per-seed
state into the checkpoint's metadata."""
from typing import List, Sequence

import numpy as np


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


class OverestimationWatch:
  """Per seed: the last and the largest epoch-mean Q of the critics, the return bound of its
  dataset and the first epoch whose mean Q passed it. `per_seed` (JSON-ready dicts) is saved in
  the checkpoint's metadata, so a resumed run keeps what it saw."""

  def __init__(self, seeds: Sequence[int], bound: float, saved: Sequence[dict] = ()):
    self.bound = float(bound)
    old = {int(d["seed"]): d for d in saved}
    self.per_seed = {}
    for s in seeds:
      d = old.get(int(s), {})
      self.per_seed[int(s)] = dict(seed=int(s), q_mean_last=d.get("q_mean_last"),
                                  q_mean_max=d.get("q_mean_max"),
                                  overestimated_epoch=d.get("overestimated_epoch"))

  @classmethod
  def from_rows(cls, seeds, bound, rows: Sequence[dict]) -> "OverestimationWatch":
    """A watch rebuilt from metrics.csv rows (their evaluation epochs' q_mean): for a checkpoint
    saved before the watch existed."""
    watch = cls(seeds, bound)
    for row in sorted(rows, key=lambda r: r["epoch"]):
      if int(row["seed"]) in watch.per_seed and "q_mean" in row:
        watch.update(int(row["seed"]), row["epoch"], row["q_mean"])
    return watch

  def update(self, seed: int, epoch: int, q_mean: float) -> bool:
    """Records seed's mean Q of `epoch`; True when it passes the bound for the first time."""
    d = self.per_seed[int(seed)]
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
    return [s for s, d in self.per_seed.items() if d["overestimated_epoch"] is not None]

  def summary(self, seeds: Sequence[int]) -> dict:
    """summary.json fields, lists per seed: q_mean_last, q_mean_max (None: never measured),
    overestimated (bool), overestimated_epoch (None: never); q_bound (one number: the seeds of a
    workdir share a dataset)."""
    recs = [self.per_seed[int(s)] for s in seeds]
    return dict(q_bound=self.bound if np.isfinite(self.bound) else None,
                q_mean_last=[d["q_mean_last"] for d in recs],
                q_mean_max=[d["q_mean_max"] for d in recs],
                overestimated=[d["overestimated_epoch"] is not None for d in recs],
                overestimated_epoch=[d["overestimated_epoch"] for d in recs])
