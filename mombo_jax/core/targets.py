"""Bellman targets: one short pure function per algorithm, all with the same signature

    target(agent, batch, key, *, dyn, config, term_fn, beta=None, real_rows=None, auto_alpha=None)
      -> (y [B], aux {name: scalar})

picked once, outside jit, from the run's algorithms.Algorithm (`get_target(config)`). The per-cell
settings may be traced (the cells of one program may differ in them, train.Cell): beta (f32
scalar, default config.beta), real_rows (int32 scalar, the batch's leading real rows; default
int(B * config.rollout.real_ratio)) and auto_alpha (bool scalar, default config.agent.auto_alpha;
it picks the temperature of a soft backup, sac.alpha).
`train.py` binds dyn/config/term_fn and the cell's settings (`bind`) and hands `sac.update` a
`target_fn(agent, batch, key)`. get_target / get_penalty / bind are the one way to an Algorithm's
functions (a built-in Algorithm holds stand-ins: algorithms._Target).

Batches come from `buffer.sample_mixed`, which puts the n_real real rows first; `_real_rows`
relies on that to give real rows the plain, unpenalised target where a target recomputes
model predictions (elite_spread, mixture, MOBILE). Real rows carry zero variance, so `mombo_lcb`
needs no mask: there the penalty vanishes by itself.

Terminal rows bootstrap through `_continue` (selection), never `(1 - d) * value`: a NaN/inf next
value times zero is NaN. `config.agent.deterministic_backup=False` adds SAC's entropy term
-alpha * log pi(a'|s') to every next-state value (MOMBO's three modes, MOBILE, MOPO alike).

Penalties. This module is the one owner of each algorithm's per-row uncertainty quantifier U, the
quantity its target subtracts (times beta / lambda). Every one is a named function with the
targets' own signature,

    penalty_<algo>(agent, batch, key, *, dyn, config, term_fn) -> U [B], UNSCALED (no beta),

and called with the key a target got, it returns exactly the per-row U that target subtracts
(before beta, and before MOBILE / elite_spread / mixture give real rows the plain target): the
targets call the same code (`lcb_moments`, `elite_spread_moments`, `mixture_moments`,
`penalty_mobile`). MOPO's U (`penalty_mopo`, an EnsemblePenalty: a function of every member's
Gaussians) is what rollout.py subtracts from the model reward, computed from the rollout step's
own prediction. `get_penalty(config)` picks the one
of a config's algorithm; mombo_jax.analysis.quantifier_quality (the paper's Table 2, docs/spec.md
section 9) uses nothing else.
"""
import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp

from mombo_jax.core import dynamics, sac, termination
from mombo_jax.core.critics import ensemble_moments, sample_tanh_gaussian


def _finish(y, config):
  """Clamp (reference code: targets >= 0) and stop gradients."""
  if config.agent.clip_target_min is not None:
    y = jnp.maximum(y, config.agent.clip_target_min)
  return jax.lax.stop_gradient(y)


def _real_rows(batch_size, config, real_rows=None):
  """bool [B]: True for the leading real rows of a mixed batch (real_rows of them, may be traced;
  default int(B * config.rollout.real_ratio))."""
  n = int(batch_size * config.rollout.real_ratio) if real_rows is None else real_rows
  return jnp.arange(batch_size) < n


def _beta(beta, config):
  return config.beta if beta is None else beta


def _continue(done, value):
  """value where the episode goes on, 0 at terminals (selection: a NaN behind a terminal stays
  out)."""
  return jnp.where(done > 0, jnp.zeros_like(value), value)


def _next_action(agent, obs, key, config, soft=True, auto_alpha=None):
  """a' ~ pi(.|obs) [..., A] and the entropy bonus -alpha log pi(a'|obs) [...] of a soft backup
  (zero for the deterministic backup, or when soft=False)."""
  mean, log_std = sac._actor_apply(agent, obs, config)
  action, logp = sample_tanh_gaussian(mean, log_std, key)
  if config.agent.deterministic_backup or not soft:
    return action, jnp.zeros_like(logp)
  return action, -sac.alpha(agent, config, auto_alpha) * logp


def _mm_min(agent, obs, obs_var, key, config, auto_alpha=None):
  """a' ~ pi(obs); (mean, var) [..., B] of the target critic with the smaller MM mean (plus the
  entropy bonus in the mean for a soft backup), by config.agent.moments (critics.ensemble_moments:
  diagonal, the paper's, or lowrank / full)."""
  action, bonus = _next_action(agent, obs, key, config, auto_alpha=auto_alpha)
  mean, var = ensemble_moments(agent.critic.apply_fn, agent.target_critic_params, obs, action,
                               obs_var, config.moments_mode)                   # [E, ..., B]
  j = jnp.argmin(mean, axis=0)[None]
  return (jnp.take_along_axis(mean, j, axis=0)[0] + bonus, jnp.take_along_axis(var, j, axis=0)[0])


