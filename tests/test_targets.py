"""Each Bellman target pinned against a straightforward numpy (float64) re-computation.

The random draws (policy actions, MOBILE's next-state samples) are reproduced by splitting the key
exactly as the target does; everything else — the moment-matched critic, the min over critics,
the elite statistics — is recomputed independently in numpy/scipy.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.stats import norm

from mombo_jax.core import buffer, dynamics, sac, targets, termination
from mombo_jax.settings import config as config_lib
from tests.test_lowrank_moments import np_lowrank

B, S, A = 16, 5, 2
RTOL, ATOL = 2e-4, 2e-4


@pytest.fixture(scope="module")
def cfg():
  return config_lib.make_config("hopper-random", "mombo", preset="tiny", real_ratio=0.25,
                                beta=0.7, clip_target_min=None)


@pytest.fixture(scope="module")
def agent(cfg):
  return sac.init_agent(jax.random.PRNGKey(0), S, A, cfg, total_steps=10)


@pytest.fixture(scope="module")
def dyn(cfg):
  dyn = dynamics.init_state(jax.random.PRNGKey(1), S, A, cfg)
  # Elites out of member order, to catch a target that ignores dyn.elites.
  shape = cfg.dynamics
  elites = jnp.arange(shape.dyn_members - 1, shape.dyn_members - 1 - shape.dyn_elites, -1,
                      dtype=jnp.int32)
  return dyn.replace(input_mean=jnp.full((S + A,), 0.1), input_std=jnp.full((S + A,), 1.5),
                     elites=elites)


@pytest.fixture(scope="module")
def batch():
  rng = np.random.default_rng(0)
  f = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)  # noqa: E731
  v = lambda *shape: jnp.asarray(rng.uniform(0.0, 0.5, size=shape), jnp.float32)  # noqa: E731
  done = jnp.asarray(rng.uniform(size=B) < 0.3, jnp.float32)
  return buffer.Batch(obs=f(B, S), action=jnp.tanh(f(B, A)), reward=f(B), next_obs=f(B, S),
                      done=done, obs_var=v(B, S), next_obs_mean=f(B, S), next_obs_var=v(B, S),
                      reward_mean=f(B), reward_var=v(B))


def _layers(critic_params, member):
  p = critic_params["params"]["members"]
  names = sorted(p, key=lambda n: int(n.split("_")[1]))
  return [(np.asarray(p[n]["kernel"][member], np.float64),
           np.asarray(p[n]["bias"][member], np.float64))
          for n in names]


def np_critic_mm(critic_params, obs, action, obs_var, member):
  """Textbook moment matching in float64: (mean, var) [...]."""
  x = np.concatenate([obs, action], -1).astype(np.float64)
  v = np.concatenate([obs_var, np.zeros_like(action)], -1).astype(np.float64)
  layers = _layers(critic_params, member)
  for i, (w, b) in enumerate(layers):
    x, v = x @ w + b, v @ (w * w)
    if i < len(layers) - 1:
      s = np.sqrt(np.maximum(v, 1e-300))
      a = x / s
      m = x * norm.cdf(a) + s * norm.pdf(a)
      v = np.where(v > 0, (x**2 + v) * norm.cdf(a) + x * s * norm.pdf(a) - m**2, 0.0)
      x = np.where(v > 0, m, np.maximum(x, 0))
  return x[..., 0], v[..., 0]


def np_critic(critic_params, obs, action, member):
  x = np.concatenate([obs, action], -1).astype(np.float64)
  layers = _layers(critic_params, member)
  for i, (w, b) in enumerate(layers):
    x = x @ w + b
    if i < len(layers) - 1:
      x = np.maximum(x, 0)
  return x[..., 0]


def np_min_q(agent, obs, action):
  p = agent.target_critic_params
  return np.minimum(np_critic(p, obs, action, 0), np_critic(p, obs, action, 1))


def test_lcb(cfg, agent, batch):
  key = jax.random.PRNGKey(3)
  y, _ = targets.mombo_lcb(agent, batch, key, dyn=None, config=cfg, term_fn=None)
  a = np.asarray(sac.policy_sample(agent, batch.next_obs_mean, key, cfg))
  p, nb = agent.target_critic_params, jax.tree.map(np.asarray, batch)
  moments = [np_critic_mm(p, nb.next_obs_mean, a, nb.next_obs_var, j) for j in range(2)]
  j = np.argmin([moments[0][0], moments[1][0]], axis=0)
  m = np.where(j == 0, moments[0][0], moments[1][0])
  v = np.where(j == 0, moments[0][1], moments[1][1])
  g, nd = cfg.agent.gamma, 1 - nb.done
  expected = nb.reward_mean + g * nd * m - cfg.beta * np.sqrt(nb.reward_var + g**2 * nd * v)
  np.testing.assert_allclose(np.asarray(y), expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("moments", ["diagonal", "lowrank", "lowrank2"])
def test_lcb_zero_variance_is_plain_backup(cfg, agent, batch, moments):
  """Real rows (zero variances) get exactly r + g (1-d) min_j Q'(s', a'), in every moment mode."""
  cfg = cfg.replace(moments=moments)
  real = batch.replace(next_obs_var=jnp.zeros_like(batch.next_obs_var),
                       reward_var=jnp.zeros_like(batch.reward_var), next_obs_mean=batch.next_obs,
                       reward_mean=batch.reward)
  key = jax.random.PRNGKey(4)
  y, _ = targets.mombo_lcb(agent, real, key, dyn=None, config=cfg, term_fn=None)
  y_plain = targets._plain_target(agent, real, key, cfg)
  np.testing.assert_array_equal(np.asarray(y), np.asarray(y_plain))


