"""Dataset cards: what a local dataset holds, how it was made, and how it compares with D4RL's
published file of the same name. `write_card(name)` writes `dataset_card.md` and
`returns_hist.png` next to the dataset (or into `out_dir`); `experiments.describe` prints it.
Cards are computed from the data and its metadata (provenance: recipe, rebuild command, the saved
actors a dataset was recorded from, the SAC run's medium point), never edited by hand: regenerate
one with `python -m experiments.describe --dataset=<name> --out=<folder>`.
"""
from __future__ import annotations

import os
from typing import Optional, Sequence

import numpy as np

from mombo_jax.data import d4rl_stats, minari_io, names, provenance, scores
from mombo_jax.env import envs


def episode_stats(name: str, episodes: Optional[Sequence[dict]] = None) -> dict:
  """Per-episode returns [E] and lengths [E] of a local dataset, plus its id and env. `episodes`
  (dicts with "rewards", as just written) saves reading them back (slow for 1M random steps)."""
  if episodes is None:
    episodes = [{"rewards": ep.rewards} for ep in minari_io.load_dataset(name).iterate_episodes()]
  returns, lengths = [], []
  for ep in episodes:
    rewards = np.asarray(ep["rewards"], np.float64)
    returns.append(float(rewards.sum()))
    lengths.append(len(rewards))
  return dict(dataset_id=names.resolve(name), env=minari_io.env_name(name),
              returns=np.asarray(returns), lengths=np.asarray(lengths, np.int64))


def summary(values: np.ndarray) -> dict:
  """mean, std, min, q25, median, q75, max of a 1-D array."""
  q = np.percentile(values, [0, 25, 50, 75, 100])
  return dict(mean=float(values.mean()), std=float(values.std()), min=float(q[0]),
              q25=float(q[1]), median=float(q[2]), q75=float(q[3]), max=float(q[4]))


def _short_name(stats: dict) -> Optional[str]:
  """The D4RL short name a dataset corresponds to ('hopper-medium-replay'), if any."""
  name = names.short_name(stats["dataset_id"])
  if name:
    return name
  parts = stats["dataset_id"].split("/")
  quality = parts[-1].rpartition("-v")[0]
  candidate = f"{stats['env']}-{quality}"
  return candidate if candidate in d4rl_stats.PUBLISHED else None


def card_text(name: str, stats: Optional[dict] = None) -> str:
  """The Markdown card of a local dataset."""
  stats = stats or episode_stats(name)
  returns, lengths = stats["returns"], stats["lengths"]
  normalised = scores.normalized_score(name, returns)
  low, high, source = scores.ref_scores(name)
  raw, norm, length = summary(returns), summary(normalised), summary(lengths.astype(np.float64))
  prov = provenance.provenance(name) or {}
  lines = [f"# Dataset card: {stats['dataset_id']}", "",
           f"Generated from the data by `python -m experiments.describe "
           f"--dataset={stats['dataset_id']} --out=<this folder>`: regenerate it, do not edit it.",
           "",
           f"- environment: {stats['env']} (evaluated in "
           f"{envs.eval_env_spec(stats['dataset_id'])['physics']})",
           f"- transitions: {int(lengths.sum())}",
           f"- episodes: {len(lengths)}",
           f"- recipe: {prov.get('recipe', 'not recorded')}"
           + (f" ({prov['steps']} of the recipe's {prov['recipe_steps']} steps)"
              if prov.get("recipe_steps") else ""),
           f"- rebuild: `{prov['command']}`" if prov.get("command") else "- rebuild: not recorded",
           *_provenance_lines(prov),
           f"- normalised with R_random={low:.2f}, R_expert={high:.2f} ({source})", "",
           "| per episode | mean | std | min | q25 | median | q75 | max |",
           "|---|---|---|---|---|---|---|---|"]
  for label, s in (("return", raw), ("normalised return", norm), ("length", length)):
    lines.append(f"| {label} | " + " | ".join(f"{s[k]:.1f}" for k in
                                               ("mean", "std", "min", "q25", "median", "q75",
                                                "max")) + " |")
  short = _short_name(stats)
  published = d4rl_stats.PUBLISHED.get(short) if short else None
  lines.append("")
  if published:
    rows, mean, std = published
    lines += [f"Compared with D4RL's published `{short}-v2` (rows in complete episodes and episode "
              "return; source in mombo_jax/data/d4rl_stats.py):", "",
              "| | transitions | mean return | std return |", "|---|---|---|---|",
              f"| D4RL v2 | {rows} | {_fmt(mean)} | {_fmt(std)} |",
              f"| this dataset | {int(lengths.sum())} | {raw['mean']:.1f} | {raw['std']:.1f} |"]
  else:
    lines.append("No published D4RL statistics for this name.")
  lines += ["", "![episode returns](returns_hist.png)", ""]
  return "\n".join(lines)


