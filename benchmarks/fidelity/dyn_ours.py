"""Our side of the dynamics and rollout comparisons (dynamics_side.py), without torch: the
synthetic hopper-shaped data, our dynamics training driven minibatch by minibatch through the
product's own compiled pieces (every intermediate kept), the draws our keys make (the split, each
member's bootstrap order per epoch as positions in the training split, each rollout step's elite
and Gaussian noise per row), and a replay of our rollout from those draws with every row kept.

tests/test_fidelity_dynamics.py holds these to the product: the positions and draws are what
dynamics_training and rollout.run use, and the replay writes what rollout.run writes.

float64 (the harness process under jax_enable_x64): the product writes float32 in four places,
which the harness casts around, keeping the values: training_data.make_arrays (the training
arrays: `arrays` builds them in float64), the ensemble's parameters (Flax Dense's default
param_dtype and EnsembleDynamics' max / min logvar: `start_training` casts them and re-inits Adam),
validation.INITIAL_BEST's array (cast with them) and the replay ring (buffer.init_ring / add:
float32 rows, as the references' ReplayBuffer; the comparison reads the ring as float32). Padding
weights (dynamics_training._steps) and terminals (rollout.run) are float32 0 / 1, exact either way.

Shapes: N rows of data, T = N - H training rows, H holdout rows, M members, E elites, K rollout
steps, R rollout branches, S = 11 obs dims, A = 3 action dims, O = S + 1 outputs.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Dict, List

import jax
import jax.numpy as jnp
import numpy as np
import optax

from mombo_jax.core import dynamics, targets, termination
from mombo_jax.data.transitions import Transitions
from mombo_jax.dynamics import dynamics_training, training_data
from mombo_jax.settings.config import make_config

ENV = "hopper-medium-replay"
S, A = 11, 3


def config(algo: str, epochs: int, **overrides):
  """The algorithm's reference settings for ENV, dynamics training capped at `epochs` epochs."""
  return make_config(ENV, algo, dyn_max_epochs=epochs, **overrides)


def synthetic(n: int, seed: int = 0) -> Transitions:
  """n hopper-shaped transitions (float64): height near the healthy 0.7 edge, angles of both
  signs near +-0.2, a smooth action-dependent delta and reward, so that some rollout branches
  terminate."""
  rng = np.random.default_rng(seed)
  obs = rng.normal(0.0, 0.5, (n, S))
  obs[:, 0] = rng.normal(1.1, 0.2, n)
  obs[:, 1] = rng.normal(0.0, 0.1, n)
  act = rng.uniform(-1.0, 1.0, (n, A))
  drive = np.tanh(obs[:, :A] + act)
  delta = 0.05 * np.concatenate([drive, np.sin(obs[:, A:])], axis=1) + rng.normal(0, 0.02, (n, S))
  delta[:, 0] -= 0.05 * np.abs(act[:, 0])
  reward = 1.0 + obs[:, 5] - 0.1 * np.sum(act ** 2, axis=1) + rng.normal(0, 0.05, n)
  return Transitions(obs, act, reward, obs + delta, np.zeros(n))


def arrays(data: Transitions, dtype: str):
  """(inputs [N, S + A], targets [N, O]) as training_data.make_arrays makes them, in dtype
  (make_arrays itself writes float32: the float64 harness builds the same arrays in float64)."""
  if dtype == "float32":
    return training_data.make_arrays(data)
  inputs = np.concatenate([data.observations, data.actions], axis=1)
  targets = np.concatenate([data.next_observations - data.observations,
                            np.reshape(data.rewards, (-1, 1))], axis=1)
  return jnp.asarray(inputs, dtype), jnp.asarray(targets, dtype)


def cast(tree, dtype):
  return jax.tree.map(lambda x: jnp.asarray(x, dtype) if jnp.issubdtype(x.dtype, jnp.floating)
                      else x, tree)


# ------------------------------------------------------------------------------- dynamics training

@dataclasses.dataclass
class TrainingTrace:
  """What our dynamics training did, epoch by epoch (numpy).

  train_idx [T], holdout_idx [H]: the split; orders[e] [M, T]: epoch e's minibatch order as data
  indices (dynamics_training._plan, padding dropped); losses[e][b]: the loss terms of minibatch b
  before its Adam step (total, nll, decay, logvar_bound); params[k]: the parameters after Adam
  step k (1-based, over all epochs) for the steps `kept_step` keeps; holdout_mse[e] [M],
  kept[e] bool [M] (snapshot taken), input_mean / input_std [D];
  final: the trained DynamicsState (validation.pick_elites); init_params: the start; further:
  the ensemble after train_epochs' further epochs.
  """
  train_idx: np.ndarray
  holdout_idx: np.ndarray
  input_mean: np.ndarray
  input_std: np.ndarray
  init_params: dict
  orders: List[np.ndarray] = dataclasses.field(default_factory=list)
  losses: List[List[Dict[str, float]]] = dataclasses.field(default_factory=list)
  params: Dict[int, dict] = dataclasses.field(default_factory=dict)
  holdout_mse: List[np.ndarray] = dataclasses.field(default_factory=list)
  kept: List[np.ndarray] = dataclasses.field(default_factory=list)
  final: dynamics.DynamicsState = None
  further: dynamics.DynamicsState = None


