"""The report over many runs: `write_report(dirs, out)` finds the run workdirs under `dirs`,
groups them (mombo_jax.report.results: every seed of all runs of one environment, dataset, algorithm
and setup pooled, a diverged seed at its frozen policy; one seed in two folders refused; runs of
different setups are separate columns named by what differs over the whole table), builds
the tables (mombo_jax.report.tables: the paper's layout and table rule, the paper's
published numbers beside ours; the mixed datasets in a table of their own in the layout of the
paper's appendix table results_mixed, mombo_jax.report.mixed) and writes them as report.md,
report.tex and report.csv, with the learning curves as curves_<env>.png. This module is the
driver (find, read, check, group, build, write); the renderings are mombo_jax.report.markdown
(report.md), mombo_jax.report.latex (report.tex) and mombo_jax.report.csv_out (report.csv), their
shared footnotes mombo_jax.report.footnotes, the curves mombo_jax.report.curves.

Each table cell gives the mean over seeds, the std over seeds and a 95% percentile-bootstrap
interval of the mean over seeds; the paper's columns give its own mean and std, with footnotes
saying what they are. A table cell with diverged seeds is marked ‡ and a table cell below the
paper's setup (fewer gradient steps, a smaller preset, a reduced dataset) §, each with a footnote
under its table (mombo_jax.report.tables); beside the paper's numbers a § table cell is never
bold or underlined.

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
from typing import List, Optional, Sequence

from mombo_jax.errors import UserError
from mombo_jax.records import outputs
from mombo_jax.records.run_search import find_runs
from mombo_jax.records.workdir import RUN_FILES
from mombo_jax.report import aggregates, mixed
from mombo_jax.report.csv_out import render_csv
from mombo_jax.report.curves import plot_curves
from mombo_jax.report.labels import label_key
from mombo_jax.report.latex import render_latex
from mombo_jax.report.markdown import render_markdown, runs_section
from mombo_jax.report.protocols import check_protocols, protocol_line
from mombo_jax.report.results import (
  ENV_ORDER,
  Run,
  check_duplicates,
  group_runs,
  ordered,
  read_run,
)
from mombo_jax.report.tables import build_table
from mombo_jax.storage import atomic

MIXED_TITLE = "Mixed datasets (the paper's appendix table results_mixed)"
WHAT = "over every seed (population std, ddof = 0; diverged seeds count at their frozen policy)"


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
  runs = _read_runs(dirs, out, log)
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
  title, preamble = f"Results of {len(runs)} run(s)", [protocol_line(out, runs)]
  text = (render_markdown(table, title=title, what=WHAT, preamble=preamble) if table
          else "\n".join([f"# {title}", ""] + [x for p in preamble for x in (p, "")]))
  tex = render_latex(table) if table else ""
  if mixed_table:
    text += "\n" + render_markdown(
        mixed_table, title=MIXED_TITLE, what=WHAT, preamble=[mixed.what_ran(mixed_groups)],
        lead=mixed.lead_cells, lead_header=mixed.LEAD_HEADER, heading="##")
    tex += f"% {MIXED_TITLE}\n" + render_latex(mixed_table, mixed.lead_cells, mixed.LEAD_HEADER)
  text += "\n" + "\n".join(runs_section(groups))
  atomic.write_text(files[0], text + across)
  atomic.write_text(files[1], f"% Protocol: {outputs.PROTOCOL} ({outputs.PROTOCOL_DOC}).\n"
                     + tex)
  render_csv(table, files[2], [mixed_table] if mixed_table else [])
  for env in ordered({k[0] for k in groups}, ENV_ORDER):
    files.append(os.path.join(out, f"curves_{env}.png"))
    plot_curves(groups, env, files[-1])
  files += figures
  return dict(runs=runs, groups=groups, table=table, mixed_table=mixed_table, files=files)


def _read_runs(dirs: Sequence[str], out: str, log) -> List[Run]:
  """The runs under `dirs`, each folder once, its warnings logged; refuses (UserError, one line)
  no run, another protocol, a seed counted twice and an unwritable `out` before anything is
  written or logged but the warnings."""
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
  return runs
