r"""Train MOMBO / MOBILE / MOPO on a D4RL-style Minari dataset, many seeds in one launch.

  python -m experiments.run --env=walker2d-medium-replay --seeds=4
  python -m experiments.run --env=hopper-random --preset=quick        # offline quick start

Steps: load the dataset (building the random ones when missing and --build_missing), train or reuse
the dynamics ensembles (one per seed, vmapped), then the jit(vmap(epoch)) loop. The workdir gets
Orbax checkpoints (resumed when the same command runs again), metrics.csv, summary.json and
learning_curve.png.
"""
import dataclasses
import json
import os
import sys
import time

from absl import app, flags, logging

FLAGS = flags.FLAGS


def define_flags():
  """Flags are defined only when this module runs as the program, so tests can import it next to
  experiments.collect (absl flags are global)."""
  flags.DEFINE_string("env", "hopper-random", "Short dataset name, e.g. walker2d-medium-replay; "
                      "selects the paper's hyperparameters and the evaluation environment.")
  flags.DEFINE_string("dataset", None, "Dataset to train on (short name or Minari id); default --env.")
  flags.DEFINE_enum("algo", "mombo", ["mombo", "mobile", "mopo"], "Algorithm.")
  flags.DEFINE_enum("target", "lcb", ["lcb", "elite_spread", "mixture"], "MOMBO target mode.")
  flags.DEFINE_enum("preset", "paper", ["paper", "quick", "tiny"], "Budget preset (config.PRESETS).")
  flags.DEFINE_integer("seeds", 1, "Number of seeds, trained together (vmapped).")
  flags.DEFINE_integer("seed", 0, "First seed.")
  flags.DEFINE_integer("epochs", None, "Epochs (each steps_per_epoch gradient steps + one rollout).")
  flags.DEFINE_integer("steps_per_epoch", None, "Gradient steps per epoch.")
  flags.DEFINE_integer("eval_every", None, "Epochs between evaluations (and checkpoints).")
  flags.DEFINE_integer("eval_episodes", None, "Evaluation episodes per seed.")
  flags.DEFINE_integer("rollout_batch_size", None, "Model rollout start states per epoch.")
  flags.DEFINE_integer("rollout_length", None, "Model rollout length k.")
  flags.DEFINE_integer("dynamics_max_epochs", None, "Cap on dynamics training epochs.")
  flags.DEFINE_float("beta", None, "Penalty coefficient (MOMBO/MOBILE beta, MOPO lambda).")
  flags.DEFINE_float("real_ratio", None, "Fraction of real transitions in each batch.")
  flags.DEFINE_string("workdir", None, "Output folder; default runs/<dataset>/<algo>[-target]/s<seed>x<seeds>.")
  flags.DEFINE_string("dynamics_dir", None, "Where the dynamics ensembles are saved / reused; "
                      "default <workdir>/dynamics.")
  flags.DEFINE_bool("build_missing", None, "Build a missing dataset locally with the collector "
                    "(any short name: random, SAC-based, mixed); default: random datasets only, with "
                    "--preset=quick/tiny.")
  flags.DEFINE_integer("build_steps", None, "Steps of each dataset recorded by --build_missing "
                       "(default 1M, quick preset 100k, tiny 5k).")
  flags.DEFINE_bool("download", False, "Try Minari's server for a dataset that is not local "
                    "(e.g. --dataset=mujoco/hopper/medium-v0).")
  flags.DEFINE_integer("keep_checkpoints", 3, "Checkpoints kept in <workdir>/checkpoints.")
  flags.DEFINE_bool("allow_small_dataset", False, "Train with the paper preset on a reduced build "
                    "of the dataset's recipe (refused by default).")
  flags.DEFINE_bool("allow_epochs_change", False, "Continue a run with another --epochs (the "
                    "actor's cosine schedule is re-spanned; recorded in config.json).")
  flags.DEFINE_string("compilation_cache", DEFAULT_COMPILATION_CACHE, "Folder of JAX's "
                      "persistent compilation cache: a later launch of the same setup reads the "
                      "compiled epoch from there instead of compiling again. Empty: off.")
  flags.DEFINE_integer("stop_after", None, "Stop after this many epochs of this launch (e.g. to fit "
                       "a job time limit); the same command resumes.")


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
  """The seed axis is sharded over all local devices: --seeds must be a multiple of their count."""
  import jax
  from mombo_jax import train as train_lib
  n = jax.local_device_count()
  try:
    train_lib.check_seed_count(num_seeds, fix=(
        f"pass --seeds a multiple of {n}, or make fewer devices visible (e.g. "
        "CUDA_VISIBLE_DEVICES=0, or XLA_FLAGS=--xla_force_host_platform_device_count on CPU)"))
  except ValueError as e:
    raise UserError(f"--seeds={num_seeds}: {e}") from None


