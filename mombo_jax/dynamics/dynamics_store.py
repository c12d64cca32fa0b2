"""Where a run's dynamics ensembles live and how a run gets them: the folder scheme (one folder
per seeds and training settings: dynamics_path), the refusal of saves that predate it
(check_legacy_dynamics), the lock, get-or-train (get_dynamics), what a sweep shares
(sharing_plan), and experiments.train_dynamics' work: the ensembles trained alone, into
default_dynamics_root unless told otherwise (train_dynamics).

    <dynamics_dir>/
      seed<s>x<S>-<tag>/          the S ensembles of seeds s.., trained with the settings <tag>
                                  names (saved_dynamics.settings_tag, e.g. cap30-1a2b3c4d)
      seed<s>x<S>-<tag>.partial/  their unfinished training (dynamics_training), resumable
      seed<s>x<S>-<tag>.lock      the lock of whoever trains or reads them

The rule (saved_dynamics): an ensemble is reused only by a run that would have trained the same
one (same data, seeds and saved_dynamics.TRAINING_FIELDS). Runs of other settings get another
folder and train their own; ensembles of the same settings are shared, whoever trained them
(a --betas grid's betas, a sweep's algorithms, experiments.train_dynamics).
"""
from __future__ import annotations

import json
import os
import shutil
import time
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from mombo_jax.core.key_scheme import cell_keys
from mombo_jax.data import minari_io, names, provenance, transitions as transitions_lib
from mombo_jax.errors import Interrupted, UserError
from mombo_jax.records.workdir import DYNAMICS, LOCK
from mombo_jax.settings import config as config_lib, references
from mombo_jax.settings.config import Config
from mombo_jax.storage import locks


def default_dynamics_root(dataset: str, root: str = "runs") -> str:
  """experiments.train_dynamics' default folder of saved ensembles: runs/dynamics/<dataset>."""
  return os.path.join(root, DYNAMICS, dataset.replace("/", "_"))


def dynamics_path(dynamics_dir: str, config) -> str:
  """<dynamics_dir>/seed<seed>x<num_seeds>-<tag>: the ensembles of config's seeds trained with
  config's dynamics settings (tag: saved_dynamics.settings_tag, e.g. "cap30-1a2b3c4d"). Runs
  whose settings differ get different folders, so one dynamics_dir may hold several; runs whose
  settings agree (a --betas grid, a sweep's algorithms) share one."""
  from mombo_jax.dynamics import saved_dynamics  # loads JAX: see sharing_plan
  return f"{legacy_dynamics_path(dynamics_dir, config)}-{saved_dynamics.settings_tag(config)}"


def legacy_dynamics_path(dynamics_dir: str, config) -> str:
  """<dynamics_dir>/seed<seed>x<num_seeds>: where mombo_jax saved the ensembles before their
  folder named the training settings (see check_legacy_dynamics)."""
  return os.path.join(dynamics_dir, f"seed{config.seed}x{config.num_seeds}")


def check_legacy_dynamics(dynamics_dir: str, config):
  """Refuses (UserError, one line naming the fix) a launch that would train config's ensembles in
  a dynamics_dir holding ensembles of the same seeds saved before their reuse key recorded the
  training settings (legacy_dynamics_path, or its unfinished training `.partial`): whether those
  were trained as this run would train them cannot be told (their epoch cap, learning rate, ...
  are not recorded), so they are neither reused nor silently left beside a second set. A run that
  resumes from its own checkpoints does not need its ensembles (they are in its CellState) and
  is not checked."""
  old = legacy_dynamics_path(dynamics_dir, config)
  found = [p for p in (old, old + ".partial") if os.path.exists(p)]
  if found:
    raise UserError(
        f"{' and '.join(found)}: dynamics ensembles of seeds {config.seed}.."
        f"{config.seed + config.num_seeds - 1} saved by an earlier mombo_jax, which did not "
        "record their training settings (dyn_max_epochs, dyn_lr, ...): they cannot be shown to be "
        "what this run would train and are not reused; delete them to have this run train its "
        f"own in {dynamics_path(dynamics_dir, config)}, or pass another `dynamics_dir`.",
        params=("dynamics_dir",))


# ------------------------------------------------------------------------------ get or train

