"""Our side of the fidelity harness, without torch: the setup (config, agent, dynamics, batches),
the standard-normal draws our update makes from its key, and our update driven by given draws
with every intermediate the comparison reads.

`step(setup, agent, batch, draws(setup, key))` is `sac.update(agent, batch, key, target_fn,
config)` of the product (tests/test_fidelity_ours.py holds it to that for every algorithm), built
from the product's own pieces (sac, targets, critics.tanh_gaussian, dynamics.predict) with each
`jax.random.normal` of the update replaced by an entry of `draws`. The reference's samplers get the
same entries (theirs_mombo.py, theirs_kit.py).

Shapes: B rows of a batch, S obs dim, A action dim, E elites, N MOBILE's next-state samples.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Dict

import jax
import jax.numpy as jnp
import numpy as np
import optax

from mombo_jax.core import buffer, critics, dynamics, sac, targets, termination
from mombo_jax.settings.config import Config, make_config

# The task whose settings the harness runs: walker2d-medium learns alpha in all three algorithms'
# reference settings (hopper's MOMBO and MOBILE rows fix it), so the temperature step is compared.
ENV = "walker2d-medium"
OBS, ACT = 17, 6
# What --algo names: (our algo, MOMBO's target).
ALGOS = {"mombo": ("mombo", "elite_spread"), "mombo-lcb": ("mombo", "lcb"),
         "mobile": ("mobile", None), "mopo": ("mopo", None)}


@dataclasses.dataclass(frozen=True, eq=False)   # hashed by identity: stepper's cache key
class Setup:
  """One comparison's fixed parts. kind: a key of ALGOS; dtype: 'float32' | 'float64'."""
  kind: str
  dtype: str
  config: Config
  dyn: dynamics.DynamicsState
  term_fn: object

  @property
  def n_real(self) -> int:
    """The batch's leading real rows (buffer.sample_mixed; the references' real_ratio)."""
    return int(self.config.agent.batch_size * self.config.rollout.real_ratio)


def _config(kind: str, overrides) -> Config:
  algo, target = ALGOS[kind]
  return make_config(ENV, algo, **({"target": target} if target else {}), **overrides)


def _cast_train_state(state, dtype):
  params = jax.tree.map(lambda x: jnp.asarray(x, dtype), state.params)
  return state.replace(params=params, opt_state=state.tx.init(params))


def init(kind: str, dtype: str = "float32", seed: int = 0, **overrides):
  """(Setup, agent): our fresh agent of the config (sac.init_agent) and a random, untrained dynamics
  ensemble with a non-trivial normaliser and elites in a shuffled order, cast to dtype (float64
  needs jax_enable_x64; our init writes float32, the cast keeps the values). overrides: config
  settings (the suite's tiny networks); none: the reference settings of ENV."""
  config = _config(kind, overrides)
  k_agent, k_dyn, k_norm = jax.random.split(jax.random.PRNGKey(seed), 3)
  agent = sac.init_agent(k_agent, OBS, ACT, config, total_steps=config.schedule_steps)
  agent = agent.replace(actor=_cast_train_state(agent.actor, dtype),
                        critic=_cast_train_state(agent.critic, dtype),
                        target_critic_params=jax.tree.map(lambda x: jnp.asarray(x, dtype),
                                                          agent.target_critic_params),
                        log_alpha=_cast_train_state(agent.log_alpha, dtype))
  dyn = dynamics.init_state(k_dyn, OBS, ACT, config)
  rng = np.random.default_rng(seed)
  members, elites = config.dynamics.dyn_members, config.dynamics.dyn_elites
  dyn = dyn.replace(input_mean=jnp.asarray(rng.normal(0.0, 0.5, OBS + ACT)),
                    input_std=jnp.asarray(rng.uniform(0.5, 2.0, OBS + ACT)),
                    elites=jnp.asarray(rng.permutation(members)[:elites], jnp.int32))
  dyn = dyn.replace(params=jax.tree.map(lambda x: jnp.asarray(x, dtype), dyn.params),
                    input_mean=dyn.input_mean.astype(dtype), input_std=dyn.input_std.astype(dtype))
  term_fn = termination.termination_fn(config.env_name)
  return Setup(kind, dtype, config, dyn, term_fn), agent