def validate(config, dataset, workdir, dynamics_dir=None, keep=3, stop_after=None,
             build_steps=None):
  """Everything checkable before any data or model work; raises UserError naming the flag."""
  if keep is None or keep < 1:
    raise UserError(f"--keep_checkpoints must be >= 1, got {keep}.")
  if stop_after is not None and stop_after < 1:
    raise UserError(f"--stop_after must be >= 1 (or unset), got {stop_after}.")
  if build_steps is not None and build_steps < 1:
    raise UserError(f"--build_steps must be >= 1, got {build_steps}.")
  check_seeds_fit_devices(config.num_seeds)
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
    if not allow_epochs_change:
      raise UserError(f"{workdir} holds a run of --epochs={old.get('epochs')}, not "
                      f"{new['epochs']}. Pass --allow_epochs_change to continue it to "
                      f"{new['epochs']} epochs (the actor's cosine learning-rate schedule is then "
                      "re-spanned over the new total from the current step on), or another "
                      "--workdir.")
    history.append({"from": old.get("epochs"), "to": new["epochs"],
                    "actor_lr_schedule": "re-spanned: the cosine continues from the current "
                                         "step over the new total number of steps"})
    notes.append(f"--epochs changed {old.get('epochs')} -> {new['epochs']} "
                 "(--allow_epochs_change): the actor's cosine schedule is re-spanned over the new "
                 "total from the current step on; recorded in config.json.")
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


def _mean_metrics(metrics):
  import numpy as np
  return {k: np.asarray(v).mean(axis=tuple(range(1, np.ndim(v)))) for k, v in metrics.items()
          if not k.startswith("diverged")}


def _poison_seed(state, seed_index):
  """Test hook: NaN into one seed's critic parameters, as a diverging update would leave them."""
  import jax
  import jax.numpy as jnp
  critic = jax.tree.map(lambda x: x.at[seed_index].set(jnp.nan), state.agent.critic.params)
  return state.replace(agent=state.agent.replace(critic=state.agent.critic.replace(params=critic)))


# -------------------------------------------------------------------------------------- train

