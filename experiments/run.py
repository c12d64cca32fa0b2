r"""Train MOMBO / MOBILE / MOPO on a D4RL-style Minari dataset, many seeds in one launch.

  python -m experiments.run --env=walker2d-medium-replay --seeds=4
  python -m experiments.run --env=hopper-random --preset=quick        # offline quick start

Steps: load the dataset (building the random ones when missing and --build_missing), train or reuse
the dynamics ensembles (one per seed, vmapped), then the jit(vmap(epoch)) loop. The workdir gets
Orbax checkpoints (resumed when the same command runs again), metrics.csv, summary.json and
learning_curve.png.
"""
import csv
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
  flags.DEFINE_bool("build_missing", None, "Build a missing random dataset locally (default: on for "
                    "--preset=quick/tiny).")
  flags.DEFINE_integer("build_steps", None, "Steps of a random dataset built by --build_missing "
                       "(default 1M, quick preset 100k).")
  flags.DEFINE_bool("download", False, "Try Minari's server for a dataset that is not local "
                    "(e.g. --dataset=mujoco/hopper/medium-v0).")
  flags.DEFINE_integer("keep_checkpoints", 3, "Checkpoints kept in <workdir>/checkpoints.")
  flags.DEFINE_integer("stop_after", None, "Stop after this many epochs of this launch (e.g. to fit "
                       "a job time limit); the same command resumes.")


class UserError(Exception):
  """A problem the user can fix; printed without a traceback."""


def log(msg):
  print(msg, flush=True)


def load_dataset(dataset, config, build_missing, build_steps, download=False):
  """Transitions of `dataset`; builds a missing random dataset when allowed."""
  from mombo_jax import data
  try:
    return data.load_transitions(dataset, download=download)
  except data.DatasetNotFoundError as e:
    quality = dataset.partition("-")[2]
    if not (build_missing and quality == "random"):
      raise UserError(str(e)) from None
    log(f"Dataset {dataset} is missing: building it locally ({build_steps} random steps).")
    # A separate process: experiments.collect defines absl flags of its own.
    import subprocess
    cmd = [sys.executable, "-m", "experiments.collect", f"--env={dataset}", f"--steps={build_steps}",
           f"--seed={config.seed}"]
    if subprocess.run(cmd, check=False).returncode != 0:
      raise UserError(f"Building {dataset} failed: {' '.join(cmd)}") from None
    return data.load_transitions(dataset)


def get_dynamics(config, transitions, seed_keys, dynamics_dir):
  """The per-seed ensembles [S, ...]: loaded from dynamics_dir when saved there, else trained."""
  import numpy as np
  from mombo_jax import checkpoint, dynamics
  path = os.path.join(dynamics_dir, f"seed{config.seed}x{config.num_seeds}")
  if os.path.exists(path):
    try:
      dyn, meta = dynamics.load(path)
    except checkpoint.CheckpointError as e:
      raise UserError(f"{e}") from None
    if meta.get("obs_dim") != transitions.observations.shape[1]:
      raise UserError(f"The dynamics models in {path} were trained on another dataset "
                      f"(obs dim {meta.get('obs_dim')}); pass another --dynamics_dir.")
    log(f"Reusing the dynamics ensembles in {path}.")
    return dyn
  log(f"Training {config.num_seeds} dynamics ensemble(s) of {config.dyn_members} members "
      f"on {len(transitions.rewards)} transitions.")
  t0 = time.time()
  dyn = dynamics.train_seeds(seed_keys, transitions, config, log_fn=log)
  log(f"Dynamics trained in {time.time() - t0:.0f} s; elites per seed: "
      f"{np.asarray(dyn.elites).tolist()}.")
  dynamics.save(path, dyn, config)
  return dyn


def _mean_metrics(metrics):
  import numpy as np
  return {k: np.asarray(v).mean(axis=tuple(range(1, np.ndim(v)))) for k, v in metrics.items()}


