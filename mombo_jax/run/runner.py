"""The training loop of experiments.run: one compiled program over every cell (seed x dataset x
beta) of a launch, evaluation, checkpoints and outputs per workdir.

A launch trains one or more groups.Group: a group is one workdir (one dataset, one beta, its
seeds) and is exactly a plain run's folder (workdir.Workdir), resumable on its own. `train` is the
one-group case. train_grid reads plan -> prepare -> loop -> finish; the loop hands the device
several epochs per call (train.make_cells_chunk), so the host acts only at evaluations,
checkpoints and stop requests. What the host does per group (watch, evaluate, log, finish) is
group_run's.
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from mombo_jax.core import buffer, dynamics, placement, train as train_lib
from mombo_jax.core.key_scheme import cell_keys
from mombo_jax.data import provenance, scores, transitions as transitions_lib
from mombo_jax.dynamics.dynamics_store import check_legacy_dynamics, get_dynamics
from mombo_jax.env import envs
from mombo_jax.errors import Interrupted, UserError
from mombo_jax.records.workdir import Workdir
from mombo_jax.run import distributed, group_run, loggers, overestimation, run_state
from mombo_jax.run.console import log
from mombo_jax.run.groups import Group, check_groups, describe_algorithm
from mombo_jax.run.preflight import validate
from mombo_jax.run.program import Program, chunk_length, compile_chunk, program_config
from mombo_jax.run.run_dataset import load_or_build
from mombo_jax.settings import references
from mombo_jax.storage import checkpoint

# -------------------------------------------------------------------------------------- train

def train_run(config, dataset, workdir, dynamics_dir=None, build_missing=False,
              build_steps=1_000_000, keep=3, stop_after=None, download=False, *,
              require_full=False, allow_epochs_change=False, should_stop=None, log_to=("csv",),
              eval_workers=0):
  """A whole run (all seeds); resumes from <workdir>/checkpoints when present. Returns the summary,
  or None when `stop_after` epochs of this call ended it early (as a preempted job would).

  require_full: refuse a reduced build of the dataset's recipe (paper settings).
  should_stop: a StopFlag (or any callable with .signum); when it fires, the run checkpoints at the
  end of the current device call (about CALL_SECONDS; an evaluation still running is abandoned,
  loop) and raises Interrupted.
  log_to: where the metrics go besides metrics.csv (always written; --log): names of
  loggers.KINDS, e.g. ("csv", "tensorboard", "wandb"), or "csv,tensorboard"; an unknown name or a
  logger whose package is missing is refused (UserError) before any work.
  eval_workers: processes stepping the evaluation envs (0: env_pool.auto_workers; changes no
  result).
  """
  return train_grid([Group(config, dataset, workdir, dynamics_dir)], build_missing, build_steps,
                    keep, stop_after, download, require_full=require_full,
                    allow_epochs_change=allow_epochs_change, should_stop=should_stop,
                    log_to=log_to, eval_workers=eval_workers)[0]


def train_grid(groups, build_missing=False, build_steps=1_000_000, keep=3, stop_after=None,
               download=False, *, require_full=False, allow_epochs_change=False,
               should_stop=None, log_to=("csv",), eval_workers=0):
  """Trains every cell (seed) of every group in one compiled program; each group's workdir gets
  what a plain run of that group alone writes, and resumes on its own. Returns the groups'
  summaries (None each when `stop_after` ended this launch early). Arguments as for `train_run`; the
  loggers of `log_to` write each workdir's rows, one series per seed (W&B: one run per seed, the
  launch's workdirs one group)."""
  kinds = loggers.parse(log_to)  # before any work: unknown names, missing packages
  if int(eval_workers) < 0:
    raise UserError(f"eval_workers={eval_workers}: pass a number of processes >= 1, or 0 (auto).")
  held = []                      # the workdirs' locks (process 0's), released by the OS at death
  try:
    records = plan(groups, keep, stop_after, build_steps, allow_epochs_change, held)
    for line in dict.fromkeys(references.describe(g.config) for g in groups):
      log(line)                  # where the settings come from, before any long work
    if distributed.is_multiprocess():
      build_missing = False      # processes building one dataset side by side would collide
    runs, program = prepare(groups, records, keep, should_stop, dict(
        build_missing=build_missing, build_steps=build_steps, download=download,
        require_full=require_full, should_stop=should_stop))
    group = loggers.launch_group([g.workdir for g in groups])
    for r in runs:               # opened by loop (process 0), once training is sure to start
      r.loggers = loggers.RunLoggers(kinds, group)
    try:
      finished = loop(runs, program, stop_after, should_stop, eval_workers)
    finally:
      for r in runs:
        if r.evaluator is not None:
          r.evaluator.close()
        if r.loggers is not None:
          r.loggers.close()
    if not finished:
      return [None] * len(runs)
    return [group_run.finish(r) if distributed.is_main() else None for r in runs]
  finally:
    for lock in reversed(held):  # a refused launch leaves no folder it created
      lock.release(cleanup=True)