def get_dynamics(config, transitions, dataset, dynamics_dir, *, should_stop=None,
                 overwrite: bool = False, log: Callable = print):
  """config's seeds' dynamics ensembles [S] in dynamics_path(dynamics_dir, config): reused when
  saved there for this very setup (saved_dynamics.reuse_key: data, seeds and every training
  setting), else trained with cell_keys' dynamics keys (resumably: <path>.partial holds an
  unfinished training) and saved. Ensembles of other settings in dynamics_dir are left alone
  (named in a note); a legacy save of these seeds is refused (check_legacy_dynamics).

  overwrite: train again and replace a saved ensemble instead of reusing it (or refusing one of
  another setup).
  should_stop: a StopFlag; when it fires, training checkpoints and Interrupted is raised.
  """
  check_legacy_dynamics(dynamics_dir, config)
  path = dynamics_path(dynamics_dir, config)
  # Reading: shared with other readers; training and writing: this process alone.
  lock = dynamics_lock(dynamics_dir, config, shared=os.path.exists(path) and not overwrite)
  lock.acquire()
  ok = False
  try:
    dyn = _get_dynamics(config, transitions, dataset, dynamics_dir, path, should_stop, overwrite,
                        log)
    ok = True
    return dyn
  finally:
    lock.release(cleanup=not ok)


def dynamics_lock(dynamics_dir: str, config, shared: bool = False):
  """locks.FolderLock of config's ensembles in dynamics_dir (<dir>/seed<s>x<S>-<tag>.lock;
  acquire() it): exclusive while they are trained or written, shared while read."""
  return locks.FolderLock(dynamics_dir,
                          os.path.basename(dynamics_path(dynamics_dir, config)) + LOCK,
                          shared=shared, what="dynamics ensemble", fix=(
                              "wait until it has trained them (then they are reused), or pass "
                              "another --dynamics_dir"))


def _get_dynamics(config, transitions, dataset, dynamics_dir, path, should_stop, overwrite, log):
  # JAX (and the training's optax, orbax) only when an ensemble is got: the store's names and
  # locks are read by sweeps' plans without them.
  import jax

  from mombo_jax.dynamics import dynamics_training, saved_dynamics
  from mombo_jax.storage import checkpoint
  key = saved_dynamics.reuse_key(config, transitions,
                                 provenance.dataset_identity(dataset, transitions))
  if os.path.exists(path) and not overwrite:
    try:
      dyn, meta = saved_dynamics.load(path)
    except checkpoint.CheckpointError as e:
      raise UserError(f"{e}") from None
    differs = saved_dynamics.reuse_mismatch(meta, key)
    if differs:
      raise UserError(f"The dynamics ensembles in {path} were trained for another setup "
                      f"({saved_dynamics.format_mismatch(differs)}). "
                      f"Pass another `dynamics_dir`, or delete {path} to retrain them.",
                      params=("dynamics_dir",))
    log(f"Reusing the dynamics ensembles in {path}.")
    return dyn
  if jax.process_count() > 1:         # (run.distributed.is_multiprocess; run/ sits above)
    # Every process would train (and write) the same ensembles: train them once, apart.
    raise UserError(f"No dynamics ensembles in {path}, and a multi-process run does not train "
                    "them. Train them first in one process: python -m experiments.train_dynamics "
                    f"--dataset={dataset} --env={config.env} --algo={config.algo} "
                    + (f"--reference={config.reference} " if config.reference else "")
                    + f"--seed={config.seed} "
                    f"--seeds={config.num_seeds} --workdir={dynamics_dir} (same --preset and "
                    "dynamics flags), then launch again with --dynamics_dir.")
  for other, differs in _other_settings(dynamics_dir, config, path, key):
    log(f"note: {other} holds ensembles of these seeds trained otherwise "
        f"({saved_dynamics.format_mismatch(differs)}); not reused: this run trains its own in "
        f"{path}.")
  log(f"Training {config.num_seeds} dynamics ensemble(s) of {config.dynamics.dyn_members} members "
      f"({'x'.join(map(str, config.dynamics.dyn_hidden))}, {config.dynamics.dyn_elites} elites "
      "each; max epochs "
      f"{config.dynamics_training.dyn_max_epochs or 'none: early stopping'}; settings: "
      f"{saved_dynamics.describe_settings(config)}) on {len(transitions.rewards)} transitions, "
      f"into {path}.")
  t0 = time.time()
  partial = path + ".partial"
  try:
    dyn = dynamics_training.train_seeds(cell_keys(config)[0], transitions, config, log_fn=log,
                                        checkpoint_dir=partial, should_stop=should_stop,
                                        reuse_key=key)
  except dynamics_training.DynamicsTrainingStopped as e:
    raise Interrupted(getattr(should_stop, "signum", None),
                      f"dynamics epoch {e.epoch} (saved in {partial})") from None
  except checkpoint.CheckpointError as e:
    raise UserError(str(e)) from None
  except ValueError as e:
    raise UserError(f"Dynamics training on {dataset}: {e}") from None
  log(f"Dynamics trained in {time.time() - t0:.0f} s; elites per seed: "
      f"{np.asarray(dyn.elites).tolist()}.")
  saved_dynamics.save(path, dyn, config, overwrite=overwrite, reuse_key=key)
  shutil.rmtree(partial, ignore_errors=True)
  return dyn


