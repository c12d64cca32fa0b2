"""The report's figures: curves_<env>.png, each algorithm's learning curve (mean over seeds, a
+-1 std band) per dataset of one environment, as the paper's figures. writer.write_report draws
them beside report.md.
"""
from __future__ import annotations

from typing import Dict

from mombo_jax.report.labels import base_algo, label_key
from mombo_jax.report.results import TYPE_ORDER, Pool, dataset_type
from mombo_jax.storage import atomic

_LINESTYLES = {"MOPO": "--", "MOBILE": ":", "MOMBO": "-"}


def plot_curves(groups: Dict[tuple, Pool], env: str, path: str):
  """curves_<env>.png: one panel per dataset of `env`, each algorithm's mean over seeds with a
  +-1 std band; the legend gives final score and AULC (mean +- std), as the paper's figures."""
  # matplotlib only when a figure is drawn (importing it takes a second).
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # after the backend is set
  mine = {k: g for k, g in groups.items() if k[0] == env}
  datasets = sorted({k[1] for k in mine},
                    key=lambda d: (TYPE_ORDER.index(dataset_type(d))
                                   if dataset_type(d) in TYPE_ORDER else 99, d))
  algos = sorted({k[2] for k in mine}, key=label_key)
  colors = {a: f"C{i}" for i, a in enumerate(algos)}
  fig, axes = plt.subplots(1, len(datasets), figsize=(4.5 * len(datasets), 3.6), squeeze=False)
  for ax, dataset in zip(axes[0], datasets):
    for algo in algos:
      g = mine.get((env, dataset, algo))
      if g is None or g.scores.shape[1] == 0 or len(g.steps) == 0:
        continue
      mean, std = g.scores.mean(axis=1), g.scores.std(axis=1)
      (fm, fs), (am, as_) = g.stat("final"), g.stat("aulc")
      ax.plot(g.steps, mean, ls=_LINESTYLES.get(base_algo(algo), "-."), lw=2, color=colors[algo],
              label=f"{algo}: {fm:.1f}±{fs:.1f}, {am:.1f}±{as_:.1f}")
      ax.fill_between(g.steps, mean - std, mean + std, color=colors[algo], alpha=0.2, lw=0)
    ax.set(title=dataset, xlabel="gradient steps", ylabel="normalised score")
    ax.legend(fontsize=7, title="final, AULC", title_fontsize=7)
  fig.tight_layout()
  try:
    atomic.save_figure(fig, path, dpi=100)
  finally:
    plt.close(fig)
