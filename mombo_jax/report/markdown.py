"""report.md's tables (mombo_jax.report.writer writes the file): `render_markdown` renders a Table
(mombo_jax.report.tables) one block per markdown table, bold **x** for the best of our columns
and <u>x</u> for those within one std of it, the paper's columns plain, each block's average
rows and footnotes under it; `runs_section` is the *Runs* table, what every table cell pools."""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import numpy as np

from mombo_jax.report.footnotes import MISSING, fmt, has_paper, mark_footnotes, paper_footnotes
from mombo_jax.report.labels import label_key
from mombo_jax.report.results import (
  CI_LEVEL,
  ENV_ORDER,
  LAST_K,
  N_BOOTSTRAP,
  TYPE_ORDER,
  Pool,
  beta_text,
  dataset_type,
)
from mombo_jax.report.tables import BELOW_MARK, DIVERGED_MARK, Block, Table, summary_best

LEAD_HEADER = ("Dataset type", "Environment")


def default_lead(row: tuple) -> List[str]:
  """A row's labels under LEAD_HEADER: its group (the dataset type) and its environment."""
  return [row[0], row[1]]


def render_markdown(table: Table, title: str = "Results", what: str = "over seeds",
                    groups: Optional[Dict[tuple, Pool]] = None,
                    preamble: Sequence[str] = (), lead=None,
                    lead_header: Sequence[str] = LEAD_HEADER, heading: str = "#") -> str:
  """report.md: one table per block; bold **x**, underline <u>x</u>; the paper's columns plain.
  groups: adds a *Runs* table (seeds, beta, evaluations, folders of every table cell). preamble:
  paragraphs under the title (the protocol's link). lead(row) -> the row's labels under
  lead_header (default: default_lead, its group, i.e. dataset type, and environment; the mixed
  table's: mombo_jax.report.mixed.lead_cells). heading: the title's level (its tables one
  below)."""
  lead = lead or default_lead
  lines = [f"{heading} {title}", ""] + [x for p in preamble for x in (p, "")]
  lines += [_legend(table, what), ""]
  lines += [n for note in paper_footnotes(table) for n in (note, "")]
  for b in table.blocks:
    lines += _md_block(table, b, lead, lead_header, heading)
  if groups:
    lines += runs_section(groups)
  return "\n".join(lines)


def _legend(table: Table, what: str) -> str:
  """The paragraph under the title: what a table cell is, what bold, underline and the marks
  mean."""
  ci = any(b.has_ci() for b in table.blocks)
  return (f"Mean ± std {what}"
          + (f" [{CI_LEVEL:.0%} percentile-bootstrap interval of the mean over seeds, "
             f"{N_BOOTSTRAP:,} resamples; with one seed, the value itself]" if ci else "")
          + ". Per row, the highest mean of our columns is **bold**; "
          "a mean within one std of the best score (best − mean ≤ std of the best) is "
          "<u>underlined</u>" + (f"; the paper's columns, and table cells below the paper's setup "
                                 f"({BELOW_MARK}), take no part" if has_paper(table) else "")
          + ". Average rank: mean over tasks of the rank of the mean (1 = best, "
          f"ties share their average rank). {DIVERGED_MARK}: seeds of the table cell diverged "
          f"(they count, at their frozen policy); {BELOW_MARK}: below the paper's setup; the "
          "footnotes under each table say which.")


def _md_block(table: Table, b: Block, lead, lead_header: Sequence[str],
              heading: str) -> List[str]:
  """Block b's lines: its heading, its table (a row per task, an average row per dataset type
  of more than one task, the average score and rank) and the footnotes under it."""
  columns = table.columns_of(b)
  paper = b.paper_mask()
  lines = [f"{heading}# {b.name}", "",
           "| " + " | ".join(list(lead_header) + columns) + " |",
           "|---" * len(lead_header) + "|" + "---:|" * len(columns)]
  pad = len(lead_header) - 1
  for i, row in enumerate(table.rows):
    dtype = row[0]
    fields = [_md_cell(b, i, j) for j in range(len(columns))]
    lines.append("| " + " | ".join(list(lead(row)) + fields) + " |")
    last_of_type = i + 1 == len(table.rows) or table.rows[i + 1][0] != dtype
    if last_of_type and sum(r[0] == dtype for r in table.rows) > 1:
      lines.append(_md_summary_row(f"*Average on {dtype}*", *b.type_avg[dtype], True,
                                   b.digits, b.unranked_mask(), pad))
  lines.append(_md_summary_row("**Average score**", b.avg, b.complete, True, b.digits,
                               b.unranked_mask(), pad))
  lines.append(_md_summary_row("**Average rank**", np.where(paper, np.nan, b.avg_rank),
                               b.complete, False, 1, b.unranked_mask(), pad))
  lines.append("")
  if not b.complete.all():
    lines += ["\\* averaged over the tasks the column has (not all of them).", ""]
  return lines + [x for note in mark_footnotes(b) for x in (note, "")]


