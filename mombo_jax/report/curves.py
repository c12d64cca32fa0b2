"""The report's figures: curves_<env>.png, each algorithm's learning curve (mean over seeds, a
+-1 std band) per dataset of one environment, as the paper's figures, runs below the paper's setup
marked as in report.md. writer.write_report draws them beside report.md.
"""
from __future__ import annotations

from typing import Dict

from mombo_jax.report.labels import base_algo, label_key
from mombo_jax.report.results import TYPE_ORDER, Pool, dataset_type
from mombo_jax.report.tables import BELOW_MARK
from mombo_jax.storage import atomic

_LINESTYLES = {"MOPO": "--", "MOBILE": ":", "MOMBO": "-"}
# Each algorithm's evaluation points: its own marker, the first filled and large, the next ones
# hollow and smaller on top (their lines thinner), so that curves that coincide (two algorithms
# of a smoke run at one score) all stay visible.
_MARKERS = ("o", "s", "^", "D", "v", "P", "X")


def _marker(i: int) -> dict:
  return dict(marker=_MARKERS[i % len(_MARKERS)], ms=max(8 - 2 * i, 3), zorder=2 + i,
              mfc=None if i == 0 else "none", mew=1.5, lw=max(3.0 - i, 1.2))


_NOTE_POOLS = 4          # pools the note names, then "and N more"


def _below_note(pools) -> str:
  """The figure's note for the pools below the paper's setup (a smoke or short run: their legend
  entries carry BELOW_MARK, as report.md's table cells), one line each, their first shortfall."""
  lines = [f"{BELOW_MARK}: below the paper's setup, a smoke or short run (report.md's footnotes "
           "list all):"]
  for g in pools[:_NOTE_POOLS]:
    more = f" and {len(g.shortfalls) - 1} more" if len(g.shortfalls) > 1 else ""
    lines.append(f"{g.algo} on {g.dataset}: {g.shortfalls[0]}{more}")
  if len(pools) > _NOTE_POOLS:
    lines.append(f"and {len(pools) - _NOTE_POOLS} more")
  return "\n".join(lines)


def curves_figure(groups: Dict[tuple, Pool], env: str):
  """The matplotlib figure of curves_<env>.png: one panel per dataset of `env`, each algorithm's
  mean over seeds with a +-1 std band; the legend gives final score and AULC (mean +- std), as the
  paper's figures. Each algorithm has its own line style and marker (coinciding curves stay
  visible); one below the paper's setup is marked BELOW_MARK in the legend and named in a note
  under the panels."""
  # matplotlib only when a figure is drawn (importing it takes a second).
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # after the backend is set
  mine = {k: g for k, g in groups.items() if k[0] == env}
  datasets = sorted({k[1] for k in mine},
                    key=lambda d: (TYPE_ORDER.index(dataset_type(d))
                                   if dataset_type(d) in TYPE_ORDER else 99, d))
  algos = sorted({k[2] for k in mine}, key=label_key)
  fig, axes = plt.subplots(1, len(datasets), figsize=(4.5 * len(datasets), 3.6), squeeze=False)
  below = []
  for ax, dataset in zip(axes[0], datasets):
    for i, algo in enumerate(algos):
      g = mine.get((env, dataset, algo))
      if g is None or g.scores.shape[1] == 0 or len(g.steps) == 0:
        continue
      mean, std = g.scores.mean(axis=1), g.scores.std(axis=1)
      (fm, fs), (am, as_) = g.stat("final"), g.stat("aulc")
      mark = f" {BELOW_MARK}" if g.shortfalls else ""
      below += [g] if g.shortfalls else []
      ax.plot(g.steps, mean, ls=_LINESTYLES.get(base_algo(algo), "-."), color=f"C{i}",
              label=f"{algo}{mark}: {fm:.1f}±{fs:.1f}, {am:.1f}±{as_:.1f}", **_marker(i))
      ax.fill_between(g.steps, mean - std, mean + std, color=f"C{i}", alpha=0.2, lw=0)
    ax.set(title=dataset, xlabel="gradient steps", ylabel="normalised score")
    ax.legend(fontsize=7, title="final, AULC", title_fontsize=7)
  if below:
    # The note gets its own room under the panels: the figure grows by its lines.
    note = _below_note(below)
    room = 0.14 * (note.count("\n") + 1)                     # inches
    fig.set_size_inches(fig.get_figwidth(), fig.get_figheight() + room)
    fig.text(0.01, 0.01, note, fontsize=7, va="bottom", ha="left")
    fig.tight_layout(rect=(0, room / fig.get_figheight(), 1, 1))
  else:
    fig.tight_layout()
  return fig


def plot_curves(groups: Dict[tuple, Pool], env: str, path: str):
  """curves_<env>.png: curves_figure's figure."""
  import matplotlib.pyplot as plt  # matplotlib only when a figure is drawn (a second to import)
  fig = curves_figure(groups, env)
  try:
    atomic.save_figure(fig, path, dpi=100)
  finally:
    plt.close(fig)
