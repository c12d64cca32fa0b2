"""The paper's result tables as numbers: rows = tasks (grouped by dataset type), columns =
algorithms, one Block per metric, each algorithm's column followed by the paper's published number
(mombo_jax.report.paper_results: Table 1 and the mixed-data table) for the metrics the paper reports
(final, AULC); the paper's MOMBO is the released code's target, elite_spread.
mombo_jax.report.markdown, .latex and .csv_out render them.

Table rule (paper, Table 1 caption, checked against its numbers): in every row the highest mean of
our columns is bold; another mean is underlined when it lies within one standard deviation *of the
best score* (best mean - mean <= std of the best; e.g. hopper-random's 25.4 +- 10.2 is not
underlined against 31.7 +- 0.1). The paper's columns are references and take no part in it; nor,
in a table beside the paper's numbers, does a table cell of ours below the paper's setup (fewer
gradient steps, a smaller preset, a reduced dataset: Pool.shortfalls), marked BELOW_MARK with a
footnote. A table cell with diverged seeds (counted at their frozen policy) is marked DIVERGED_MARK,
its footnote giving how many and the mean over the others.
Averages are plain means over tasks; the average rank is the mean over tasks of each algorithm's
rank of the mean (1 = best, ties share the average of their ranks).
Every comparison is made at the printed precision (`as_printed`: the values as the table shows
them, `digits` decimals): means equal as printed share their rank and their bold / underline, and
a summary row's best is its best as printed, so no mark or rank rests on a difference the reader
cannot see (two runs at 2.9 ± 1.9 whose means differ by 2e-4 both rank 1.5).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from mombo_jax.report import paper_results
from mombo_jax.report.labels import base_algo, label_key
from mombo_jax.report.paper_setup import paper_dataset
from mombo_jax.report.results import ENV_ORDER, LAST_K, TYPE_ORDER, Pool, dataset_type, ordered

PAPER = "paper"
# Marks of our table cells (the paper's table cells carry † for the paper's own footnotes).
DIVERGED_MARK = "‡"
BELOW_MARK = "§"


def as_printed(values, digits: Optional[int]) -> np.ndarray:
  """values (any shape; NaN kept) as a table prints them with `digits` decimals (the number the
  formatted text reads back as); None: unchanged."""
  v = np.asarray(values, float)
  if digits is None:
    return v
  return np.vectorize(lambda x: x if np.isnan(x) else float(f"{x:.{digits}f}"),
                      otypes=[float])(v) if v.size else v


def mark_row(means, stds) -> Tuple[np.ndarray, np.ndarray]:
  """(bold [K], underline [K]) for one row of K algorithms; NaN means are missing table cells.

  bold: the highest mean (every tied one). underline: not bold and best - mean <= std of the
  best (with tied bests, the largest of their stds), up to a 1e-9 relative slack.
  """
  means = np.asarray(means, float)
  stds = np.asarray(stds, float)
  present = ~np.isnan(means)
  bold = np.zeros(means.shape, bool)
  under = np.zeros(means.shape, bool)
  if not present.any():
    return bold, under
  best = np.max(means[present])
  bold = present & (means == best)
  best_std = np.max(np.where(bold, stds, -np.inf))
  # A relative 1e-9 slack: a gap equal to the std in decimal (95.2 - 94.5 vs 0.7) counts as within.
  slack = 1e-9 * max(1.0, abs(best))
  under = present & ~bold & (best - np.where(present, means, np.inf) <= best_std + slack)
  return bold, under


def ranks(means) -> np.ndarray:
  """Rank [K] of each mean in one row, 1 = highest; ties share the average of their ranks;
  NaN (missing) -> NaN."""
  means = np.asarray(means, float)
  out = np.full(means.shape, np.nan)
  present = ~np.isnan(means)
  for i in np.flatnonzero(present):
    higher = np.sum(means[present] > means[i])
    tied = np.sum(means[present] == means[i])
    out[i] = higher + (tied + 1) / 2.0
  return out


def average_ranks(mean_table) -> np.ndarray:
  """[K] mean over rows (tasks) of `ranks` of mean_table [R, K], over the rows where each
  algorithm has a value (NaN when it has none)."""
  table = np.asarray(mean_table, float)
  r = np.stack([ranks(row) for row in table]) if len(table) else np.empty((0, table.shape[1]))
  return _average(r)[0]


@dataclasses.dataclass
class Block:
  """One metric's table over `columns`: our algorithms, each algorithm's followed by the paper's
  column for it where the paper reports the metric (`paper` [K] marks those).

  mean, std [R, K] (NaN: missing); lo, hi [R, K]: the bootstrap interval (NaN where none is
  known, and in the paper's columns); bold / underline [R, K] (our columns only); per-type and
  overall averages [K] with complete [K] (bool: the column has every row the average covers; only
  complete columns compete for bold there); average ranks [K] (NaN for the paper's columns);
  notes {(i, j): footnote} of the paper's table cells that carry one; marks {(i, j): [(mark,
  footnote)]} of our table cells (DIVERGED_MARK, BELOW_MARK); unranked [K]: the columns that take no
  bold in the summary rows (the paper's, and beside them a column of ours with a marked
  BELOW_MARK table cell); extra: report.csv's further columns of our table cells."""
  name: str
  mean: np.ndarray
  std: np.ndarray
  bold: np.ndarray
  under: np.ndarray
  type_avg: Dict[str, Tuple[np.ndarray, np.ndarray]]
  avg: np.ndarray
  complete: np.ndarray
  avg_rank: np.ndarray
  digits: int = 1
  metric: str = ""
  columns: List[str] = dataclasses.field(default_factory=list)
  paper: Optional[np.ndarray] = None
  lo: Optional[np.ndarray] = None
  hi: Optional[np.ndarray] = None
  notes: Dict[Tuple[int, int], str] = dataclasses.field(default_factory=dict)
  marks: Dict[Tuple[int, int], List[Tuple[str, str]]] = dataclasses.field(default_factory=dict)
  unranked: Optional[np.ndarray] = None
  # {(i, j): {seeds, diverged, mean_healthy, std_healthy, below}} of our table cells built from
  # Pools.
  extra: Dict[Tuple[int, int], dict] = dataclasses.field(default_factory=dict)

  def paper_mask(self) -> np.ndarray:
    """bool [K]: the paper's columns (none for a Block built without them)."""
    return np.zeros(self.mean.shape[1], bool) if self.paper is None else self.paper

  def unranked_mask(self) -> np.ndarray:
    """bool [K]: the columns no summary row sets in bold (`unranked`; the paper's by default)."""
    return self.paper_mask() if self.unranked is None else self.unranked

  def has_ci(self) -> bool:
    """Whether some table cell has a bootstrap interval (the legend then explains it)."""
    return self.lo is not None and bool(np.any(~np.isnan(self.lo)))


