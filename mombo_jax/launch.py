"""What a launch of experiments.run checks and prepares before training: the errors a user can
fix, the stop signals, validation of flags and workdirs, loading (or building) the dataset and
training (or reusing) the dynamics ensembles. The training loop itself is mombo_jax.runner.

Errors here are UserError: experiments.run prints them as one `error:` line without a traceback.
"""
import dataclasses
import json
import os
import sys
import time


class UserError(Exception):
  """A problem the user can fix; printed as one `error:` line without a traceback."""


class Interrupted(Exception):
  """SIGINT / SIGTERM stopped the run at a safe point, after checkpointing what it had."""

  def __init__(self, signum: int, where: str):
    super().__init__(where)
    self.signum = signum
    self.where = where


DEFAULT_COMPILATION_CACHE = os.path.join("~", ".cache", "mombo_jax", "jax")
EXIT_DIVERGED = 3           # the run finished, but at least one seed diverged and was left out
_OBS_DIM = {"hopper": 11, "walker2d": 17, "halfcheetah": 17}
_ACTION_DIM = {"hopper": 3, "walker2d": 6, "halfcheetah": 6}
# Config fields that may change between launches of one run without --allow_epochs_change.
_HARMLESS = ("eval_every", "eval_episodes")


def log(msg):
  """Progress output; in a multi-process run only process 0 speaks."""
  from mombo_jax import distributed
  if distributed.is_main():
    print(msg, flush=True)


