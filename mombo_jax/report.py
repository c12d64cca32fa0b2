"""Result tables and learning-curve figures over many runs, in the paper's layout.

`write_report(dirs, out)` finds the run workdirs under `dirs` (a workdir holds config.json,
metrics.csv and summary.json, written by experiments.run through mombo_jax/outputs.py), groups
them by (environment, dataset, algorithm), pools the healthy seeds of all runs of a group and
writes report.md, report.tex and curves_<env>.png.

Table rule (paper, Table 1 caption, checked against its numbers): in every row the highest mean is
bold; another mean is underlined when it lies within one standard deviation *of the best score*
(best mean - mean <= std of the best; e.g. hopper-random's 25.4 +- 10.2 is not underlined against
31.7 +- 0.1). Averages are plain means over tasks; the average rank is the mean over tasks of each
algorithm's rank of the mean (1 = best, ties share the average of their ranks). Stds are over
seeds, population std (ddof = 0), as summary.json's.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from mombo_jax import outputs

RUN_FILES = ("config.json", "metrics.csv", "summary.json")
# Column order of the paper (baselines first), then MOMBO's other target modes.
_ALGO_ORDER = ("MOPO", "MOBILE", "MOMBO", "MOMBO (elite_spread)", "MOMBO (mixture)")
_TYPE_ORDER = ("random", "medium", "medium-replay", "medium-expert", "expert")
_ENV_ORDER = ("halfcheetah", "hopper", "walker2d")
_LINESTYLES = {"MOPO": "--", "MOBILE": ":", "MOMBO": "-"}
MISSING = "–"


class ReportError(Exception):
  """Nothing to report (no runs found, unreadable folders); the message names what was searched."""


@dataclasses.dataclass
class Run:
  """One run workdir, healthy seeds only. final, aulc: [S]; steps [T]; scores [T, S]."""
  path: str
  env: str               # halfcheetah | hopper | walker2d
  dataset: str           # short name (hopper-random) or Minari id
  algo: str              # table label: MOPO | MOBILE | MOMBO | MOMBO (<target>)
  seeds: List[int]
  final: np.ndarray
  aulc: np.ndarray
  steps: np.ndarray
  scores: np.ndarray


@dataclasses.dataclass
class Group:
  """All seeds of one (env, dataset, algo), pooled over runs. Arrays as in Run."""
  env: str
  dataset: str
  algo: str
  runs: List[str]
  seeds: List[int]
  final: np.ndarray
  aulc: np.ndarray
  steps: np.ndarray
  scores: np.ndarray

  def stat(self, what: str) -> Tuple[Optional[float], Optional[float]]:
    """(mean, std) over seeds of 'final' or 'aulc'; (None, None) when no healthy seed is left."""
    x = getattr(self, what)
    if x.size == 0:
      return None, None
    return float(np.mean(x)), float(np.std(x))


def algo_label(config: dict) -> str:
  """MOMBO with the paper's target (lcb) is plain 'MOMBO'; other modes name their target."""
  algo = str(config.get("algo", "?")).upper()
  target = config.get("target", "lcb")
  if algo == "MOMBO" and target not in (None, "lcb"):
    return f"MOMBO ({target})"
  return algo


def dataset_type(dataset: str) -> str:
  """'hopper-medium-replay' -> 'medium-replay'; a Minari id ('mujoco/hopper/expert-v0') is its
  own type."""
  env, _, quality = dataset.partition("-")
  return quality if env in _ENV_ORDER and quality else dataset


# ---------------------------------------------------------------------------------- discovery

def find_runs(dirs: Sequence[str]) -> Tuple[List[str], List[str]]:
  """(run workdirs, warnings) under `dirs`. A folder holding any of RUN_FILES is a run (its
  subfolders, checkpoints and dynamics, are not searched); one missing some of them is skipped
  with a warning naming it and what is missing. Raises ReportError for a DIR that does not exist."""
  found, warnings = [], []
  for top in dirs:
    if not os.path.isdir(top):
      raise ReportError(f"{top} is not a folder; pass folders that hold run workdirs "
                        "(written by experiments.run).")
    for root, subdirs, files in os.walk(top):
      present = [f for f in RUN_FILES if f in files]
      if not present:
        subdirs.sort()
        continue
      subdirs[:] = []
      missing = [f for f in RUN_FILES if f not in files]
      if missing:
        why = " (unfinished run?)" if "summary.json" in missing else ""
        warnings.append(f"warning: skipping {root}: missing {', '.join(missing)}{why}")
      else:
        found.append(os.path.normpath(root))
  return sorted(set(found)), warnings