def _md_cell(b: Block, i: int, j: int) -> str:
  """Table cell (i, j) of block b: mean ± std, bold or underlined, its interval, † and its marks."""
  if np.isnan(b.mean[i, j]):
    return MISSING
  text = f"{b.mean[i, j]:.{b.digits}f} ± {b.std[i, j]:.{b.digits}f}"
  text = f"**{text}**" if b.bold[i, j] else f"<u>{text}</u>" if b.under[i, j] else text
  if b.lo is not None and not np.isnan(b.lo[i, j]):
    text += f" [{b.lo[i, j]:.{b.digits}f}, {b.hi[i, j]:.{b.digits}f}]"
  if (i, j) in b.notes:
    text += " †"
  return text + "".join(f" {mark}" for mark, _ in b.marks.get((i, j), []))


def _md_summary_row(label, values, complete, highest, digits=1, paper=None, pad=1) -> str:
  best = summary_best(values, highest, complete, exclude=paper, digits=digits)
  fields = []
  for j, v in enumerate(values):
    text = fmt(v, digits)
    if not complete[j] and text != MISSING:
      text += "\\*"
    fields.append(f"**{text}**" if best[j] else text)
  return f"| {label} | " + "| " * pad + " | ".join(fields) + " |"


def runs_section(groups: Dict[tuple, Pool]) -> List[str]:
  """The *Runs* section: what every table cell pools."""
  lines = ["## Runs", "",
           "Each row pools runs of one setup (config.json but seeds and evaluation fields); an "
           "algorithm run with several setups has a column per setup, its label naming the "
           "fields that differ over the whole table (`field=default`: each task's paper-preset "
           "value). "
           f"Seeds: every seed pooled in the table cell; {DIVERGED_MARK} marks one that diverged "
           "(frozen at its last healthy state, its policy evaluated and counted like the others). "
           f"Evaluations: the fewest of its runs (the window of 'last {LAST_K}' when fewer). β: "
           "config.beta (MOMBO / MOBILE β, MOPO λ). Steps: gradient steps (epochs × "
           f"steps_per_epoch); Transitions: the dataset's ({MISSING}: not recorded); "
           f"{BELOW_MARK}: below the paper's setup (footnotes above). Q > bound: the seeds whose "
           "critics' mean Q passed the return bound max|r| / (1 − γ) (overestimation; "
           f"{MISSING}: not recorded by the run).",
           "",
           "| Dataset | Algorithm | β | Seeds | Evaluations | Last step | Steps | Transitions "
           "| Q > bound | Runs |",
           "|---|---|---:|---|---:|---:|---:|---:|---|---|"]
  keys = sorted(groups, key=lambda k: (ENV_ORDER.index(k[0]) if k[0] in ENV_ORDER else 99,
                                       TYPE_ORDER.index(dataset_type(k[1]))
                                       if dataset_type(k[1]) in TYPE_ORDER else 99, k[1],
                                       label_key(k[2])))
  lines += [_runs_row(groups[k]) for k in keys]
  lines.append("")
  return lines


def _runs_row(g: Pool) -> str:
  """One row of the *Runs* table: pool g's dataset, algorithm, β, seeds, budget and folders."""
  seeds = ", ".join(f"{s}{DIVERGED_MARK if s in g.diverged else ''}" for s in g.seeds)
  diverged = f", {len(g.diverged)} diverged" if g.diverged else ""
  last_step = int(g.steps[-1]) if len(g.steps) else MISSING
  over = (MISSING if g.overestimated is None
          else ", ".join(map(str, g.overestimated)) or "none")
  below = f" {BELOW_MARK}" if g.shortfalls else ""
  steps = MISSING if g.gradient_steps is None else f"{g.gradient_steps:,}"
  transitions = MISSING if g.transitions is None else f"{g.transitions:,}"
  return (f"| {g.dataset} | {g.algo} | {beta_text(g.beta)} | {len(g.seeds)} ({seeds})"
          f"{diverged} | {g.evaluations or len(g.steps)} | {last_step} | {steps}{below} | "
          f"{transitions} | {over} | " + "<br>".join(f"`{r}`" for r in g.runs) + " |")