@dataclasses.dataclass
class Table:
  """rows: (dataset type, env, dataset) in the paper's order; algos: our column labels (each
  block's `columns` adds the paper's)."""
  rows: List[Tuple[str, str, str]]
  algos: List[str]
  blocks: List[Block]

  def columns_of(self, b: Block) -> List[str]:
    """b's column labels (a Block built without any has our algorithms)."""
    return b.columns or self.algos


METRICS = (("final", "Normalised score (final evaluation)"),
           ("last", f"Normalised score (mean of the last {LAST_K} evaluations)"),
           ("aulc", "AULC"))


def paper_label(base: str) -> str:
  return f"{base} ({PAPER})"


def _columns(algos: Sequence[str], metric: str, paper: bool) -> Tuple[List[str], List[str]]:
  """(column labels, base algorithm of each paper column or '' for ours): each algorithm's own
  columns, then its paper column when `paper` and the paper reports `metric`."""
  columns, bases = [], []
  with_paper = paper and metric in paper_results.METRICS
  for i, a in enumerate(algos):
    columns.append(a)
    bases.append("")
    base = base_algo(a)
    last_of_base = i + 1 == len(algos) or base_algo(algos[i + 1]) != base
    if with_paper and last_of_base and base in paper_results.ALGOS:
      columns.append(paper_label(base))
      bases.append(base)
  return columns, bases