def load_run(path: str) -> Run:
  """One workdir -> Run (healthy seeds only). Raises ValueError on unreadable or inconsistent
  files."""
  try:
    with open(os.path.join(path, "config.json")) as f:
      config = json.load(f)
    with open(os.path.join(path, "summary.json")) as f:
      summary = json.load(f)
    rows = outputs.read_rows(os.path.join(path, "metrics.csv"))
  except (OSError, ValueError, KeyError) as e:
    raise ValueError(f"unreadable ({type(e).__name__}: {e})") from None
  if not rows:
    raise ValueError("metrics.csv holds no evaluation rows")
  env = str(config.get("env", ""))
  dataset = str(config.get("dataset") or env)
  bad = {int(d["seed"]) for d in summary.get("diverged", [])}
  all_seeds = [int(s) for s in summary["seeds"]]
  keep = [i for i, s in enumerate(all_seeds) if s not in bad]
  seeds = [all_seeds[i] for i in keep]
  try:
    steps, table = outputs.score_table(rows, seeds, key="step")
  except KeyError as e:
    raise ValueError(f"metrics.csv lacks the evaluation {e} of a seed in summary.json") from None
  return Run(path=path, env=env.partition("-")[0], dataset=dataset, algo=algo_label(config),
             seeds=seeds, final=np.asarray(summary["final_normalized_score"], float)[keep],
             aulc=np.asarray(summary["aulc"], float)[keep], steps=np.asarray(steps),
             scores=table.reshape(len(steps), len(seeds)))


def group_runs(runs: Sequence[Run]) -> Tuple[Dict[tuple, Group], List[str]]:
  """{(env, dataset, algo): Group} pooling the seeds of the runs of each key; curves are kept at
  the evaluation steps all of them share. Returns (groups, warnings)."""
  by_key: Dict[tuple, List[Run]] = {}
  for r in runs:
    by_key.setdefault((r.env, r.dataset, r.algo), []).append(r)
  groups, warnings = {}, []
  for key, members in by_key.items():
    steps = members[0].steps
    for r in members[1:]:
      steps = np.intersect1d(steps, r.steps)
    if any(len(r.steps) != len(steps) for r in members):
      warnings.append(f"warning: {key[2]} on {key[1]}: runs evaluated at different steps; the "
                      f"curve keeps the {len(steps)} steps they share")
    seen: Dict[int, str] = {}
    for r in members:
      for s in r.seeds:
        if s in seen:
          warnings.append(f"warning: {key[2]} on {key[1]}: seed {s} appears in {seen[s]} and "
                          f"{r.path}; both are counted")
        seen[s] = r.path
    cols = [r.scores[np.isin(r.steps, steps)] for r in members]
    groups[key] = Group(env=key[0], dataset=key[1], algo=key[2], runs=[r.path for r in members],
                        seeds=[s for r in members for s in r.seeds],
                        final=np.concatenate([r.final for r in members]),
                        aulc=np.concatenate([r.aulc for r in members]), steps=steps,
                        scores=np.concatenate(cols, axis=1))
  return groups, warnings


# ------------------------------------------------------------------------------ table logic

def mark_row(means, stds) -> Tuple[np.ndarray, np.ndarray]:
  """(bold [K], underline [K]) for one row of K algorithms; NaN means are missing cells.

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
  """One metric's table: mean, std [R, K] (NaN: missing), bold/underline [R, K], per-type and
  overall averages [K] with complete [K] (bool: the column has every row the average covers; only
  complete columns compete for bold there), average ranks [K]."""
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


@dataclasses.dataclass
class Table:
  """rows: (dataset type, env, dataset) in the paper's order; algos: column labels."""
  rows: List[Tuple[str, str, str]]
  algos: List[str]
  blocks: List[Block]


