"""The report over many runs: `write_report(dirs, out)` finds the run workdirs under `dirs`,
groups them (mombo_jax.report.results: every seed of all runs of one environment, dataset, algorithm
and setup pooled, a diverged seed at its frozen policy; one seed in two folders refused; runs of
different setups are separate columns named by what differs over the whole table), builds
the tables (mombo_jax.report.tables: the paper's layout and table rule, the paper's
published numbers beside ours; the mixed datasets in a table of their own in the layout of the
paper's appendix table results_mixed, mombo_jax.report.mixed) and writes them as report.md,
report.tex and report.csv, with the learning curves as curves_<env>.png.

Each cell gives the mean over seeds, the std over seeds and a 95% percentile-bootstrap interval of
the mean over seeds; the paper's columns give its own mean and std, with footnotes saying what
they are. A cell with diverged seeds is marked ‡ and a cell below the paper's setup (fewer
gradient steps, a smaller preset, a reduced dataset) §, each with a footnote under its table
(mombo_jax.report.tables); beside the paper's numbers a § cell is never bold or underlined.

Protocol: every summary.json names the reporting protocol its numbers follow (outputs.PROTOCOL,
docs/protocol.md), and report.md links that page. Summaries of protocol/1 (whose means left
diverged seeds out; its per-seed scores are protocol/2's) and summaries written before the field
existed are read with a warning and a note: the report computes every number from the per-seed
scores, over every seed. Any other protocol is refused (one line naming the runs).

Across tasks: the section *Across tasks (rliable)* of report.md and performance_profile.png
(mombo_jax.report.aggregates: IQM, median, mean, optimality gap, probability of improvement,
performance profiles with stratified-bootstrap intervals), when rliable (the extra `report`) is
installed.
"""
from __future__ import annotations

import os
import re
from typing import Dict, List, Optional, Sequence

import numpy as np

from mombo_jax.errors import UserError
from mombo_jax.records import outputs
from mombo_jax.records.run_search import find_runs
from mombo_jax.records.workdir import RUN_FILES
from mombo_jax.report import aggregates, mixed, paper_results
from mombo_jax.report.curves import plot_curves
from mombo_jax.report.labels import label_key
from mombo_jax.report.paper_setup import paper_dataset
from mombo_jax.report.protocols import check_protocols, protocol_line
from mombo_jax.report.results import (
  CI_LEVEL,
  ENV_ORDER,
  LAST_K,
  N_BOOTSTRAP,
  TYPE_ORDER,
  Pool,
  beta_text,
  check_duplicates,
  dataset_type,
  group_runs,
  ordered,
  read_run,
)
from mombo_jax.report.tables import (
  BELOW_MARK,
  DIVERGED_MARK,
  PAPER,
  Block,
  Table,
  build_table,
  summary_best,
)
from mombo_jax.storage import atomic

MISSING = "–"
MIXED_TITLE = "Mixed datasets (the paper's appendix table results_mixed)"


# -------------------------------------------------------------------------------- rendering

def _fmt(x, digits=1) -> str:
  return MISSING if x is None or np.isnan(x) else f"{x:.{digits}f}"


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