def _d4rl_row_order(env: str, dataset: str) -> tuple:
  return (ENV_ORDER.index(env) if env in ENV_ORDER else 99, env, dataset)


def _paper_number(what: str, dataset: str, base: str):
  """((mean, std) or None, footnote or None): the paper's number for algorithm `base` on our
  `dataset` (its name there: paper_dataset) and the paper's footnote on it."""
  name_there = paper_dataset(dataset)
  number = name_there and paper_results.lookup(what, name_there, base)
  if not number:
    return None, None
  note = paper_results.NOTES.get((what, name_there, base))
  return number, (f"{base} on {name_there}: {note}" if note else None)


def _paper_where_ours_ran(mean, columns, bases):
  """mean [R, K] with each paper column NaN in the rows where none of our columns of its
  algorithm has a number, so that the paper's averages cover only the tasks we ran."""
  averaged = mean.copy()
  for j, base in enumerate(bases):
    if base:
      ran = [k for k, (b, c) in enumerate(zip(bases, columns)) if not b and base_algo(c) == base]
      averaged[~np.any(~np.isnan(mean[:, ran]), axis=1), j] = np.nan
  return averaged


def build_table(groups: Dict[tuple, Pool], metrics=METRICS, digits: int = 1,
                paper: bool = False, below_ranked: Optional[bool] = None,
                group_of: Callable[[str], str] = dataset_type,
                group_order: Sequence[str] = TYPE_ORDER,
                row_order: Callable[[str, str], tuple] = _d4rl_row_order) -> Table:
  """Rows = tasks (grouped by dataset type), columns = algorithms, one block per metric
  (default: final score, mean of the last LAST_K evaluations and AULC). groups: {(env, dataset,
  algo): anything with .stat(metric) -> (mean, std) or (None, None), and optionally .ci(metric)
  -> (low, high)}. paper: add the paper's column beside each algorithm's for the metrics the
  paper reports (mombo_jax.report.paper_results). below_ranked: whether a table cell below the
  paper's setup (BELOW_MARK) competes for bold, underline and the summary rows' bold (default: only
  in a table without the paper's columns); False for a table that stands beside the paper's numbers
  in blocks that lack its column (experiments.uncertainty's alternative readings). group_of,
  group_order, row_order: a row's group (its summary row; default its dataset type), the groups'
  order and the order within a group (default the paper's environment order; the mixed table's:
  mombo_jax.report.mixed)."""
  if below_ranked is None:
    below_ranked = not paper
  tasks = {(group_of(d), e, d) for (e, d, _) in groups}
  types = ordered({t for t, _, _ in tasks}, group_order)
  rows = [row for t in types for row in sorted(
      (x for x in tasks if x[0] == t), key=lambda x: row_order(x[1], x[2]))]
  algos = sorted({a for (_, _, a) in groups}, key=label_key)
  blocks = []
  for what, name in metrics:
    columns, bases = _columns(algos, what, paper)
    is_paper = np.array([bool(b) for b in bases], bool)
    mean = np.full((len(rows), len(columns)), np.nan)
    std, lo, hi = (np.full_like(mean, np.nan) for _ in range(3))
    notes, marks, extra = {}, {}, {}
    below = np.zeros(mean.shape, bool)
    for i, (_, env, dataset) in enumerate(rows):
      for j, (label, base) in enumerate(zip(columns, bases)):
        if base:
          number, note = _paper_number(what, dataset, base)
          if number:
            mean[i, j], std[i, j] = number
          if note:
            notes[(i, j)] = note
          continue
        g = groups.get((env, dataset, label))
        if g is None:
          continue
        m, s = g.stat(what)
        if m is None:
          continue
        mean[i, j], std[i, j] = m, s
        if hasattr(g, "ci"):
          low, high = g.ci(what)
          if low is not None:
            lo[i, j], hi[i, j] = low, high
        marks[(i, j)] = table_cell_marks(g, what, label, dataset, digits)
        if hasattr(g, "stat_healthy"):
          mh, sh = g.stat_healthy(what)
          extra[(i, j)] = dict(seeds=len(g.seeds), diverged=len(g.diverged), mean_healthy=mh,
                               std_healthy=sh, below="; ".join(g.shortfalls))
        below[i, j] = bool(getattr(g, "shortfalls", None))
    marks = {k: v for k, v in marks.items() if v}
    ours = np.where(is_paper[None, :], np.nan, mean)
    # Beside the paper's numbers, a table cell below the paper's setup competes for nothing.
    ranked = ours if below_ranked else np.where(below, np.nan, ours)
    # Marks and ranks compare the numbers as printed (as_printed): equal as shown, equal here.
    ranked, shown_std = as_printed(ranked, digits), as_printed(std, digits)
    rule = [mark_row(ranked[i], shown_std[i]) for i in range(len(rows))]
    bold = np.array([b for b, _ in rule], bool).reshape(mean.shape)
    under = np.array([u for _, u in rule], bool).reshape(mean.shape)
    unranked = is_paper | (False if below_ranked else below.any(axis=0))
    # The paper's averages cover only the tasks where we ran its algorithm, so that they can be
    # read against ours; the paper's other numbers are in the rows, not in the average.
    averaged = _paper_where_ours_ran(mean, columns, bases)
    type_avg = {t: _average(averaged[[r[0] == t for r in rows]]) for t in types}
    avg, complete = _average(averaged)
    blocks.append(Block(name=name, mean=mean, std=std, bold=bold, under=under, type_avg=type_avg,
                        avg=avg, complete=complete,
                        avg_rank=average_ranks(as_printed(ours, digits)), digits=digits,
                        metric=what, columns=columns, paper=is_paper, lo=lo, hi=hi,
                        notes=notes, marks=marks, unranked=unranked, extra=extra))
  return Table(rows=rows, algos=algos, blocks=blocks)