@pytest.mark.parametrize("moments, rank", [("lowrank", None), ("lowrank2", 2)])
def test_lcb_lowrank(cfg, agent, batch, moments, rank):
  """--moments=lowrank[k]: lcb's critic moments are the low-rank recursion's (float64 re-derivation
  in tests/test_lowrank_moments.py)."""
  key = jax.random.PRNGKey(3)
  y, _ = targets.mombo_lcb(agent, batch, key, dyn=None, config=cfg.replace(moments=moments),
                           term_fn=None)
  a = np.asarray(sac.policy_sample(agent, batch.next_obs_mean, key, cfg))
  p, nb = agent.target_critic_params, jax.tree.map(np.asarray, batch)
  x = np.concatenate([nb.next_obs_mean, a], -1)
  moments = [np_lowrank(_layers(p, j), x, nb.next_obs_var, rank) for j in range(2)]
  j = np.argmin([moments[0][0][:, 0], moments[1][0][:, 0]], axis=0)
  m = np.where(j == 0, moments[0][0][:, 0], moments[1][0][:, 0])
  v = np.where(j == 0, moments[0][1][:, 0], moments[1][1][:, 0])
  g, nd = cfg.agent.gamma, 1 - nb.done
  expected = nb.reward_mean + g * nd * m - cfg.beta * np.sqrt(nb.reward_var + g**2 * nd * v)
  np.testing.assert_allclose(np.asarray(y), expected, rtol=RTOL, atol=ATOL)
  y_diag, _ = targets.mombo_lcb(agent, batch, key, dyn=None, config=cfg, term_fn=None)
  assert np.max(np.abs(np.asarray(y) - np.asarray(y_diag))) > 10 * ATOL     # not the diagonal


def test_clamp(cfg, agent, batch):
  clamped = cfg.replace(clip_target_min=0.0)
  key = jax.random.PRNGKey(3)
  y, _ = targets.mombo_lcb(agent, batch, key, dyn=None, config=cfg, term_fn=None)
  yc, _ = targets.mombo_lcb(agent, batch, key, dyn=None, config=clamped, term_fn=None)
  assert np.any(np.asarray(y) < 0)
  np.testing.assert_array_equal(np.asarray(yc), np.maximum(np.asarray(y), 0.0))


def test_mopo_soft_target(cfg, agent, batch):
  mopo_cfg = config_lib.make_config("hopper-random", "mopo", preset="tiny")
  key = jax.random.PRNGKey(5)
  y, _ = targets.get_target(mopo_cfg)(agent, batch, key, dyn=None, config=mopo_cfg, term_fn=None)
  mean, log_std = agent.actor.apply_fn(agent.actor.params, batch.next_obs)
  from mombo_jax.core.critics import sample_tanh_gaussian
  a, logp = map(np.asarray, sample_tanh_gaussian(mean, log_std, key))
  nb = jax.tree.map(np.asarray, batch)
  alpha = np.exp(mopo_cfg.agent.log_alpha_init)
  expected = nb.reward + mopo_cfg.agent.gamma * (1 - nb.done) * (np_min_q(agent, nb.next_obs, a)
                                                          - alpha * logp)
  np.testing.assert_allclose(np.asarray(y), expected, rtol=RTOL, atol=ATOL)


