"""Training of the dynamics ensemble: a seed's state and its start (bootstrap samples, input
normaliser, parameters), the compiled epoch, the loop over epochs (_Training) and its resumable
stops (Resumable: checkpoint_dir / should_stop -> DynamicsTrainingStopped). Its loss:
core/dynamics.loss_fn; its data and train / holdout split: training_data.py; what the holdout
decides (snapshots, early stopping, elites): validation.py.

Training follows the MBPO/OfflineRL-Kit recipe: holdout split, per-member bootstrap, per-member
snapshots on > 1 % holdout improvement, patience-based early stopping, elites = best holdout MSE.
An epoch is three compiled pieces: its minibatch order (_plan), its minibatch steps (_steps, a
fori_loop with traced bounds, run in device calls of about signals.POLL_SECONDS each) and its end
(validation.validate_epoch: holdout evaluation, snapshot and stopping bookkeeping). The Python
loop polls should_stop between the calls, so a stop takes about that long, not an epoch; how the
steps are split into calls changes no bit of the result. A stop mid-epoch checkpoints the state
before the epoch (the partial epoch is dropped and trained again on resume, from the same order:
exact). The loop between epochs logs and checks whether every seed has stopped. Stopped seeds are
frozen with a select (no lax.cond on per-seed state: under vmap it would run both branches
anyway). Several seeds: one program over a leading seed axis, its seeds vmapped or looped
(core/cell_layout's choice: looped on CPU).
"""
from __future__ import annotations

import dataclasses
import functools
import time
from typing import Callable, NamedTuple, Optional

import chex
import flax.struct as struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from mombo_jax import signals
from mombo_jax.core import cell_layout, xla_options
from mombo_jax.core.dynamics import DynamicsState, loss_fn, make_module
from mombo_jax.dynamics import reuse, validation
from mombo_jax.dynamics.training_data import make_arrays, seed_keys, split_indices, split_sizes
from mombo_jax.settings import environment, groups
from mombo_jax.storage import checkpoint

# Inputs whose training-split std is below this are not scaled (constant features).
_MIN_STD = 1e-12


# ----------------------------------------------------------------------------------------------
# One epoch of training (its loss: core/dynamics.loss_fn)

class _SeedTrain(struct.PyTreeNode):
  """Training state of one seed's ensemble (vmapped: a leading seed axis)."""
  params: dict
  opt_state: optax.OptState
  snapshot: dict            # members' params at their best holdout loss (leading member axis)
  best: jax.Array           # [M] best holdout MSE so far
  since: jax.Array          # int32: epochs since any member improved
  epoch: jax.Array          # int32: epochs trained
  active: jax.Array         # bool: still training
  key: jax.Array
  boot: jax.Array           # int32 [M, T]: each member's bootstrap sample (indices into the data)
  holdout: jax.Array        # int32 [H]
  input_mean: jax.Array     # [D]
  input_std: jax.Array      # [D]


def _init_seed(config, key, inputs, targets) -> _SeedTrain:
  n = inputs.shape[0]
  n_train, _ = split_sizes(n, config)
  _, k_boot, k_init, k_train = seed_keys(key)
  train_idx, holdout = split_indices(key, n, config)
  boot = train_idx[jax.random.randint(k_boot, (config.dynamics.dyn_members, n_train), 0, n_train)]
  x_train = inputs[train_idx]
  mu = jnp.mean(x_train, axis=0)
  std = jnp.std(x_train, axis=0)
  std = jnp.where(std < _MIN_STD, 1.0, std)
  module = make_module(config, targets.shape[-1] - 1)
  params = module.init(k_init,
                       jnp.zeros((config.dynamics.dyn_members, 1, inputs.shape[-1])))["params"]
  opt_state = optax.adam(config.dynamics_training.dyn_lr).init(params)
  return _SeedTrain(params=params, opt_state=opt_state, snapshot=params["members"],
                    best=jnp.full((config.dynamics.dyn_members,), validation.INITIAL_BEST,
                                  jnp.float32),
                    since=jnp.zeros((), jnp.int32), epoch=jnp.zeros((), jnp.int32),
                    active=jnp.ones((), bool), key=k_train, boot=boot, holdout=holdout,
                    input_mean=mu, input_std=std)