def render_markdown(table: Table, title: str = "Results", what: str = "over seeds",
                    groups: Optional[Dict[tuple, Pool]] = None,
                    preamble: Sequence[str] = (), lead=None, lead_header: Sequence[str] = (
                        "Dataset type", "Environment"), heading: str = "#") -> str:
  """report.md: one table per block; bold **x**, underline <u>x</u>; the paper's columns plain.
  groups: adds a *Runs* table (seeds, beta, evaluations, folders of every cell). preamble:
  paragraphs under the title (the protocol's link). lead(row) -> the row's labels under
  lead_header (default: its group, i.e. dataset type, and environment; the mixed table's:
  mombo_jax.report.mixed.lead_cells). heading: the title's level (its tables one below)."""
  lead = lead or (lambda row: [row[0], row[1]])
  ci = any(b.has_ci() for b in table.blocks)
  lines = [f"{heading} {title}", ""] + [x for p in preamble for x in (p, "")] + [
           f"Mean ± std {what}"
           + (f" [{CI_LEVEL:.0%} percentile-bootstrap interval of the mean over seeds, "
              f"{N_BOOTSTRAP:,} resamples; with one seed, the value itself]" if ci else "")
           + ". Per row, the highest mean of our columns is **bold**; "
           "a mean within one std of the best score (best − mean ≤ std of the best) is "
           "<u>underlined</u>" + (f"; the paper's columns, and cells below the paper's setup "
                                  f"({BELOW_MARK}), take no part" if _has_paper(table) else "")
           + ". Average rank: mean over tasks of the rank of the mean (1 = best, "
           f"ties share their average rank). {DIVERGED_MARK}: seeds of the cell diverged (they "
           f"count, at their frozen policy); {BELOW_MARK}: below the paper's setup; the "
           "footnotes under each table say which.", ""]
  notes = paper_footnotes(table)
  if notes:
    lines += [n for note in notes for n in (note, "")]
  for b in table.blocks:
    columns = table.columns_of(b)
    paper = b.paper_mask()
    lines += [f"{heading}# {b.name}", "",
              "| " + " | ".join(list(lead_header) + columns) + " |",
              "|---" * len(lead_header) + "|" + "---:|" * len(columns)]
    pad = len(lead_header) - 1
    for i, row in enumerate(table.rows):
      dtype = row[0]
      cells = []
      for j in range(len(columns)):
        if np.isnan(b.mean[i, j]):
          cells.append(MISSING)
          continue
        text = f"{b.mean[i, j]:.{b.digits}f} ± {b.std[i, j]:.{b.digits}f}"
        text = f"**{text}**" if b.bold[i, j] else f"<u>{text}</u>" if b.under[i, j] else text
        if b.lo is not None and not np.isnan(b.lo[i, j]):
          text += f" [{b.lo[i, j]:.{b.digits}f}, {b.hi[i, j]:.{b.digits}f}]"
        if (i, j) in b.notes:
          text += " †"
        text += "".join(f" {mark}" for mark, _ in b.marks.get((i, j), []))
        cells.append(text)
      lines.append("| " + " | ".join(list(lead(row)) + cells) + " |")
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
    lines += [x for note in mark_footnotes(b) for x in (note, "")]
  if groups:
    lines += _md_runs(groups)
  return "\n".join(lines)


def _has_paper(table: Table) -> bool:
  return any(b.paper_mask().any() for b in table.blocks)


def mark_footnotes(b: Block) -> List[str]:
  """The footnotes of block b's marked cells of ours (DIVERGED_MARK, BELOW_MARK), one per cell
  and mark, in the table's order."""
  return [f"{mark} {text}." for _, cell in sorted(b.marks.items()) for mark, text in cell]


def _md_summary_row(label, values, complete, highest, digits=1, paper=None, pad=1) -> str:
  best = summary_best(values, highest, complete, exclude=paper, digits=digits)
  cells = []
  for j, v in enumerate(values):
    text = _fmt(v, digits)
    if not complete[j] and text != MISSING:
      text += "\\*"
    cells.append(f"**{text}**" if best[j] else text)
  return f"| {label} | " + "| " * pad + " | ".join(cells) + " |"