def _order(values, order):
  return sorted(values, key=lambda v: (order.index(v) if v in order else len(order), v))


METRICS = (("final", "Normalised score (final)"), ("aulc", "AULC"))


def build_table(groups: Dict[tuple, Group], metrics=METRICS, digits: int = 1) -> Table:
  """Rows = tasks (grouped by dataset type), columns = algorithms, one block per metric
  (default: final score and AULC). groups: {(env, dataset, algo): anything with
  .stat(metric) -> (mean, std) or (None, None)}."""
  tasks = {(dataset_type(d), e, d) for (e, d, _) in groups}
  types = _order({t for t, _, _ in tasks}, _TYPE_ORDER)
  rows = [row for t in types for row in sorted(
      (x for x in tasks if x[0] == t),
      key=lambda x: (_ENV_ORDER.index(x[1]) if x[1] in _ENV_ORDER else 99, x[1], x[2]))]
  algos = _order({a for (_, _, a) in groups}, _ALGO_ORDER)
  blocks = []
  for what, name in metrics:
    mean = np.full((len(rows), len(algos)), np.nan)
    std = np.full_like(mean, np.nan)
    for i, (_, env, dataset) in enumerate(rows):
      for j, algo in enumerate(algos):
        g = groups.get((env, dataset, algo))
        if g is not None:
          m, s = g.stat(what)
          if m is not None:
            mean[i, j], std[i, j] = m, s
    marks = [mark_row(mean[i], std[i]) for i in range(len(rows))]
    bold = np.array([b for b, _ in marks]).reshape(mean.shape)
    under = np.array([u for _, u in marks]).reshape(mean.shape)
    type_avg = {t: _average(mean[[r[0] == t for r in rows]]) for t in types}
    avg, complete = _average(mean)
    blocks.append(Block(name=name, mean=mean, std=std, bold=bold, under=under, type_avg=type_avg,
                        avg=avg, complete=complete, avg_rank=average_ranks(mean), digits=digits))
  return Table(rows=rows, algos=algos, blocks=blocks)


def _average(mean) -> Tuple[np.ndarray, np.ndarray]:
  """(mean over rows of mean [R, K] ignoring missing cells (NaN where a column has none),
  complete [K]: the column has every row)."""
  mean = np.asarray(mean, float)
  count = np.sum(~np.isnan(mean), axis=0)
  avg = np.where(count > 0, np.nansum(mean, axis=0) / np.maximum(count, 1), np.nan)
  return avg, count == mean.shape[0]


def _best(values, highest=True, complete=None) -> np.ndarray:
  """bool [K]: the best of `values`; among the complete columns only, when some are complete
  (an algorithm run on one easy task must not win the average)."""
  v = np.asarray(values, float)
  if complete is not None and np.any(complete & ~np.isnan(v)):
    v = np.where(complete, v, np.nan)
  if np.all(np.isnan(v)):
    return np.zeros(v.shape, bool)
  return v == (np.nanmax(v) if highest else np.nanmin(v))


# -------------------------------------------------------------------------------- rendering

def _fmt(x, digits=1) -> str:
  return MISSING if x is None or np.isnan(x) else f"{x:.{digits}f}"


def render_markdown(table: Table, title: str = "Results", what: str = "over seeds") -> str:
  """report.md: one table per block; bold **x**, underline <u>x</u>."""
  lines = [f"# {title}", "",
           f"Mean ± std {what}. Per row, the highest mean is **bold**; "
           "a mean within one std of the best score (best − mean ≤ std of the best) is "
           "<u>underlined</u>. Average rank: mean over tasks of the rank of the mean (1 = best, "
           "ties share their average rank).", ""]
  for b in table.blocks:
    lines += [f"## {b.name}", "",
              "| Dataset type | Environment | " + " | ".join(table.algos) + " |",
              "|---|---|" + "---:|" * len(table.algos)]
    for i, (dtype, env, _) in enumerate(table.rows):
      cells = []
      for j in range(len(table.algos)):
        if np.isnan(b.mean[i, j]):
          cells.append(MISSING)
          continue
        text = f"{b.mean[i, j]:.{b.digits}f} ± {b.std[i, j]:.{b.digits}f}"
        cells.append(f"**{text}**" if b.bold[i, j] else f"<u>{text}</u>" if b.under[i, j]
                     else text)
      lines.append(f"| {dtype} | {env} | " + " | ".join(cells) + " |")
      last_of_type = i + 1 == len(table.rows) or table.rows[i + 1][0] != dtype
      if last_of_type and sum(r[0] == dtype for r in table.rows) > 1:
        lines.append(_md_summary_row(f"*Average on {dtype}*", *b.type_avg[dtype], True,
                                     b.digits))
    lines.append(_md_summary_row("**Average score**", b.avg, b.complete, True, b.digits))
    lines.append(_md_summary_row("**Average rank**", b.avg_rank, b.complete, False))
    lines.append("")
    if not b.complete.all():
      lines += ["\\* averaged over the tasks the algorithm was run on (not all of them).", ""]
  return "\n".join(lines)