def _np_elites(dyn, batch, cfg, term_fn):
  s_mean, s_var, r_mean, r_var = map(np.asarray,
                                     dynamics.predict(dyn, batch.obs, batch.action, cfg))
  e = np.asarray(dyn.elites)
  s_mean, s_var, r_mean, r_var = s_mean[e], s_var[e], r_mean[e], r_var[e]
  done = np.stack([np.asarray(term_fn(batch.obs, batch.action, jnp.asarray(s))) for s in s_mean])
  # The references' runaway bound on each elite's next-state mean (adinlab/MOMBO
  # utils/termination_fns.py, used by its per-elite targets).
  if cfg.rollout.rollout_obs_limit is not None:
    done = done | np.any(np.abs(s_mean) >= cfg.rollout.rollout_obs_limit, axis=-1)
  return s_mean, s_var, r_mean, r_var, done.astype(np.float64)


def _np_per_elite(agent, batch, key, dyn, cfg, term_fn, alpha=None):
  """Per-elite targets T_e and their MM variances [E, B]. alpha: a soft backup's temperature (None:
  the deterministic backup): elite e's next value gains the bonus -alpha log pi(a'_e|s'_e), a'_e
  drawn with the elite's key (the critic picked by the smaller MM mean, which the bonus, the
  same for both critics, leaves as it is)."""
  s_mean, s_var, r_mean, r_var, done = _np_elites(dyn, batch, cfg, term_fn)
  keys = jax.random.split(key, s_mean.shape[0])
  p = agent.target_critic_params
  t, tv = [], []
  for e in range(s_mean.shape[0]):
    a = np.asarray(sac.policy_sample(agent, jnp.asarray(s_mean[e]), keys[e], cfg))
    mom = [np_critic_mm(p, s_mean[e], a, s_var[e], j) for j in range(2)]
    pick = np.argmin([mom[0][0], mom[1][0]], axis=0)
    m = np.where(pick == 0, mom[0][0], mom[1][0])
    v = np.where(pick == 0, mom[0][1], mom[1][1])
    if alpha is not None:
      m = m - alpha * _logp(agent, jnp.asarray(s_mean[e]), keys[e], cfg)
    t.append(r_mean[e] + cfg.agent.gamma * (1 - done[e]) * m)
    tv.append(r_var[e] + cfg.agent.gamma**2 * (1 - done[e]) * v)
  return np.array(t), np.array(tv)


def _np_plain(agent, batch, key, cfg, alpha=None):
  """r + g (1-d) min_j Q'(s', a') [B] (alpha: minus alpha log pi(a'|s') in the next value)."""
  a = np.asarray(sac.policy_sample(agent, batch.next_obs, key, cfg))
  nb = jax.tree.map(np.asarray, batch)
  value = np_min_q(agent, nb.next_obs, a)
  if alpha is not None:
    value = value - alpha * _logp(agent, batch.next_obs, key, cfg)
  return nb.reward + cfg.agent.gamma * (1 - nb.done) * value


def _np_elite_target(agent, batch, key, dyn, cfg, term_fn, mode, alpha=None):
  """MOMBO elite_spread / mixture's target [B] in float64: the plain backup on the leading real
  rows, the elites' mean minus beta times their spread on model rows (alpha: a soft backup)."""
  k_model, k_real = jax.random.split(key)
  t, tv = _np_per_elite(agent, batch, k_model, dyn, cfg, term_fn, alpha)
  if mode == "elite_spread":
    model_y = t.mean(0) - cfg.beta * t.std(0, ddof=1)
  else:
    model_y = t.mean(0) - cfg.beta * np.sqrt(tv.mean(0) + t.var(0))
  n_real = int(B * cfg.rollout.real_ratio)
  return np.concatenate([_np_plain(agent, batch, k_real, cfg, alpha)[:n_real], model_y[n_real:]])


