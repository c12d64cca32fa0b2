"""What a launch of experiments.run checks and prepares before training: the stop signals,
validation of flags and folders, and loading (or building) the dataset. The run's folder
(config.json, checkpoints, dynamics) is mombo_jax.workdir's; the training loop mombo_jax.runner's.

Errors here are errors.UserError: experiments.run prints them as one `error:` line without a
traceback.
"""
import os
import sys

from mombo_jax.errors import DatasetNotFoundError, Interrupted, UserError


def default_compilation_cache(environ=os.environ) -> str:
  """--compilation_cache's default: JAX's own JAX_COMPILATION_CACHE_DIR where set (one cache for
  a shell's, or a test session's, launches), else ~/.cache/mombo_jax/jax."""
  return environ.get("JAX_COMPILATION_CACHE_DIR") or os.path.join("~", ".cache", "mombo_jax", "jax")


DEFAULT_COMPILATION_CACHE = default_compilation_cache()
EXIT_DIVERGED = 3           # the run finished, but at least one seed diverged and was left out


def log(msg):
  """Progress output; in a multi-process run only process 0 speaks."""
  from mombo_jax import distributed
  if distributed.is_main():
    print(msg, flush=True)


class StopFlag:
  """Callable flag set by SIGINT / SIGTERM: the run stops at the next safe point (within seconds:
  the loops poll it between device calls of about stops.CHUNK_SECONDS and between env steps),
  checkpoints and exits; a second signal aborts at once. SIGUSR1 is a stop request passed on by a
  parent process (launch.run_child): it sets the flag like the first signal and never aborts, so
  that a Ctrl-C that reached both processes is not taken twice."""

  def __init__(self):
    self.signum = None
    self._from_parent = False         # the flag was set by the parent's stop request (SIGUSR1)

  def __call__(self) -> bool:
    return self.signum is not None

  def install(self):
    import signal
    for sig in (signal.SIGINT, signal.SIGTERM):
      signal.signal(sig, self._handle)
    if hasattr(signal, "SIGUSR1"):
      signal.signal(signal.SIGUSR1, self._passed_on)

  def _handle(self, signum, frame):
    del frame
    import signal
    name = signal.Signals(signum).name
    if self.signum is not None and not self._from_parent:
      print(f"\n{name} again: aborting at once; the last checkpoint stays usable.",
            file=sys.stderr, flush=True)
      os._exit(128 + signum)
    if self.signum is None:
      print(f"\n{name} received: stopping within seconds, after saving a checkpoint "
            f"(send it again to abort at once).", file=sys.stderr, flush=True)
    self.signum, self._from_parent = signum, False

  def _passed_on(self, signum, frame):
    del signum, frame
    import signal
    if self.signum is None:
      self.signum, self._from_parent = signal.SIGTERM, True
      print("\nStop requested by the parent launch: stopping within seconds, after saving a "
            "checkpoint.", file=sys.stderr, flush=True)


def run_child(cmd, should_stop=None) -> int:
  """Runs cmd (argv list) in a child process to its end; returns its exit status. Once
  should_stop fires (this launch got SIGINT / SIGTERM), passes the stop on to the child once, as
  SIGUSR1 (StopFlag: a stop request that never aborts), so that a SIGTERM sent to this process
  alone stops the child within seconds too, and a Ctrl-C that reached both counts once."""
  import signal
  import subprocess
  proc = subprocess.Popen(cmd)
  passed = False
  while True:
    try:
      return proc.wait(timeout=0.2)
    except subprocess.TimeoutExpired:
      pass
    if not passed and should_stop is not None and should_stop():
      proc.send_signal(getattr(signal, "SIGUSR1", signal.SIGTERM))
      passed = True


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
  """`path` is a writable folder, or one that can be created (its nearest existing parent is a
  writable folder); else UserError. Creates nothing: a refused launch leaves no empty folder."""
  import tempfile
  if os.path.exists(path) and not os.path.isdir(path):
    raise UserError(f"{flag}={path} is a file, not a folder; pass another {flag}.")
  parent = os.path.abspath(path)
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    raise UserError(f"{flag}={path} cannot be created: {parent} is a file; pass another {flag}.")
  try:
    with tempfile.TemporaryFile(dir=parent):
      pass
  except OSError as e:
    raise UserError(f"{flag}={path} cannot be {'written' if parent == os.path.abspath(path) else 'created'} "
                    f"({e.strerror or e}: {parent}); pass a writable {flag}.") from None