def train(config, dataset, workdir, dynamics_dir=None, build_missing=False, build_steps=1_000_000,
          keep=3, stop_after=None, download=False, *, require_full=False,
          allow_epochs_change=False, should_stop=None, _poison=None):
  """A whole run (all seeds); resumes from <workdir>/checkpoints when present. Returns the summary,
  or None when `stop_after` epochs of this call ended it early (as a preempted job would).

  require_full: refuse a reduced build of the dataset's recipe (paper settings).
  should_stop: a StopFlag (or any callable with .signum); when it fires, the run checkpoints at the
  end of the current epoch and raises Interrupted.
  _poison: (seed index, epoch) test hook that makes that seed diverge before that epoch.
  """
  validate(config, dataset, workdir, dynamics_dir, keep, stop_after)
  cfg_json, notes = check_workdir_config(workdir, config, dataset, allow_epochs_change)

  import jax
  import jax.numpy as jnp
  import numpy as np
  from mombo_jax import buffer, checkpoint, data, evaluate, outputs, train as train_lib

  transitions = load_dataset(dataset, config, build_missing, build_steps, download, require_full)
  log(f"{dataset}: {len(transitions.rewards)} transitions, obs dim "
      f"{transitions.observations.shape[1]}, action dim {transitions.actions.shape[1]}.")
  # Only now, with the flags valid and the data loaded, does the workdir become this run's.
  outputs.write_json(os.path.join(workdir, "config.json"), cfg_json)
  for note in notes:
    log(f"note: {note}")

  real = buffer.from_transitions(transitions)
  seeds = np.arange(config.seed, config.seed + config.num_seeds)
  seed_keys = jax.vmap(jax.random.PRNGKey)(jnp.asarray(seeds))
  dyn_keys, init_keys, epoch_keys = (jax.vmap(lambda k, i=i: jax.random.fold_in(k, i))(seed_keys)
                                     for i in range(3))
  dyn = get_dynamics(config, transitions, dyn_keys, dynamics_dir or os.path.join(workdir, "dynamics"),
                     dataset, should_stop)

  # The seed axis lives split over all local devices from here on (restores keep the placement
  # of their template); the real dataset is copied to every device once.
  state = train_lib.shard_seeds(train_lib.init_seeds(init_keys, config, real, dyn))
  real, epoch_keys = train_lib.replicate(real), train_lib.shard_seeds(epoch_keys)
  ckpt = checkpoint.RunCheckpointer(os.path.join(workdir, "checkpoints"), keep=keep)
  csv_path = os.path.join(workdir, "metrics.csv")
  diverged = {}                      # seed -> {"seed", "epoch", "quantity"}
  if ckpt.latest_step() is not None:
    try:
      state, meta = ckpt.restore(state)
    except checkpoint.CheckpointError as e:
      raise UserError(str(e)) from None
    diverged = {int(d["seed"]): d for d in (meta or {}).get("diverged", [])}
    log(f"Resumed from {ckpt.directory} at epoch {int(np.asarray(state.epoch)[0])}.")
  start_epoch = int(np.asarray(state.epoch)[0])
  rows = outputs.read_rows(csv_path, max_epoch=start_epoch)
  outputs.write_rows(csv_path, rows)

  def save(epoch):
    if ckpt.latest_step() != epoch:
      ckpt.save(epoch, state, {"epoch": epoch, "diverged": list(diverged.values())})

  def stop_requested(epoch):
    if should_stop is not None and should_stop():
      save(epoch)
      raise Interrupted(getattr(should_stop, "signum", None), f"epoch {epoch} (checkpoint in {ckpt.directory})")

  fold = jax.jit(jax.vmap(jax.random.fold_in, in_axes=(0, None)))
  devices = jax.local_devices()
  log(f"Seeds sharded over {len(devices)} {devices[0].platform} device(s), "
      f"{config.num_seeds // len(devices)} per device.")
  # Compiled ahead of the loop, so steps/s and the ETA measure training only. Arguments keep
  # one placement throughout (the compiled function refuses any other).
  if start_epoch < config.epochs:
    t_compile = time.time()
    epoch_fn = train_lib.make_seeds_epoch(config).lower(
        state, real, fold(epoch_keys, start_epoch)).compile()
    log(f"Compiled the epoch in {time.time() - t_compile:.1f} s.")
  ref_min, ref_max, ref_source = data.ref_scores(dataset)
  log(f"Normalised scores use R_random={ref_min:.2f}, R_expert={ref_max:.2f} ({ref_source}).")
  t_start, steps_done = time.time(), 0
  evaluator = None                   # built at the first evaluation, reused by the others
  try:
    for epoch in range(start_epoch, config.epochs):
      stop_requested(epoch)
      if stop_after is not None and epoch - start_epoch >= stop_after:
        save(epoch)
        log(f"Stopping after {stop_after} epoch(s) as asked; run again to resume.")
        return None
      if _poison is not None and _poison[1] == epoch:
        state = train_lib.shard_seeds(_poison_seed(state, _poison[0]))
      state, metrics = epoch_fn(state, real, fold(epoch_keys, epoch))
      steps_done += config.steps_per_epoch
      done = epoch + 1
      frozen = np.asarray(metrics["diverged"])
      for i, s in enumerate(seeds):
        if frozen[i] and int(s) not in diverged:
          what = [k for k in train_lib.DIVERGENCE_CHECKS
                  if bool(np.asarray(metrics[f"diverged/{k}"])[i])]
          quantity = ", ".join(what) or "unknown"
          diverged[int(s)] = {"seed": int(s), "epoch": done, "quantity": quantity}
          log(f"seed {s} diverged at epoch {done} ({quantity} non-finite or beyond +-"
              f"{config.max_abs_loss:g}); it is frozen at its last healthy state and left out of "
              "the summary. The other seeds go on.")
      if done % config.eval_every and done != config.epochs:
        stop_requested(done)
        continue
      means = _mean_metrics(metrics)
      if evaluator is None:
        evaluator = evaluate.Evaluator(config, config.env_name, config.num_seeds,
                                       config.eval_episodes)
      returns = evaluator.run(state.agent.actor.params, seed=10_000 * config.seed + done)
      scores = data.normalized_score(dataset, returns)          # [S, episodes]
      for i, s in enumerate(seeds):
        row = dict(epoch=done, step=done * config.steps_per_epoch, seed=int(s),
                   return_mean=float(returns[i].mean()), normalized_score=float(scores[i].mean()),
                   diverged=float(int(s) in diverged))
        row.update({k: float(v[i]) for k, v in sorted(means.items())})
        rows.append(row)
      outputs.write_rows(csv_path, rows)
      save(done)
      elapsed = time.time() - t_start
      rate = steps_done * config.num_seeds / max(elapsed, 1e-9)
      eta = (config.epochs - done) * config.steps_per_epoch * config.num_seeds / max(rate, 1e-9)
      log(f"epoch {done}/{config.epochs}  {rate:.0f} steps/s (all seeds)  score per seed "
          f"[{', '.join(f'{x:.1f}' for x in scores.mean(axis=1))}]  critic_loss "
          f"[{', '.join(f'{x:.3g}' for x in means['critic_loss'])}]  ETA {_fmt(eta)}"
          + (f"  diverged seeds {sorted(diverged)}" if diverged else ""))
      stop_requested(done)
  finally:
    if evaluator is not None:
      evaluator.close()

  summary = outputs.summarise(rows, seeds, sorted(diverged.values(), key=lambda d: d["seed"]))
  outputs.write_json(os.path.join(workdir, "summary.json"), summary)
  title = (f"{config.algo} ({config.target}) on {dataset}" if config.algo == "mombo"
           else f"{config.algo} on {dataset}")
  outputs.plot_curve(rows, seeds, os.path.join(workdir, "learning_curve.png"), title,
                     sorted(diverged))
  log(f"final normalised score {_num(summary['final_normalized_score_mean'])} "
      f"+- {_num(summary['final_normalized_score_std'])}, AULC {_num(summary['aulc_mean'])}"
      + (f" over the {len(seeds) - len(diverged)} healthy seed(s)" if diverged else "")
      + f"; wrote {workdir}")
  return summary