@pytest.mark.parametrize("mode", ["elite_spread", "mixture"])
def test_mombo_elite_modes(cfg, agent, batch, dyn, mode):
  term_fn = termination.termination_fn("hopper")
  key = jax.random.PRNGKey(6)
  y, _ = targets.get_target(cfg.replace(target=mode))(
      agent, batch, key, dyn=dyn, config=cfg, term_fn=term_fn)
  expected = _np_elite_target(agent, batch, key, dyn, cfg, term_fn, mode)
  np.testing.assert_allclose(np.asarray(y), expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("mode", ["elite_spread", "mixture"])
def test_runaway_elite_prediction_is_terminal_in_the_targets(cfg, agent, batch, dyn, mode):
  """An elite whose next-state mean has some |x| >= config.rollout.rollout_obs_limit (100)
  bootstraps nothing in MOMBO's per-elite targets, as a rollout ends such a branch; halfcheetah's
  termination function alone never ends a finite state, so the bound is what decides here."""
  term_fn = termination.termination_fn("halfcheetah")
  obs = np.asarray(batch.obs).copy()
  runaway = np.arange(8, B, 2)                         # model rows only (the first 4 are real)
  obs[runaway, 0] = 1e3                                # next-state mean ~ obs + a small delta
  far = batch.replace(obs=jnp.asarray(obs))
  s_mean, _, r_mean, r_var, done = _np_elites(dyn, far, cfg, term_fn)
  assert np.all(np.abs(s_mean[:, runaway, 0]) >= 100), "the premise: every elite runs away there"
  assert np.all(done[:, runaway] == 1) and not np.any(done[:, np.setdiff1d(np.arange(B), runaway)])
  mode_cfg = cfg.replace(target=mode)
  key = jax.random.PRNGKey(6)
  y = np.asarray(targets.get_target(mode_cfg)(agent, far, key, dyn=dyn, config=mode_cfg,
                                              term_fn=term_fn)[0])
  k_model, k_real = jax.random.split(key)
  t, tv = _np_per_elite(agent, far, k_model, dyn, cfg, term_fn)
  if mode == "elite_spread":
    model_y = t.mean(0) - cfg.beta * t.std(0, ddof=1)
  else:
    model_y = t.mean(0) - cfg.beta * np.sqrt(tv.mean(0) + t.var(0))
  n_real = int(B * cfg.rollout.real_ratio)
  expected = np.concatenate([_np_plain(agent, far, k_real, cfg)[:n_real], model_y[n_real:]])
  np.testing.assert_allclose(y, expected, rtol=RTOL, atol=ATOL)
  # There the target is the elites' rewards alone: no next value, no next-value variance.
  r, rv = r_mean[:, runaway].astype(np.float64), r_var[:, runaway].astype(np.float64)
  alone = (r.mean(0) - cfg.beta * r.std(0, ddof=1) if mode == "elite_spread" else
           r.mean(0) - cfg.beta * np.sqrt(rv.mean(0) + r.var(0)))
  np.testing.assert_allclose(y[runaway], alone, rtol=RTOL, atol=ATOL)
  # Without the bound those rows bootstrap (the check has teeth).
  loose = mode_cfg.replace(rollout_obs_limit=None)
  y_loose = np.asarray(targets.get_target(loose)(agent, far, key, dyn=dyn, config=loose,
                                                 term_fn=term_fn)[0])
  assert np.all(np.abs(y_loose[runaway] - y[runaway]) > 1e-4)
  np.testing.assert_allclose(np.delete(y_loose, runaway), np.delete(y, runaway), rtol=1e-6,
                             atol=1e-6)


def test_mobile(cfg, agent, batch, dyn):
  mob = config_lib.make_config("hopper-random", "mobile", preset="tiny", real_ratio=0.25, beta=0.7,
                               clip_target_min=None, mobile_num_samples=3)
  key = jax.random.PRNGKey(7)
  y, _ = targets.mobile(agent, batch, key, dyn=dyn, config=mob, term_fn=None)
  k_noise, k_pi, k_next = jax.random.split(key, 3)
  s_mean, s_var, _, _ = map(np.asarray, dynamics.predict(dyn, batch.obs, batch.action, mob))
  e = np.asarray(dyn.elites)
  s_mean, s_std = s_mean[e], np.sqrt(s_var[e])
  eps = np.asarray(jax.random.normal(k_noise, (mob.agent.mobile_num_samples,) + s_mean.shape))
  samples = s_mean + s_std * eps
  a = np.asarray(sac.policy_sample(agent, jnp.asarray(samples, jnp.float32), k_pi, mob))
  q = np_min_q(agent, samples, a)                                    # [N, E, B]
  penalty = q.mean(0).std(0, ddof=1)
  penalty[: int(B * mob.rollout.real_ratio)] = 0.0
  nb = jax.tree.map(np.asarray, batch)
  a_next = np.asarray(sac.policy_sample(agent, batch.next_obs, k_next, mob))
  expected = (nb.reward - mob.beta * penalty
              + mob.agent.gamma * (1 - nb.done) * np_min_q(agent, nb.next_obs, a_next))
  np.testing.assert_allclose(np.asarray(y), expected, rtol=RTOL, atol=ATOL)


def _logp(agent, obs, key, cfg):
  from mombo_jax.core.critics import sample_tanh_gaussian
  mean, log_std = agent.actor.apply_fn(agent.actor.params, obs)
  return np.asarray(sample_tanh_gaussian(mean, log_std, key)[1], np.float64)


def test_soft_backup_is_honoured_by_mombo_and_mobile(cfg, agent, batch, dyn):
  """deterministic_backup=False adds -alpha log pi(a'|s') to the next value; the penalties (MOMBO's
  std, MOBILE's spread) are unchanged by it."""
  nb = jax.tree.map(np.asarray, batch)
  alpha = float(sac.alpha(agent, cfg))
  key = jax.random.PRNGKey(3)
  soft = cfg.replace(deterministic_backup=False)
  y_det, _ = targets.mombo_lcb(agent, batch, key, dyn=None, config=cfg, term_fn=None)
  y_soft, _ = targets.mombo_lcb(agent, batch, key, dyn=None, config=soft, term_fn=None)
  bonus = -alpha * _logp(agent, batch.next_obs_mean, key, cfg)
  np.testing.assert_allclose(np.asarray(y_soft) - np.asarray(y_det),
                             cfg.agent.gamma * (1 - nb.done) * bonus, rtol=1e-3, atol=1e-3)
  assert np.any(np.abs(bonus[nb.done == 0]) > 1e-2)   # the check has teeth

  mob = config_lib.make_config("hopper-random", "mobile", preset="tiny", real_ratio=0.25, beta=0.7,
                               clip_target_min=None, mobile_num_samples=3)
  key = jax.random.PRNGKey(7)
  y_det, _ = targets.mobile(agent, batch, key, dyn=dyn, config=mob, term_fn=None)
  y_soft, _ = targets.mobile(agent, batch, key, dyn=dyn,
                             config=mob.replace(deterministic_backup=False),
                             term_fn=None)
  k_next = jax.random.split(key, 3)[2]
  bonus = -alpha * _logp(agent, batch.next_obs, k_next, mob)
  np.testing.assert_allclose(np.asarray(y_soft) - np.asarray(y_det),
                             mob.agent.gamma * (1 - nb.done) * bonus, rtol=1e-3, atol=1e-3)

  # elite_spread / mixture: each elite's next value gains its own bonus, so the elites' spread
  # (the penalty) moves too; real rows gain the plain backup's. The soft target and what the
  # soft backup adds to the deterministic one, each against the float64 recomputation.
  # halfcheetah's termination ends no finite state: with hopper's, every elite's prediction at
  # these random states is terminal and bootstraps nothing, so no bonus would reach a model row.
  term_fn = termination.termination_fn("halfcheetah")
  for mode in ("elite_spread", "mixture"):
    det_cfg = cfg.replace(target=mode)
    y_det, _ = targets.get_target(det_cfg)(agent, batch, key, dyn=dyn, config=det_cfg,
                                           term_fn=term_fn)
    soft_cfg = det_cfg.replace(deterministic_backup=False)
    y_soft, _ = targets.get_target(soft_cfg)(agent, batch, key, dyn=dyn, config=soft_cfg,
                                             term_fn=term_fn)
    want_det = _np_elite_target(agent, batch, key, dyn, det_cfg, term_fn, mode)
    want_soft = _np_elite_target(agent, batch, key, dyn, soft_cfg, term_fn, mode, alpha)
    np.testing.assert_allclose(np.asarray(y_soft), want_soft, rtol=RTOL, atol=ATOL, err_msg=mode)
    bonus = want_soft - want_det
    np.testing.assert_allclose(np.asarray(y_soft) - np.asarray(y_det), bonus, rtol=1e-3,
                               atol=1e-3, err_msg=mode)
    n_real = int(B * cfg.rollout.real_ratio)
    for rows in (slice(0, n_real), slice(n_real, B)):     # the check has teeth on both kinds
      assert np.any(np.abs(bonus[rows]) > 1e-2), (mode, rows)


def test_nan_behind_a_terminal_never_reaches_the_target(cfg, agent, batch, dyn):
  """A terminal row whose next state is NaN bootstraps nothing: its target stays finite."""
  done = np.asarray(batch.done).copy()
  done[:4] = 1.0
  nan_rows = np.zeros((B, 1), bool)
  nan_rows[:4] = True
  poison = lambda x: jnp.where(jnp.asarray(nan_rows), jnp.nan, x)  # noqa: E731
  bad = batch.replace(done=jnp.asarray(done), next_obs=poison(batch.next_obs),
                      next_obs_mean=poison(batch.next_obs_mean),
                      next_obs_var=poison(batch.next_obs_var))
  key = jax.random.PRNGKey(8)
  mob = cfg.replace(algo="mobile", mobile_num_samples=3)
  mopo = config_lib.make_config("hopper-random", "mopo", preset="tiny")
  for config in (cfg, cfg.replace(deterministic_backup=False), mob, mopo):
    y, _ = targets.get_target(config)(agent, bad, key, dyn=dyn, config=config,
                                      term_fn=termination.termination_fn("hopper"))
    assert np.all(np.isfinite(np.asarray(y))), config.algo


# ------------------------------------------------------------------ the penalties (U) themselves

@pytest.mark.parametrize("algo, mode", [("mombo", "lcb"), ("mombo", "elite_spread"),
                                        ("mombo", "mixture"), ("mobile", None)])
def test_penalty_is_what_the_target_subtracts(cfg, agent, batch, dyn, algo, mode):
  """targets.get_penalty(config) with the target's key is exactly the per-row U its target
  subtracts times beta, on model rows (past the leading real rows): y(beta=0) - y(beta=1) = U."""
  config = (cfg.replace(target=mode) if algo == "mombo" else
            cfg.replace(algo="mobile", mobile_num_samples=3))
  term_fn = termination.termination_fn("hopper")
  key = jax.random.PRNGKey(11)
  target, penalty = targets.get_target(config), targets.get_penalty(config)
  y0, y1 = (np.asarray(target(agent, batch, key, dyn=dyn, config=config, term_fn=term_fn,
                              beta=b)[0], np.float64) for b in (0.0, 1.0))
  u = np.asarray(penalty(agent, batch, key, dyn=dyn, config=config, term_fn=term_fn))
  assert u.shape == (B,) and np.all(u > 0)
  n_real = 0 if mode == "lcb" else int(B * config.rollout.real_ratio)
  np.testing.assert_allclose(y0[n_real:] - y1[n_real:], u[n_real:], rtol=1e-5, atol=1e-5)
  # And it is the named function of that algorithm.
  named = {"lcb": targets.penalty_mombo_lcb, "elite_spread": targets.penalty_elite_spread,
           "mixture": targets.penalty_mixture, None: targets.penalty_mobile}[mode]
  assert penalty is named


def test_mopo_penalty_is_the_rollout_penalty(cfg, batch, dyn):
  """MOPO's U: max over ALL members (not only elites) of ||(sigma_s', sigma_r)||_2, the value
  rollout.run subtracts (times lambda) from the model reward: the same function of the Gaussians
  its model step predicted for every member (an EnsemblePenalty)."""
  mopo_cfg = config_lib.make_config("hopper-random", "mopo", preset="tiny")
  u = np.asarray(targets.get_penalty(mopo_cfg)(None, batch, jax.random.PRNGKey(0), dyn=dyn,
                                              config=mopo_cfg, term_fn=None))
  _, s_var, _, r_var = map(np.asarray, dynamics.predict(dyn, batch.obs, batch.action, mopo_cfg))
  # ||sigma||_2 = sqrt(sum of the variances) per member [M, B]; the max over all M members.
  norms = np.sqrt(np.concatenate([s_var, r_var[..., None]], -1).astype(np.float64).sum(-1))
  assert norms.shape[0] == mopo_cfg.dynamics.dyn_members
  np.testing.assert_allclose(u, norms.max(0), rtol=1e-5)
  step = dynamics.step(dyn, batch.obs, batch.action, jax.random.PRNGKey(1), mopo_cfg,
                       every_member=True)
  assert isinstance(targets.penalty_mopo, targets.EnsemblePenalty)
  np.testing.assert_allclose(u, np.asarray(targets.penalty_mopo.of_ensemble(step.ensemble)),
                             rtol=1e-6)