def check_dataset_env(dataset: str, config):
  """Refuses a dataset of another environment than --env's (by name, or by its local metadata)."""
  from mombo_jax import names, provenance
  try:
    names.resolve(dataset)
  except ValueError as e:
    raise UserError(f"--dataset: {e}") from None
  found = provenance.dataset_env(dataset)
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
    train_lib.check_cell_count(num_seeds, fix=(
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


# ------------------------------------------------------------------------------------- data

def load_dataset(dataset, config, build_missing, build_steps, download=False, require_full=False,
                 should_stop=None):
  """Transitions of `dataset`; a missing dataset that the collector knows by its short name is
  built with `build_steps` per recorded dataset when build_missing is True (any quality: random,
  the SAC qualities, the mixed ones) or "random" (random datasets only: the quick/tiny presets'
  default, as the others need an online SAC run first). A reduced build of a recipe (fewer
  transitions than its recipe's size) is refused when require_full. should_stop: the launch's
  StopFlag; a build it stopped raises errors.Interrupted (the collector keeps its progress)."""
  from mombo_jax import config as config_lib, data, envs, provenance, recipes
  try:
    transitions = data.load_transitions(dataset, download=download)
  except DatasetNotFoundError as e:
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
    cmd = [sys.executable, "-m", "experiments.collect", f"--env={dataset}", f"--steps={build_steps}",
           f"--seed={config.seed}"]
    code = run_child(cmd, should_stop)
    # The collector checkpoints and stops on Ctrl-C (one process group) or the stop passed on.
    signum = (getattr(should_stop, "signum", None) if should_stop is not None and should_stop()
              else (-code if code < 0 else code - 128 if code in (130, 143) else None))
    if signum:
      raise Interrupted(signum, f"building {dataset} (the collector resumes from its "
                        "checkpoint)") from None
    if code != 0:
      raise UserError(f"Building {dataset} failed: {' '.join(cmd)}") from None
    transitions = data.load_transitions(dataset)
  except ValueError as e:
    raise UserError(f"--dataset={dataset}: {e}") from None
  small = provenance.smaller_than_recipe(dataset)
  if small and require_full:
    raise UserError(small + " (paper settings expect the full dataset)")
  if small:
    log(f"note: {small.split(' Rebuild')[0]} Training on it as asked.")
  env = config.env_name
  if transitions.actions.shape[1] != envs.ACTION_DIM[env] or \
      transitions.observations.shape[1] != envs.OBS_DIM[env]:
    raise UserError(f"Dataset {dataset} has obs dim {transitions.observations.shape[1]} and action "
                    f"dim {transitions.actions.shape[1]}, but {env} needs {envs.OBS_DIM[env]} and "
                    f"{envs.ACTION_DIM[env]}; check --dataset / --env.")
  return transitions


# ----------------------------------------------------------------------------- dynamics alone

def dynamics_task(env, dataset):
  """(config env short name, dataset name or id, note for the log or None)."""
  from mombo_jax import config as config_lib, minari_io, names
  if env is None and dataset is None:
    raise UserError("Pass --env=<short name> (e.g. hopper-medium) or --dataset=<Minari id>.")
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
                   reference=None):
  """experiments.train_dynamics: loads the dataset, trains `seeds` ensembles in one vmapped run
  (workdir.get_dynamics: the key scheme and the saved layout experiments.run reuses) and saves
  them; returns the saved path. The dynamics settings are `algo`'s for `env` under `preset` from
  the source `reference` (config.make_config; None: the algorithm's default; the references
  differ, e.g. in walker2d-medium's epoch cap), so the ensembles are reused by runs of the
  algorithms whose settings agree. UserError for what the user can fix."""
  from mombo_jax import config as config_lib, data, saved_dynamics, workdir as workdir_lib

  try:
    env, dataset, note = dynamics_task(env, dataset)
  except ValueError as e:                  # unknown names: the message lists the valid ones
    raise UserError(str(e)) from None
  if note:
    log_fn(note)
  if seeds < 1:
    raise UserError(f"--seeds must be >= 1, got {seeds}.")
  overrides = dict(seed=seed, num_seeds=seeds, reference=reference)
  if max_epochs is not None:
    if max_epochs < 1:
      raise UserError(f"--max_epochs must be >= 1, got {max_epochs}.")
    overrides["dyn_max_epochs"] = max_epochs
  try:
    config = config_lib.make_config(env, algo, preset, **overrides)
  except ValueError as e:
    raise UserError(str(e)) from None
  workdir = workdir or workdir_lib.default_dynamics_root(dataset)
  workdir_lib.check_legacy_dynamics(workdir, config)
  path = workdir_lib.dynamics_path(workdir, config)
  if os.path.exists(path) and not overwrite:
    raise UserError(f"{path} already exists; pass --overwrite to replace it, or another --workdir.")
  with workdir_lib.dynamics_lock(workdir, config):      # before any work: one writer
    try:
      transitions = data.load_transitions(dataset)
    except FileNotFoundError as e:         # DatasetNotFoundError names the collector command
      raise UserError(str(e)) from None
    log_fn(f"{dataset}: {len(transitions.rewards)} transitions, obs dim "
           f"{transitions.observations.shape[1]}, action dim {transitions.actions.shape[1]}.")
    workdir_lib.get_dynamics(config, transitions, dataset, workdir, should_stop=should_stop,
                             overwrite=overwrite, log=log_fn)
  log_fn(f"Saved to {path} (dynamics settings: {saved_dynamics.describe_settings(config)}; "
         f"reused by runs with the same, e.g. python -m experiments.run --env={env} --algo={algo} "
         f"--reference={config.reference} --preset={preset} --seed={seed} --seeds={seeds} "
         f"--dynamics_dir={workdir}).")
  return path