def _plain_min(agent, obs, key, config, soft=True, auto_alpha=None):
  """a' ~ pi(obs); min over target critics of Q(obs, a') [..., B] (+ entropy bonus if soft)."""
  action, bonus = _next_action(agent, obs, key, config, soft, auto_alpha)
  return agent.critic.apply_fn(agent.target_critic_params, obs, action).min(axis=0) + bonus


def _elite_predictions(dyn, batch, config, term_fn):
  """Per-elite model predictions at (s, a): next-state mean/var [E, B, S], reward mean/var [E, B],
  done [E, B] float32.

  done: each elite's next-state mean judged as a rollout judges a draw (termination.model_done:
  term_fn or any |x| >= config.rollout.rollout_obs_limit), as adinlab/MOMBO's per-elite targets do
  (dynamics/ensemble_dynamics.py torch_step: terminal_fn on the elites' means, whose
  utils/termination_fns.py includes the |x| < 100 bound).
  """
  # Only the elites' networks run (E of M members).
  s_mean, s_var, r_mean, r_var = dynamics.predict(dyn, batch.obs, batch.action, config,
                                                  members=dyn.elites)
  done = jax.vmap(lambda nxt: termination.model_done(
      term_fn, batch.obs, batch.action, nxt, config.rollout.rollout_obs_limit))(s_mean)
  return s_mean, s_var, r_mean, r_var, done.astype(jnp.float32)


def _plain_target(agent, batch, key, config, auto_alpha=None):
  """r + gamma (1 - d) min_j Q'(s', a'), the backup of real rows."""
  return batch.reward + config.agent.gamma * _continue(
      batch.done, _plain_min(agent, batch.next_obs, key, config, auto_alpha=auto_alpha))


def lcb_moments(agent, batch, key, config, auto_alpha=None):
  """MOMBO lcb's (mean [B], std [B]) of a row's Bellman target, from the stored Gaussian of the
  elite that produced it: mean = r_mean + g(1-d) m*, std = sqrt(var_r + g^2 (1-d) v*), (m*, v*) the
  MM moments of the target critic with the smaller MM mean at (next_obs_mean, a' ~ pi(.|
  next_obs_mean)) with input variance next_obs_var. batch: buffer.Batch [B, ...]; key: the target's.
  """
  m, v = _mm_min(agent, batch.next_obs_mean, batch.next_obs_var, key, config, auto_alpha)
  std = jnp.sqrt(batch.reward_var + config.agent.gamma**2 * _continue(batch.done, v))
  return batch.reward_mean + config.agent.gamma * _continue(batch.done, m), std


def penalty_mombo_lcb(agent, batch, key, *, dyn=None, config, term_fn=None):
  """U [B] of MOMBO lcb, unscaled: lcb_moments' std (what mombo_lcb subtracts times beta). It is a
  function of the row's stored Gaussian (next_obs_mean/var, reward_var) and done, so a model row
  must carry the Gaussian of the elite that drew it, as rollout rows do. Real rows: zero variances,
  U = 0."""
  del dyn, term_fn
  return lcb_moments(agent, batch, key, config)[1]


def mombo_lcb(agent, batch, key, *, dyn, config, term_fn, beta=None, real_rows=None,
              auto_alpha=None):
  """MOMBO (paper eq. 1 + reward variance), from the stored Gaussian of the producing elite:

  y = r + g(1-d) m* - beta sqrt(var_r + g^2 (1-d) v*),  (m*, v*) = MM moments of the target critic
  with the smaller mean at (mu_s', a' ~ pi(mu_s')), input variance var_s'. The Gaussian's mean is
  the elite's mean (next_obs_mean, reward_mean), not the sample the rollout continued from.
  """
  del dyn, term_fn, real_rows          # real rows: zero variance, no penalty by themselves
  t, std = lcb_moments(agent, batch, key, config, auto_alpha)
  y = t - _beta(beta, config) * std
  return _finish(y, config), {"penalty": _beta(beta, config) * std.mean(), "target_std": std.mean()}


def _per_elite_mm(agent, batch, key, dyn, config, term_fn, auto_alpha=None):
  """T_e = r_e + g(1-d_e) m_e and its MM variance var_r,e + g^2 (1-d_e) v_e, both [E, B]."""
  s_mean, s_var, r_mean, r_var, done = _elite_predictions(dyn, batch, config, term_fn)
  keys = jax.random.split(key, s_mean.shape[0])
  m, v = jax.vmap(lambda s, sv, k: _mm_min(agent, s, sv, k, config, auto_alpha))(s_mean, s_var,
                                                                                 keys)
  return (r_mean + config.agent.gamma * _continue(done, m),
          r_var + config.agent.gamma**2 * _continue(done, v))


