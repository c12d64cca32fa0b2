"""The training loop of experiments.run: one compiled epoch over every cell (seed x dataset x beta)
of a launch, Python epochs around it, evaluation, checkpoints and outputs per workdir.

A launch trains one or more Groups: a group is one workdir (one dataset, one beta, its seeds) and
is exactly a plain run's folder (config.json, checkpoints, dynamics, metrics.csv, summary.json,
learning_curve.png), resumable on its own. `train` is the one-group case.
"""
import dataclasses
import os
import time

from mombo_jax.launch import (Interrupted, UserError, check_workdir_config, get_dynamics,
                              load_dataset, log, validate)


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

@dataclasses.dataclass(frozen=True)
class Group:
  """One workdir of a launch: config.num_seeds seeds (from config.seed) of one dataset at
  config.beta. dynamics_dir: where its ensembles are saved / reused (default <workdir>/dynamics)."""
  config: object
  dataset: str
  workdir: str
  dynamics_dir: str = None

  def label(self) -> str:
    return f"{self.dataset} beta={self.config.beta:g} seeds {self.config.seed}..{self.config.seed + self.config.num_seeds - 1}"


def describe_algorithm(config, betas=None) -> str:
  """One line naming the algorithm and, for MOMBO, which target (the variant matters: see README
  "Which MOMBO"); betas: the launch's betas (a --betas grid), default config.beta."""
  values = ", ".join(f"{b:g}" for b in (betas or [config.beta]))
  coef = ("lambda" if config.algo == "mopo" else "beta") + ("s" if betas and len(betas) > 1 else "")
  if config.algo == "mombo":
    origin = {"elite_spread": "the released code's", "lcb": "the paper's eq. (1)",
              "mixture": "law of total variance"}[config.target]
    return f"MOMBO, target {config.target} ({origin}), {coef} {values}"
  return f"{config.algo.upper()}, {coef} {values}"


def run_dir(root, dataset, algo, target, seed, seeds, beta=None) -> str:
  """<root>/<dataset>/<algo>[-<target>][-beta<beta>]/s<seed>x<seeds>: a run's default workdir
  (beta only in the name of a --betas grid's cells)."""
  name = algo + (f"-{target}" if algo == "mombo" else "") + ("" if beta is None else f"-beta{beta:g}")
  return os.path.join(root, dataset.replace("/", "_"), name, f"s{seed}x{seeds}")


def plan_groups(env, algo, preset, overrides, datasets=None, betas=None, root="runs",
                dynamics_dir=None):
  """The Groups of a --datasets x --betas launch (datasets default [env], betas default each
  dataset's own paper beta or overrides["beta"]). A short dataset name brings its own paper
  settings (config.make_config); a Minari id trains with env's. Workdirs: run_dir under root.
  With betas, a dataset's groups share their dynamics in <dynamics_dir or root/<dataset>>/dynamics
  (without, each workdir keeps its own, as a plain run does). Raises UserError for a bad name or
  value."""
  from mombo_jax import config as config_lib
  datasets = list(datasets or [env])
  if len(set(datasets)) != len(datasets) or (betas and len(set(betas)) != len(betas)):
    raise UserError("--datasets and --betas must not repeat a value.")
  groups = []
  for dataset in datasets:
    task = dataset if dataset in config_lib.valid_names() else env
    for beta in (betas or [None]):
      values = dict(overrides) if beta is None else dict(overrides, beta=beta)
      try:
        config = config_lib.make_config(task, algo, preset, **values)
      except ValueError as e:
        raise UserError(f"{dataset}: {e}") from None
      workdir = run_dir(root, dataset, algo, config.target, config.seed, config.num_seeds,
                        None if not betas else beta)
      dyn = os.path.join(dynamics_dir or os.path.join(root, dataset.replace("/", "_")),
                         "dynamics") if betas else None
      groups.append(Group(config, dataset, workdir, dyn))
  return groups


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
  return train_grid([Group(config, dataset, workdir, dynamics_dir)], build_missing, build_steps,
                    keep, stop_after, download, require_full=require_full,
                    allow_epochs_change=allow_epochs_change, should_stop=should_stop,
                    _poison=_poison)[0]


