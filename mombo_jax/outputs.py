"""A run's outputs, written and read in one place: metrics.csv (one row per seed per evaluation),
summary.json (final normalised score and AULC per seed, mean and std over every seed - a diverged
one counted at its frozen policy - and over the seeds that did not diverge, the diverged seeds, the
critics' mean Q against the return bound, the reporting protocol it follows) and
learning_curve.png. `experiments.run` writes them; reports read them back.

Every file is written through a temporary file renamed over the target (`atomic_write`), so a
reader never sees half a file and a failed write leaves the committed one as it was. A write the
OS refuses (read-only file system, no space left, a file where a folder should be) raises
`WriteError`: a UserError of one line naming the path and the cause, its temporary file removed.

Protocol: `PROTOCOL` names the definitions summary.json's numbers follow (docs/protocol.md: what
"final" is, what AULC averages, std with ddof = 0 over every seed, ...); `summarise` writes it into
every summary. The report reads READABLE_PROTOCOLS (protocol/1's per-seed numbers are protocol/2's;
only its means left diverged seeds out, and the report recomputes them) and refuses any other.

Overestimation watch: no policy's return can exceed max|r| / (1 - gamma) (r: the real dataset's
rewards), so critics whose mean Q passes that bound have overestimated. `return_bound` computes it,
`QWatch` tracks each seed's epoch-mean Q against it and flags a seed once (not a divergence: the run
goes on).
"""
import csv
import errno
import json
import os
from typing import Callable, List, Optional, Sequence

import numpy as np

from mombo_jax.errors import UserError

_INT_COLUMNS = ("epoch", "step", "seed")
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

# What to do about a refused write, by errno.
_WRITE_FIXES = {
    errno.ENOSPC: "free some space and run again",
    errno.EDQUOT: "free some space (disk quota) and run again",
    errno.EROFS: "pass a folder on a writable file system",
    errno.EACCES: "pass a folder you may write to",
    errno.EPERM: "pass a folder you may write to",
    errno.ENOTDIR: "a part of the path is a file, not a folder; pass another folder",
    errno.EEXIST: "a file stands where a folder should be; pass another folder",
}


class WriteError(UserError):
  """A file or folder the OS refused to write (read-only file system, no space, no permission, a
  file in the way). One line: the path, the OS's cause, the fix. path: what was being written;
  cause: the OS's words (strerror); errno: the OSError's errno."""

  def __init__(self, path: str, error: OSError):
    self.path = str(path)
    self.errno = error.errno
    self.cause = error.strerror or str(error)
    fix = _WRITE_FIXES.get(error.errno)
    super().__init__(f"Cannot write {self.path}: {self.cause}" + (f"; {fix}." if fix else "."))


def write_error(path: str, error: OSError) -> WriteError:
  """The WriteError for `error` (an OSError) raised while writing `path`: for callers that write
  through their own code (os.makedirs, a library's save) and want the same one-line refusal."""
  return WriteError(path, error)


def make_dirs(path: str):
  """os.makedirs(path, exist_ok=True); WriteError instead of an OSError."""
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    raise WriteError(path, e) from None


def check_writable(folder: str):
  """Creates `folder` if needed and checks that a file can be written in it (a temporary file,
  removed at once); WriteError naming the folder otherwise. For a program's output folder, before
  any work."""
  import tempfile
  make_dirs(folder)
  try:
    with tempfile.TemporaryFile(dir=folder):
      pass
  except OSError as e:
    raise WriteError(folder, e) from None


def atomic_write(path: str, write: Callable, binary: bool = False):
  """Writes `path` through `<path>.tmp`: write(f) fills the open temporary file, which is then
  renamed over `path`. On any failure the temporary file is removed and `path` is untouched; an
  OSError (of the open, the write or the rename) becomes a WriteError naming `path`."""
  tmp = path + ".tmp"
  try:
    with open(tmp, "wb" if binary else "w", **({} if binary else {"newline": ""})) as f:
      write(f)
    os.replace(tmp, path)
  except BaseException as e:
    try:
      os.remove(tmp)
    except OSError:
      pass
    if isinstance(e, OSError):
      raise WriteError(path, e) from None
    raise


def write_text(path: str, text: str):
  """Atomically writes `text` (report.md, report.tex, ...)."""
  atomic_write(path, lambda f: f.write(text))


def save_figure(fig, path: str, **kwargs):
  """Atomically saves a matplotlib figure (format from path's extension)."""
  fmt = os.path.splitext(path)[1].lstrip(".") or "png"
  atomic_write(path, lambda f: fig.savefig(f, format=fmt, **kwargs), binary=True)


def read_rows(path: str, max_epoch: Optional[int] = None) -> List[dict]:
  """metrics.csv as dicts (epoch/step/seed int, the rest float); rows past max_epoch dropped (a run
  killed before its next checkpoint wrote them)."""
  if not os.path.exists(path):
    return []
  with open(path) as f:
    rows = [{k: (int(v) if k in _INT_COLUMNS else float(v)) for k, v in r.items()}
            for r in csv.DictReader(f)]
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


def write_json(path: str, obj, indent: int = 1):
  """Atomically (atomic_write) writes obj as JSON. WriteError when the OS refuses."""
  atomic_write(path, lambda f: json.dump(obj, f, indent=indent))


def score_table(rows: Sequence[dict], seeds: Sequence[int], key: str = "epoch"):
  """(evaluation points [T], normalised scores [T, S]) from metrics rows."""
  points = sorted({r[key] for r in rows})
  lookup = {(r[key], r["seed"]): r["normalized_score"] for r in rows}
  return points, np.array([[lookup[(t, int(s))] for s in seeds] for t in points], np.float64)


def summarise(rows: Sequence[dict], seeds: Sequence[int], diverged: Sequence[dict] = (),
              q: Optional["QWatch"] = None) -> dict:
  """summary.json: per-seed final score (the last evaluation's) and AULC (mean normalised score
  over all evaluations, equally weighted), and their mean / std (np.std: ddof = 0) over EVERY seed
  (a diverged seed is frozen at its last healthy policy, and that policy's evaluations count:
  docs/protocol.md); `*_healthy`: the same over the seeds that did not diverge (None when none is
  left); `num_seeds`, `num_diverged`; `protocol`: PROTOCOL; with `q` (the run's QWatch) also its
  fields (QWatch.summary). A statistic over values of which one is not finite is None (never NaN
  in the file): the per-seed lists show which."""
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
  """learning_curve.png: every seed thin (diverged ones dashed: their frozen policy's scores),
  the mean over every seed thick (summary.json's)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  steps, table = score_table(rows, seeds, key="step")
  bad = {int(s) for s in diverged}
  fig, ax = plt.subplots(figsize=(6, 4))
  for i, s in enumerate(seeds):
    ax.plot(steps, table[:, i], lw=0.8, alpha=0.5, ls="--" if int(s) in bad else "-",
            label=f"seed {s}" + (" (diverged, frozen)" if int(s) in bad else ""))
  if len(seeds):
    ax.plot(steps, table.mean(1), lw=2, color="k",
            label=f"mean of {len(seeds)}" + (f" ({len(bad)} diverged)" if bad else ""))
  ax.set(xlabel="gradient steps", ylabel="normalised score", title=title)
  ax.legend(fontsize=7)
  fig.tight_layout()
  try:
    save_figure(fig, path, dpi=100)
  finally:
    plt.close(fig)