def _md_summary_row(label, values, complete, highest, digits=1) -> str:
  best = _best(values, highest, complete)
  cells = []
  for j, v in enumerate(values):
    text = _fmt(v, digits)
    if not complete[j] and text != MISSING:
      text += "\\*"
    cells.append(f"**{text}**" if best[j] else text)
  return f"| {label} | | " + " | ".join(cells) + " |"


def _tex_escape(s: str) -> str:
  return s.replace("\\", r"\textbackslash{}").replace("_", r"\_").replace("&", r"\&") \
      .replace("%", r"\%").replace("#", r"\#")


def render_latex(table: Table) -> str:
  """report.tex: the paper's tabular (booktabs, multirow; \\sd and lightgray rows as in the
  paper's preamble, defined here if missing)."""
  k = len(table.algos)
  algo_cells = " & ".join(rf"\texttt{{{_tex_escape(a)}}}" for a in table.algos)
  heads = " &\n  ".join(rf"\multicolumn{{{k}}}{{c}}{{\textsc{{{h}}} ($\uparrow$)}}"
                        for h in ("Normalized Reward", "AULC"))
  rules = " ".join(rf"\cmidrule(lr){{{3 + n * k}-{2 + (n + 1) * k}}}" for n in range(2))
  out = [r"% Generated by experiments.report; needs \usepackage{booktabs,multirow,colortbl}.",
         r"\providecommand{\sd}[1]{{\scriptsize #1}}",
         r"\begin{tabular}{@{}cc" + "c" * (2 * k) + "@{}}", r"\toprule",
         r"  \multirow{2}{*}{Dataset Type} & \multirow{2}{*}{Environment} &",
         "  " + heads, r"  \\ " + rules, "  & & " + algo_cells + " & " + algo_cells,
         r"  \\ \midrule"]
  types = []
  for t, _, _ in table.rows:
    if t not in types:
      types.append(t)
  for t in types:
    idx = [i for i, r in enumerate(table.rows) if r[0] == t]
    for n, i in enumerate(idx):
      first = rf"\multirow{{{len(idx)}}}{{*}}{{\texttt{{{_tex_escape(t)}}}}}" if n == 0 else ""
      cells = [first, rf"\texttt{{{_tex_escape(table.rows[i][1])}}}"]
      for b in table.blocks:
        for j in range(k):
          if np.isnan(b.mean[i, j]):
            cells.append("--")
            continue
          body = rf"{b.mean[i, j]:.{b.digits}f} \sd{{\pm {b.std[i, j]:.{b.digits}f}}}"
          if b.bold[i, j]:
            body = r"\bf " + body
          elif b.under[i, j]:
            body = rf"\underline{{{body}}}"
          cells.append(f"${body}$")
      out.append("  " + " & ".join(cells) + r" \\")
    if len(idx) > 1:
      out.append(_tex_summary(rf"Average on \texttt{{{_tex_escape(t)}}}",
                              [(*b.type_avg[t], True) for b in table.blocks]))
    out.append(r"  \midrule")
  out.append(_tex_summary("Average Score", [(b.avg, b.complete, True) for b in table.blocks]))
  out.append(_tex_summary("Average Ranking", [(b.avg_rank, b.complete, False)
                                              for b in table.blocks]))
  out += [r"\bottomrule", r"\end{tabular}", ""]
  return "\n".join(out)