def check_groups(groups):
  """Refuses groups that cannot share one compiled epoch (settings other than the dataset, beta,
  seeds and the dynamics' training differ) or one folder."""
  from mombo_jax import train as train_lib
  if not groups:
    raise UserError("Nothing to train: no dataset / beta given.")
  dirs = [os.path.abspath(g.workdir) for g in groups]
  if len(set(dirs)) != len(dirs):
    raise UserError(f"Two cells of this launch would share a workdir ({', '.join(dirs)}); give "
                    "each (dataset, beta) its own.")
  first = dataclasses.asdict(train_lib.epoch_config(groups[0].config))
  envs = {g.config.env_name for g in groups}
  if len(envs) > 1:
    raise UserError(f"--datasets of one launch must share an environment, got {sorted(envs)}: "
                    "launch one per environment.")
  for g in groups[1:]:
    other = dataclasses.asdict(train_lib.epoch_config(g.config))
    diff = {k: (first[k], v) for k, v in other.items() if first[k] != v}
    if diff:
      what = ", ".join(f"{k}: {a!r} for {groups[0].dataset} vs {b!r} for {g.dataset}"
                       for k, (a, b) in sorted(diff.items()))
      raise UserError(f"{groups[0].dataset} and {g.dataset} cannot train in one program: their "
                      f"settings differ beyond the dataset and beta ({what}). Pass flags that "
                      "set these fields for all (e.g. --rollout_length), or launch them apart.")