def elite_spread_moments(agent, batch, key, *, dyn, config, term_fn, auto_alpha=None):
  """MOMBO elite_spread's (mean_e T_e [B], std_e T_e [B], ddof=1 as torch) over the elites'
  recomputed predictions at (batch.obs, batch.action); key: the target's (its first split draws
  the elites' a'_e)."""
  k_model, _ = jax.random.split(key)
  t, _ = _per_elite_mm(agent, batch, k_model, dyn, config, term_fn, auto_alpha)
  return t.mean(axis=0), t.std(axis=0, ddof=1)


def penalty_elite_spread(agent, batch, key, *, dyn, config, term_fn):
  """U [B] of MOMBO elite_spread, unscaled: std_e T_e (ddof=1), what mombo_elite_spread subtracts
  (times beta) on model rows. Depends on (obs, action) only (plus the key's policy draws)."""
  return elite_spread_moments(agent, batch, key, dyn=dyn, config=config, term_fn=term_fn)[1]


def mombo_elite_spread(agent, batch, key, *, dyn, config, term_fn, beta=None, real_rows=None,
                       auto_alpha=None):
  """What the public MOMBO code does: y = mean_e T_e - beta std_e T_e (ddof=1); MM variance
  unused."""
  _, k_real = jax.random.split(key)
  mean, std = elite_spread_moments(agent, batch, key, dyn=dyn, config=config, term_fn=term_fn,
                                   auto_alpha=auto_alpha)
  penalty = _beta(beta, config) * std
  y = jnp.where(_real_rows(batch.reward.shape[0], config, real_rows),
                _plain_target(agent, batch, k_real, config, auto_alpha), mean - penalty)
  return _finish(y, config), {"penalty": penalty.mean()}


def mixture_moments(agent, batch, key, *, dyn, config, term_fn, auto_alpha=None):
  """MOMBO mixture's (mean_e T_e [B], sqrt(mean_e MM var_e + var_e T_e) [B]) (law of total
  variance over the elites, ddof=0); key: the target's."""
  k_model, _ = jax.random.split(key)
  t, t_var = _per_elite_mm(agent, batch, k_model, dyn, config, term_fn, auto_alpha)
  return t.mean(axis=0), jnp.sqrt(t_var.mean(axis=0) + t.var(axis=0))


def penalty_mixture(agent, batch, key, *, dyn, config, term_fn):
  """U [B] of MOMBO mixture, unscaled: the mixture's std (what mombo_mixture subtracts times beta
  on model rows)."""
  return mixture_moments(agent, batch, key, dyn=dyn, config=config, term_fn=term_fn)[1]


def mombo_mixture(agent, batch, key, *, dyn, config, term_fn, beta=None, real_rows=None,
                  auto_alpha=None):
  """Law of total variance over elites: var = mean_e(MM var_e) + var_e(T_e); y = mean - beta
  sqrt(var)."""
  _, k_real = jax.random.split(key)
  mean, std = mixture_moments(agent, batch, key, dyn=dyn, config=config, term_fn=term_fn,
                              auto_alpha=auto_alpha)
  y = jnp.where(_real_rows(batch.reward.shape[0], config, real_rows),
                _plain_target(agent, batch, k_real, config, auto_alpha),
                mean - _beta(beta, config) * std)
  return _finish(y, config), {"penalty": _beta(beta, config) * std.mean(), "target_std": std.mean()}


def penalty_mobile(agent, batch, key, *, dyn, config, term_fn=None):
  """U [B] of MOBILE, unscaled: std over elites (ddof=1) of the mean over N = mobile_num_samples
  next-state samples of min_j Q'(s'_n, a'_n), a'_n ~ pi (no entropy term); key: the target's (its
  first two splits draw the samples and the actions). The target zeroes it on real rows."""
  del term_fn
  k_noise, k_pi, _ = jax.random.split(key, 3)
  s_mean, s_var, _, _ = dynamics.predict(dyn, batch.obs, batch.action, config,
                                         members=dyn.elites)
  s_std = jnp.sqrt(s_var)
  n = config.agent.mobile_num_samples
  eps = jax.random.normal(k_noise, (n,) + s_mean.shape, s_mean.dtype)
  samples = s_mean + s_std * eps                                        # [N, E, B, S]
  # The penalty measures Q's spread only (the reference adds no entropy term here).
  q = _plain_min(agent, samples, k_pi, config, soft=False)              # [N, E, B]
  return q.mean(axis=0).std(axis=0, ddof=1)                             # [B]