def _provenance_lines(prov: dict) -> list:
  """Card lines for the saved actors a dataset was recorded from and the SAC run's medium point
  (mombo_jax.collection.recipes), and for an import of D4RL's file its timeout mode, physics check,
  the non-finite rows it dropped and its quality check (mombo_jax.collection.d4rl), where its
  provenance records them."""
  lines = []
  if prov.get("recipe") == "d4rl-import":
    mode = prov.get("timeouts")
    lines.append("- D4RL rows: " + {
        "drop": "timed-out rows and the file's last row skipped (--timeouts=drop, the paper's "
                "loader)",
        "keep": "every row with a next state kept, timed-out ones too (--timeouts=keep)",
    }.get(mode, "timeout mode not recorded (imported before --timeouts: rows kept)"))
    lines.append(f"- physics check: {prov.get('physics_check') or 'not recorded'}")
    if prov.get("nonfinite_rows_dropped"):
      lines.append(f"- non-finite rows: {prov['nonfinite_rows_dropped']} row(s) holding NaN/inf "
                   "dropped (--drop_nonfinite)")
    if prov.get("quality_check"):
      lines.append(f"- quality check: {prov['quality_check']}")
  actors = prov.get("actors")
  if isinstance(actors, dict):
    for quality, actor in actors.items():
      if isinstance(actor, dict):
        lines.append(f"- recorded from the {quality} actor `{actor.get('path')}` (sha256 "
                     f"`{actor.get('sha256')}`, SAC step {actor.get('sac_step')})")
  for name, part in (prov.get("ingredients") or {}).items():
    if isinstance(part, dict):
      lines.append(f"- ingredient {name}: {part.get('steps')} transitions, rebuilt by "
                   f"`{part.get('command')}`" + "".join(
                       f"; its {q} actor `{a.get('path')}` (SAC step {a.get('sac_step')})"
                       for q, a in (part.get("actors") or {}).items() if isinstance(a, dict)))
  for note in prov.get("reduced") or []:
    lines.append(f"- REDUCED recipe: {note}")
  point = prov.get("medium_point")
  if isinstance(point, dict):
    evals = ", ".join(f"{r:.1f} at step {s}" for s, r in point.get("qualifying_evals") or [])
    threshold = point.get("medium_return")
    lines.append(f"- SAC medium point: step {point.get('medium_step')}, after "
                 f"{point.get('medium_consecutive')} evaluation(s) in a row of "
                 f"{point.get('eval_episodes')} episodes >= "
                 + (f"{threshold:.1f}" if isinstance(threshold, (int, float)) else "?")
                 + f" ({evals})")
  return lines


def _fmt(x):
  return "n/a" if x is None else f"{x:.1f}"


def write_card(name: str, out_dir: Optional[str] = None,
               episodes: Optional[Sequence[dict]] = None) -> str:
  """Writes dataset_card.md and returns_hist.png into out_dir (default: the dataset's own folder
  in the Minari root); returns the card's path. episodes: see episode_stats."""
  stats = episode_stats(name, episodes)
  out_dir = out_dir or os.path.join(minari_io.datasets_root(), stats["dataset_id"])
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, "dataset_card.md")
  with open(path, "w") as f:
    f.write(card_text(name, stats))
  _histogram(stats, os.path.join(out_dir, "returns_hist.png"))
  return path


def _histogram(stats: dict, path: str):
  # matplotlib only for a histogram: experiments.import_d4rl imports cards
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # after the backend is set
  fig, ax = plt.subplots(figsize=(5, 3.2))
  ax.hist(stats["returns"], bins=min(50, max(5, len(stats["returns"]) // 5)), color="tab:blue")
  ax.set(xlabel="episode return", ylabel="episodes",
         title=f"{stats['dataset_id']} ({len(stats['returns'])} episodes)")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