def batches(setup: Setup, steps: int, seed: int = 0) -> buffer.Batch:
  """`steps` mixed batches [T, B, ...] as buffer.sample_mixed lays them out: n_real real rows
  (zero variances, Gaussian = the recorded values) first, then model rows with positive variances.
  Walker2d-like states: height near the healthy band's edge and angles of both signs, so that
  some elites' predicted next states terminate; a few stored terminals among all rows."""
  rng = np.random.default_rng(1000 + seed)
  b, n_real = setup.config.agent.batch_size, setup.n_real
  shape = (steps, b)
  obs = rng.normal(0.0, 0.5, shape + (OBS,))
  obs[..., 0] = rng.normal(1.2, 0.3, shape)
  next_obs = obs + rng.normal(0.0, 0.1, shape + (OBS,))
  fake = np.arange(b) >= n_real
  obs_var = np.exp(rng.normal(-4.0, 1.0, shape + (OBS,))) * fake[:, None]
  next_obs_var = np.exp(rng.normal(-4.0, 1.0, shape + (OBS,))) * fake[:, None]
  reward = rng.normal(1.0, 0.5, shape)
  reward_var = np.exp(rng.normal(-4.0, 1.0, shape)) * fake
  cast = lambda x: jnp.asarray(x, setup.dtype)  # noqa: E731
  return buffer.Batch(
      obs=cast(obs), action=cast(rng.uniform(-0.99, 0.99, shape + (ACT,))), reward=cast(reward),
      next_obs=cast(next_obs), done=cast(rng.uniform(size=shape) < 0.05), obs_var=cast(obs_var),
      next_obs_mean=cast(next_obs), next_obs_var=cast(next_obs_var), reward_mean=cast(reward),
      reward_var=cast(reward_var))


def step_batch(batches_: buffer.Batch, t: int) -> buffer.Batch:
  return jax.tree.map(lambda x: x[t], batches_)


# ---------------------------------------------------------------------------------------- draws

def draws(setup: Setup, key) -> Dict[str, jax.Array]:
  """_draws (below), jitted once per setup."""
  return _drawer(setup)(key)


@functools.lru_cache(maxsize=None)
def _drawer(setup: Setup):
  return jax.jit(functools.partial(_draws, setup))


def _draws(setup: Setup, key) -> Dict[str, jax.Array]:
  """The standard-normal draws sac.update(agent, batch, key, targets.bind(...)) makes, by name,
  reproducing its key splits (sac.update: k_target, k_actor; then the target's own):
    actor [B, A]: the actor loss's a ~ pi(s) (k_actor);
    mombo: elite [E, B, A] (a'_e at each elite's mean, targets._per_elite_mm's split of k_model),
      real [B, A] (a' of the real rows' plain target, k_real);
    mombo-lcb: target [B, A] (a' at next_obs_mean);
    mobile: samples [N, E, B, S] (next-state noise), pi [N, E, B, A] (their a'), next [B, A];
    mopo: target [B, A] (sac.soft_target's a')."""
  b, e = setup.config.agent.batch_size, setup.config.dynamics.dyn_elites
  dtype = jnp.dtype(setup.dtype)
  normal = lambda k, *shape: jax.random.normal(k, shape, dtype)  # noqa: E731
  k_target, k_actor = jax.random.split(key)
  out = {"actor": normal(k_actor, b, ACT)}
  if setup.kind == "mombo":
    k_model, k_real = jax.random.split(k_target)
    out["elite"] = jax.vmap(lambda k: normal(k, b, ACT))(jax.random.split(k_model, e))
    out["real"] = normal(k_real, b, ACT)
  elif setup.kind == "mobile":
    n = setup.config.agent.mobile_num_samples
    k_noise, k_pi, k_next = jax.random.split(k_target, 3)
    out.update(samples=normal(k_noise, n, e, b, OBS), pi=normal(k_pi, n, e, b, ACT),
               next=normal(k_next, b, ACT))
  else:
    out["target"] = normal(k_target, b, ACT)
  return out