class StopFlag:
  """Callable flag set by SIGINT / SIGTERM: the run stops at the next safe point (end of the epoch
  or dynamics epoch), checkpoints and exits; a second signal aborts at once."""

  def __init__(self):
    self.signum = None

  def __call__(self) -> bool:
    return self.signum is not None

  def install(self):
    import signal
    for sig in (signal.SIGINT, signal.SIGTERM):
      signal.signal(sig, self._handle)

  def _handle(self, signum, frame):
    del frame
    import signal
    name = signal.Signals(signum).name
    if self.signum is not None:
      print(f"\n{name} again: aborting at once; the last checkpoint stays usable.",
            file=sys.stderr, flush=True)
      os._exit(128 + signum)
    self.signum = signum
    print(f"\n{name} received: finishing the current epoch, then saving a checkpoint "
          f"(send it again to abort at once).", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------- validation

def enable_compilation_cache(path: str):
  """Points JAX's persistent compilation cache at `path` (~ expanded); "" leaves it off. Returns
  the folder used, or None. A folder that cannot be created only costs the cache (a note)."""
  if not path:
    return None
  path = os.path.expanduser(path)
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    log(f"note: --compilation_cache={path} cannot be created ({e.strerror or e}); compiling "
        "without a persistent cache.")
    return None
  import jax
  jax.config.update("jax_compilation_cache_dir", path)
  return path


def _check_dir(path: str, flag: str):
  """`path` exists or can be created, is a directory and is writable; else UserError."""
  import tempfile
  if os.path.exists(path) and not os.path.isdir(path):
    raise UserError(f"{flag}={path} is a file, not a folder; pass another {flag}.")
  try:
    os.makedirs(path, exist_ok=True)
    with tempfile.TemporaryFile(dir=path):
      pass
  except OSError as e:
    raise UserError(f"{flag}={path} cannot be created or written ({e.strerror or e}); pass a "
                    f"writable {flag}.") from None


def check_dataset_env(dataset: str, config):
  """Refuses a dataset of another environment than --env's (by name, or by its local metadata)."""
  from mombo_jax import data
  try:
    data._resolve(dataset)
  except ValueError as e:
    raise UserError(f"--dataset: {e}") from None
  found = data.dataset_env(dataset)
  if found is not None and found != config.env_name:
    raise UserError(f"--dataset={dataset} holds {found} data, but --env={config.env} trains and "
                    f"evaluates in {config.env_name}: pass a {config.env_name} dataset, or an "
                    f"--env of {found}.")


def check_seeds_fit_devices(num_seeds: int):
  """The seed axis is sharded over all devices (of every process): --seeds must be a multiple of
  their count."""
  import jax
  from mombo_jax import train as train_lib
  n = jax.device_count()
  try:
    train_lib.check_seed_count(num_seeds, fix=(
        f"pass --seeds a multiple of {n}, or make fewer devices visible (e.g. "
        "CUDA_VISIBLE_DEVICES=0, or XLA_FLAGS=--xla_force_host_platform_device_count on CPU)"))
  except ValueError as e:
    raise UserError(f"--seeds={num_seeds}: {e}") from None


def validate(config, dataset, workdir, dynamics_dir=None, keep=3, stop_after=None,
             build_steps=None, cells=None):
  """Everything checkable before any data or model work; raises UserError naming the flag.
  cells: how many cells the launch trains in one program (default config.num_seeds)."""
  if keep is None or keep < 1:
    raise UserError(f"--keep_checkpoints must be >= 1, got {keep}.")
  if stop_after is not None and stop_after < 1:
    raise UserError(f"--stop_after must be >= 1 (or unset), got {stop_after}.")
  if build_steps is not None and build_steps < 1:
    raise UserError(f"--build_steps must be >= 1, got {build_steps}.")
  check_seeds_fit_devices(config.num_seeds if cells is None else cells)
  check_dataset_env(dataset, config)
  _check_dir(workdir, "--workdir")
  if dynamics_dir is not None:
    _check_dir(dynamics_dir, "--dynamics_dir")


def _config_json(config, dataset):
  return json.loads(json.dumps(dict(dataclasses.asdict(config), dataset=dataset)))


def check_workdir_config(workdir, config, dataset, allow_epochs_change=False):
  """(config dict to write, list of notes) for `workdir`; refuses a run of another config, and a
  changed --epochs unless allow_epochs_change (then recorded with how the schedule was handled)."""
  new = _config_json(config, dataset)
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    return new, []
  try:
    with open(path) as f:
      old = json.load(f)
  except (OSError, ValueError) as e:
    raise UserError(f"{path} is unreadable ({e}); delete that file to start the run afresh "
                    "(its checkpoints then no longer match and must go too).") from None
  changed = {k: (old.get(k), v) for k, v in new.items() if old.get(k) != v
             and k not in ("epochs",) + _HARMLESS}
  if changed:
    raise UserError(f"{workdir} holds a run with another config "
                    f"({', '.join(f'{k}: {a!r} -> {b!r}' for k, (a, b) in sorted(changed.items()))}). "
                    "Pass another --workdir, or delete that folder to start over.")
  notes, history = [], list(old.get("epochs_changes", []))
  if old.get("epochs") != new["epochs"]:
    # With a fixed schedule_epochs the schedule does not move: the run stays a prefix of the
    # schedule_epochs-epoch run. Without one it spans --epochs and is re-spanned.
    fixed = new.get("schedule_epochs") is not None
    how = (f"unchanged: it spans schedule_epochs={new['schedule_epochs']} epochs whatever --epochs "
           "says" if fixed else "re-spanned over the new total from the current step on")
    if not allow_epochs_change:
      raise UserError(f"{workdir} holds a run of --epochs={old.get('epochs')}, not "
                      f"{new['epochs']}. Pass --allow_epochs_change to continue it to "
                      f"{new['epochs']} epochs (the actor's cosine learning-rate schedule is then "
                      f"{how}), or another --workdir.")
    history.append({"from": old.get("epochs"), "to": new["epochs"],
                    "actor_lr_schedule": ("unchanged: spans schedule_epochs" if fixed else
                                          "re-spanned: the cosine continues from the current "
                                          "step over the new total number of steps")})
    notes.append(f"--epochs changed {old.get('epochs')} -> {new['epochs']} "
                 f"(--allow_epochs_change): the actor's cosine schedule is {how}; recorded in "
                 "config.json.")
  for k in _HARMLESS:
    if old.get(k) != new[k]:
      notes.append(f"--{k} changed {old.get(k)} -> {new[k]}.")
  if history:
    new["epochs_changes"] = history
  return new, notes


# ------------------------------------------------------------------------------------- data

def load_dataset(dataset, config, build_missing, build_steps, download=False, require_full=False):
  """Transitions of `dataset`; a missing dataset that the collector knows by its short name is
  built with `build_steps` per recorded dataset when build_missing is True (any quality: random,
  the SAC qualities, the mixed ones) or "random" (random datasets only: the quick/tiny presets'
  default, as the others need an online SAC run first). A reduced build of a recipe (fewer
  transitions than its recipe's size) is refused when require_full."""
  from mombo_jax import config as config_lib, data, recipes
  try:
    transitions = data.load_transitions(dataset, download=download)
  except data.DatasetNotFoundError as e:
    try:
      quality = config_lib.parse_name(dataset)[1]
    except ValueError:
      quality = None                  # a Minari id: nothing here can build it
    if not quality or not (build_missing is True or (build_missing and quality == "random")):
      hint = ("" if not quality or quality == "random" else
              " Or pass --build_missing to have this run build it (an online SAC run first).")
      raise UserError(str(e) + hint) from None
    recipe = "mixed" if quality.endswith("pct") else quality
    sac = "" if quality == "random" else (
        "; it needs an online SAC run up to its medium point (about 20 minutes for hopper on a "
        "2-core CPU)" + (" and on to 1M steps for the expert (hours)" if "expert" in quality
                         else ""))
    log(f"Dataset {dataset} is missing: building it locally with the collector "
        f"({build_steps} steps per recorded dataset{sac}).")
    full = recipes.RECIPE_STEPS.get(recipe)
    if full and build_steps < min(full, 1_000_000):
      log(f"note: this is a REDUCED build of {dataset} ({build_steps} steps per recorded dataset "
          "where the recipe has 1M); paper-preset runs will refuse it until it is rebuilt with "
          f"`python -m experiments.collect --env={dataset} --overwrite`.")
    # A separate process: experiments.collect defines absl flags of its own.
    import subprocess
    cmd = [sys.executable, "-m", "experiments.collect", f"--env={dataset}", f"--steps={build_steps}",
           f"--seed={config.seed}"]
    if subprocess.run(cmd, check=False).returncode != 0:
      raise UserError(f"Building {dataset} failed: {' '.join(cmd)}") from None
    transitions = data.load_transitions(dataset)
  except ValueError as e:
    raise UserError(f"--dataset={dataset}: {e}") from None
  small = data.smaller_than_recipe(dataset)
  if small and require_full:
    raise UserError(small + " (paper settings expect the full dataset)")
  if small:
    log(f"note: {small.split(' Rebuild')[0]} Training on it as asked.")
  env = config.env_name
  if transitions.actions.shape[1] != _ACTION_DIM[env] or \
      transitions.observations.shape[1] != _OBS_DIM[env]:
    raise UserError(f"Dataset {dataset} has obs dim {transitions.observations.shape[1]} and action "
                    f"dim {transitions.actions.shape[1]}, but {env} needs {_OBS_DIM[env]} and "
                    f"{_ACTION_DIM[env]}; check --dataset / --env.")
  return transitions


def get_dynamics(config, transitions, seed_keys, dynamics_dir, dataset, should_stop=None):
  """The per-seed ensembles [S, ...]: loaded from dynamics_dir when saved there for this very
  setup (identity), else trained (resumably: <path>.partial holds an unfinished training)."""
  import shutil
  import numpy as np
  from mombo_jax import checkpoint, data, dynamics
  path = os.path.join(dynamics_dir, f"seed{config.seed}x{config.num_seeds}")
  ident = dynamics.identity(config, transitions, data.dataset_identity(dataset, transitions))
  if os.path.exists(path):
    try:
      dyn, meta = dynamics.load(path)
    except checkpoint.CheckpointError as e:
      raise UserError(f"{e}") from None
    differs = dynamics.identity_mismatch(meta, ident)
    if differs:
      what = "; ".join(f"{k}: saved {a!r}, now {b!r}" for k, (a, b) in sorted(differs.items()))
      raise UserError(f"The dynamics ensembles in {path} were trained for another setup ({what}). "
                      f"Pass another --dynamics_dir, or delete {path} to retrain them.")
    log(f"Reusing the dynamics ensembles in {path}.")
    return dyn
  from mombo_jax import distributed
  if distributed.is_multiprocess():
    # Every process would train (and write) the same ensembles: train them once, apart.
    raise UserError(f"No dynamics ensembles in {path}, and a multi-process run does not train "
                    "them. Train them first in one process: python -m experiments.train_dynamics "
                    f"--dataset={dataset} --env={config.env} --seed={config.seed} "
                    f"--seeds={config.num_seeds} --workdir={dynamics_dir} (same --preset and "
                    "dynamics flags), then launch again with --dynamics_dir.")
  log(f"Training {config.num_seeds} dynamics ensemble(s) of {config.dyn_members} members "
      f"on {len(transitions.rewards)} transitions.")
  t0 = time.time()
  partial = path + ".partial"
  try:
    dyn = dynamics.train_seeds(seed_keys, transitions, config, log_fn=log,
                               checkpoint_dir=partial, should_stop=should_stop, identity=ident)
  except dynamics.Interrupted as e:
    raise Interrupted(getattr(should_stop, "signum", None), f"dynamics epoch {e.epoch} (saved in {partial})") from None
  except checkpoint.CheckpointError as e:
    raise UserError(str(e)) from None
  except ValueError as e:
    raise UserError(f"Dynamics training on {dataset}: {e}") from None
  log(f"Dynamics trained in {time.time() - t0:.0f} s; elites per seed: "
      f"{np.asarray(dyn.elites).tolist()}.")
  dynamics.save(path, dyn, config, identity=ident)
  shutil.rmtree(partial, ignore_errors=True)
  return dyn


