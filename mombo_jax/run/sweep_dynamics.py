"""What a sweep's entries share: which entries of a dataset train one dynamics ensemble together and
why (sharing_plan, printed by experiments.sweep before it runs: sweep.dynamics_plan), with where
each of the ensemble's settings comes from (settings_sources). Entries share an ensemble exactly
when their dynamics training settings agree (mombo_jax.dynamics.reuse: the folder those settings
name). No JAX: the sweep's parent process plans without it.
"""
from __future__ import annotations

import json
from typing import Dict, List, Optional, Sequence

from mombo_jax.dynamics import reuse
from mombo_jax.settings import config as config_lib, references
from mombo_jax.settings.config import Config


def settings_sources(env: str, algo: str, preset: str = "paper", flags: Sequence[str] = (),
                     reference: Optional[str] = None) -> Dict[str, str]:
  """{training field: where make_config(env, algo, preset, reference=reference, ...) takes its
  value}, in make_config's order of precedence: a flag (`flags`: the fields the caller's flags
  set), the preset (config.PRESETS), the algorithm's reference source (references.source: its row
  for env, or its settings for every task; each citing its file), else the Config default (the
  references' shared dynamics settings)."""
  src, ref = references.source(algo, reference), references.check(algo, reference)
  out = {}
  for name in reuse.TRAINING_FIELDS:
    if name in flags:
      out[name] = "flag"
    elif name in config_lib.PRESETS[preset].overrides:
      out[name] = f"preset {preset}"
    elif name in src.tasks.get(env, {}):
      out[name] = f"{src.code}, its {env} row [--reference={ref}]"
    elif name in src.settings:
      out[name] = f"{src.code}, every task [--reference={ref}]"
    else:
      out[name] = f"Config default, not set by --reference={ref}"
  return out


def sharing_plan(entries: Sequence[tuple], preset: str = "paper", flags: Dict[str, str] = None) \
    -> List[str]:
  """Lines saying, per dataset, which entries share a dynamics ensemble and why. entries: (env,
  algo, config, dynamics_dir) each; flags: {training field: the flag that set it for every entry}.
  Per dataset: how many ensembles and the settings that keep them apart; per ensemble its folder
  (reuse.dynamics_path), the algorithms that use it and the dynamics settings it follows with each
  value's source (settings_sources). Entries share an ensemble exactly when their training settings
  (reuse.training_settings) agree."""
  flags = flags or {}
  fields = reuse.TRAINING_FIELDS
  defaults = reuse.training_settings(Config())
  lines = []
  for env in dict.fromkeys(c[0] for c in entries):
    mine = [c for c in entries if c[0] == env]
    ensembles = {}                       # dynamics_path -> entries, in plan order
    for c in mine:
      ensembles.setdefault(reuse.dynamics_path(c[3], c[2]), []).append(c)
    settings = {p: reuse.training_settings(cs[0][2]) for p, cs in ensembles.items()}
    apart = [f for f in fields if len({json.dumps(s[f]) for s in settings.values()}) > 1]
    shown = [f for f in fields
             if f in apart or any(s[f] != defaults[f] for s in settings.values())]
    lines.append(f"dynamics of {env}: {len(ensembles)} ensemble(s) for {len(mine)} entries"
                 + (f", apart because these settings differ: {', '.join(apart)}" if apart else
                    ": every entry's dynamics settings agree, one ensemble is shared"))
    for path, users in ensembles.items():
      algos = [c[1] for c in users]
      lines.append(f"  {'shared by ' + ', '.join(algos) if len(algos) > 1 else algos[0] + ' alone'}"
                   f": {path}")
      for name in shown:
        by_source = {}
        for c in users:
          src = settings_sources(env, c[1], preset, list(flags), c[2].reference)[name]
          by_source.setdefault(f"flag {flags[name]}" if src == "flag" else src, []).append(c[1])
        where = "; ".join(src if len(by_source) == 1 else f"{src} ({', '.join(a)})"
                          for src, a in by_source.items())
        lines.append(f"    {name}={users[0][2].settings()[name]!r}: {where}")
      if len(fields) > len(shown):
        lines.append(f"    {'the other' if shown else 'all'} {len(fields) - len(shown)} dynamics "
                     "settings: Config defaults (the references' shared defaults)")
  return lines