def _tex_summary(label, parts) -> str:
  cells = []
  for values, complete, highest in parts:
    best = _best(values, highest, complete)
    for j, v in enumerate(values):
      text = _fmt(v) + ("" if complete[j] else "^*")
      cells.append("--" if np.isnan(v) else (rf"$\bf {text}$" if best[j] else f"${text}$"))
  return (r"  \rowcolor{lightgray!50} \multicolumn{2}{r}{" + label + "} & " + " & ".join(cells)
          + r" \\")


# ---------------------------------------------------------------------------------- figures

def plot_curves(groups: Dict[tuple, Group], env: str, path: str):
  """curves_<env>.png: one panel per dataset of `env`, each algorithm's mean over seeds with a
  +-1 std band; the legend gives final score and AULC (mean +- std), as the paper's figures."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  mine = {k: g for k, g in groups.items() if k[0] == env}
  datasets = sorted({k[1] for k in mine},
                    key=lambda d: (_TYPE_ORDER.index(dataset_type(d))
                                   if dataset_type(d) in _TYPE_ORDER else 99, d))
  algos = _order({k[2] for k in mine}, _ALGO_ORDER)
  colors = {a: f"C{i}" for i, a in enumerate(algos)}
  fig, axes = plt.subplots(1, len(datasets), figsize=(4.5 * len(datasets), 3.6), squeeze=False)
  for ax, dataset in zip(axes[0], datasets):
    for algo in algos:
      g = mine.get((env, dataset, algo))
      if g is None or g.scores.shape[1] == 0 or len(g.steps) == 0:
        continue
      mean, std = g.scores.mean(axis=1), g.scores.std(axis=1)
      (fm, fs), (am, as_) = g.stat("final"), g.stat("aulc")
      ax.plot(g.steps, mean, ls=_LINESTYLES.get(algo, "-."), lw=2, color=colors[algo],
              label=f"{algo}: {fm:.1f}±{fs:.1f}, {am:.1f}±{as_:.1f}")
      ax.fill_between(g.steps, mean - std, mean + std, color=colors[algo], alpha=0.2, lw=0)
    ax.set(title=dataset, xlabel="gradient steps", ylabel="normalised score")
    ax.legend(fontsize=7, title="final, AULC", title_fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


# ------------------------------------------------------------------------------------ driver

def write_report(dirs: Sequence[str], out: Optional[str] = None, log=print) -> dict:
  """Finds, groups, writes report.md, report.tex, curves_<env>.png into `out` (default dirs[0]).

  Warnings (skipped folders) go to `log`. Returns {"runs", "groups", "table", "files"}.
  Raises ReportError when no run is found (naming the folders searched).
  """
  if not dirs:
    raise ReportError("Pass at least one folder to search for runs.")
  out = out or dirs[0]
  paths, warnings = find_runs(dirs)
  runs = []
  for p in paths:
    try:
      runs.append(load_run(p))
    except ValueError as e:
      warnings.append(f"warning: skipping {p}: {e}")
  for w in warnings:
    log(w)
  if not runs:
    raise ReportError(f"No runs found under {', '.join(dirs)} (a run folder holds "
                      f"{', '.join(RUN_FILES)}, written by experiments.run)"
                      + (f"; {len(warnings)} folder(s) were skipped, see the warnings above."
                         if warnings else "."))
  groups, more = group_runs(runs)
  for w in more:
    log(w)
  table = build_table(groups)
  os.makedirs(out, exist_ok=True)
  files = [os.path.join(out, "report.md"), os.path.join(out, "report.tex")]
  with open(files[0], "w") as f:
    f.write(render_markdown(table, title=f"Results of {len(runs)} run(s)",
                            what="over seeds (diverged seeds left out)"))
  with open(files[1], "w") as f:
    f.write(render_latex(table))
  for env in _order({k[0] for k in groups}, _ENV_ORDER):
    files.append(os.path.join(out, f"curves_{env}.png"))
    plot_curves(groups, env, files[-1])
  return dict(runs=runs, groups=groups, table=table, files=files)