# ------------------------------------------------------------------------ targets with the draws

def _next_action(setup, agent, obs, eps, soft=True):
  """targets._next_action with its draw given."""
  config = setup.config
  mean, log_std = sac._actor_apply(agent, obs, config)
  action, logp = critics.tanh_gaussian(mean, log_std, eps)
  if config.agent.deterministic_backup or not soft:
    return action, jnp.zeros_like(logp)
  return action, -sac.alpha(agent, config) * logp


def _plain_min(setup, agent, obs, eps, soft=True):
  action, bonus = _next_action(setup, agent, obs, eps, soft)
  return agent.critic.apply_fn(agent.target_critic_params, obs, action).min(axis=0) + bonus


def _mm_min(setup, agent, obs, obs_var, eps):
  """targets._mm_min with its draw given: (mean, var) of the critic with the smaller MM mean."""
  action, bonus = _next_action(setup, agent, obs, eps)
  mean, var = agent.critic.apply_fn(agent.target_critic_params, obs, action, obs_var)
  j = jnp.argmin(mean, axis=0)[None]
  return (jnp.take_along_axis(mean, j, axis=0)[0] + bonus, jnp.take_along_axis(var, j, axis=0)[0])


def target(setup: Setup, agent, batch, noise):
  """(y [B], U [B] unscaled penalty or None): targets.<algorithm> with the draws given."""
  config, gamma = setup.config, setup.config.agent.gamma
  real = jnp.arange(batch.reward.shape[0]) < setup.n_real
  cont = targets._continue
  penalty = None
  if setup.kind == "mombo":
    s_mean, s_var, r_mean, _, done = targets._elite_predictions(setup.dyn, batch, config,
                                                                setup.term_fn)
    m, _ = jax.vmap(lambda s, v, eps: _mm_min(setup, agent, s, v, eps))(s_mean, s_var,
                                                                        noise["elite"])
    t = r_mean + gamma * cont(done, m)
    penalty = t.std(axis=0, ddof=1)
    plain = batch.reward + gamma * cont(batch.done,
                                        _plain_min(setup, agent, batch.next_obs, noise["real"]))
    y = jnp.where(real, plain, t.mean(axis=0) - config.beta * penalty)
  elif setup.kind == "mombo-lcb":
    m, v = _mm_min(setup, agent, batch.next_obs_mean, batch.next_obs_var, noise["target"])
    penalty = jnp.sqrt(batch.reward_var + gamma**2 * cont(batch.done, v))
    y = batch.reward_mean + gamma * cont(batch.done, m) - config.beta * penalty
  elif setup.kind == "mobile":
    s_mean, s_var, _, _ = dynamics.predict(setup.dyn, batch.obs, batch.action, config,
                                           members=setup.dyn.elites)
    samples = s_mean + jnp.sqrt(s_var) * noise["samples"]
    penalty = _plain_min(setup, agent, samples, noise["pi"], soft=False).mean(0).std(0, ddof=1)
    y = batch.reward - config.beta * jnp.where(real, 0.0, penalty) + gamma * cont(
        batch.done, _plain_min(setup, agent, batch.next_obs, noise["next"]))
  else:  # mopo: sac.soft_target
    y = batch.reward + gamma * jnp.where(batch.done > 0, 0.0,
                                         _plain_min(setup, agent, batch.next_obs, noise["target"]))
  if config.agent.clip_target_min is not None:
    y = jnp.maximum(y, config.agent.clip_target_min)
  return jax.lax.stop_gradient(y).astype(batch.reward.dtype), penalty


# --------------------------------------------------------------------------------- the update

