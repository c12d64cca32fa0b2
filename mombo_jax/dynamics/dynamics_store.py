"""Where a run's dynamics ensembles live and how a run gets them: the refusal of saves that predate
the folder scheme (check_legacy_dynamics), the lock (dynamics_lock) and get-or-train
(get_dynamics: reuse the saved ensembles of this very setup, else train and save them).

    <dynamics_dir>/
      seed<s>x<S>-<tag>/          the S ensembles of seeds s.., trained with the settings <tag>
                                  names (reuse.dynamics_path, reuse.settings_tag: cap30-1a2b3c4d)
      seed<s>x<S>-<tag>.partial/  their unfinished training (dynamics_training), resumable
      seed<s>x<S>-<tag>.lock      the lock of whoever trains or reads them

The rule (reuse.py): an ensemble is reused only by a run that would have trained the same one
(same data, seeds and reuse.TRAINING_FIELDS). Runs of other settings get another folder and train
their own; ensembles of the same settings are shared, whoever trained them (a --betas grid's
betas, a sweep's algorithms, experiments.train_dynamics: pretrain.py).
"""
from __future__ import annotations

import os
import shutil
import time
from typing import Optional

import jax
import numpy as np

from mombo_jax.core.key_scheme import cell_keys
from mombo_jax.data import provenance
from mombo_jax.dynamics import dynamics_training, reuse, saved_dynamics
from mombo_jax.errors import Interrupted, UserError
from mombo_jax.records.workdir import LOCK
from mombo_jax.storage import checkpoint, locks


def check_legacy_dynamics(dynamics_dir: str, config, place: Optional[reuse.Shelf] = None):
  """Refuses (UserError, one line naming the fix) a launch that would train config's ensembles in
  a dynamics_dir holding ensembles of the same seeds saved before their reuse key recorded the
  training settings (reuse.legacy_dynamics_path, or its unfinished training `.partial`): whether
  those were trained as this run would train them cannot be told (their epoch cap, learning
  rate, ... are not recorded), so they are neither reused nor silently left beside a second set.
  A run that resumes from its own checkpoints does not need its ensembles (they are in its
  CellState) and is not checked. place: config's reuse.Shelf, if already looked up."""
  place = place or reuse.shelf(dynamics_dir, config)
  found = [p for p in (place.legacy, place.legacy + ".partial") if os.path.exists(p)]
  if found:
    raise UserError(
        f"{' and '.join(found)}: dynamics ensembles of seeds {config.seed}.."
        f"{config.seed + config.num_seeds - 1} saved by an earlier mombo_jax, which did not "
        "record their training settings (dyn_max_epochs, dyn_lr, ...): they cannot be shown to be "
        f"what this run would train and are not reused; delete them to have this run train its "
        f"own in {place.path}, or pass another `dynamics_dir`.",
        params=("dynamics_dir",))


def dynamics_lock(dynamics_dir: str, config, shared: bool = False,
                  place: Optional[reuse.Shelf] = None):
  """locks.FolderLock of config's ensembles in dynamics_dir (<dir>/seed<s>x<S>-<tag>.lock;
  acquire() it): exclusive while they are trained or written, shared while read."""
  place = place or reuse.shelf(dynamics_dir, config)
  return locks.FolderLock(dynamics_dir, os.path.basename(place.path) + LOCK,
                          shared=shared, what="dynamics ensemble", fix=(
                              "wait until it has trained them (then they are reused), or pass "
                              "another --dynamics_dir"))


# ------------------------------------------------------------------------------ get or train

class Console:
  """Where get_dynamics's lines go: line(text) hands each to `write` (default: printed). Any
  object with a line(text) method serves: a launch passes run/console.CONSOLE (process 0 speaks),
  tests a collector."""

  def __init__(self, write=print):
    self.write = write

  def line(self, text: str):
    self.write(text)


def get_dynamics(config, transitions, dataset, dynamics_dir, *, should_stop=None,
                 overwrite: bool = False, console=None):
  """config's seeds' dynamics ensembles [S] in reuse.dynamics_path(dynamics_dir, config): reused
  when saved there for this very setup (reuse.reuse_key: data, seeds and every training
  setting), else trained with cell_keys' dynamics keys (resumably: <path>.partial holds an
  unfinished training) and saved. Ensembles of other settings in dynamics_dir are left alone
  (named in a note); a legacy save of these seeds is refused (check_legacy_dynamics).

  Read top to bottom, it is the whole get-or-train: the place and key worked out once
  (reuse.shelf), the legacy check, the lock, then reuse (_reuse) or train (_train).

  overwrite: train again and replace a saved ensemble instead of reusing it (or refusing one of
  another setup).
  should_stop: a StopFlag; when it fires, training checkpoints and Interrupted is raised.
  console: where its lines go (line(text); default Console(): printed).
  """
  console = console or Console()
  place = reuse.shelf(dynamics_dir, config, transitions,
                      provenance.dataset_identity(dataset, transitions))
  check_legacy_dynamics(dynamics_dir, config, place)
  # Reading: shared with other readers; training and writing: this process alone.
  lock = dynamics_lock(dynamics_dir, config, shared=os.path.exists(place.path) and not overwrite,
                       place=place).acquire()
  ok = False
  try:
    if os.path.exists(place.path) and not overwrite:      # as found under the lock
      dyn = _reuse(place, console)
    else:
      dyn = _train(config, transitions, dataset, dynamics_dir, place, should_stop, overwrite,
                   console)
    ok = True
    return dyn
  finally:
    lock.release(cleanup=not ok)