def _other_settings(dynamics_dir, config, path, key):
  """[(path, reuse_mismatch)] of the saved ensembles of config's seeds in dynamics_dir other than
  `path` (trained with other settings or on other data); unreadable ones are skipped."""
  from mombo_jax.dynamics import saved_dynamics  # loads JAX: see sharing_plan
  from mombo_jax.storage import checkpoint  # loads JAX: see sharing_plan
  prefix = os.path.basename(legacy_dynamics_path(dynamics_dir, config)) + "-"
  out = []
  names = os.listdir(dynamics_dir) if os.path.isdir(dynamics_dir) else []
  for name in sorted(names):
    other = os.path.join(dynamics_dir, name)
    if not name.startswith(prefix) or other == path or not os.path.isdir(other) \
        or name.endswith(".partial"):
      continue
    try:
      meta = saved_dynamics.metadata(other)
    except checkpoint.CheckpointError:
      continue
    out.append((other, saved_dynamics.reuse_mismatch(meta, key)))
  return out


# ------------------------------------------------------------------------------ what is shared

def settings_sources(env: str, algo: str, preset: str = "paper", flags: Sequence[str] = (),
                     reference: Optional[str] = None) -> Dict[str, str]:
  """{training field: where make_config(env, algo, preset, reference=reference, ...) takes its
  value}, in make_config's order of precedence: a flag (`flags`: the fields the caller's flags
  set), the preset (config.PRESETS), the algorithm's reference source (references.source: its row
  for env, or its settings for every task; each citing its file), else the Config default (the
  references' shared dynamics settings)."""
  from mombo_jax.dynamics import saved_dynamics  # loads JAX: see sharing_plan
  src, ref = references.source(algo, reference), references.check(algo, reference)
  out = {}
  for name in saved_dynamics.TRAINING_FIELDS:
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


def sharing_plan(cells: Sequence[tuple], preset: str = "paper", flags: Dict[str, str] = None) \
    -> List[str]:
  """Lines saying, per dataset, which cells share a dynamics ensemble and why. cells: (env, algo,
  config, dynamics_dir) each; flags: {training field: the flag that set it for every cell}.
  Per dataset: how many ensembles and the settings that keep them apart; per ensemble its folder
  (dynamics_path), the algorithms that use it and the dynamics settings it follows with each
  value's source (settings_sources). Cells share an ensemble exactly when their training settings
  (saved_dynamics.training_settings) agree."""
  # saved_dynamics (and the training, the checkpoints) load JAX: a sweep's plan reads this
  # module's names and tags without it.
  from mombo_jax.dynamics import saved_dynamics
  flags = flags or {}
  fields = saved_dynamics.TRAINING_FIELDS
  defaults = saved_dynamics.training_settings(Config())
  lines = []
  for env in dict.fromkeys(c[0] for c in cells):
    mine = [c for c in cells if c[0] == env]
    ensembles = {}                       # dynamics_path -> cells, in plan order
    for c in mine:
      ensembles.setdefault(dynamics_path(c[3], c[2]), []).append(c)
    settings = {p: saved_dynamics.training_settings(cs[0][2]) for p, cs in ensembles.items()}
    apart = [f for f in fields if len({json.dumps(s[f]) for s in settings.values()}) > 1]
    shown = [f for f in fields
             if f in apart or any(s[f] != defaults[f] for s in settings.values())]
    lines.append(f"dynamics of {env}: {len(ensembles)} ensemble(s) for {len(mine)} cell(s)"
                 + (f", apart because these settings differ: {', '.join(apart)}" if apart else
                    ": every cell's dynamics settings agree, one ensemble is shared"))
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