def _step(setup: Setup, agent, batch, noise):
  """sac.update with the draws given; returns (agent, intermediates)."""
  config = setup.config
  y, penalty = target(setup, agent, batch, noise)

  def critic_loss_fn(params):
    q = agent.critic.apply_fn(params, batch.obs, batch.action)
    return jnp.sum(jnp.mean((q - y[None]) ** 2, axis=1))

  critic_loss, critic_grads = jax.value_and_grad(critic_loss_fn)(agent.critic.params)
  critic = agent.critic.apply_gradients(grads=critic_grads)
  temperature = sac.alpha(agent, config)

  def actor_loss_fn(params):
    mean, log_std = agent.actor.apply_fn(params, batch.obs)
    action, logp = critics.tanh_gaussian(mean, log_std, noise["actor"])
    q_pi = sac._critic_values(agent, critic.params, batch.obs, action, batch.obs_var, config)
    return jnp.mean(temperature * logp - q_pi.min(0)), logp

  (actor_loss, logp), actor_grads = jax.value_and_grad(actor_loss_fn, has_aux=True)(
      agent.actor.params)
  actor = agent.actor.apply_gradients(grads=actor_grads)
  log_alpha, alpha_loss, alpha_grads = agent.log_alpha, jnp.zeros((), y.dtype), None
  if config.agent.auto_alpha:
    gap = jax.lax.stop_gradient(logp) + sac.target_entropy(config, batch.action.shape[-1])
    alpha_loss, alpha_grads = jax.value_and_grad(
        lambda p: -jnp.mean(p["log_alpha"] * gap))(log_alpha.params)
    log_alpha = log_alpha.apply_gradients(grads=alpha_grads)
  target_params = optax.incremental_update(critic.params, agent.target_critic_params,
                                           config.agent.tau)
  new = agent.replace(actor=actor, critic=critic, target_critic_params=target_params,
                      log_alpha=log_alpha)
  out = {"y": y, "penalty": penalty, "critic_loss": critic_loss, "critic_grads": critic_grads,
         "actor_loss": actor_loss, "actor_grads": actor_grads, "alpha_loss": alpha_loss,
         "alpha_grads": alpha_grads, "alpha": temperature}
  return new, out


@functools.lru_cache(maxsize=None)
def stepper(setup: Setup):
  """step(agent, batch, noise) -> (agent, intermediates), jitted once per setup."""
  return jax.jit(functools.partial(_step, setup))


def step(setup: Setup, agent, batch, noise):
  return stepper(setup)(agent, batch, noise)


def actor_lrs(setup: Setup, steps: int) -> np.ndarray:
  """[steps]: the actor learning rate our update number t (0-based) applies
  (sac.actor_lr_schedule, in the setup's dtype)."""
  schedule = sac.actor_lr_schedule(setup.config, setup.config.schedule_steps)
  if not callable(schedule):
    return np.full(steps, schedule)
  return np.asarray(jax.vmap(schedule)(jnp.arange(steps)), np.float64)


# ----------------------------------------------------------------- names shared with the reference

def actor_arrays(actor_params) -> Dict[str, np.ndarray]:
  """{'actor.<i>.weight' [out, in], 'actor.<i>.bias' [out]}: the actor's layers in call order
  (hidden..., mean head, log-std head), kernels transposed to torch.nn.Linear's [out, in]."""
  hidden, mean_head, log_std_head = sac.actor_layers(actor_params)
  return _named("actor", hidden + [mean_head, log_std_head])


def critic_arrays(critic_params) -> Dict[str, np.ndarray]:
  """{'critic<e>.<i>.weight' [out, in], ...} per member e of the vmapped ensemble (leading axis)."""
  members = critic_params["params"]["members"]
  names = sorted(members, key=lambda n: int(n.rsplit("_", 1)[1]))
  size = members[names[0]]["kernel"].shape[0]
  out = {}
  for e in range(size):
    out.update(_named(f"critic{e}", [(members[n]["kernel"][e], members[n]["bias"][e])
                                     for n in names]))
  return out


def _named(prefix, layers):
  out = {}
  for i, (kernel, bias) in enumerate(layers):
    out[f"{prefix}.{i}.weight"] = np.asarray(kernel).T
    out[f"{prefix}.{i}.bias"] = np.asarray(bias)
  return out