def train_grid(groups, build_missing=False, build_steps=1_000_000, keep=3, stop_after=None,
               download=False, *, require_full=False, allow_epochs_change=False,
               should_stop=None, _poison=None):
  """Trains every cell (seed) of every group in one compiled epoch; each group's workdir gets what
  a plain run of that group alone writes, and resumes on its own. Returns the groups' summaries
  (None each when `stop_after` ended this launch early). Arguments as for `train`; _poison's seed
  index counts cells over all groups."""
  check_groups(groups)
  cells_total = sum(g.config.num_seeds for g in groups)
  for g in groups:
    validate(g.config, g.dataset, g.workdir, g.dynamics_dir, keep, stop_after, cells=cells_total)
  checked = [check_workdir_config(g.workdir, g.config, g.dataset, allow_epochs_change)
             for g in groups]

  import jax
  import jax.numpy as jnp
  import numpy as np
  from mombo_jax import buffer, checkpoint, data, distributed, outputs, train as train_lib

  main = distributed.is_main()
  if distributed.is_multiprocess():
    build_missing = False        # processes building one dataset side by side would collide
  names = list(dict.fromkeys(g.dataset for g in groups))      # distinct datasets, in order
  transitions = {}
  for name in names:
    config = next(g.config for g in groups if g.dataset == name)
    transitions[name] = load_dataset(name, config, build_missing, build_steps, download,
                                     require_full)
    log(f"{name}: {len(transitions[name].rewards)} transitions, obs dim "
        f"{transitions[name].observations.shape[1]}, action dim "
        f"{transitions[name].actions.shape[1]}.")
  # Only now, with the flags valid and the data loaded, do the workdirs become this launch's.
  for g, (cfg_json, notes) in zip(groups, checked):
    if main:
      outputs.write_json(os.path.join(g.workdir, "config.json"), cfg_json)
    for note in notes:
      log(f"note: {note}" + (f" ({g.workdir})" if len(groups) > 1 else ""))

  reals = {name: buffer.from_transitions(transitions[name]) for name in names}
  stacked, sizes = buffer.stack([reals[name] for name in names])
  # Each dataset's return bound max|r| / (1 - gamma), from its real rewards (the stack's NaN
  # padding ignored): the critics' mean Q of its cells is watched against it (outputs.QWatch).
  bounds = dict(zip(names, outputs.return_bound(np.asarray(stacked.reward), config.gamma)))
  # The compiled program's config: the shared settings, one cell per seed of every group.
  config = dataclasses.replace(groups[0].config, num_seeds=cells_total)
  join = lambda trees: jax.tree.map(lambda *xs: jnp.concatenate(xs), *trees)  # noqa: E731
  runs, dyns, init_keys, epoch_keys, cell_dataset, cell_beta = [], [], [], [], [], []
  for g in groups:
    c = g.config
    seeds = np.arange(c.seed, c.seed + c.num_seeds)
    seed_keys = jax.vmap(jax.random.PRNGKey)(jnp.asarray(seeds))
    dyn_keys, init_k, keys = (jax.vmap(lambda k, i=i: jax.random.fold_in(k, i))(seed_keys)
                              for i in range(3))
    dyns.append(get_dynamics(c, transitions[g.dataset], dyn_keys,
                             g.dynamics_dir or os.path.join(g.workdir, "dynamics"), g.dataset,
                             should_stop))
    init_keys.append(init_k)
    epoch_keys.append(keys)
    cell_dataset += [names.index(g.dataset)] * c.num_seeds
    cell_beta += [c.beta] * c.num_seeds
    offset = sum(r["config"].num_seeds for r in runs)
    runs.append(dict(group=g, config=c, seeds=seeds, diverged={},
                     cells=slice(offset, offset + c.num_seeds),
                     ckpt=checkpoint.RunCheckpointer(os.path.join(g.workdir, "checkpoints"),
                                                     keep=keep),
                     csv=os.path.join(g.workdir, "metrics.csv")))
  # One init for all cells (one set of network and optimiser objects, so the groups' states
  # concatenate); each group's checkpoint then restores onto its slice.
  fresh = train_lib.init_seeds(join(init_keys), config, reals[names[0]], join(dyns))
  del dyns
  states = []
  for r in runs:
    state = jax.tree.map(lambda x, r=r: x[r["cells"]], fresh)
    meta = {}
    if r["ckpt"].latest_step() is not None:
      try:
        state, meta = r["ckpt"].restore(state)
      except checkpoint.CheckpointError as e:
        raise UserError(str(e)) from None
      r["diverged"] = {int(d["seed"]): d for d in (meta or {}).get("diverged", [])}
      log(f"Resumed from {r['ckpt'].directory} at epoch {int(np.asarray(state.epoch)[0])}.")
    r["start"] = int(np.asarray(state.epoch)[0])
    r["meta"] = meta or {}
    states.append(state)
  del fresh
  starts = {r["group"].workdir: r["start"] for r in runs}
  if len(set(starts.values())) > 1:
    raise UserError("The workdirs of this launch stopped at different epochs ("
                    + ", ".join(f"{w}: {e}" for w, e in starts.items()) + "); one program "
                    "trains them in step. Resume each with its own experiments.run launch (one "
                    "--dataset and --beta) to the same epoch, or delete the lagging ones.")
  start_epoch = runs[0]["start"]
  for r in runs:
    r["rows"] = outputs.read_rows(r["csv"], max_epoch=start_epoch)
    if main:
      outputs.write_rows(r["csv"], r["rows"])
    bound = bounds[r["group"].dataset]
    if "q" in r["meta"]:
      r["q"] = outputs.QWatch(r["seeds"], bound, r["meta"]["q"])
    else:                        # a fresh run, or a checkpoint saved before the watch existed
      r["q"] = outputs.QWatch.from_rows(r["seeds"], bound, r["rows"])
    del r["meta"]

  # The cell axis lives split over all devices (of all processes) from here on; the datasets are
  # copied to every device once.
  state = train_lib.shard_seeds(join(states))
  del states
  epoch_keys = train_lib.shard_seeds(join(epoch_keys))
  cells = train_lib.shard_seeds(train_lib.make_cells(cell_dataset, sizes[cell_dataset], cell_beta))
  stacked = train_lib.replicate(stacked)

  def save(epoch):
    todo = [r for r in runs if r["ckpt"].latest_step() != epoch]
    # Several processes: the whole state gathered on every process, written by Orbax's primary
    # process (every process calls save). One process: each group's slice stays on the device.
    whole = distributed.to_host(state) if todo and distributed.is_multiprocess() else state
    for r in todo:
      r["ckpt"].save(epoch, jax.tree.map(lambda x, r=r: x[r["cells"]], whole),
                     {"epoch": epoch, "diverged": list(r["diverged"].values()),
                      "q": list(r["q"].records.values())})

  def stop_requested(epoch):
    if should_stop is not None and distributed.agree(should_stop()):
      save(epoch)
      where = ", ".join(r["ckpt"].directory for r in runs)
      raise Interrupted(getattr(should_stop, "signum", None), f"epoch {epoch} (checkpoint in {where})")

  fold = jax.jit(jax.vmap(jax.random.fold_in, in_axes=(0, None)))
  devices = jax.devices()
  what = "Seeds" if len(runs) == 1 else f"{cells_total} cells ({len(runs)} workdirs x seeds)"
  procs = (f" of {distributed.process_count()} processes" if distributed.is_multiprocess()
           else "")
  log(f"{what} sharded over {len(devices)} {devices[0].platform} device(s){procs}, "
      f"{cells_total // len(devices)} per device.")
  betas = sorted({r["config"].beta for r in runs})
  log(f"Algorithm: {describe_algorithm(config, betas)}; actor lr schedule over "
      f"{config.schedule_steps // config.steps_per_epoch} epochs, stop at {config.epochs}.")
  # Compiled ahead of the loop, so steps/s and the ETA measure training only. Arguments keep
  # one placement throughout (the compiled function refuses any other).
  if start_epoch < config.epochs:
    t_compile = time.time()
    epoch_fn = train_lib.make_seeds_epoch(config).lower(
        state, stacked, fold(epoch_keys, start_epoch), cells).compile()
    log(f"Compiled the epoch in {time.time() - t_compile:.1f} s.")
  for r in runs:
    r["ref"] = data.ref_scores(r["group"].dataset)
  for name in names:
    ref_min, ref_max, ref_source = next(r["ref"] for r in runs if r["group"].dataset == name)
    log(f"Normalised scores{'' if len(names) == 1 else f' of {name}'} use R_random={ref_min:.2f}, "
        f"R_expert={ref_max:.2f} ({ref_source}).")
  t_start, steps_done = time.time(), 0
  try:
    for epoch in range(start_epoch, config.epochs):
      stop_requested(epoch)
      if stop_after is not None and epoch - start_epoch >= stop_after:
        save(epoch)
        log(f"Stopping after {stop_after} epoch(s) as asked; run again to resume.")
        return [None] * len(runs)
      if _poison is not None and _poison[1] == epoch:
        state = train_lib.shard_seeds(_poison_seed(state, _poison[0]))
      state, metrics = epoch_fn(state, stacked, fold(epoch_keys, epoch), cells)
      if distributed.is_multiprocess():
        metrics = distributed.to_host(metrics)   # every process takes the same decisions
      steps_done += config.steps_per_epoch
      done = epoch + 1
      frozen = np.asarray(metrics["diverged"])
      # The critics' mean Q over this epoch's steps, per cell (one small pull per epoch).
      q_epoch = _mean_metrics({"q_mean": metrics["q_mean"]})["q_mean"]
      for r in runs:
        for i, s in zip(range(r["cells"].start, r["cells"].stop), r["seeds"]):
          # A frozen seed's metrics are its failed epoch's (maybe NaN): not watched.
          if not frozen[i] and r["q"].update(int(s), done, q_epoch[i]):
            log(f"warning: seed {s} of {r['group'].dataset} beta={r['config'].beta:g} "
                f"overestimates: the critics' mean Q {q_epoch[i]:.4g} passed the return bound "
                f"max|r|/(1-gamma) = {r['q'].bound:.4g} at epoch {done}. Training goes on; the "
                "seed is flagged `overestimated` in summary.json.")
          if frozen[i] and int(s) not in r["diverged"]:
            quantity = ", ".join(k for k in train_lib.DIVERGENCE_CHECKS
                                 if bool(np.asarray(metrics[f"diverged/{k}"])[i])) or "unknown"
            r["diverged"][int(s)] = {"seed": int(s), "epoch": done, "quantity": quantity}
            log(f"seed {s}{_where(r, runs)} diverged at epoch {done} ({quantity} non-finite or "
                f"beyond +-{config.max_abs_loss:g}); it is frozen at its last healthy state and "
                "left out of the summary. The other seeds go on.")
      if done % config.eval_every and done != config.epochs:
        stop_requested(done)
        continue
      means = _mean_metrics(metrics)
      elapsed = time.time() - t_start
      rate = steps_done * cells_total / max(elapsed, 1e-9)
      eta = (config.epochs - done) * config.steps_per_epoch * cells_total / max(rate, 1e-9)
      actors = distributed.to_host(state.agent.actor.params)
      for r in runs:
        if not main:                         # process 0 evaluates and writes the outputs
          continue
        _evaluate(r, actors, means, done, runs)
        log(f"epoch {done}/{config.epochs}{_where(r, runs)}  {rate:.0f} steps/s (all "
            f"{'seeds' if len(runs) == 1 else 'cells'})  score per seed "
            f"[{', '.join(f'{x:.1f}' for x in r['scores'].mean(axis=1))}]  critic_loss "
            f"[{', '.join(f'{x:.3g}' for x in means['critic_loss'][r['cells']])}]  q_mean "
            f"[{', '.join(f'{x:.4g}' for x in means['q_mean'][r['cells']])}] (bound "
            f"{r['q'].bound:.4g})  ETA {_fmt(eta)}"
            + (f"  OVERESTIMATED seeds {r['q'].flagged()}" if r["q"].flagged() else "")
            + (f"  diverged seeds {sorted(r['diverged'])}" if r["diverged"] else ""))
      save(done)
      stop_requested(done)
  finally:
    for r in runs:
      if r.get("evaluator") is not None:
        r["evaluator"].close()
  return [_finish(r) if main else None for r in runs]