def _num(x):
  return "n/a" if x is None else f"{x:.1f}"


def _fmt(seconds):
  seconds = int(seconds)
  return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m{seconds % 60:02d}s"


def _overrides():
  mapping = dict(epochs="epochs", steps_per_epoch="steps_per_epoch", eval_every="eval_every",
                 eval_episodes="eval_episodes", rollout_batch_size="rollout_batch_size",
                 rollout_length="rollout_length", dynamics_max_epochs="dyn_max_epochs",
                 beta="beta", real_ratio="real_ratio")
  out = {field: getattr(FLAGS, flag) for flag, field in mapping.items()
         if getattr(FLAGS, flag) is not None}
  out.update(target=FLAGS.target, seed=FLAGS.seed, num_seeds=FLAGS.seeds)
  return out


def _resume_command() -> str:
  import shlex
  return " ".join([shlex.quote(sys.executable), "-m", "experiments.run"]
                  + [shlex.quote(a) for a in sys.argv[1:]])


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)   # Orbax logs every save at INFO
  stop = StopFlag()
  stop.install()
  from mombo_jax import config as config_lib
  try:
    config = config_lib.make_config(FLAGS.env, FLAGS.algo, FLAGS.preset, **_overrides())
  except ValueError as e:
    sys.exit(f"error: {e}")
  dataset = FLAGS.dataset or FLAGS.env
  workdir = FLAGS.workdir or os.path.join(
      "runs", dataset.replace("/", "_"),
      FLAGS.algo + (f"-{FLAGS.target}" if FLAGS.algo == "mombo" else ""),
      f"s{FLAGS.seed}x{FLAGS.seeds}")
  build = FLAGS.build_missing
  if build is None:
    build = "random" if FLAGS.preset in ("quick", "tiny") else False
  build_steps = FLAGS.build_steps or (100_000 if FLAGS.preset == "quick" else
                                      5_000 if FLAGS.preset == "tiny" else 1_000_000)
  try:
    validate(config, dataset, workdir, FLAGS.dynamics_dir, FLAGS.keep_checkpoints,
             FLAGS.stop_after, build_steps)
    enable_compilation_cache(FLAGS.compilation_cache)
    summary = train(config, dataset=dataset, workdir=workdir, dynamics_dir=FLAGS.dynamics_dir,
                    build_missing=build, build_steps=build_steps, keep=FLAGS.keep_checkpoints,
                    stop_after=FLAGS.stop_after, download=FLAGS.download,
                    require_full=FLAGS.preset == "paper" and not FLAGS.allow_small_dataset,
                    allow_epochs_change=FLAGS.allow_epochs_change, should_stop=stop)
  except UserError as e:
    sys.exit(f"error: {e}")
  except Interrupted as e:
    print(f"Stopped at {e.where}. Resume with:\n  {_resume_command()}", file=sys.stderr,
          flush=True)
    sys.exit(128 + (e.signum or 2))
  if summary and summary.get("diverged"):
    seeds = ", ".join(f"seed {d['seed']} (epoch {d['epoch']}, {d['quantity']})"
                      for d in summary["diverged"])
    print(f"error: {len(summary['diverged'])} seed(s) diverged and were left out of the summary: "
          f"{seeds}. Their last healthy checkpoints are in {os.path.join(workdir, 'checkpoints')}; "
          "a smaller --beta often helps.", file=sys.stderr, flush=True)
    sys.exit(EXIT_DIVERGED)


if __name__ == "__main__":
  define_flags()
  app.run(main)