def plan(groups, keep, stop_after, build_steps, allow_epochs_change, held):
  """Every check that needs no data: the groups fit one program, the flags and folders are valid,
  no other launch writes these workdirs (their locks are taken and appended to `held`; process 0
  holds them), each workdir's config.json agrees. Returns each group's (config.json record,
  notes)."""
  check_groups(groups)
  cells = sum(g.config.num_seeds for g in groups)
  for g in groups:
    validate(g.config, g.dataset, g.workdir, g.dynamics_dir, keep, stop_after, build_steps,
             cells=cells)
  if distributed.is_main():
    for g in groups:
      held.append(Workdir(g.workdir).lock().acquire())
      for line in run_state.remove_leftovers(Workdir(g.workdir)):
        log(f"note: {line}.")
  records = [Workdir(g.workdir, g.dynamics_dir).check_config(g.config, g.dataset,
                                                             allow_epochs_change)
             for g in groups]
  for g in groups:
    wd = Workdir(g.workdir, g.dynamics_dir)
    if not wd.checkpointer_steps():      # a resume takes its ensembles from its checkpoint
      check_legacy_dynamics(wd.dynamics_dir, g.config)
  return records


def prepare(groups, records, keep, should_stop, data_options):
  """Loads the datasets, writes config.json (only now that the data loaded), gets the dynamics,
  initialises or restores every cell and places the program's arguments on the devices.
  Returns ([GroupRun], Program)."""
  # Whole (109 lines): its steps' order is the launch's contract (data, config.json, dynamics, init
  # or restore, placement); read top to bottom, it is that order.
  names = list(dict.fromkeys(g.dataset for g in groups))      # distinct datasets, in order
  transitions, dataset_scores = {}, {}
  for name in names:
    config = next(g.config for g in groups if g.dataset == name)
    transitions[name] = load_or_build(name, config, **data_options)
    t = transitions[name]
    # Which physics the policies meet (docs/protocol.md, "Environments"): D4RL's walker model for
    # an imported D4RL walker dataset, else the v5 env.
    log(f"{name}: {len(t.rewards)} transitions, obs dim {t.observations.shape[1]}, action dim "
        f"{t.actions.shape[1]}; evaluated in {envs.eval_env_spec(name)['physics']}.")
    # What the behaviour policy scored: the final line sets the run's score beside it.
    dataset_scores[name] = float(np.mean(
        scores.normalized_score(name, transitions_lib.episode_returns(t))))
  for g, (record, notes) in zip(groups, records):
    wd = Workdir(g.workdir, g.dynamics_dir)
    record, more = wd.check_data(record, provenance.dataset_identity(g.dataset,
                                                                     transitions[g.dataset]))
    if distributed.is_main():
      wd.write_config(record)
    for note in notes + more:
      log(f"note: {note}" + (f" ({g.workdir})" if len(groups) > 1 else ""))

  reals = [buffer.from_transitions(transitions[name]) for name in names]
  stacked, sizes = buffer.stack(reals)
  # Each dataset's return bound max|r| / (1 - gamma), from its real rewards (the stack's NaN
  # padding ignored): the critics' mean Q of its cells is watched against it
  # (overestimation.OverestimationWatch).
  bounds = dict(zip(names, overestimation.return_bound(np.asarray(stacked.reward),
                                                       groups[0].config.agent.gamma)))
  join = lambda trees: jax.tree.map(lambda *xs: jnp.concatenate(xs), *trees)  # noqa: E731
  runs, dyns, init_keys, epoch_keys, cell_dataset, cell_configs = [], [], [], [], [], []
  for g in groups:
    c, wd = g.config, Workdir(g.workdir, g.dynamics_dir)
    dyn_k, init_k, epoch_k = cell_keys(c)
    ckpt = run_state.checkpointer(wd, keep)
    if ckpt.latest_step() is not None:
      # The run's CellState holds its dynamics: the restore below brings them back, so the saved
      # ensembles are not needed (nor checked: they may have gone, or predate reuse keys that
      # record the training settings). Only their shapes are built here.
      dyns.append(_dynamics_placeholder(dyn_k, transitions[g.dataset], c))
      log(f"Resuming {g.workdir}: its dynamics ensembles come from its checkpoint.")
    else:
      dyns.append(get_dynamics(c, transitions[g.dataset], g.dataset, wd.dynamics_dir,
                               should_stop=should_stop, log=log))
    init_keys.append(init_k)
    epoch_keys.append(epoch_k)
    cell_dataset += [names.index(g.dataset)] * c.num_seeds
    cell_configs += [c] * c.num_seeds
    offset = len(cell_configs) - c.num_seeds
    runs.append(group_run.GroupRun(group=g, workdir=wd, cells=slice(offset, offset + c.num_seeds),
                         seeds=np.arange(c.seed, c.seed + c.num_seeds), ckpt=ckpt,
                         dataset_score=dataset_scores[g.dataset]))
  # One init for all cells (one set of network and optimiser objects, so the groups' states
  # concatenate); each group's checkpoint then restores onto its slice.
  config = program_config(groups)  # the settings all cells share; C = len(cell_configs)
  fresh = train_lib.init_cells(join(init_keys), config, reals[0], join(dyns))
  del dyns
  states, starts, metas = [], [], []
  for r in runs:
    state, meta = jax.tree.map(lambda x, r=r: x[r.cells], fresh), {}
    if r.ckpt.latest_step() is not None:
      try:
        # The checkpoint holds the group's own ring (a plain run's); the program's may be longer.
        state, meta = r.ckpt.restore(placement.resize_rings(state, train_lib.capacity(r.config)))
      except checkpoint.CheckpointError as e:
        raise UserError(str(e)) from None
      state = placement.resize_rings(state, train_lib.capacity(config))
      r.diverged = {int(d["seed"]): d for d in (meta or {}).get("diverged", [])}
      log(f"Resumed from {r.ckpt.directory} at epoch {int(np.asarray(state.epoch)[0])}.")
    states.append(state)
    starts.append(int(np.asarray(state.epoch)[0]))
    metas.append(meta or {})
  del fresh
  if len(set(starts)) > 1:
    raise UserError("The workdirs of this launch stopped at different epochs ("
                    + ", ".join(f"{r.group.workdir}: {e}" for r, e in zip(runs, starts))
                    + "); one program trains them in step. Resume each with its own "
                    "experiments.run launch (one --dataset and --beta) to the same epoch, or "
                    "delete the lagging ones.")
  for r, meta in zip(runs, metas):
    r.rows = r.workdir.read_rows(max_epoch=starts[0])
    unwritten = meta.get("eval")
    if unwritten and int(unwritten["epoch"]) == starts[0] and not any(
        int(row["epoch"]) == starts[0] for row in r.rows):
      r.unwritten_eval = unwritten    # killed between the checkpoint and the rows: loop writes them
    if distributed.is_main():
      r.workdir.write_rows(r.rows)
    bound = bounds[r.group.dataset]
    # A checkpoint saved before the watch existed (or a fresh run): rebuilt from metrics.csv.
    r.q = (overestimation.OverestimationWatch(r.seeds, bound, meta["q"]) if "q" in meta
           else overestimation.OverestimationWatch.from_rows(r.seeds, bound, r.rows))
  # The cell axis lives split over all devices (of all processes) from here on; the datasets are
  # copied to every device once.
  program = Program(config=config, num_cells=len(cell_configs),
                    state=placement.shard_cells(join(states)), real=placement.replicate(stacked),
                    keys=placement.shard_cells(join(epoch_keys)),
                    cells=placement.shard_cells(train_lib.make_cells(
                        cell_dataset, sizes[cell_dataset], cell_configs)),
                    start=starts[0],
                    per_cell=train_lib.per_cell_settings([g.config for g in groups]))
  return runs, program