def _where(r, runs):
  return "" if len(runs) == 1 else f" [{r['group'].label()}]"


def _evaluate(r, actors, means, done, runs):
  """Evaluates group r's actors (of all cells: `actors`, the actor parameters on the host),
  appends its metrics.csv rows; r["scores"] [S, episodes]."""
  import jax
  from mombo_jax import data, evaluate, outputs
  c = r["config"]
  if r.get("evaluator") is None:               # built at the first evaluation, reused after
    r["evaluator"] = evaluate.Evaluator(c, c.env_name, c.num_seeds, c.eval_episodes)
  params = jax.tree.map(lambda x: x[r["cells"]], actors)
  returns = r["evaluator"].run(params, seed=10_000 * c.seed + done)
  r["scores"] = scores = data.normalized_score(r["group"].dataset, returns)   # [S, episodes]
  for i, s in enumerate(r["seeds"]):
    cell = r["cells"].start + i
    row = dict(epoch=done, step=done * c.steps_per_epoch, seed=int(s),
               return_mean=float(returns[i].mean()), normalized_score=float(scores[i].mean()),
               diverged=float(int(s) in r["diverged"]))
    row.update({k: float(v[cell]) for k, v in sorted(means.items())})
    row.update(q_bound=r["q"].bound, overestimated=float(int(s) in r["q"].flagged()))
    r["rows"].append(row)
  outputs.write_rows(r["csv"], r["rows"])