def mobile(agent, batch, key, *, dyn, config, term_fn, beta=None, real_rows=None,
           auto_alpha=None):
  """MOBILE: penalty = std over elites (ddof=1) of the mean over N next-state samples of min_j Q';
  zero for real rows; y = r - beta penalty + g(1-d) min_j Q'(s', a'), s' from the buffer
  (OfflineRL-Kit offlinerlkit/policy/model_based/mobile.py: compute_lcb and learn's target_q)."""
  _, _, k_next = jax.random.split(key, 3)
  penalty = penalty_mobile(agent, batch, key, dyn=dyn, config=config, term_fn=term_fn)
  penalty = jnp.where(_real_rows(batch.reward.shape[0], config, real_rows), 0.0, penalty)
  y = batch.reward - _beta(beta, config) * penalty + config.agent.gamma * _continue(
      batch.done, _plain_min(agent, batch.next_obs, k_next, config, auto_alpha=auto_alpha))
  return _finish(y, config), {"penalty": _beta(beta, config) * penalty.mean()}


def mopo(agent, batch, key, *, dyn, config, term_fn, beta=None, real_rows=None, auto_alpha=None):
  """MOPO: the reward was penalised at rollout time (with beta: penalty_mopo); plain SAC soft
  target (OfflineRL-Kit offlinerlkit/policy/model_based/mopo.py: its learn is SAC's)."""
  del dyn, term_fn, beta, real_rows
  return sac.soft_target(agent, batch, key, config, auto_alpha)


def plain(agent, batch, key, *, dyn, config, term_fn, beta=None, real_rows=None, auto_alpha=None):
  """Plain SAC's soft target, no penalty (algorithms.SAC)."""
  del dyn, term_fn, beta, real_rows
  return sac.soft_target(agent, batch, key, config, auto_alpha)


def max_std_norm(ensemble: dynamics.Gaussians):
  """MOPO's U [B] from every member's Gaussians [M, B, ...]: max over the M members of the L2 norm
  of the std over (next-state, reward) dims (OfflineRL-Kit offlinerlkit/dynamics/
  ensemble_dynamics.py, step: uncertainty_mode "aleatoric", amax over members of norm(std))."""
  all_var = jnp.concatenate([ensemble.next_obs_var, ensemble.reward_var[..., None]], axis=-1)
  return jnp.max(jnp.linalg.norm(jnp.sqrt(all_var), axis=-1), axis=0)


@dataclasses.dataclass(frozen=True)
class EnsemblePenalty:
  """A penalty that is a function of every ensemble member's Gaussians at (s, a) alone (no agent,
  no key): U = of_ensemble(dynamics.Gaussians [M, B, ...]) [B]. Called like any penalty (the
  signature above) it predicts them itself; a rollout hands it the Gaussians its own model step
  predicted (dynamics.step(every_member=True)), so MOPO's rollout runs ONE ensemble forward per
  model step. Hashable: it sits in an Algorithm, a static argument of the compiled epoch."""
  of_ensemble: Callable

  def __call__(self, agent, batch, key, *, dyn, config, term_fn=None):
    del agent, key, term_fn
    return self.of_ensemble(dynamics.Gaussians(*dynamics.predict(dyn, batch.obs, batch.action,
                                                                 config)))


# U [B] of MOPO, unscaled: max over ALL members of ||(sigma_s', sigma_r)||_2 at (batch.obs,
# batch.action) (max_std_norm), which rollout.py subtracts (times lambda = beta) from the model
# reward of every row it writes. Deterministic in (obs, action).
penalty_mopo = EnsemblePenalty(max_std_norm)


def _function(fn):
  """The function an Algorithm's field holds: a built-in Algorithm's stand-in (algorithms._Target,
  which this module cannot import: algorithms imports it) gives its `function`, a function
  itself."""
  return getattr(fn, "function", fn)


def get_target(config):
  """The target function of config's algorithm (config.algorithm: algorithms.Algorithm), a
  built-in Algorithm's stand-in resolved (_function)."""
  return _function(config.algorithm.bellman_target)


def get_penalty(config):
  """penalty_fn(agent, batch, key, *, dyn, config, term_fn) -> U [B] (unscaled) of config's
  algorithm: the per-row quantity its training subtracts times beta (a stand-in resolved)."""
  if config.algorithm.penalty is None:
    raise ValueError(f"{config.algorithm.label} has no uncertainty penalty.")
  return _function(config.algorithm.penalty)


def bind(config, dyn, term_fn, beta=None, real_rows=None, auto_alpha=None):
  """target_fn(agent, batch, key) for sac.update: config's target (get_target) with the dynamics,
  config, termination and the cell's settings bound (train.make_epoch's)."""
  return functools.partial(get_target(config), dyn=dyn, config=config, term_fn=term_fn, beta=beta,
                           real_rows=real_rows, auto_alpha=auto_alpha)