def _dynamics_placeholder(keys, transitions, config):
  """Untrained ensembles [S] of config's shapes (dynamics.init_state per key, keys [S, 2]): the
  stand-in a resumed group's checkpoint restore overwrites."""
  obs_dim, act_dim = transitions.observations.shape[1], transitions.actions.shape[1]
  return jax.jit(jax.vmap(lambda k: dynamics.init_state(k, obs_dim, act_dim, config)))(keys)


def loop(runs, program: Program, stop_after, should_stop, eval_workers=0) -> bool:
  """Trains from program.start to config.epochs (or stop_after epochs of this launch), evaluating
  (all groups in one pass over `eval_workers` processes: group_run.build_evaluators, then a
  group_run.Evaluation in a thread while the device trains on) and checkpointing
  every eval_every epochs. Returns False when stop_after ended it early; raises Interrupted when
  should_stop fired (after a checkpoint).

  The evaluation of epoch E runs in a background thread (process 0, the policy on the host CPU)
  while the device trains E..E+eval_every; its rows are written at the next evaluation point (or
  at a stop, or at the end) before anything later. The checkpoint of E holds what writing them
  needs (`eval` in its metadata), so a launch killed before they were written writes them when
  it resumes (group_run.recover). A stop request while that evaluation still runs does not wait
  for it: it is abandoned and the launch resumes at E (its rows recovered, the epochs since
  trained again: the same results), so a stop takes one device call (about CALL_SECONDS, at
  least one epoch) and the checkpoint."""
  several_groups = len(runs) > 1
  pending = []                   # at most one group_run.Evaluation (process 0)

  def flush():
    while pending:
      pending.pop(0).finish(several_groups)

  def save(epoch, evals=None):
    todo = [r for r in runs if r.ckpt.latest_step() != epoch]
    for r in todo:
      # The group's cells with the group's own ring (what a plain run of it saves), each device
      # keeping the cells it holds: every process writes its own shards (every process calls
      # save; nothing is gathered).
      state = placement.take_cells(program.state, r.cells, train_lib.capacity(r.config))
      meta = {"epoch": epoch, "diverged": list(r.diverged.values()),
              "q": list(r.q.records.values())}
      if evals is not None:      # what writing this point's rows needs, should they be lost
        meta["eval"] = evals[id(r)]
      try:
        r.ckpt.save(epoch, state, meta)
      except checkpoint.CheckpointError as e:
        raise UserError(str(e)) from None

  def abandon(epoch):            # the evaluation of the last checkpoint still runs: see above
    for p in pending:
      p.cancel()
    where = ", ".join(r.ckpt.directory for r in runs)
    back = pending[0].epoch if pending else "the last evaluation"
    raise Interrupted(getattr(should_stop, "signum", None),
                      f"epoch {epoch}; the resume starts at epoch {back}, whose evaluation was "
                      f"still running (checkpoint in {where})")

  def stop_requested(epoch):
    if should_stop is None or not distributed.agree(should_stop()):
      return
    if distributed.agree(any(p.running() for p in pending)):
      abandon(epoch)
    flush()
    save(epoch)
    where = ", ".join(r.ckpt.directory for r in runs)
    raise Interrupted(getattr(should_stop, "signum", None),
                      f"epoch {epoch} (checkpoint in {where})")

  def flush_or_stop(epoch):
    """flush(); a stop request while the evaluation still runs abandons it instead of waiting
    (one process: in a multi-process launch only process 0 evaluates, and the others would not
    hear of it)."""
    if should_stop is not None and not distributed.is_multiprocess():
      while any(p.running() for p in pending):
        if should_stop():
          abandon(epoch)
        for p in pending:
          p.join(0.2)
    flush()

  try:
    return _loop(runs, program, stop_requested, save, flush_or_stop, pending, stop_after,
                 eval_workers, should_stop)
  finally:
    for p in pending:            # an error: the thread ends before the Evaluators close
      p.join()