def _reuse(place: reuse.Shelf, console):
  """The saved ensembles at place.path, refused when saved for another setup."""
  try:
    dyn, meta = saved_dynamics.load(place.path)
  except checkpoint.CheckpointError as e:
    raise UserError(f"{e}") from None
  differs = place.mismatch_line(meta)
  if differs:
    raise UserError(f"The dynamics ensembles in {place.path} were trained for another setup "
                    f"({differs}). Pass another `dynamics_dir`, or delete {place.path} to "
                    "retrain them.", params=("dynamics_dir",))
  console.line(f"Reusing the dynamics ensembles in {place.path}.")
  return dyn


def _train(config, transitions, dataset, dynamics_dir, place: reuse.Shelf, should_stop, overwrite,
           console):
  """config's ensembles trained (resumably, in place.partial) and saved at place.path."""
  if jax.process_count() > 1:         # (run.distributed.is_multiprocess; run/ sits above)
    # Every process would train (and write) the same ensembles: train them once, apart.
    raise UserError(f"No dynamics ensembles in {place.path}, and a multi-process run does not "
                    "train them. Train them first in one process: python -m "
                    f"experiments.train_dynamics --dataset={dataset} --env={config.env} "
                    f"--algo={config.algo} "
                    + (f"--reference={config.reference} " if config.reference else "")
                    + f"--seed={config.seed} "
                    f"--seeds={config.num_seeds} --workdir={dynamics_dir} (same --preset and "
                    "dynamics flags), then launch again with --dynamics_dir.")
  for other, differs in _other_settings(dynamics_dir, place):
    console.line(f"note: {other} holds ensembles of these seeds trained otherwise ({differs}); "
                 f"not reused: this run trains its own in {place.path}.")
  console.line(
      f"Training {config.num_seeds} dynamics ensemble(s) of {config.dynamics.dyn_members} members "
      f"({'x'.join(map(str, config.dynamics.dyn_hidden))}, {config.dynamics.dyn_elites} elites "
      "each; max epochs "
      f"{config.dynamics_training.dyn_max_epochs or 'none: early stopping'}; settings: "
      f"{place.settings}) on {len(transitions.rewards)} transitions, into {place.path}.")
  t0 = time.time()
  try:
    dyn = dynamics_training.train_seeds(cell_keys(config)[0], transitions, config,
                                        log_fn=console.line, checkpoint_dir=place.partial,
                                        should_stop=should_stop, reuse_key=place.key)
  except dynamics_training.DynamicsTrainingStopped as e:
    raise Interrupted(getattr(should_stop, "signum", None),
                      f"dynamics epoch {e.epoch} (saved in {place.partial})") from None
  except checkpoint.CheckpointError as e:
    raise UserError(str(e)) from None
  except ValueError as e:
    raise UserError(f"Dynamics training on {dataset}: {e}") from None
  console.line(f"Dynamics trained in {time.time() - t0:.0f} s; elites per seed: "
               f"{np.asarray(dyn.elites).tolist()}.")
  saved_dynamics.save(place.path, dyn, config, overwrite=overwrite, reuse_key=place.key)
  shutil.rmtree(place.partial, ignore_errors=True)
  return dyn


def _other_settings(dynamics_dir, place: reuse.Shelf):
  """[(path, what differs)] of the saved ensembles of these seeds in dynamics_dir other than
  place.path (trained with other settings or on other data); unreadable ones are skipped."""
  prefix = os.path.basename(place.legacy) + "-"
  out = []
  names = os.listdir(dynamics_dir) if os.path.isdir(dynamics_dir) else []
  for name in sorted(names):
    other = os.path.join(dynamics_dir, name)
    if not name.startswith(prefix) or other == place.path or not os.path.isdir(other) \
        or name.endswith(".partial"):
      continue
    try:
      meta = saved_dynamics.metadata(other)
    except checkpoint.CheckpointError:
      continue
    out.append((other, place.mismatch_line(meta)))
  return out