def kept_step(k: int, n_batches: int) -> bool:
  """Whether the parameters after Adam step k are kept: the first, and each epoch's last (all of
  them would be ~7 MB a step in float64)."""
  return k == 1 or k % n_batches == 0


@functools.lru_cache(maxsize=None)
def _loss_terms(cfg):
  """jit(params, x_std [M, B, D], y [M, B, O], w [M, B]) -> the loss's terms (core/dynamics.loss_fn
  and its _decay; nll = total - decay - logvar_bound, so the three add up to loss_fn)."""
  coef = cfg.dynamics_training.dyn_logvar_coef

  def terms(params, x, y, w):
    total = dynamics.loss_fn(cfg, params, x, y, w)
    decay = dynamics._decay(cfg, params)
    bound = coef * (jnp.sum(params["max_logvar"]) - jnp.sum(params["min_logvar"]))
    return dict(total=total, nll=total - decay - bound, decay=decay, logvar_bound=bound)
  return jax.jit(terms)


def _fns(cfg):
  return dynamics_training._compiled_as(dynamics_training._dyn_config(cfg), None)


def start_training(cfg, key, inputs, targets, dtype: str):
  """One seed's training state (dynamics_training._init_seed through its compiled piece), its
  parameters, optimiser and best losses cast to dtype (our init writes float32 parameters; the
  cast keeps their values)."""
  st = _fns(cfg).init(key, inputs, targets)
  params = cast(st.params, dtype)
  return st.replace(params=params, snapshot=params["members"], best=st.best.astype(dtype),
                    opt_state=optax.adam(cfg.dynamics_training.dyn_lr).init(params))


def train_epochs(cfg, key, inputs, targets, epochs: int, dtype: str,
                 further: int = 0) -> TrainingTrace:
  """`epochs` epochs of our dynamics training, each minibatch one call of the product's compiled
  step (dynamics_training._steps with start = b, stop = b + 1: the same bits as the epoch in one
  call), its loss terms taken before the step and its parameters after; then `further` epochs
  as the product trains them (dynamics_training.run_epoch), nothing recorded but the ensemble
  they end with (TrainingTrace.further)."""
  fns = _fns(cfg)
  st = start_training(cfg, key, inputs, targets, dtype)
  train_idx, holdout_idx = (np.asarray(a) for a in training_data.split_indices(
      key, inputs.shape[0], cfg))
  tr = TrainingTrace(train_idx, holdout_idx, np.asarray(st.input_mean), np.asarray(st.input_std),
                     jax.device_get(st.params))
  terms = _loss_terms(cfg)
  n_train = train_idx.shape[0]
  bs = cfg.dynamics_training.dyn_batch_size
  max_epochs = jnp.asarray(epochs + further, jnp.int32)
  for _ in range(epochs):
    order = fns.plan(st)                                            # [n_batches, M, bs]
    params, opt_state = st.params, st.opt_state
    losses = []
    for b in range(order.shape[0]):
      idx = order[b]
      w = jnp.broadcast_to((b * bs + jnp.arange(bs) < n_train).astype(inputs.dtype), idx.shape)
      x = (inputs[idx] - st.input_mean) / st.input_std
      losses.append({k: float(v) for k, v in terms(params, x, targets[idx], w).items()})
      carry = fns.steps(st, dynamics_training._Carry(params=params, opt_state=opt_state),
                        dynamics_training._Data(inputs=inputs, targets=targets), order, b, b + 1)
      params, opt_state = carry.params, carry.opt_state
      k = sum(map(len, tr.losses)) + b + 1
      if kept_step(k, order.shape[0]):
        tr.params[k] = jax.device_get(params)
    new, mse = fns.end(st, params, opt_state, inputs, targets, max_epochs)
    tr.orders.append(np.asarray(order).swapaxes(0, 1).reshape(order.shape[1], -1)[:, :n_train])
    tr.losses.append(losses)
    tr.holdout_mse.append(np.asarray(mse))
    tr.kept.append(np.asarray(new.best != st.best))
    st = new
    if not bool(st.active):          # patience ran out (their train() breaks there too)
      break
  tr.final = fns.finish(st)
  for _ in range(further):
    st, _ = dynamics_training.run_epoch(fns, st, inputs, targets, max_epochs)
  tr.further = fns.finish(st)
  return tr


