"""Per-seed divergence inside the compiled epoch: a seed that goes non-finite or explodes is frozen
at its last healthy agent and flagged; the other seeds are untouched (bitwise: the same compiled
program, the same vmap width)."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mombo_jax import buffer, config as config_lib, dynamics
from mombo_jax import train as train_lib

S_DIM, A_DIM, N = 11, 3, 256
SEEDS = 2


@pytest.fixture(scope="module")
def cfg():
  return config_lib.make_config("hopper-random", "mombo", preset="tiny", steps_per_epoch=4,
                                rollout_batch_size=16, rollout_length=2, batch_size=16)


@pytest.fixture(scope="module")
def real():
  rng = np.random.default_rng(0)
  f = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)  # noqa: E731
  obs = f(N, S_DIM).at[:, 0].set(1.25).at[:, 1].set(0.0)   # healthy hopper heights / angles
  zeros = jnp.zeros((N, S_DIM), jnp.float32)
  return buffer.Batch(obs=obs, action=jnp.tanh(f(N, A_DIM)), reward=f(N), next_obs=obs,
                      done=jnp.zeros(N, jnp.float32), obs_var=zeros, next_obs_mean=obs,
                      next_obs_var=zeros, reward_mean=jnp.zeros(N), reward_var=jnp.zeros(N))


def _fresh(cfg, real):
  keys = jax.random.split(jax.random.PRNGKey(0), SEEDS)
  one = dynamics.init_state(jax.random.PRNGKey(1), S_DIM, A_DIM, cfg)
  dyn = jax.tree.map(lambda x: jnp.stack([x] * SEEDS), one)
  return train_lib.init_seeds(keys, cfg, real, dyn)


def _poison(state, seed):
  """NaN into one seed's critic parameters (as a diverged update would leave them)."""
  critic = jax.tree.map(lambda x: x.at[seed].set(jnp.nan), state.agent.critic.params)
  return state.replace(agent=state.agent.replace(
      critic=state.agent.critic.replace(params=critic)))


def _host(tree):
  return jax.tree.map(np.asarray, jax.device_get(tree))


def _assert_tree_equal(a, b):
  jax.tree.map(lambda x, y: np.testing.assert_array_equal(x, y), a, b)


def _args(cfg, real, epoch):
  """(datasets, keys, cells): the epoch's arguments after the state, for SEEDS seeds."""
  stacked, cells = train_lib.single_dataset(real, cfg, SEEDS)
  return stacked, _keys(epoch), cells


def _keys(epoch):
  return jax.vmap(lambda k: jax.random.fold_in(k, epoch))(
      jax.random.split(jax.random.PRNGKey(7), SEEDS))


def test_nonfinite_seed_is_frozen_and_others_untouched(cfg, real):
  epoch_fn = train_lib.make_seeds_epoch(cfg)
  clean, clean_metrics = epoch_fn(_fresh(cfg, real), *_args(cfg, real, 0))
  assert not np.any(np.asarray(clean_metrics["diverged"]))
  clean = _host(clean)

  poisoned = _poison(_fresh(cfg, real), 0)
  poisoned_agent = _host(poisoned.agent)
  state, metrics = epoch_fn(poisoned, *_args(cfg, real, 0))
  np.testing.assert_array_equal(np.asarray(metrics["diverged"]), [True, False])
  flagged = [k for k in train_lib.DIVERGENCE_CHECKS if bool(metrics[f"diverged/{k}"][0])]
  assert "params" in flagged and "critic_loss" in flagged, flagged
  assert not any(bool(metrics[f"diverged/{k}"][1]) for k in train_lib.DIVERGENCE_CHECKS)
  agent = _host(state.agent)
  # Seed 0 kept the agent it came in with; seed 1 is bit for bit the clean run's seed 1.
  _assert_tree_equal(jax.tree.map(lambda x: x[0], agent),
                     jax.tree.map(lambda x: x[0], poisoned_agent))
  _assert_tree_equal(jax.tree.map(lambda x: x[1], agent),
                     jax.tree.map(lambda x: x[1], clean.agent))
  np.testing.assert_array_equal(np.asarray(state.epoch), [1, 1])

  # Frozen for good: a second epoch leaves seed 0 as it was and reports no new failure.
  state2, metrics2 = epoch_fn(state, *_args(cfg, real, 1))
  np.testing.assert_array_equal(np.asarray(metrics2["diverged"]), [True, False])
  assert not any(bool(metrics2[f"diverged/{k}"][0]) for k in train_lib.DIVERGENCE_CHECKS)
  _assert_tree_equal(jax.tree.map(lambda x: x[0], _host(state2.agent)),
                     jax.tree.map(lambda x: x[0], poisoned_agent))
  assert np.all(np.isfinite(np.asarray(metrics2["critic_loss"][1])))


def test_a_finite_explosion_counts_as_divergence(cfg, real):
  """A loss beyond max_abs_loss (beta=1e18 gives ~1e37 critic losses) freezes the seed too."""
  strict = dataclasses.replace(cfg, max_abs_loss=1e-6)
  state = _fresh(strict, real)
  before = _host(state.agent)
  state, metrics = train_lib.make_seeds_epoch(strict)(state, *_args(strict, real, 0))
  assert np.all(np.asarray(metrics["diverged"]))
  assert np.all(np.asarray(metrics["diverged/critic_loss"]))
  assert not np.any(np.asarray(metrics["diverged/params"]))   # finite, just too large
  assert np.all(np.isfinite(np.asarray(metrics["critic_loss"])))
  _assert_tree_equal(_host(state.agent), before)
