"""The mixed datasets' table in the paper's layout (its appendix table results_mixed, "Performance
evaluation on the mixed dataset"): rows grouped by the partner's share (1, 5, 10, 50 %), within
a share by partner (random-medium, then random-expert) and environment, an average per share,
then the overall average score and average rank; one block per metric the paper reports
(normalised score at the last evaluation, AULC), each of our columns followed by the paper's
number (paper_results.MIXED). The rule, marks and averages are mombo_jax.report.tables', so a
table cell below the paper's setup (fewer gradient steps, a reduced dataset or partner: §) competes
for nothing beside the paper's numbers.

`split` takes the mixed datasets' groups out of a report's groups (the D4RL table keeps the
rest); `build_mixed_table` builds the table; `lead_cells` / LEAD_HEADER are the row labels
mombo_jax.report.markdown and .latex render in front of the numbers; `what_ran` is the sentence
that says, above the table, what our table cells ran (seeds, gradient steps, what falls short of the
paper's).
"""
from __future__ import annotations

import re
from typing import Dict, List, Optional, Tuple

from mombo_jax.data import names
from mombo_jax.report.paper_setup import paper_dataset
from mombo_jax.report.results import ENV_ORDER, Pool
from mombo_jax.report.tables import Table, build_table

# The paper's mixed table reports these two metrics (no "last K" mean).
MIXED_METRICS = (("final", "Normalised score (final evaluation), mixed datasets"),
                 ("aulc", "AULC, mixed datasets"))
LEAD_HEADER = ("Ratio (%)", "Dataset type", "Environment")
_MIXED = re.compile(r"([a-z0-9]+)-random-(medium|expert)-(\d+)pct")


def mixed_parts(dataset: str) -> Optional[Tuple[str, str, int]]:
  """(env, partner, percent) of a mixed dataset (its short name or our Minari id
  mombo/<env>/random-<partner>-<p>pct-v0); None for any other dataset."""
  name = paper_dataset(dataset)
  m = _MIXED.fullmatch(name or "")
  if not m:
    return None
  return m.group(1), m.group(2), int(m.group(3))


def split(groups: Dict[tuple, Pool]) -> Tuple[Dict[tuple, Pool], Dict[tuple, Pool]]:
  """(the other datasets' groups, the mixed datasets' groups) of {(env, dataset, algo): Pool}."""
  mixed = {k: g for k, g in groups.items() if mixed_parts(k[1])}
  return {k: g for k, g in groups.items() if k not in mixed}, mixed


def ratio_group(dataset: str) -> str:
  """A mixed dataset's row group: its partner's share, '1' .. '50' (the paper's first column)."""
  return str(mixed_parts(dataset)[2])


def row_order(env: str, dataset: str) -> tuple:
  """Within a share: random-medium before random-expert, then the paper's environment order."""
  partner = mixed_parts(dataset)[1]
  return (names.MIXED_PARTNERS.index(partner), ENV_ORDER.index(env) if env in ENV_ORDER else 99,
          env, dataset)


RATIO_ORDER = tuple(str(p) for p in names.MIXED_PERCENTS)


def build_mixed_table(groups: Dict[tuple, Pool], digits: int = 1) -> Table:
  """The mixed table beside the paper's numbers: rows (share, env, dataset) in the paper's order,
  the summary of each share under it (Table.blocks[k].type_avg keyed by share)."""
  return build_table(groups, metrics=MIXED_METRICS, digits=digits, paper=True,
                     group_of=ratio_group, group_order=RATIO_ORDER, row_order=row_order)


def lead_cells(row: Tuple[str, str, str]) -> List[str]:
  """The row's labels under LEAD_HEADER: share, 'random-<partner>', environment."""
  group, env, dataset = row
  return [group, f"random-{mixed_parts(dataset)[1]}", env]


def what_ran(groups: Dict[tuple, Pool]) -> str:
  """One paragraph on what our mixed table cells ran: seeds per table cell, gradient steps, and
  every way in which they fall short of the paper's setup (2M gradient steps, 4 seeds, the full
  datasets), so that nothing in the table reads as the paper's protocol when it was not."""
  seeds = sorted({len(g.seeds) for g in groups.values()})
  steps = sorted({g.gradient_steps for g in groups.values() if g.gradient_steps is not None})
  short = list(dict.fromkeys(s for g in groups.values() for s in g.shortfalls))
  text = (f"Our table cells: {'/'.join(map(str, seeds))} seed(s) each, "
          + (f"{'/'.join(f'{s:,}' for s in steps)} gradient steps" if steps
             else "gradient steps not recorded")
          + " (the paper: 4 seeds, 2,000,000 gradient steps).")
  if short:
    text += (" BELOW THE PAPER'S SETUP (§), not its protocol: " + "; ".join(short)
             + ". Read them as a smoke run of the pipeline, not as a replication.")
  return text