def _md_runs(groups: Dict[tuple, Pool]) -> List[str]:
  """The *Runs* section: what every cell pools."""
  lines = ["## Runs", "",
           "Each row pools runs of one setup (config.json but seeds and evaluation fields); an "
           "algorithm run with several setups has a column per setup, its label naming the "
           "fields that differ over the whole table (`field=default`: each task's paper-preset "
           "value). "
           f"Seeds: every seed pooled in the cell; {DIVERGED_MARK} marks one that diverged (frozen "
           "at its last healthy state, its policy evaluated and counted like the others). "
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
  for k in keys:
    g = groups[k]
    seeds = ", ".join(f"{s}{DIVERGED_MARK if s in g.diverged else ''}" for s in g.seeds)
    diverged = f", {len(g.diverged)} diverged" if g.diverged else ""
    last_step = int(g.steps[-1]) if len(g.steps) else MISSING
    over = (MISSING if g.overestimated is None
            else ", ".join(map(str, g.overestimated)) or "none")
    below = f" {BELOW_MARK}" if g.shortfalls else ""
    steps = MISSING if g.gradient_steps is None else f"{g.gradient_steps:,}"
    transitions = MISSING if g.transitions is None else f"{g.transitions:,}"
    lines.append(f"| {g.dataset} | {g.algo} | {beta_text(g.beta)} | {len(g.seeds)} ({seeds})"
                 f"{diverged} | {g.evaluations or len(g.steps)} | {last_step} | {steps}{below} | "
                 f"{transitions} | {over} | " + "<br>".join(f"`{r}`" for r in g.runs) + " |")
  lines.append("")
  return lines


def _tex_escape(s: str) -> str:
  return s.replace("\\", r"\textbackslash{}").replace("_", r"\_").replace("&", r"\&") \
      .replace("%", r"\%").replace("#", r"\#").replace("β", r"$\beta$") \
      .replace("<", r"\textless{}").replace(">", r"\textgreater{}")


def render_latex(table: Table, lead=None,
                 lead_header: Sequence[str] = ("Dataset Type", "Environment")) -> str:
  """report.tex: one tabular per block in the paper's style (booktabs, multirow; \\sd and
  lightgray rows as in the paper's preamble, defined here if missing), each algorithm's column
  followed by the paper's, and the footnotes on the paper's columns. lead, lead_header: as
  render_markdown's (the first label spans its group's rows)."""
  out = [r"% Generated by experiments.report; needs \usepackage{booktabs,multirow,colortbl}.",
         r"\providecommand{\sd}[1]{{\scriptsize #1}}"]
  for b in table.blocks:
    out += _tex_block(table, b, lead or (lambda row: [row[0], row[1]]), lead_header)
    marks = mark_footnotes(b)
    if marks:
      out += [r"{\footnotesize"] + [_md_to_tex(n) + r" \par" for n in marks] + ["}"]
    out += [r"\par\medskip", ""]
  notes = paper_footnotes(table)
  if notes:
    out += [r"{\footnotesize"] + [_md_to_tex(n) + r" \par" for n in notes] + ["}"]
  out.append("")
  return "\n".join(out)


def _md_to_tex(line: str) -> str:
  """One footnote line of report.md in LaTeX: `code` -> \\texttt, *emphasis* and quotes plain."""
  out = []
  for part in re.split(r"(`[^`]+`)", line):
    if len(part) > 1 and part[0] == part[-1] == "`":
      out.append(r"\texttt{" + _tex_escape(part[1:-1]) + "}")
      continue
    part = re.sub(r"\*([^*]+)\*", r"\1", part)
    part = re.sub(r'"([^"]*)"', r"``\1''", _tex_escape(part))
    out.append(part.replace("†", r"${}^{\dagger}$").replace(DIVERGED_MARK, r"${}^{\ddagger}$")
               .replace(BELOW_MARK, r"\S{}").replace("±", r"$\pm$").replace(MISSING, "--"))
  return "".join(out)


def _tex_block(table: Table, b: Block, lead, lead_header: Sequence[str]) -> List[str]:
  columns = table.columns_of(b)
  paper = b.paper_mask()
  k, n = len(columns), len(lead_header)
  algo_cells = " & ".join(rf"\texttt{{{_tex_escape(a)}}}" for a in columns)
  out = [f"% {b.name}", r"\begin{tabular}{@{}" + "c" * (n + k) + "@{}}", r"\toprule",
         "  " + "".join(rf"\multirow{{2}}{{*}}{{{_tex_escape(h)}}} & " for h in lead_header),
         rf"  \multicolumn{{{k}}}{{c}}{{\textsc{{{_tex_escape(b.name)}}} ($\uparrow$)}}",
         rf"  \\ \cmidrule(lr){{{n + 1}-{n + k}}}", "  " + "& " * n + algo_cells,
         r"  \\ \midrule"]
  types = []
  for t, _, _ in table.rows:
    if t not in types:
      types.append(t)
  for t in types:
    idx = [i for i, r in enumerate(table.rows) if r[0] == t]
    for m, i in enumerate(idx):
      labels = lead(table.rows[i])
      first = (rf"\multirow{{{len(idx)}}}{{*}}{{\texttt{{{_tex_escape(labels[0])}}}}}"
               if m == 0 else "")
      cells = [first] + [rf"\texttt{{{_tex_escape(x)}}}" for x in labels[1:]]
      for j in range(k):
        if np.isnan(b.mean[i, j]):
          cells.append("--")
          continue
        body = rf"{b.mean[i, j]:.{b.digits}f} \sd{{\pm {b.std[i, j]:.{b.digits}f}}}"
        if b.bold[i, j]:
          body = rf"{{\bf {body}}}"
        elif b.under[i, j]:
          body = rf"\underline{{{body}}}"
        if b.lo is not None and not np.isnan(b.lo[i, j]):
          body += rf"\ \sd{{[{b.lo[i, j]:.{b.digits}f}, {b.hi[i, j]:.{b.digits}f}]}}"
        if (i, j) in b.notes:
          body += r"{}^{\dagger}"
        body += "".join(r"{}^{\ddagger}" if mark == DIVERGED_MARK else r"{}^{\S}"
                        for mark, _ in b.marks.get((i, j), []))
        cells.append(f"${body}$")
      out.append("  " + " & ".join(cells) + r" \\")
    if len(idx) > 1:
      out.append(_tex_summary(rf"Average on \texttt{{{_tex_escape(t)}}}",
                              *b.type_avg[t], True, b.unranked_mask(), b.digits, n))
    out.append(r"  \midrule")
  out.append(_tex_summary("Average Score", b.avg, b.complete, True, b.unranked_mask(), b.digits,
                          n))
  out.append(_tex_summary("Average Ranking", np.where(paper, np.nan, b.avg_rank), b.complete,
                          False, b.unranked_mask(), 1, n))
  out += [r"\bottomrule", r"\end{tabular}"]
  return out


def _tex_summary(label, values, complete, highest, paper, digits=1, n=2) -> str:
  best = summary_best(values, highest, complete, exclude=paper, digits=digits)
  cells = []
  for j, v in enumerate(values):
    text = _fmt(v, digits) + ("" if complete[j] else "^*")
    cells.append("--" if np.isnan(v) else (rf"$\bf {text}$" if best[j] else f"${text}$"))
  return (rf"  \rowcolor{{lightgray!50}} \multicolumn{{{n}}}{{r}}{{" + label + "} & "
          + " & ".join(cells)
          + r" \\")


def render_csv(table: Optional[Table], path: str, more: Sequence[Table] = ()):
  """report.csv: one row per (dataset, column, metric) cell that has a number, ours and the
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
  outputs.write_rows(path, rows, fields=["env", "dataset", "column", "metric", "mean", "std",
                                         "ci_low", "ci_high", "source", "seeds", "diverged",
                                         "mean_healthy", "std_healthy", "below_paper_setup"])


# ------------------------------------------------------------------------------------ driver

def write_report(dirs: Sequence[str], out: Optional[str] = None, log=print) -> dict:
  """Finds, groups, writes report.md, report.tex, report.csv, curves_<env>.png into `out`
  (default dirs[0]), with the paper's numbers beside ours.

  Warnings (skipped folders, short runs, runs of protocol/1 or without a protocol field) go to
  `log`. Returns {"runs", "groups", "table" (the D4RL-style table; None when every run is on a
  mixed dataset), "mixed_table" (None without mixed datasets), "files"}. Raises UserError when
  no run is found (naming the folders searched), when a run follows another protocol
  (check_protocols), when one (setup, seed) is in two folders (results.check_duplicates), when a
  seed has no finite score
  (results.read_run), and atomic.WriteError when `out` cannot be written (nothing half-written
  is left: each file goes through a rename); every refusal comes before anything is written.
  """
  if not dirs:
    raise UserError("Pass at least one folder to search for runs.")
  out = out or dirs[0]
  paths, warnings = find_runs(dirs)
  # One folder reached by two spellings (runs/ and /abs/runs/) is one run.
  paths = list({os.path.realpath(p): p for p in reversed(paths)}.values())[::-1]
  runs = []
  for p in paths:
    try:
      runs.append(read_run(p))
    except ValueError as e:
      warnings.append(f"warning: skipping {p}: {e}")
  notes = []
  if runs:   # before any warning or work: another protocol, a seed counted twice, an unwritable
    notes = check_protocols(runs)   # --out are one line
    check_duplicates(runs)
    atomic.check_writable(out)
  for w in warnings:
    log(w)
  if not runs:
    raise UserError(f"No runs found under {', '.join(dirs)} (a run folder holds "
                    f"{', '.join(RUN_FILES)}, written by experiments.run)"
                    + (f"; {len(warnings)} folder(s) were skipped, see the warnings above."
                       if warnings else "."))
  for w in notes:
    log(w)
  groups, more = group_runs(runs)
  for w in more:
    log(w)
  # The mixed datasets get the paper's appendix table (mombo_jax.report.mixed), the rest Table 1's.
  main, mixed_groups = mixed.split(groups)
  table = build_table(main, paper=True) if main or not mixed_groups else None
  mixed_table = mixed.build_mixed_table(mixed_groups) if mixed_groups else None
  files = [os.path.join(out, name) for name in ("report.md", "report.tex", "report.csv")]
  # Across-task aggregates (rliable, an optional extra): a section of its own after the tables.
  across, figures = aggregates.report_section(groups, out, log=log, order=label_key)
  what = ("over every seed (population std, ddof = 0; diverged seeds count at their frozen "
          "policy)")
  title, preamble = f"Results of {len(runs)} run(s)", [protocol_line(out, runs)]
  text = (render_markdown(table, title=title, what=what, preamble=preamble) if table
          else "\n".join([f"# {title}", ""] + [x for p in preamble for x in (p, "")]))
  tex = render_latex(table) if table else ""
  if mixed_table:
    text += "\n" + render_markdown(
        mixed_table, title=MIXED_TITLE, what=what, preamble=[mixed.what_ran(mixed_groups)],
        lead=mixed.lead_cells, lead_header=mixed.LEAD_HEADER, heading="##")
    tex += f"% {MIXED_TITLE}\n" + render_latex(mixed_table, mixed.lead_cells, mixed.LEAD_HEADER)
  text += "\n" + "\n".join(_md_runs(groups))
  atomic.write_text(files[0], text + across)
  atomic.write_text(files[1], f"% Protocol: {outputs.PROTOCOL} ({outputs.PROTOCOL_DOC}).\n"
                     + tex)
  render_csv(table, files[2], [mixed_table] if mixed_table else [])
  for env in ordered({k[0] for k in groups}, ENV_ORDER):
    files.append(os.path.join(out, f"curves_{env}.png"))
    plot_curves(groups, env, files[-1])
  files += figures
  return dict(runs=runs, groups=groups, table=table, mixed_table=mixed_table, files=files)
