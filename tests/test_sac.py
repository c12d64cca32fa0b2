"""SAC: state layout, one update's arithmetic, target rules, schedules, scan/vmap, and a learning
check on Pendulum-v1 that fails when SAC is broken."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mombo_jax.core import sac
from mombo_jax.core.buffer import Batch
from mombo_jax.core.critics import sample_tanh_gaussian
from mombo_jax.settings.config import make_config

OBS_DIM, ACT_DIM, B = 5, 2, 16


def _batch(seed=0, obs_var_scale=0.0, done=None):
  rng = np.random.default_rng(seed)
  obs = rng.normal(size=(B, OBS_DIM)).astype(np.float32)
  next_obs = rng.normal(size=(B, OBS_DIM)).astype(np.float32)
  reward = rng.normal(size=B).astype(np.float32)
  done = np.zeros(B, np.float32) if done is None else np.asarray(done, np.float32)
  obs_var = (obs_var_scale * rng.uniform(size=(B, OBS_DIM))).astype(np.float32)
  action = rng.uniform(-1, 1, (B, ACT_DIM)).astype(np.float32)
  return Batch(obs=jnp.asarray(obs), action=jnp.asarray(action),
               reward=jnp.asarray(reward), next_obs=jnp.asarray(next_obs), done=jnp.asarray(done),
               obs_var=jnp.asarray(obs_var), next_obs_mean=jnp.asarray(next_obs),
               next_obs_var=jnp.zeros_like(next_obs), reward_mean=jnp.asarray(reward),
               reward_var=jnp.zeros_like(reward))


@pytest.fixture(scope="module")
def cfg():
  return make_config("hopper-random", "mombo", preset="tiny", actor_hidden=(16, 16),
                     critic_hidden=(16, 16))


@pytest.fixture(scope="module")
def agent(cfg):
  # total_steps=2: the third update runs at actor lr 0 (cosine schedule test).
  return sac.init_agent(jax.random.key(0), OBS_DIM, ACT_DIM, cfg, total_steps=2)


@functools.lru_cache(maxsize=None)
def target_fn(config):
  """One target function object per config, so jit's cache (keyed on it) is shared by tests."""
  return functools.partial(sac.soft_target, config=config)


_update = jax.jit(sac.update, static_argnames=("target_fn", "config"))


def update(agent, batch, key, config):
  return _update(agent, batch, key, target_fn(config), config)


def _leaves(tree):
  return jax.tree_util.tree_leaves(tree)


def test_init_layout(agent, cfg):
  for leaf in _leaves((agent.actor.params, agent.critic.params, agent.target_critic_params)):
    assert leaf.dtype == jnp.float32
  assert agent.log_alpha.params["log_alpha"].shape == ()
  assert float(agent.log_alpha.params["log_alpha"]) == cfg.agent.log_alpha_init
  assert agent.actor.step.dtype == jnp.int32
  for a, b in zip(_leaves(agent.critic.params), _leaves(agent.target_critic_params)):
    np.testing.assert_array_equal(a, b)
  # The critic ensemble has a leading member axis of size num_critics.
  kernel = agent.critic.params["params"]["members"]["MMDense_0"]["kernel"]
  assert kernel.shape == (cfg.agent.num_critics, OBS_DIM + ACT_DIM, 16)
  with pytest.raises(ValueError, match="total_steps"):
    sac.init_agent(jax.random.key(1), OBS_DIM, ACT_DIM, cfg, total_steps=0)


def test_alpha(agent, cfg):
  assert float(sac.alpha(agent, cfg)) == pytest.approx(np.exp(cfg.agent.log_alpha_init))
  fixed = cfg.replace(auto_alpha=False, alpha=0.2)
  assert float(sac.alpha(agent, fixed)) == pytest.approx(0.2)
  assert sac.target_entropy(cfg, ACT_DIM) == -ACT_DIM
  assert sac.target_entropy(cfg.replace(target_entropy=-0.5), ACT_DIM) == -0.5


def test_alpha_is_capped_like_the_references(agent, cfg):
  """alpha = min(exp(log_alpha), alpha_max) (the references clamp at 1); log_alpha itself and its
  gradient step are untouched by the cap."""
  big = agent.replace(log_alpha=agent.log_alpha.replace(
      params={"log_alpha": jnp.asarray(2.0, jnp.float32)}))
  assert cfg.agent.alpha_max == 1.0
  assert float(sac.alpha(big, cfg)) == 1.0
  assert float(sac.alpha(big, cfg.replace(alpha_max=None))) == pytest.approx(
      np.exp(2.0), rel=1e-6)
  assert float(sac.alpha(big, cfg.replace(alpha_max=3.0))) == pytest.approx(3.0)
  small = agent.replace(log_alpha=agent.log_alpha.replace(
      params={"log_alpha": jnp.asarray(-1.0, jnp.float32)}))
  assert float(sac.alpha(small, cfg)) == pytest.approx(np.exp(-1.0), rel=1e-6)
  new, metrics = update(big, _batch(3), jax.random.key(3), cfg)
  assert float(metrics["alpha"]) == 1.0
  # The alpha loss still moves log_alpha from 2.0 (Adam's first step is ~lr in size).
  assert float(new.log_alpha.params["log_alpha"]) != 2.0
  assert abs(float(new.log_alpha.params["log_alpha"]) - 2.0) < 2 * cfg.agent.alpha_lr