def _finish(r):
  """Group r's summary.json and learning_curve.png; returns the summary."""
  from mombo_jax import outputs
  c, g, seeds, diverged = r["config"], r["group"], r["seeds"], r["diverged"]
  summary = outputs.summarise(r["rows"], seeds, sorted(diverged.values(), key=lambda d: d["seed"]),
                              r["q"])
  outputs.write_json(os.path.join(g.workdir, "summary.json"), summary)
  title = (f"{c.algo} ({c.target}) on {g.dataset}" if c.algo == "mombo"
           else f"{c.algo} on {g.dataset}")
  outputs.plot_curve(r["rows"], seeds, os.path.join(g.workdir, "learning_curve.png"), title,
                     sorted(diverged))
  log(f"final normalised score {_num(summary['final_normalized_score_mean'])} "
      f"+- {_num(summary['final_normalized_score_std'])}, AULC {_num(summary['aulc_mean'])}"
      + (f" over the {len(seeds) - len(diverged)} healthy seed(s)" if diverged else "")
      + (f"; seed(s) {r['q'].flagged()} overestimated (mean Q above the return bound "
         f"{r['q'].bound:.4g})" if r["q"].flagged() else "")
      + f"; wrote {g.workdir}")
  return summary


def _num(x):
  return "n/a" if x is None else f"{x:.1f}"


def _fmt(seconds):
  seconds = int(seconds)
  return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m{seconds % 60:02d}s"


