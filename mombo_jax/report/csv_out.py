"""report.csv (mombo_jax.report.writer writes it with the other files): `render_csv` writes one
row per table cell of a Table (mombo_jax.report.tables) that has a number, ours and the paper's."""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from mombo_jax.records import outputs
from mombo_jax.report import paper_results
from mombo_jax.report.paper_setup import paper_dataset
from mombo_jax.report.tables import Table

FIELDS = ["env", "dataset", "column", "metric", "mean", "std", "ci_low", "ci_high", "source",
          "seeds", "diverged", "mean_healthy", "std_healthy", "below_paper_setup"]


def render_csv(table: Optional[Table], path: str, more: Sequence[Table] = ()):
  """report.csv: one row per (dataset, column, metric) table cell that has a number, ours and the
  paper's: mean, std, ci_low / ci_high (ours), source ('ours' or the paper's table); ours also
  seeds (every seed: the mean's), diverged (how many of them), mean_healthy / std_healthy (over
  the seeds that did not diverge) and below_paper_setup (what falls short, '' when nothing).
  more: further tables (the mixed datasets'), their rows after table's (None: none)."""
  rows = []
  for table, b in [(t, b) for t in [table, *more] if t is not None for b in t.blocks]:
    columns = table.columns_of(b)
    paper = b.paper_mask()
    for i, (_, env, dataset) in enumerate(table.rows):
      for j, col in enumerate(columns):
        if np.isnan(b.mean[i, j]):
          continue
        has_ci = b.lo is not None and not np.isnan(b.lo[i, j])
        extra = {k: ("" if v is None else v) for k, v in b.extra.get((i, j), {}).items()}
        rows.append(dict(
            env=env, dataset=dataset, column=col, metric=b.metric or b.name,
            mean=float(b.mean[i, j]), std=float(b.std[i, j]),
            ci_low=float(b.lo[i, j]) if has_ci else "", ci_high=float(b.hi[i, j]) if has_ci else "",
            source=(paper_results.source(b.metric, paper_dataset(dataset)) if paper[j]
                    else "ours"),
            seeds=extra.get("seeds", ""), diverged=extra.get("diverged", ""),
            mean_healthy=extra.get("mean_healthy", ""), std_healthy=extra.get("std_healthy", ""),
            below_paper_setup=extra.get("below", "")))
  outputs.write_rows(path, rows, fields=FIELDS)
