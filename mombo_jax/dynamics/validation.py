"""What the holdout split decides in dynamics training: each member's holdout MSE (holdout_mse),
at the end of every epoch a snapshot of the members that improved by more than dyn_improvement
and the patience-based stop (validate_epoch), and at the end the kept members with the elites,
best holdout MSE first (pick_elites). The recipe is MBPO's / OfflineRL-Kit's (its
EnsembleDynamics.validate, select_elites).

`st` below is one seed's training state (dynamics_training._SeedTrain, vmapped: a leading seed
axis): the holdout indices `holdout` [H], the normaliser `input_mean` / `input_std` [D], the
members' best holdout MSE `best` [M], their kept parameters `snapshot`, the epoch counters
`since` / `epoch` and `active` (still training). Every function here is traced into a compiled
piece of the epoch (dynamics_training._compiled_as).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from mombo_jax.core.dynamics import DynamicsState, apply

# Holdout loss of a member before its first epoch: any finite loss is a > 1 % improvement on it.
INITIAL_BEST = 1e10


def holdout_mse(config, params, st, inputs, targets):
  """[M] MSE of each member's mean prediction on the seed's holdout split."""
  x = (inputs[st.holdout] - st.input_mean) / st.input_std
  x = jnp.broadcast_to(x, (config.dynamics.dyn_members,) + x.shape)
  mean, _ = apply(config, params, x)
  return jnp.mean(jnp.square(mean - targets[st.holdout]), axis=(1, 2))


def validate_epoch(config, st, params, opt_state, inputs, targets, max_epochs):
  """The end of one epoch of one seed, after all its minibatches (dynamics_training._steps) gave
  (params, opt_state): holdout evaluation, snapshot, stopping.

  max_epochs: int32 [] (an argument, not a compile-time constant, so one compilation serves
  every dyn_max_epochs).

  A stopped seed (st.active False) comes back unchanged, by select rather than cond.
  Returns (new state, holdout MSE [M] of this epoch's parameters; a stopped seed: its best).
  """
  members = st.boot.shape[0]
  key, _ = jax.random.split(st.key)
  mse = holdout_mse(config, params, st, inputs, targets)
  improved = ((st.best - mse) / st.best > config.dynamics_training.dyn_improvement) & st.active
  sel_m = lambda new, old: jnp.where(  # noqa: E731
      improved.reshape((members,) + (1,) * (new.ndim - 1)), new, old)
  snapshot = jax.tree.map(sel_m, params["members"], st.snapshot)
  best = jnp.where(improved, mse, st.best)
  since = jnp.where(jnp.any(improved), 0, st.since + 1)
  epoch = st.epoch + 1
  stop = (since >= config.dynamics_training.dyn_patience) | (epoch >= max_epochs)
  new = st.replace(params=params, opt_state=opt_state, snapshot=snapshot, best=best, since=since,
                   epoch=epoch, active=~stop, key=key)
  out = jax.tree.map(lambda a, b: jnp.where(st.active, a, b), new, st)
  # A stopped seed reports its kept (snapshot) losses, not those of the discarded update.
  return out, jnp.where(st.active, mse, st.best)


def pick_elites(config, st) -> DynamicsState:
  """The trained ensemble: snapshot members + the final shared log-variance bounds; elites
  int32 [dyn_elites] by best holdout MSE, best first."""
  params = dict(st.params, members=st.snapshot)
  elites = jnp.argsort(st.best)[:config.dynamics.dyn_elites].astype(jnp.int32)
  return DynamicsState(params=params, input_mean=st.input_mean, input_std=st.input_std,
                       elites=elites)