def train(config, dataset, workdir, dynamics_dir=None, build_missing=False, build_steps=1_000_000,
          keep=3, stop_after=None, download=False):
  """A whole run (all seeds); resumes from <workdir>/checkpoints when present. Returns the summary,
  or None when `stop_after` epochs of this call ended it early (as a preempted job would)."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from mombo_jax import buffer, checkpoint, data, evaluate, train as train_lib

  os.makedirs(workdir, exist_ok=True)
  cfg_path = os.path.join(workdir, "config.json")
  cfg_dict = dict(dataclasses.asdict(config), dataset=dataset)
  cfg_json = json.loads(json.dumps(cfg_dict))
  if os.path.exists(cfg_path):
    with open(cfg_path) as f:
      old = json.load(f)
    changed = {k: (old.get(k), v) for k, v in cfg_json.items() if old.get(k) != v
               and k not in ("epochs", "eval_every", "eval_episodes")}
    if changed:
      raise UserError(f"{workdir} holds a run with another config ({changed}, old -> new). "
                      "Pass another --workdir, or delete that folder to start over.")
  with open(cfg_path, "w") as f:
    json.dump(cfg_json, f, indent=1)

  transitions = load_dataset(dataset, config, build_missing, build_steps, download)
  if transitions.actions.shape[1] != _action_dim(config):
    raise UserError(f"Dataset {dataset} has action dim {transitions.actions.shape[1]} but "
                    f"{config.env_name} needs {_action_dim(config)}; check --dataset / --env.")
  log(f"{dataset}: {len(transitions.rewards)} transitions, obs dim "
      f"{transitions.observations.shape[1]}, action dim {transitions.actions.shape[1]}.")
  real = buffer.from_transitions(transitions)
  seeds = np.arange(config.seed, config.seed + config.num_seeds)
  seed_keys = jax.vmap(jax.random.PRNGKey)(jnp.asarray(seeds))
  dyn_keys, init_keys, epoch_keys = (jax.vmap(lambda k, i=i: jax.random.fold_in(k, i))(seed_keys)
                                     for i in range(3))
  dyn = get_dynamics(config, transitions, dyn_keys, dynamics_dir or os.path.join(workdir, "dynamics"))

  state = train_lib.init_seeds(init_keys, config, real, dyn)
  ckpt = checkpoint.RunCheckpointer(os.path.join(workdir, "checkpoints"), keep=keep)
  csv_path = os.path.join(workdir, "metrics.csv")
  if ckpt.latest_step() is not None:
    try:
      state, _ = ckpt.restore(state)
    except checkpoint.CheckpointError as e:
      raise UserError(str(e)) from None
    log(f"Resumed from {ckpt.directory} at epoch {int(np.asarray(state.epoch)[0])}.")
  start_epoch = int(np.asarray(state.epoch)[0])
  rows = _read_rows(csv_path, max_epoch=start_epoch)
  _write_rows(csv_path, rows)

  epoch_fn = train_lib.make_seeds_epoch(config)
  fold = jax.jit(jax.vmap(jax.random.fold_in, in_axes=(0, None)))
  ref_min, ref_max, ref_source = data.ref_scores(dataset)
  log(f"Normalised scores use R_random={ref_min:.2f}, R_expert={ref_max:.2f} ({ref_source}).")
  t_start, steps_done = time.time(), 0
  for epoch in range(start_epoch, config.epochs):
    if stop_after is not None and epoch - start_epoch >= stop_after:
      if ckpt.latest_step() != epoch:
        ckpt.save(epoch, state, {"epoch": epoch})
      log(f"Stopping after {stop_after} epoch(s) as asked; run again to resume.")
      return None
    state, metrics = epoch_fn(state, real, fold(epoch_keys, epoch))
    steps_done += config.steps_per_epoch
    done = epoch + 1
    if done % config.eval_every and done != config.epochs:
      continue
    means = _mean_metrics(metrics)
    bad = [k for k, v in means.items() if not np.all(np.isfinite(v))]
    if bad:
      raise UserError(f"Non-finite training metrics at epoch {done}: {bad}. The last good "
                      f"checkpoint is in {ckpt.directory}; try a smaller --beta or learning rate.")
    returns = evaluate.run(state.agent.actor.params, config, config.env_name,
                           config.eval_episodes, seed=10_000 * config.seed + done)
    scores = data.normalized_score(dataset, returns)          # [S, episodes]
    for i, s in enumerate(seeds):
      row = dict(epoch=done, step=done * config.steps_per_epoch, seed=int(s),
                 return_mean=float(returns[i].mean()), normalized_score=float(scores[i].mean()))
      row.update({k: float(v[i]) for k, v in sorted(means.items())})
      rows.append(row)
    _write_rows(csv_path, rows)
    ckpt.save(done, state, {"epoch": done})
    elapsed = time.time() - t_start
    rate = steps_done * config.num_seeds / max(elapsed, 1e-9)
    eta = (config.epochs - done) * config.steps_per_epoch * config.num_seeds / max(rate, 1e-9)
    log(f"epoch {done}/{config.epochs}  {rate:.0f} steps/s (all seeds)  score per seed "
        f"[{', '.join(f'{x:.1f}' for x in scores.mean(axis=1))}]  critic_loss "
        f"[{', '.join(f'{x:.3g}' for x in means['critic_loss'])}]  ETA {_fmt(eta)}")
  summary = _summarise(rows, seeds)
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    json.dump(summary, f, indent=1)
  _plot(rows, seeds, os.path.join(workdir, "learning_curve.png"), dataset, config)
  log(f"final normalised score {summary['final_normalized_score_mean']:.1f} "
      f"+- {summary['final_normalized_score_std']:.1f}, AULC {summary['aulc_mean']:.1f}; "
      f"wrote {workdir}")
  return summary


def _action_dim(config):
  return {"hopper": 3, "walker2d": 6, "halfcheetah": 6}[config.env_name]


def _fmt(seconds):
  seconds = int(seconds)
  return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m{seconds % 60:02d}s"


def _read_rows(path, max_epoch):
  if not os.path.exists(path):
    return []
  with open(path) as f:
    rows = [{k: (int(v) if k in ("epoch", "step", "seed") else float(v)) for k, v in r.items()}
            for r in csv.DictReader(f)]
  # Rows after the restored checkpoint were written by a run killed before it checkpointed.
  return [r for r in rows if r["epoch"] <= max_epoch]


def _write_rows(path, rows):
  tmp = path + ".tmp"
  with open(tmp, "w", newline="") as f:
    if rows:
      writer = csv.DictWriter(f, fieldnames=list(rows[0]))
      writer.writeheader()
      writer.writerows(rows)
  os.replace(tmp, path)


def _summarise(rows, seeds):
  import numpy as np
  from mombo_jax import evaluate
  epochs = sorted({r["epoch"] for r in rows})
  table = np.array([[next(r["normalized_score"] for r in rows if r["epoch"] == e and r["seed"] == s)
                     for s in seeds] for e in epochs])              # [T, S]
  final, aulc = table[-1], evaluate.aulc(table)
  return dict(seeds=[int(s) for s in seeds], epochs=epochs,
              final_normalized_score=final.tolist(), aulc=np.asarray(aulc).tolist(),
              final_normalized_score_mean=float(final.mean()),
              final_normalized_score_std=float(final.std()),
              aulc_mean=float(np.mean(aulc)), aulc_std=float(np.std(aulc)))


def _plot(rows, seeds, path, dataset, config):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import numpy as np
  fig, ax = plt.subplots(figsize=(6, 4))
  steps = sorted({r["step"] for r in rows})
  table = np.array([[next(r["normalized_score"] for r in rows if r["step"] == t and r["seed"] == s)
                     for s in seeds] for t in steps])
  for i, s in enumerate(seeds):
    ax.plot(steps, table[:, i], lw=0.8, alpha=0.5, label=f"seed {s}")
  ax.plot(steps, table.mean(1), lw=2, color="k", label="mean")
  ax.set(xlabel="gradient steps", ylabel="normalised score",
         title=f"{config.algo} ({config.target}) on {dataset}" if config.algo == "mombo"
         else f"{config.algo} on {dataset}")
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def _overrides():
  mapping = dict(epochs="epochs", steps_per_epoch="steps_per_epoch", eval_every="eval_every",
                 eval_episodes="eval_episodes", rollout_batch_size="rollout_batch_size",
                 rollout_length="rollout_length", dynamics_max_epochs="dyn_max_epochs",
                 beta="beta", real_ratio="real_ratio")
  out = {field: getattr(FLAGS, flag) for flag, field in mapping.items()
         if getattr(FLAGS, flag) is not None}
  out.update(target=FLAGS.target, seed=FLAGS.seed, num_seeds=FLAGS.seeds)
  return out


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)   # Orbax logs every save at INFO
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
    build = FLAGS.preset in ("quick", "tiny")
  build_steps = FLAGS.build_steps or (100_000 if FLAGS.preset == "quick" else
                                      5_000 if FLAGS.preset == "tiny" else 1_000_000)
  try:
    train(config, dataset=dataset, workdir=workdir, dynamics_dir=FLAGS.dynamics_dir,
          build_missing=build, build_steps=build_steps, keep=FLAGS.keep_checkpoints,
          stop_after=FLAGS.stop_after, download=FLAGS.download)
  except UserError as e:
    sys.exit(f"error: {e}")


if __name__ == "__main__":
  define_flags()
  app.run(main)