def _num_batches(n_train: int, config) -> int:
  return -(-n_train // config.dynamics_training.dyn_batch_size)


def _plan(config, st: _SeedTrain):
  """The order of one epoch's minibatches: int32 [n_batches, M, bs], each member visiting its own
  bootstrap sample in a fresh order (from st.key); the last batch is zero-padded (_steps gives
  the padding weight 0)."""
  members, n_train = st.boot.shape
  bs = config.dynamics_training.dyn_batch_size
  n_batches = _num_batches(n_train, config)
  pad = n_batches * bs - n_train
  _, k_perm = jax.random.split(st.key)
  order = jax.vmap(jax.random.permutation)(jax.random.split(k_perm, members), st.boot)
  order = jnp.pad(order, ((0, 0), (0, pad)))
  return order.reshape(members, n_batches, bs).swapaxes(0, 1)


class _Data(struct.PyTreeNode):
  """The training arrays (make_arrays): every seed's, shared by them."""
  inputs: jax.Array         # [N, D]: observations and actions
  targets: jax.Array        # [N, O + 1]: reward and next-observation delta


class _Carry(struct.PyTreeNode):
  """What an epoch's minibatches carry from one to the next (one seed: a leading seed axis when
  vmapped): the ensemble's parameters and their optimiser state."""
  params: dict
  opt_state: optax.OptState


def _steps(config, st: _SeedTrain, carry: _Carry, data: _Data, order, start, stop) -> _Carry:
  """Minibatches start .. stop-1 of the epoch `order` (_plan) from `carry`; returns the carry
  after them. start / stop are traced int32 scalars: one compilation serves every chunk of an
  epoch, and a chunk's minibatches compute exactly what they compute in any other split of the
  epoch (the same loop body, the carry passed on unchanged)."""
  members, n_train = st.boot.shape
  bs = config.dynamics_training.dyn_batch_size
  tx = optax.adam(config.dynamics_training.dyn_lr)
  grad_fn = jax.value_and_grad(functools.partial(loss_fn, config))

  def minibatch(i, carry):
    params, opt_state = carry
    idx = order[i]                                                    # [M, bs]
    w = jnp.broadcast_to((i * bs + jnp.arange(bs) < n_train).astype(jnp.float32), (members, bs))
    x = (data.inputs[idx] - st.input_mean) / st.input_std
    _, grads = grad_fn(params, x, data.targets[idx], w)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  params, opt_state = jax.lax.fori_loop(start, stop, minibatch, (carry.params, carry.opt_state))
  return _Carry(params=params, opt_state=opt_state)


class _Fns(NamedTuple):
  """The jitted pieces of training (one seed, or vmapped over a leading seed axis)."""
  init: Callable       # (keys, inputs, targets) -> _SeedTrain
  plan: Callable       # (st) -> order [(S,) n_batches, M, bs]
  steps: Callable      # (st, carry, data, order, start, stop) -> carry: _steps
  end: Callable        # (st, params, opt_state, inputs, targets, max_epochs) -> (st, mse):
                       #   validation.validate_epoch
  finish: Callable     # (st) -> DynamicsState: validation.pick_elites
  config: object       # the (_dyn_config) config they were built for


def _compiled(config, batched: bool) -> _Fns:
  """The training functions (_Fns) jitted for one seed, or over a leading seed axis (vmapped or
  looped: core/cell_layout, as the training epoch's cells)."""
  return _compiled_as(config, cell_layout.layout(environment.cells()) if batched else None)


@functools.lru_cache(maxsize=None)
def _compiled_as(config, layout) -> _Fns:
  # Each piece's dots at the run's matmul precision (xla_options.at_precision), pinned in the
  # function jit traces: float32 by default, as the references train their ensembles.
  fns = [xla_options.at_precision(functools.partial(f, config), config.matmul_precision)
         for f in (_init_seed, _plan, _steps, validation.validate_epoch, validation.pick_elites)]
  if layout is not None:
    axes = [(0, None, None), (0,), (0, 0, None, 0, None, None),
            (0, 0, 0, None, None, None), (0,)]
    fns = [cell_layout.map_cells(f, a, layout) for f, a in zip(fns, axes)]
  return _Fns(*map(jax.jit, fns), config=config)


def _end(fns: _Fns, st, carry: _Carry, data: _Data, max_epochs):
  """validation.validate_epoch after the epoch's minibatches: (st, mse)."""
  return fns.end(st, carry.params, carry.opt_state, data.inputs, data.targets, max_epochs)


def run_epoch(fns: _Fns, st, inputs, targets, max_epochs):
  """One whole epoch in three device calls (plan, all minibatches, end); what _Training's chunks
  of the same epoch compute. Returns (st, mse)."""
  n_train = st.boot.shape[-1]
  n_batches = _num_batches(n_train, fns.config)
  data = _Data(inputs=inputs, targets=targets)
  carry = fns.steps(st, _Carry(params=st.params, opt_state=st.opt_state), data, fns.plan(st), 0,
                    n_batches)
  return _end(fns, st, carry, data, max_epochs)


@dataclasses.dataclass(frozen=True)
class _DynConfig:
  """What training reads of a Config: the ensemble's shape and its training recipe, whole
  (dyn_max_epochs None: it is a runtime argument), and the run's matmul precision. The compile
  cache's key."""
  dynamics: groups.DynamicsConfig
  dynamics_training: groups.DynamicsTrainingConfig
  matmul_precision: str


def _dyn_config(config) -> _DynConfig:
  """config's _DynConfig: what the compiled training functions read, and nothing else."""
  training = dataclasses.replace(config.dynamics_training, dyn_max_epochs=None)
  return _DynConfig(dynamics=config.dynamics, dynamics_training=training,
                    matmul_precision=config.matmul_precision)


class DynamicsTrainingStopped(Exception):
  """Dynamics training stopped on request (should_stop) after checkpointing the state after epoch
  `epoch`; `mid_epoch`: the request came during epoch `epoch` + 1, whose minibatches so far were
  dropped (the resume trains that epoch again, from its start: the same result). Calling
  train_ensemble / train_seeds again with the same checkpoint_dir resumes from there."""

  def __init__(self, epoch: int, checkpoint_dir: str, mid_epoch: bool = False):
    during = f" during epoch {epoch + 1} (redone from its start on resume)" if mid_epoch else ""
    super().__init__(f"dynamics training stopped after epoch {epoch}{during}; its state is in "
                     f"{checkpoint_dir} and the same call resumes from it")
    self.epoch = epoch
    self.checkpoint_dir = checkpoint_dir
    self.mid_epoch = mid_epoch


@dataclasses.dataclass(frozen=True)
class Resumable:
  """Where a training saves itself and when it stops: checkpoint_dir (None: nowhere), should_stop
  (polled; needs checkpoint_dir), reuse_key (reuse.reuse_key: a checkpoint of another is
  refused)."""
  checkpoint_dir: Optional[str] = None
  should_stop: Optional[Callable[[], bool]] = None
  reuse_key: Optional[dict] = None


class _Training:
  """One call of train_ensemble / train_seeds: the compiled pieces, the training state and its
  checkpoints, the epoch loop (run) and its log lines. log_fn: one line per epoch; history:
  as train_ensemble's."""

  def __init__(self, keys, transitions, config, batched: bool, resume: Resumable, log_fn,
               history: Optional[list]):
    inputs, targets = make_arrays(transitions)
    self.n_train, n_hold = split_sizes(inputs.shape[0], config)
    if n_hold < 1 or self.n_train < 1:
      raise ValueError(f"{inputs.shape[0]} transitions are too few to split off a holdout set "
                       f"(holdout ratio {config.dynamics_training.dyn_holdout_ratio}); pass more "
                       "data.")
    self.config, self.resume, self.log_fn, self.history = config, resume, log_fn, history
    self.data = _Data(inputs=inputs, targets=targets)
    self.fns = _compiled(_dyn_config(config), batched)
    self.st = self.fns.init(keys, inputs, targets)
    self.ckpt = None if resume.checkpoint_dir is None else checkpoint.RunCheckpointer(
        resume.checkpoint_dir, keep=2, kind="dynamics training")
    resumed = self._restore()
    self.last_save = time.time()
    self.saved = self._epoch() if resumed else None        # epoch of the last save
    cap = config.dynamics_training.dyn_max_epochs
    self.max_epochs = jnp.asarray(np.iinfo(np.int32).max if cap is None else cap, jnp.int32)
    self.num_seeds = keys.shape[0] if batched else 1
    self.n_batches = _num_batches(self.n_train, config)
    self.chunks = signals.Chunks(self.n_batches)

  def _epoch(self) -> int:
    return int(np.max(jax.device_get(self.st.epoch)))

  def _restore(self) -> bool:
    """The checkpointed training state, if there is one; refuses another reuse key."""
    if self.ckpt is None or self.ckpt.latest_step() is None:
      return False
    self.st, meta = self.ckpt.restore(self.st)
    differs = reuse.reuse_mismatch(meta, self.resume.reuse_key or {})
    if differs:
      raise checkpoint.CheckpointError(
          f"The unfinished dynamics training in {self.ckpt.directory} belongs to another setup "
          f"({reuse.format_mismatch(differs)}); delete that folder to train from scratch, "
          "or pass another --dynamics_dir.")
    self.log_fn(f"dynamics: resumed unfinished training from {self.resume.checkpoint_dir} at "
                f"epoch {self._epoch()}")
    return True

  def announce(self, pace: float):
    """A long epoch (no line for minutes otherwise) is told, once its pace is known."""
    if pace * self.n_batches >= 10.0:
      self.log_fn(f"dynamics: {self.n_batches} minibatches an epoch, about "
                  f"{pace * self.n_batches:.0f} s an epoch at this pace (a stop request waits "
                  f"about {signals.POLL_SECONDS:g} s)")

  def save(self, ep: int):
    if self.ckpt is not None and self.saved != ep:
      self.ckpt.save(ep, self.st, {reuse.REUSE_KEY_FIELD: self.resume.reuse_key or {}})
      self.last_save, self.saved = time.time(), ep

  def epoch(self):
    """One epoch in device calls of chunks.next() minibatches (signals.Chunks), should_stop
    polled before each. Returns (st, mse) after the epoch, or None when should_stop fired
    (self.st, the state before the epoch, is untouched: nothing of the epoch is kept)."""
    st, chunks, should_stop = self.st, self.chunks, self.resume.should_stop
    order = self.fns.plan(st)
    carry, done = _Carry(params=st.params, opt_state=st.opt_state), 0
    while done < chunks.total:
      if should_stop is not None and should_stop():
        return None
      n = chunks.next(chunks.total - done)
      carry = chunks.run(lambda a, b: self.fns.steps(st, carry, self.data, order, a, b), done, n)
      done += n
      pace = chunks.first_pace()
      if pace is not None:
        self.announce(pace)
    return _end(self.fns, st, carry, self.data, self.max_epochs)

  def report(self, mse, t0: float) -> bool:
    """The epoch's line (and history row); whether any seed still trains."""
    st, num_seeds, cfg = self.st, self.num_seeds, self.config.dynamics_training
    mse, best, active, since, ep = jax.device_get((mse, st.best, st.active, st.since, st.epoch))
    mse, best = (np.reshape(a, (num_seeds, -1)) for a in (mse, best))
    active, since, ep = (np.reshape(a, (num_seeds,)) for a in (active, since, ep))
    if self.history is not None:
      self.history.append(dict(epoch=ep, holdout_mse=mse, best=best, active=active))
    left = int(np.max(np.where(active, cfg.dyn_patience - since, 0)))
    if cfg.dyn_max_epochs is not None:
      left = min(left, cfg.dyn_max_epochs - int(ep.max()))
    per_seed = " | ".join(
        f"seed {s}{'' if active[s] else ' (stopped)'}: " + " ".join(f"{v:.4g}" for v in mse[s])
        for s in range(num_seeds))
    self.log_fn(f"dynamics epoch {int(ep.max())}: holdout mse {per_seed}; "
                f"{time.time() - t0:.1f} s elapsed; {int(active.sum())}/{num_seeds} seed(s) "
                f"training, at most {left} epoch(s) left unless a member improves")
    return bool(active.any())

  def run(self) -> DynamicsState:
    t0, should_stop = time.time(), self.resume.should_stop
    while True:
      done = self.epoch()
      if done is None:               # stopped mid-epoch: the state before it is what resumes
        ep = self._epoch()
        self.save(ep)
        raise DynamicsTrainingStopped(ep, self.resume.checkpoint_dir, mid_epoch=True)
      self.st, mse = done
      if not self.report(mse, t0):
        break
      stop = should_stop is not None and should_stop()
      if stop or time.time() - self.last_save >= self.config.dyn_checkpoint_every_s:
        self.save(self._epoch())
      if stop:
        raise DynamicsTrainingStopped(self._epoch(), self.resume.checkpoint_dir)
    return self.fns.finish(self.st)


def train_ensemble(key, transitions, config, log_fn: Callable = print,
                   history: Optional[list] = None, **resume) -> DynamicsState:
  """Trains one seed's ensemble on data.Transitions (numpy). key: PRNG key [2].

  log_fn gets one progress line per epoch. history: if a list, one dict per epoch is appended
  (epoch [1], holdout_mse [1, M], best [1, M], active [1]; numpy). `resume`: checkpoint_dir,
  should_stop, reuse_key as in train_seeds.
  """
  chex.assert_shape(key, (2,))
  return _Training(key, transitions, config, False, Resumable(**resume), log_fn, history).run()


def train_seeds(keys, transitions, config, log_fn: Callable = print,
                history: Optional[list] = None, *, checkpoint_dir: Optional[str] = None,
                should_stop: Optional[Callable[[], bool]] = None,
                reuse_key: Optional[dict] = None) -> DynamicsState:
  """Trains len(keys) seeds' ensembles in one program over the seeds (vmapped, or looped on CPU:
  core/cell_layout), the same calls per epoch as one seed. keys [N, 2].

  Returns a DynamicsState with a leading seed axis N. Each seed stops on its own; stopped seeds
  stay frozen while the others finish, so seed i's result equals train_ensemble(keys[i], ...) up
  to float rounding (the one-seed program is not batched).
  history: as in `train_ensemble`, with N rows per array (only the epochs of this call after a
  resume).

  checkpoint_dir: the training state is saved there (every config.dyn_checkpoint_every_s seconds,
  and when stopping), and a call with the same checkpoint_dir resumes from it, ending with the same
  result as an uninterrupted call; a checkpoint of another `reuse_key` (reuse.reuse_key)
  is refused.
  should_stop: polled between device calls (about every signals.POLL_SECONDS; after each epoch);
  when it returns True the state after the last whole epoch is checkpointed and
  `DynamicsTrainingStopped` raised (needs checkpoint_dir); the minibatches of an unfinished epoch
  are dropped.
  """
  chex.assert_rank(keys, 2)
  if should_stop is not None and checkpoint_dir is None:
    raise ValueError("should_stop needs a checkpoint_dir to save the interrupted training in.")
  resume = Resumable(checkpoint_dir, should_stop, reuse_key)
  return _Training(keys, transitions, config, True, resume, log_fn, history).run()