# ----------------------------------------------------------------------------- dynamics alone

def dynamics_task(env, dataset):
  """(config env short name, dataset name or id, note for the log or None)."""
  if env is None and dataset is None:
    raise UserError("Pass env=<short name> (e.g. hopper-medium) or dataset=<Minari id>.",
                    params=("env", "dataset"))
  dataset = dataset or env
  if env is None:
    env = dataset if "/" not in dataset else names.short_name(dataset)
  note = None
  if env is None:
    # A foreign Minari id: the dynamics settings are the same for every task of an environment
    # (except walker2d-medium's epoch cap), so any short name of that environment gives them.
    env = f"{minari_io.env_name(dataset)}-random"
    note = f"{dataset} is not one of the project's datasets: using {env}'s dynamics settings."
  config_lib.parse_name(env)   # ValueError listing the valid names
  return env, dataset, note


def train_dynamics(env=None, dataset=None, seeds=4, seed=0, max_epochs=None, preset="paper",
                   workdir=None, overwrite=False, log_fn=print, should_stop=None, algo="mombo",
                   reference=None, matmul_precision="float32"):
  """experiments.train_dynamics: loads the dataset, trains `seeds` ensembles in one vmapped run
  (get_dynamics: the key scheme and the saved layout experiments.run reuses) and saves
  them; returns the saved path. The dynamics settings are `algo`'s for `env` under `preset` from
  the source `reference` (config.make_config; None: the algorithm's default; the references
  differ, e.g. in walker2d-medium's epoch cap), so the ensembles are reused by runs of the
  algorithms whose settings agree; matmul_precision: Config.matmul_precision (a run reuses the
  ensembles of its own). UserError for what the user can fix."""
  from mombo_jax.dynamics import saved_dynamics  # loads JAX: see sharing_plan

  try:
    env, dataset, note = dynamics_task(env, dataset)
  except ValueError as e:                  # unknown names: the message lists the valid ones
    raise UserError(str(e)) from None
  if note:
    log_fn(note)
  if seeds < 1:
    raise UserError(f"`seeds` must be >= 1, got {seeds}.", params=("seeds",))
  overrides = dict(seed=seed, num_seeds=seeds, reference=reference,
                   matmul_precision=matmul_precision)
  if max_epochs is not None:
    if max_epochs < 1:
      raise UserError(f"`max_epochs` must be >= 1, got {max_epochs}.", params=("max_epochs",))
    overrides["dyn_max_epochs"] = max_epochs
  try:
    config = config_lib.make_config(env, algo, preset, **overrides)
  except ValueError as e:
    raise UserError(str(e)) from None
  workdir = workdir or default_dynamics_root(dataset)
  check_legacy_dynamics(workdir, config)
  path = dynamics_path(workdir, config)
  if os.path.exists(path) and not overwrite:
    raise UserError(f"{path} already exists; pass overwrite=True to replace it, or another "
                    "`workdir`.", params=("overwrite", "workdir"))
  with dynamics_lock(workdir, config):       # before any work: one writer
    try:
      transitions = transitions_lib.load_transitions(dataset)
    except FileNotFoundError as e:         # DatasetNotFoundError names the collector command
      raise UserError(str(e)) from None
    log_fn(f"{dataset}: {len(transitions.rewards)} transitions, obs dim "
           f"{transitions.observations.shape[1]}, action dim {transitions.actions.shape[1]}.")
    get_dynamics(config, transitions, dataset, workdir, should_stop=should_stop,
                 overwrite=overwrite, log=log_fn)
  log_fn(f"Saved to {path} (dynamics settings: {saved_dynamics.describe_settings(config)}; "
         f"reused by runs with the same, e.g. python -m experiments.run --env={env} --algo={algo} "
         f"--reference={config.reference} --preset={preset} --seed={seed} --seeds={seeds} "
         + ("" if matmul_precision == config_lib.Config.matmul_precision
            else f"--matmul_precision={matmul_precision} ")
         + f"--dynamics_dir={workdir}).")
  return path