def _loop(runs, program, stop_requested, save, flush, pending, stop_after, eval_workers,
          should_stop=None):
  """loop's body; `pending` holds the evaluation under way (loop joins it on any exit);
  flush(epoch) writes its rows once it is done (or stops, see loop)."""
  config, several_groups = program.config, len(runs) > 1
  devices = jax.devices()
  what = ("Seeds" if not several_groups
          else f"{program.num_cells} cells ({len(runs)} workdirs x seeds)")
  procs = (f" of {distributed.process_count()} processes" if distributed.is_multiprocess()
           else "")
  log(f"{what} sharded over {len(devices)} {devices[0].platform} device(s){procs}, "
      f"{program.num_cells // len(devices)} per device.")
  log(f"Algorithm: {describe_algorithm(config, sorted({r.config.beta for r in runs}))}; actor lr "
      f"schedule over {config.schedule_steps // config.steps_per_epoch} epochs, stop at "
      f"{config.epochs}.")
  end = config.epochs if stop_after is None else min(config.epochs, program.start + stop_after)
  unwritten = [r for r in runs if r.unwritten_eval is not None]
  if program.start < end or unwritten:
    if program.start < end:
      # Compiled ahead of the loop, so steps/s and the ETA measure training only.
      t_compile = time.time()
      chunk = compile_chunk(program)
      log(f"Compiled the epoch in {time.time() - t_compile:.1f} s.")
    if distributed.is_main():      # before training: a logger that fails costs no epoch
      for r in runs:
        group_run.open_loggers(r, program.start)
  group_run.log_reference_scores(runs)
  if unwritten:
    group_run.recover(unwritten, program, eval_workers, should_stop)
  epoch, pace, t_start = program.start, None, time.time()
  pace_line = group_run.Pace(epoch, t_start)      # the progress line's moving-average steps/s
  while epoch < end:
    stop_requested(epoch)
    n = chunk_length(epoch, end, config.evaluation.eval_every, pace)
    t0 = time.time()
    program.state, metrics = chunk(program.state, program.real, program.keys, program.cells,
                                   np.int32(epoch), np.int32(n))
    # One pull per call; in a multi-process run every process takes the same decisions.
    metrics = (distributed.to_host(metrics) if distributed.is_multiprocess()
               else jax.device_get(metrics))
    pace = (time.time() - t0) / n
    for i in range(n):
      group_run.watch(runs, {k: np.asarray(v[i]) for k, v in metrics.items()}, epoch + i + 1,
                      config, several_groups)
    epoch += n
    if pending and not pending[0].running():
      flush(epoch)               # done while the device trained: its rows now, not a point later
    if epoch % config.evaluation.eval_every and epoch != config.epochs:
      stop_requested(epoch)
      continue
    flush(epoch)                 # the previous point's rows first: metrics.csv in epoch order
    last = {k: np.asarray(v[n - 1]) for k, v in metrics.items() if not k.startswith("diverged")}
    rate = pace_line.rate(epoch, time.time(), config.steps_per_epoch * program.num_cells)
    eta = (config.epochs - epoch) * config.steps_per_epoch * program.num_cells / max(rate, 1e-9)
    actors = distributed.to_host(program.state.agent.actor.params)
    snaps = [group_run.snapshot(r) for r in runs]
    save(epoch, {id(r): dict(snap, epoch=epoch, last={k: [float(x) for x in v[r.cells]]
                                                      for k, v in sorted(last.items())})
                 for r, snap in zip(runs, snaps)})
    if distributed.is_main():                # process 0 evaluates and writes the outputs
      group_run.build_evaluators(runs, eval_workers)
      pending.append(group_run.Evaluation(runs, actors, last, epoch, snaps, rate, eta))
    stop_requested(epoch)
  flush(epoch)
  if epoch < config.epochs:
    save(epoch)
    log(f"Stopping after {stop_after} epoch(s) as asked; run again to resume.")
    return False
  return True
