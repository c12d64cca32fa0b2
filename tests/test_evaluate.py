"""evaluate.py: shapes, determinism, a hand-stepped constant-action check, masking, aulc."""
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mombo_jax import envs, evaluate
from mombo_jax.config import make_config
from mombo_jax.critics import TanhGaussianActor

HOPPER_OBS, HOPPER_ACT = 11, 3


@pytest.fixture(scope="module")
def config():
  return make_config("hopper-random", preset="tiny", actor_hidden=(8,))


def _random_params(config, num_seeds, obs_dim=HOPPER_OBS, action_dim=HOPPER_ACT, seed=0):
  actor = TanhGaussianActor(config.actor_hidden, action_dim, config.log_std_min,
                            config.log_std_max)
  keys = jax.random.split(jax.random.PRNGKey(seed), num_seeds)
  return jax.vmap(lambda k: actor.init(k, jnp.zeros((1, obs_dim))))(keys)


def _constant_params(config, actions, obs_dim):
  """Actor variables [S, ...] whose tanh(mean) is actions[s] for every observation: all kernels
  zero, the mean head's bias atanh(actions[s])."""
  actions = np.asarray(actions, np.float32)
  params = _random_params(config, len(actions), obs_dim, actions.shape[1])
  params = jax.tree.map(jnp.zeros_like, params)
  mean_head = f"Dense_{len(config.actor_hidden)}"
  params["params"][mean_head]["bias"] = jnp.arctanh(jnp.asarray(actions))
  return params


def _manual_return(env_id, seed, action, horizon):
  """Undiscounted return of one plain gymnasium episode with a constant action, and its length."""
  env = gym.make(env_id, max_episode_steps=horizon)
  env.reset(seed=int(seed))
  total, steps = 0.0, 0
  while True:
    _, reward, terminated, truncated, _ = env.step(np.asarray(action, np.float32))
    total += reward
    steps += 1
    if terminated or truncated:
      env.close()
      return total, steps


def test_shape_and_determinism(config):
  params = _random_params(config, num_seeds=2)
  a = evaluate.run(params, config, "hopper", episodes=3, seed=5, max_episode_steps=20)
  b = evaluate.run(params, config, "hopper-random", episodes=3, seed=5, max_episode_steps=20)
  c = evaluate.run(params, config, "hopper", episodes=3, seed=6, max_episode_steps=20)
  assert a.shape == (2, 3) and a.dtype == np.float64 and np.all(np.isfinite(a))
  np.testing.assert_array_equal(a, b)        # same seed (and short or dataset name) -> same returns
  assert not np.array_equal(a, c)            # another seed -> other start states
  assert len(np.unique(a)) == a.size         # every episode starts from its own state


def test_constant_action_matches_plain_gymnasium(config):
  """Seed 0 pushes hard and falls over (terminates) before the horizon; seed 1 stands still and is
  cut by the time limit. Later steps of the fallen env must not count."""
  horizon, episodes, seed = 80, 2, 3
  actions = np.array([[1.0 - 1e-3, -0.9, 0.9], [0.0, 0.0, 0.0]], np.float32)
  params = _constant_params(config, actions, HOPPER_OBS)
  got = evaluate.run(params, config, "hopper", episodes, seed, max_episode_steps=horizon)
  start_seeds = evaluate.env_seeds(seed, len(actions), episodes)
  lengths = np.zeros((len(actions), episodes), int)
  for s in range(len(actions)):
    for e in range(episodes):
      want, lengths[s, e] = _manual_return("Hopper-v5", start_seeds[s, e], actions[s], horizon)
      np.testing.assert_allclose(got[s, e], want, rtol=1e-5)
  assert lengths[0].max() < horizon and lengths[1].min() == horizon   # both end conditions seen
  assert not np.allclose(got[0], got[1])


def test_reused_evaluator_matches_fresh_envs(config):
  """One env set for a sequence of evaluations (one that ends with a fallen env, whose auto-reset
  is still pending: seed 0 falls before the horizon, see the test above) gives each evaluation
  the returns of fresh envs."""
  horizon = 80
  falling = _constant_params(config, [[1.0 - 1e-3, -0.9, 0.9], [0.0, 0.0, 0.0]], HOPPER_OBS)
  random = _random_params(config, num_seeds=2, seed=4)
  calls = [(falling, 3), (random, 5), (falling, 3), (random, 6)]
  with evaluate.Evaluator(config, "hopper", num_seeds=2, episodes=2,
                          max_episode_steps=horizon) as evaluator:
    vector_env = evaluator.envs
    reused = [evaluator.run(params, seed) for params, seed in calls]
    assert evaluator.envs is vector_env
    with pytest.raises(ValueError, match="2 seed"):
      evaluator.run(_random_params(config, num_seeds=3), 0)
  for (params, seed), got in zip(calls, reused):
    fresh = evaluate.run(params, config, "hopper", 2, seed, max_episode_steps=horizon)
    np.testing.assert_array_equal(got, fresh)
  np.testing.assert_array_equal(reused[0], reused[2])
  assert not np.array_equal(reused[1], reused[3])


def test_action_bounds_are_rescaled(config, monkeypatch):
  """An env with bounds [-2, 2] (Pendulum) gets low + (a + 1) / 2 * (high - low) = 2a."""
  monkeypatch.setattr(envs, "make_env",
                      lambda name, max_episode_steps: gym.make("Pendulum-v1",
                                                               max_episode_steps=max_episode_steps))
  actions = np.array([[0.25], [-0.5]], np.float32)
  got = evaluate.run(_constant_params(config, actions, 3), config, "pendulum", 1, seed=0,
                     max_episode_steps=10)
  start_seeds = evaluate.env_seeds(0, 2, 1)
  for s in range(2):
    want, _ = _manual_return("Pendulum-v1", start_seeds[s, 0], 2.0 * actions[s], 10)
    np.testing.assert_allclose(got[s, 0], want, rtol=1e-5)


def test_bad_inputs(config):
  params = _random_params(config, num_seeds=2)
  single = jax.tree.map(lambda x: x[0], params)
  with pytest.raises(ValueError, match="leading seed axis"):
    evaluate.run(single, config, "hopper", 1, 0, max_episode_steps=2)
  with pytest.raises(ValueError, match="episodes"):
    evaluate.run(params, config, "hopper", 0, 0)


def test_aulc():
  scores = np.array([[10.0, 20.0], [30.0, 40.0], [50.0, 0.0]])          # [T=3, S=2]
  np.testing.assert_allclose(evaluate.aulc(scores), [30.0, 20.0])
  np.testing.assert_allclose(evaluate.aulc(scores[:1]), [10.0, 20.0])
  with pytest.raises(ValueError, match=r"\[T, S\]"):
    evaluate.aulc(np.ones(3))