def _expected_soft_target(agent, batch, key, config):
  mean, log_std = agent.actor.apply_fn(agent.actor.params, batch.next_obs)
  a, logp = sample_tanh_gaussian(mean, log_std, key)
  q = agent.critic.apply_fn(agent.target_critic_params, batch.next_obs, a).min(0)
  if not config.agent.deterministic_backup:
    q = q - sac.alpha(agent, config) * logp
  return batch.reward + config.agent.gamma * (1 - batch.done) * q


def test_soft_target(agent, cfg):
  """The formula with and without the entropy term, terminals, and the clamp only when asked."""
  det = cfg.replace(deterministic_backup=True, clip_target_min=None)
  soft = cfg.replace(deterministic_backup=False, clip_target_min=None)
  clamp = cfg.replace(clip_target_min=0.0)
  done = np.zeros(B)
  done[:4] = 1.0
  batch = _batch(1, done=done)
  low = batch.replace(reward=jnp.full((B,), -50.0))

  @jax.jit
  def run(agent, batch, low, key):
    out = {}
    for name, config in (("det", det), ("soft", soft)):
      out[name], aux = sac.soft_target(agent, batch, key, config)
      out[name + "_expected"] = _expected_soft_target(agent, batch, key, config)
      out[name + "_aux"] = aux
    out["low"], _ = sac.soft_target(agent, low, key, det)
    out["low_clamped"], _ = sac.soft_target(agent, low, key, clamp)
    return out

  out = run(agent, batch, low, jax.random.key(3))
  for name in ("det", "soft"):
    y = out[name]
    assert y.shape == (B,) and y.dtype == jnp.float32
    np.testing.assert_allclose(y, out[name + "_expected"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(y[:4], batch.reward[:4], rtol=1e-6)  # terminal: no bootstrap
    assert set(out[name + "_aux"]) == {"next_q_mean"}
  assert not np.allclose(out["det"][4:], out["soft"][4:])  # the entropy term matters
  assert float(out["low"].max()) < 0.0  # clip_target_min=None: no clamp
  np.testing.assert_array_equal(out["low_clamped"], jnp.zeros(B))


def test_update_one_step(agent, cfg):
  batch = _batch(5)
  new, metrics = update(agent, batch, jax.random.key(6), cfg)
  for name in ("critic_loss", "actor_loss", "alpha_loss", "alpha", "q_mean", "target_mean",
               "entropy", "next_q_mean"):
    assert metrics[name].shape == () and metrics[name].dtype == jnp.float32, name
    assert np.isfinite(metrics[name]), name
  assert int(new.actor.step) == int(new.critic.step) == int(new.log_alpha.step) == 1
  # Critic loss is the sum over members of the MSE to y, with y recomputed by target_fn.
  k_target, _ = jax.random.split(jax.random.key(6))
  y, _ = jax.jit(target_fn(cfg))(agent, batch, k_target)
  q = agent.critic.apply_fn(agent.critic.params, batch.obs, batch.action)
  np.testing.assert_allclose(metrics["critic_loss"], jnp.sum(jnp.mean((q - y) ** 2, axis=1)),
                             rtol=1e-5)
  np.testing.assert_allclose(metrics["target_mean"], y.mean(), rtol=1e-5)
  # Polyak: target' = (1 - tau) target + tau critic'.
  for t_old, c_new, t_new in zip(_leaves(agent.target_critic_params), _leaves(new.critic.params),
                                 _leaves(new.target_critic_params)):
    tau = cfg.agent.tau
    np.testing.assert_allclose(t_new, (1 - tau) * t_old + tau * c_new, rtol=1e-5, atol=1e-7)
  for old, fresh in zip(_leaves(agent.actor.params), _leaves(new.actor.params)):
    assert not np.array_equal(old, fresh)
  # Temperature: loss -log_alpha * mean(logp + H*) has gradient entropy - H*, so Adam's first
  # step moves log_alpha by about alpha_lr against that sign (up when the policy's entropy is
  # below the target, down when above).
  delta = float(new.log_alpha.params["log_alpha"] - agent.log_alpha.params["log_alpha"])
  gap = float(metrics["entropy"]) - sac.target_entropy(cfg, ACT_DIM)
  assert np.sign(delta) == -np.sign(gap)
  assert abs(delta) == pytest.approx(cfg.agent.alpha_lr, rel=1e-2)
  assert float(metrics["alpha_loss"]) == 0.0  # log_alpha starts at 0


def test_update_steps_the_pure_losses(agent, cfg):
  """sac.update is the three pure losses (critic_loss, actor_loss, alpha_loss), each stepped by its
  own optimiser in the references' order: its metrics are the losses' values, its parameters
  their gradient steps."""
  batch, key = _batch(7), jax.random.key(8)
  new, metrics = update(agent, batch, key, cfg)
  k_target, k_actor = jax.random.split(key)

  @jax.jit
  def by_hand(agent, batch):
    y, _ = target_fn(cfg)(agent, batch, k_target)
    (q_loss, _), grads = jax.value_and_grad(sac.critic_loss, has_aux=True)(
        agent.critic.params, agent, batch, y)
    critic = agent.critic.apply_gradients(grads=grads)
    (pi_loss, logp), grads = jax.value_and_grad(sac.actor_loss, has_aux=True)(
        agent.actor.params, agent, critic.params, batch, k_actor, sac.alpha(agent, cfg), cfg)
    actor = agent.actor.apply_gradients(grads=grads)
    a_loss, grads = jax.value_and_grad(sac.alpha_loss)(agent.log_alpha.params, logp,
                                                       sac.target_entropy(cfg, ACT_DIM))
    log_alpha = agent.log_alpha.apply_gradients(grads=grads)
    return (q_loss, pi_loss, a_loss), (critic.params, actor.params, log_alpha.params)

  losses, params = by_hand(agent, batch)
  for name, value in zip(("critic_loss", "actor_loss", "alpha_loss"), losses):
    np.testing.assert_allclose(metrics[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
  for want, got in zip(_leaves(params), _leaves((new.critic.params, new.actor.params,
                                                new.log_alpha.params))):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_plain_critic_fixed_alpha_and_mombo_variance(agent, cfg):
  """Fixed alpha is not learned. With zero state variance MOMBO's actor step equals the plain
  critic's bit for bit; with variance it differs (the MM mean of a ReLU net is not the net at the
  mean), while the plain actor ignores obs_var."""
  # alpha = exp(log_alpha_init) keeps both actor losses comparable.
  plain = cfg.replace(algo="mobile", auto_alpha=False, alpha=1.0)
  key = jax.random.key(11)
  zero_var, with_var = _batch(12), _batch(12, obs_var_scale=4.0)
  new, plain_zero = update(agent, zero_var, key, plain)
  assert float(plain_zero["alpha"]) == 1.0
  assert float(new.log_alpha.params["log_alpha"]) == float(agent.log_alpha.params["log_alpha"])
  _, mombo_zero = update(agent, zero_var, key, cfg)
  _, plain_var = update(agent, with_var, key, plain)
  _, mombo_var = update(agent, with_var, key, cfg)
  assert float(mombo_zero["actor_loss"]) == float(plain_zero["actor_loss"])
  assert float(plain_var["actor_loss"]) == float(plain_zero["actor_loss"])
  assert float(mombo_var["actor_loss"]) != float(plain_var["actor_loss"])


def test_actor_cosine_schedule_reaches_zero(agent, cfg):
  new = agent
  for i in range(2):  # total_steps=2
    new, _ = update(new, _batch(i), jax.random.key(i), cfg)
  after, _ = update(new, _batch(3), jax.random.key(3), cfg)
  for a, b in zip(_leaves(new.actor.params), _leaves(after.actor.params)):
    np.testing.assert_array_equal(a, b)  # lr annealed to 0
  assert any(not np.array_equal(a, b) for a, b in zip(_leaves(new.critic.params),
                                                      _leaves(after.critic.params)))
  schedule = sac.actor_lr_schedule(cfg, 10)
  assert float(schedule(0)) == pytest.approx(cfg.agent.actor_lr)
  assert float(schedule(5)) == pytest.approx(cfg.agent.actor_lr / 2)
  assert float(schedule(10)) == 0.0
  constant = cfg.replace(actor_cosine_schedule=False)
  assert sac.actor_lr_schedule(constant, 10) == cfg.agent.actor_lr


def test_scan_and_seed_vmap_match_sequential_updates(agent, cfg):
  """make_scan_update runs T updates as one lax.scan; vmapped over a leading seed axis (the
  agent pytree stacks as it is) each seed equals T sequential updates with its own key."""
  steps, seeds = 3, 2
  batches = [_batch(20 + i) for i in range(steps)]
  stacked = jax.tree_util.tree_map(lambda *x: jnp.stack(x), *batches)
  keys = jax.random.split(jax.random.key(13), seeds)
  agents = jax.tree_util.tree_map(lambda x: jnp.stack([x] * seeds), agent)
  scan_update = sac.make_scan_update(cfg, target_fn(cfg))
  scanned, metrics = jax.jit(jax.vmap(scan_update, in_axes=(0, None, 0)))(agents, stacked, keys)
  assert metrics["critic_loss"].shape == (seeds, steps)
  assert scanned.actor.step.shape == (seeds,) and int(scanned.actor.step[0]) == steps
  for seed in range(seeds):
    seq = agent
    for batch, k in zip(batches, jax.random.split(keys[seed], steps)):
      seq, _ = update(seq, batch, k, cfg)
    for a, b in zip(_leaves(jax.tree_util.tree_map(lambda x: x[seed], scanned)), _leaves(seq)):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
  assert not np.allclose(metrics["actor_loss"][0], metrics["actor_loss"][1])


def test_policy_sample_and_mode(agent, cfg):
  obs = _batch(40).obs

  @jax.jit
  def run(agent, obs):
    k1, k2 = jax.random.key(1), jax.random.key(2)
    return dict(
        a1=sac.policy_sample(agent, obs, k1, cfg),
        a2=sac.policy_sample(agent.actor.params, obs, k1, cfg),
        a3=sac.policy_sample(agent, obs, k2, cfg),
        m1=sac.policy_mode(agent, obs, cfg), m2=sac.policy_mode(agent.actor.params, obs, cfg),
        nested=sac.policy_sample(agent, obs.reshape(2, B // 2, OBS_DIM), k1, cfg))

  out = run(agent, obs)
  assert out["a1"].shape == (B, ACT_DIM) and out["a1"].dtype == jnp.float32
  np.testing.assert_array_equal(out["a1"], out["a2"])
  assert float(jnp.abs(out["a1"]).max()) <= 1.0
  assert not np.array_equal(out["a1"], out["a3"])
  np.testing.assert_array_equal(out["m1"], out["m2"])
  # Leading batch axes pass through (rollouts of several start states per seed).
  assert out["nested"].shape == (2, B // 2, ACT_DIM)


def test_update_rejects_bad_batch_shapes(agent, cfg):
  bad = _batch(0).replace(reward=jnp.zeros((B, 1)))
  with pytest.raises(AssertionError):
    update(agent, bad, jax.random.key(0), cfg)


# --------------------------------------------------------------------------- learning check

PENDULUM_STEPS = 8000
PENDULUM_EVAL_EVERY = 1000
# Uniform random actions score about -1200 on Pendulum-v1 and a SAC whose actor climbs -Q stays
# below -1500. A working SAC with these settings (gradient steps in the collector's default chunks
# of 1000) swings up between 3000 and 6000 steps, and its evaluations at 7000 and 8000 steps lay
# between -300 and -120 for seeds 0-3 (measured 2026-11-22). A single evaluation at 5000 steps
# (this test's former criterion) ranged from -1356 to -165 over seeds: too early to judge.
PENDULUM_PASS = -500.0


def pendulum_config():
  """Small fast SAC for Pendulum: 64x64 nets, lr 1e-3, soft backup, no clamp, constant lr."""
  import dataclasses

  from mombo_jax.collection.online_sac import ONLINE_AGENT, OnlineSettings
  agent = dataclasses.replace(ONLINE_AGENT, actor_lr=1e-3, critic_lr=1e-3, alpha_lr=1e-3,
                              actor_hidden=(64, 64), critic_hidden=(64, 64), batch_size=128)
  return OnlineSettings("pendulum", agent=agent)


def run_pendulum(seed=0):
  import gymnasium as gym

  from mombo_jax.collection import sac_run
  schedule = sac_run.SacSchedule(PENDULUM_STEPS, start_steps=500,
                                    eval_every=PENDULUM_EVAL_EVERY, eval_episodes=3, seed=seed,
                                    log_every=PENDULUM_STEPS)
  result = sac_run.train_sac(lambda: gym.make("Pendulum-v1"), pendulum_config(), schedule,
                                log_fn=lambda *_: None)
  return [r for _, r in result.evals]


@pytest.mark.slow
def test_sac_learns_pendulum():
  """Online SAC (mombo_jax.collection.online_sac, the loop the collector builds datasets with)
  swings the pendulum up. Fails when the actor ascends -Q (checked by hand: about -1900), when the
  critic target or the tanh action mapping is wrong, or when updates do not happen."""
  returns = run_pendulum()
  assert len(returns) == PENDULUM_STEPS // PENDULUM_EVAL_EVERY
  final = float(np.mean(returns[-2:]))
  assert final > PENDULUM_PASS, (
      f"SAC did not learn Pendulum-v1: mean of the last two evaluations {final:.0f} "
      f"(all: {[round(r) for r in returns]})")