def positions(train_idx, order):
  """order [M, T] of data indices -> the same order as positions in the training split (what the
  references index their standardised training rows with): train_idx[positions] == order."""
  where = np.empty(int(train_idx.max()) + 1, np.int64)
  where[train_idx] = np.arange(train_idx.shape[0])
  return where[order]


def reorder(current, target):
  """p [M, T] with current[m, p[m]] == target[m] for multisets current[m], target[m] (a bootstrap
  sample repeats indices: any matching of equal values serves)."""
  p = np.empty_like(current)
  for m in range(current.shape[0]):
    p[m, np.argsort(target[m], kind="stable")] = np.argsort(current[m], kind="stable")
  return p


# ------------------------------------------------------------------------------------- rollout

def linear_policy(seed: int = 0):
  """(W [S, A], b [A]): the fixed policy both sides roll out with, a = tanh(obs @ W + b)."""
  rng = np.random.default_rng(100 + seed)
  return rng.normal(0.0, 0.3, (S, A)), rng.normal(0.0, 0.1, A)


def policy_fn(w, b):
  """The policy as rollout.run calls it: (obs [R, S], key) -> action [R, A] (the key unused)."""
  return lambda obs, key: jnp.tanh(obs @ jnp.asarray(w, obs.dtype) + jnp.asarray(b, obs.dtype))


def rollout_draws(key, n: int, cfg, elites, dtype: str):
  """The elite [K, R] (member index) and noise [K, R, O] rollout.run's dynamics.step draws per
  step and row from `key`, reproducing their splits (rollout.run: split(key, K), then
  (k_pi, k_model); dynamics.step: (k_elite, k_noise) of k_model)."""
  elite, noise = [], []
  for step_key in jax.random.split(key, cfg.rollout.rollout_length):
    _, k_model = jax.random.split(step_key)
    k_elite, k_noise = jax.random.split(k_model)
    slot = jax.random.randint(k_elite, (n,), 0, elites.shape[0])
    elite.append(np.asarray(elites)[np.asarray(slot)])
    noise.append(np.asarray(jax.random.normal(k_noise, (n, S + 1), dtype)))
  return np.stack(elite), np.stack(noise)


def rollout_replay(key, policy, dyn, start_obs, cfg, beta):
  """rollout.run's steps replayed one model step at a time (dynamics.step with the keys it gets
  there), every row kept, unwritten ones included. Returns (rows: dict of [K, R, ...] arrays:
  obs, action, next_obs, reward, done, obs_var, next_obs_var, penalty (MOPO's, else absent);
  written bool [K, R])."""
  term_fn = termination.termination_fn(cfg.env_name)
  penalise = cfg.algorithm.penalise_reward
  # MOPO's penalty is of the whole ensemble (targets.EnsemblePenalty): the step returns every
  # member's Gaussians, as rollout.run asks for them.
  penalty_fn = targets.get_penalty(cfg) if penalise else None
  step = jax.jit(functools.partial(dynamics.step, config=cfg, every_member=penalise))
  obs, obs_var = start_obs, jnp.zeros_like(start_obs)
  alive = np.ones(start_obs.shape[0], bool)
  rows, written = [], []
  for step_key in jax.random.split(key, cfg.rollout.rollout_length):
    k_pi, k_model = jax.random.split(step_key)
    action = policy(obs, k_pi)
    out = step(dyn, obs, action, k_model)
    penalty = penalty_fn.of_ensemble(out.ensemble) if penalise else None
    reward = out.reward - beta * penalty if penalise else out.reward
    done = np.asarray(termination.model_done(term_fn, obs, action, out.next_obs,
                                             cfg.rollout.rollout_obs_limit))
    finite = np.all(np.isfinite(np.asarray(out.next_obs)), -1) & np.isfinite(np.asarray(reward))
    row = dict(obs=obs, action=action, next_obs=out.next_obs, reward=reward, done=done,
               obs_var=obs_var, next_obs_var=out.next_obs_var)
    if penalise:
      row["penalty"] = penalty
    rows.append({k: np.asarray(v) for k, v in row.items()})
    written.append(alive & finite)
    alive = written[-1] & ~done
    obs = jnp.where(alive[:, None], out.next_obs, 0.0)
    obs_var = jnp.where(alive[:, None], out.next_obs_var, 0.0)
  return {k: np.stack([r[k] for r in rows]) for k in rows[0]}, np.stack(written)
