"""The dynamics ensemble's training data: transitions as input / target arrays (`make_arrays`) and
each seed's train / holdout split (`split_sizes`, `split_indices`, from the seed's keys
`seed_keys`). The training itself: dynamics_training.py.
"""
import jax
import jax.numpy as jnp
import numpy as np


def split_sizes(n: int, config) -> tuple:
  """(train size, holdout size) for n transitions."""
  training = config.dynamics_training
  holdout = min(int(n * training.dyn_holdout_ratio), training.dyn_max_holdout)
  return n - holdout, holdout


def seed_keys(key):
  """(permutation, bootstrap, init, training) keys of one seed."""
  return jax.random.split(key, 4)


def split_indices(key, n: int, config) -> tuple:
  """(train_idx [n - H], holdout_idx [H]): the split train_ensemble / train_seeds use for this seed
  key."""
  n_train, n_hold = split_sizes(n, config)
  perm = jax.random.permutation(seed_keys(key)[0], n).astype(jnp.int32)
  return perm[n_hold:], perm[:n_hold]


def make_arrays(transitions):
  """Transitions -> (inputs [N, S + A], targets [N, S + 1]) float32 device arrays.

  targets = (next_obs - obs, reward).
  """
  obs = np.asarray(transitions.observations, np.float32)
  act = np.asarray(transitions.actions, np.float32)
  nxt = np.asarray(transitions.next_observations, np.float32)
  rew = np.asarray(transitions.rewards, np.float32).reshape(-1, 1)
  if obs.ndim != 2 or act.ndim != 2 or nxt.shape != obs.shape or len(rew) != len(obs) \
      or len(act) != len(obs):
    raise ValueError("Transitions must hold observations [N, S], actions [N, A], "
                     "next_observations [N, S] and rewards [N]; got shapes "
                     f"{obs.shape}, {act.shape}, {nxt.shape}, {rew.shape[:1]}.")
  inputs = np.concatenate([obs, act], axis=1)
  targets = np.concatenate([nxt - obs, rew], axis=1)
  if not (np.all(np.isfinite(inputs)) and np.all(np.isfinite(targets))):
    raise ValueError("Transitions contain NaN or inf values; clean the dataset first.")
  return jnp.asarray(inputs), jnp.asarray(targets)
