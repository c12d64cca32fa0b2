"""What report.md and report.tex say the same way (mombo_jax.report.markdown and .latex): the
blank table cell (MISSING), a summary number as printed (`fmt`), the footnotes on the paper's
columns (`paper_footnotes`) and on our marked table cells (`mark_footnotes`: DIVERGED_MARK,
BELOW_MARK, mombo_jax.report.tables). Written in markdown; latex.md_to_tex turns a line into
LaTeX."""
from __future__ import annotations

from typing import List

import numpy as np

from mombo_jax.report import paper_results
from mombo_jax.report.tables import PAPER, Block, Table

MISSING = "–"


def fmt(x, digits=1) -> str:
  """x to `digits` decimals; MISSING for None or NaN."""
  return MISSING if x is None or np.isnan(x) else f"{x:.{digits}f}"


def has_paper(table: Table) -> bool:
  """Whether any block of the table has a column of the paper's numbers."""
  return any(b.paper_mask().any() for b in table.blocks)


def paper_footnotes(table: Table) -> List[str]:
  """The lines that say what the paper's columns are (empty when the table has none)."""
  if not any(b.paper is not None and b.paper.any() for b in table.blocks):
    return []
  lines = [
      f"*({PAPER})* columns: the paper's number ({paper_results.CITATION}; Table 1 for "
      "D4RL, the appendix's mixed-data table for `-pct` datasets): mean ± std over its 4 seeds, "
      f"after 3M gradient steps (D4RL) or 2M (mixed); {MISSING} where the paper has none "
      "(expert datasets, other Minari ids, metrics it does not report). Its averages cover the "
      "tasks where we ran that algorithm.",
      f"*MOMBO ({PAPER})* is the paper's MOMBO, i.e. its released code, whose Bellman target is "
      f"`{paper_results.PAPER_MOMBO_TARGET}`: compare it with the "
      f"MOMBO ({paper_results.PAPER_MOMBO_TARGET}) column. MOMBO (lcb) is the paper's written "
      "equation, MOMBO (mixture) this package's extension; the paper reports neither.",
      "The paper trained on D4RL's v2 files (a dataset named `d4rl/<env>/<quality>-v2` is those "
      "files, imported by experiments.import_d4rl) and evaluated in gym's v2 MuJoCo envs; this "
      "package evaluates every dataset in gymnasium v5, an imported walker2d dataset in D4RL's v2 "
      "walker model (right-foot friction 0.9); a short name is a dataset rebuilt here with D4RL's "
      "recipe, evaluated in v5's own model. Expect "
      "agreement in level, not to the decimal, and only for runs of the paper's budget (report.md, "
      "*Runs*: last step)."]
  for b in table.blocks:
    for (i, j), note in sorted(b.notes.items()):
      line = f"† {note}."
      if line not in lines:
        lines.append(line)
  return lines


def mark_footnotes(b: Block) -> List[str]:
  """The footnotes of block b's marked table cells of ours (DIVERGED_MARK, BELOW_MARK), one per
  table cell and mark, in the table's order."""
  return [f"{mark} {text}." for _, marked in sorted(b.marks.items()) for mark, text in marked]