def table_cell_marks(g, what: str, label: str, dataset: str,
                     digits: int = 1) -> List[Tuple[str, str]]:
  """[(mark, footnote)] of our table cell `g` (a Pool; a group without `diverged` / `shortfalls` has
  none): DIVERGED_MARK with how many seeds diverged, when, and the mean +- std of `what` over
  the others; BELOW_MARK with what its runs have less of than the paper's setup."""
  out = []
  diverged = getattr(g, "diverged", None) or {}
  if diverged:
    n = len(getattr(g, "seeds", ())) or len(diverged)
    when = ", ".join(f"seed {s} at epoch {e}" for s, e in sorted(diverged.items()))
    m, s = g.stat_healthy(what) if hasattr(g, "stat_healthy") else (None, None)
    rest = (f"over the {n - len(diverged)} others {m:.{digits}f} ± {s:.{digits}f}"
            if m is not None else "no other seed")
    out.append((DIVERGED_MARK, f"{label} on {dataset}: {len(diverged)} of {n} seeds diverged "
                f"({when}), counted at their frozen policy; {rest}"))
  short = getattr(g, "shortfalls", None)
  if short:
    out.append((BELOW_MARK, f"{label} on {dataset}: below the paper's setup: "
                + "; ".join(short)))
  return out


def _average(mean) -> Tuple[np.ndarray, np.ndarray]:
  """(mean over rows of mean [R, K] ignoring missing table cells (NaN where a column has none),
  complete [K]: the column has every row)."""
  mean = np.asarray(mean, float)
  count = np.sum(~np.isnan(mean), axis=0)
  avg = np.where(count > 0, np.nansum(mean, axis=0) / np.maximum(count, 1), np.nan)
  return avg, count == mean.shape[0]


def summary_best(values, highest=True, complete=None, exclude=None,
                 digits: Optional[int] = None) -> np.ndarray:
  """bool [K]: the bold table cells of a summary row (an average, an average rank): the best of
  `values` (never an `exclude`d column: the paper's); among the complete columns only, when some
  are complete (an algorithm run on one easy task must not win the average). digits: compared as
  printed with that many decimals (as_printed): values equal as shown are all bold."""
  v = as_printed(values, digits)
  if exclude is not None:
    v = np.where(exclude, np.nan, v)
  if complete is not None and np.any(complete & ~np.isnan(v)):
    v = np.where(complete, v, np.nan)
  if np.all(np.isnan(v)):
    return np.zeros(v.shape, bool)
  return v == (np.nanmax(v) if highest else np.nanmin(v))
