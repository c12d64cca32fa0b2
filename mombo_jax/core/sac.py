"""Soft actor-critic as pure functions over one pytree agent state (docs/spec.md section 6).

The Bellman target is an argument (`target_fn(agent, batch, key) -> (y [B], aux)`), so this module
does not know which algorithm runs: MOMBO, MOBILE and MOPO differ only in their target functions
(targets.py), plus one switch here: for an algorithm with `moment_matching` (MOMBO;
config.algorithm, mombo_jax.core.algorithms) the actor is trained on the critics' moment-matched
mean evaluated with the batch's state variance (the reference code does so).

Parameter layout: every TrainState's `params` is the full Flax variables dict, so
`state.apply_fn(state.params, ...)` and e.g. `TanhGaussianActor(...).apply(agent.actor.params, obs)`
work as they are; `log_alpha.params == {"log_alpha": f32 scalar}`.

Shapes: B = batch rows, S = observation dim, A = action dim, E = config.agent.num_critics.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Dict, Optional, Tuple

import chex
import flax.struct as struct
import jax
import jax.numpy as jnp
import optax
from flax.training.train_state import TrainState

from mombo_jax.core import pieces
from mombo_jax.core.buffer import Batch
from mombo_jax.core.critics import (
  CriticEnsemble,
  TanhGaussianActor,
  actor_layer_names,
  deterministic_action,
  sample_tanh_gaussian,
)

# A Config or an EpochSettings (or online SAC's settings): read by attribute names only, so the
# core imports no settings module.
Config = Any

TargetFn = Callable[["AgentState", Batch, jax.Array], Tuple[jax.Array, Dict[str, jax.Array]]]


class AgentState(struct.PyTreeNode):
  """Everything SAC learns. A pytree: vmap it over seeds, save it whole with Orbax.

  actor: TrainState of TanhGaussianActor (params = {"params": ...}).
  critic: TrainState of CriticEnsemble (params = {"params": {"members": ... leading axis E}}).
  target_critic_params: Polyak average of critic.params (same structure).
  log_alpha: TrainState with params {"log_alpha": f32 scalar}; untouched when alpha is fixed
  (config.agent.auto_alpha, or update's per-cell auto_alpha, False).
  """
  actor: TrainState
  critic: TrainState
  target_critic_params: Any
  log_alpha: TrainState


def make_actor(config: Config, action_dim: int) -> TanhGaussianActor:
  """The policy network the config describes."""
  agent = config.agent
  return TanhGaussianActor(hidden_dims=tuple(agent.actor_hidden), action_dim=action_dim,
                           log_std_min=agent.log_std_min, log_std_max=agent.log_std_max)


def actor_layers(actor_params):
  """The actor's (kernel, bias) pairs from its variables {"params": ...}: (hidden, mean, log_std),
  hidden a list of (W [in, h], b [h]), mean and log_std (W [h, A], b [A]) the two heads, looked
  up by their names (critics.actor_layer_names; an actor has two layers beyond its hidden ones)."""
  layers = actor_params["params"]
  hidden, mean_head, log_std_head = actor_layer_names(len(layers) - 2)

  def pair(name):
    return layers[name]["kernel"], layers[name]["bias"]

  return [pair(n) for n in hidden], pair(mean_head), pair(log_std_head)


def actor_action_dim(actor_params) -> int:
  """A: the width of the actor's mean head (actor_params: its variables {"params": ...})."""
  return int(actor_layers(actor_params)[1][0].shape[-1])


def make_critic(config: Config) -> CriticEnsemble:
  """The critic ensemble the config describes."""
  return CriticEnsemble(hidden_dims=tuple(config.agent.critic_hidden),
                        num_critics=config.agent.num_critics)


def actor_lr_schedule(config: Config, total_steps: int):
  """Actor learning rate: cosine-annealed to 0 over `total_steps` gradient steps, or constant."""
  if config.agent.actor_cosine_schedule:
    if total_steps < 1:
      raise ValueError("total_steps must be >= 1 for the actor's cosine schedule, got "
                       f"{total_steps}.")
    return optax.cosine_decay_schedule(init_value=config.agent.actor_lr, decay_steps=total_steps,
                                       alpha=0.0)
  return config.agent.actor_lr


def _train_state(apply_fn, params, tx) -> TrainState:
  state = TrainState.create(apply_fn=apply_fn, params=params, tx=tx)
  # A fixed int32 step keeps the carry's dtype stable inside lax.scan (a Python 0 is weakly typed).
  return state.replace(step=jnp.zeros((), jnp.int32))


def init_agent(key: jax.Array, obs_dim: int, action_dim: int, config: Config,
               total_steps: int) -> AgentState:
  """Fresh networks and optimisers; `total_steps` = gradient steps of the run (cosine schedule).

  Vmap over a leading key axis for several seeds: `jax.vmap(lambda k: init_agent(k, ...))(keys)`.
  Compiled once per (dims, config, total_steps): run eagerly, Flax init would compile every small
  op on its own (seconds on a busy CPU). A cached compilation also hands back the same optimiser
  objects (static TrainState fields), so agents from repeated calls share `update`'s jit cache.
  """
  if not config.agent.actor_cosine_schedule:
    total_steps = 1  # unused: one cache entry (and one set of optimiser objects) for all lengths
  elif total_steps < 1:
    raise ValueError("total_steps must be >= 1 for the actor's cosine schedule, got "
                     f"{total_steps}.")
  return _init_agent(key, int(obs_dim), int(action_dim), config, int(total_steps))


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))
def _init_agent(key, obs_dim, action_dim, config, total_steps):
  k_actor, k_critic = jax.random.split(key)
  obs = jnp.zeros((1, obs_dim), jnp.float32)
  act = jnp.zeros((1, action_dim), jnp.float32)
  actor = make_actor(config, action_dim)
  critic = make_critic(config)
  actor_params = actor.init(k_actor, obs)
  critic_params = critic.init(k_critic, obs, act)
  log_alpha = {"log_alpha": jnp.asarray(config.agent.log_alpha_init, jnp.float32)}
  return AgentState(
      actor=_train_state(actor.apply, actor_params,
                         optax.adam(actor_lr_schedule(config, total_steps))),
      critic=_train_state(critic.apply, critic_params, optax.adam(config.agent.critic_lr)),
      target_critic_params=jax.tree_util.tree_map(lambda x: x, critic_params),
      log_alpha=_train_state(None, log_alpha, optax.adam(config.agent.alpha_lr)))


def alpha(agent: AgentState, config: Config, auto_alpha=None) -> jax.Array:
  """Entropy temperature (f32 scalar): exp(log_alpha) if auto_alpha, else config.agent.alpha.

  auto_alpha: bool scalar, may be traced (cells of one program may learn or fix alpha: train.Cell);
  default config.agent.auto_alpha.
  With auto_alpha the temperature is capped at config.agent.alpha_max (1.0 by default), as the
  MOMBO, MOBILE and MOPO references do (`clamp(log_alpha.exp(), 0, 1)`): on penalised synthetic
  rewards the entropy term can otherwise dominate early. The cap acts on the value used in the
  losses and targets only; log_alpha's own gradient step is unaffected.
  """
  fixed = jnp.asarray(config.agent.alpha, jnp.float32)
  if auto_alpha is None and not config.agent.auto_alpha:
    return fixed
  value = jnp.exp(agent.log_alpha.params["log_alpha"])
  if config.agent.alpha_max is not None:
    value = jnp.minimum(value, jnp.asarray(config.agent.alpha_max, jnp.float32))
  return value if auto_alpha is None else jnp.where(auto_alpha, value, fixed)


def target_entropy(config: Config, action_dim: int) -> float:
  """-dim(A) unless config.agent.target_entropy overrides it."""
  return float(-action_dim if config.agent.target_entropy is None else config.agent.target_entropy)


def _check_batch(batch: Batch):
  chex.assert_rank([batch.obs, batch.action, batch.next_obs, batch.obs_var], 2)
  chex.assert_rank([batch.reward, batch.done], 1)
  chex.assert_equal_shape([batch.obs, batch.next_obs, batch.obs_var])
  chex.assert_equal_shape_prefix([batch.obs, batch.action, batch.reward, batch.done], 1)


def soft_target(agent: AgentState, batch: Batch, key: jax.Array, config: Config,
                auto_alpha=None):
  """Standard SAC target from the sampled next state: returns (y [B], aux dict of scalars).

  y = r + gamma * (1 - d) * (min_j Q'_j(s', a') - alpha * log pi(a'|s')),  a' ~ pi(.|s'),
  without the entropy term when config.agent.deterministic_backup. Clamped at
  config.agent.clip_target_min unless that is None (online SAC, mombo_jax.collection.online_sac,
  passes a config with None).
  auto_alpha: as alpha's.
  """
  _check_batch(batch)
  mean, log_std = agent.actor.apply_fn(agent.actor.params, batch.next_obs)
  next_action, next_logp = sample_tanh_gaussian(mean, log_std, key)
  q_next = agent.critic.apply_fn(agent.target_critic_params, batch.next_obs, next_action).min(0)
  if not config.agent.deterministic_backup:
    q_next = q_next - alpha(agent, config, auto_alpha) * next_logp
  # Selection, not (1 - d) * q: a NaN/inf value behind a terminal must not reach the target.
  y = batch.reward + config.agent.gamma * jnp.where(batch.done > 0, 0.0, q_next)
  if config.agent.clip_target_min is not None:
    y = jnp.maximum(y, config.agent.clip_target_min)
  chex.assert_shape(y, batch.reward.shape)
  # The reward's dtype (float32 in every run; float64 in the fidelity harness's x64 process).
  return y.astype(batch.reward.dtype), {"next_q_mean": q_next.mean()}


def _critic_values(agent: AgentState, critic_params, obs, action, obs_var, config: Config):
  """Q [E, B] for the actor loss: MM mean with obs_var for MOMBO, the plain Q otherwise."""
  if config.algorithm.moment_matching:
    q_mean, _ = agent.critic.apply_fn(critic_params, obs, action, obs_var)
    return q_mean
  return agent.critic.apply_fn(critic_params, obs, action)


# The losses: pure functions of the parameters they train (first argument) and what they read,
# as brax's training/agents/sac/losses.py; `update` takes the gradient steps. Equations: Haarnoja
# et al. 2018, "Soft Actor-Critic Algorithms and Applications" (arXiv:1812.05905).

def critic_loss(critic_params, agent: AgentState, batch: Batch, y: jax.Array):
  """J_Q (eq. 5): sum over the E critics of mean_b (Q_j(s_b, a_b) - y_b)^2. Returns (loss,
  Q [E, B]).

  y [B]: the Bellman target, a constant (stop-gradient). Each critic's own mean squared error, as
  OfflineRL-Kit's model_free/sac.py (critic1_loss, critic2_loss, one optimiser each); the sum keeps
  every critic's gradient its own (model_based/mobile.py and adinlab/MOMBO policies/mombo.py take
  the mean over critics too: the same Adam steps but for its eps). No 1/2 (the references have
  none). Q at zero input variance: the batch's obs_var reaches the actor only.
  """
  q = agent.critic.apply_fn(critic_params, batch.obs, batch.action)  # [E, B], zero input variance
  return jnp.sum(jnp.mean((q - y[None]) ** 2, axis=1)), q


def actor_loss(actor_params, agent: AgentState, critic_params, batch: Batch, key: jax.Array,
               temperature: jax.Array, config: Config):
  """J_pi (eq. 7, reparameterised): mean_b [alpha log pi(a_b|s_b) - min_j Q_j(s_b, a_b)],
  a_b = tanh(mu + sigma eps) ~ pi(.|s_b). Returns (loss, log pi(a|s) [B]).

  critic_params: the critics after this step's critic update (the references' order); the min
  over critics as every reference (OfflineRL-Kit sac.py `torch.min(q1a, q2a)`); Q the critics'
  moment-matched mean at the batch's obs_var for an algorithm with moment_matching (adinlab/MOMBO
  policies/mombo.py: `critic(obss, a, obs_variances)[0]`). temperature: alpha (f32 scalar).
  """
  mean, log_std = agent.actor.apply_fn(actor_params, batch.obs)
  action, logp = sample_tanh_gaussian(mean, log_std, key)
  q_pi = _critic_values(agent, critic_params, batch.obs, action, batch.obs_var, config).min(0)
  return jnp.mean(temperature * logp - q_pi), logp


def alpha_loss(log_alpha_params, logp: jax.Array, target_entropy_value: float):
  """J(alpha) (eq. 18) in log alpha: -mean_b log_alpha (log pi(a_b|s_b) + H-bar), logp [B] a
  constant (the actor step's, stop-gradient) and H-bar the target entropy. The references' form
  (OfflineRL-Kit sac.py `-(self._log_alpha * log_probs).mean()`): the paper's J(alpha) has alpha
  where this has log alpha, whose gradient has the same sign."""
  entropy_gap = jax.lax.stop_gradient(logp) + target_entropy_value
  return -jnp.mean(log_alpha_params["log_alpha"] * entropy_gap)


def _gradient_step(state: TrainState, loss_fn, *args):
  """One optimiser step of `state` on loss_fn(state.params, *args) -> (loss, aux): returns
  (state stepped, loss, aux)."""
  (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, *args)
  return state.apply_gradients(grads=grads), loss, aux


def _temperature_step(log_alpha: TrainState, logp, config: Config, action_dim: int, auto_alpha):
  """(log_alpha stepped on alpha_loss, the loss); unchanged and 0 where alpha is fixed. auto_alpha
  traced (per cell): the step is computed always and kept only where the cell learns alpha."""
  if not (config.agent.auto_alpha or auto_alpha is not None):
    return log_alpha, jnp.zeros((), jnp.float32)
  loss, grads = jax.value_and_grad(alpha_loss)(log_alpha.params, logp,
                                               target_entropy(config, action_dim))
  stepped = log_alpha.apply_gradients(grads=grads)
  if auto_alpha is None:
    return stepped, loss
  loss = jnp.where(auto_alpha, loss, 0.0)
  return jax.tree.map(lambda new, old: jnp.where(auto_alpha, new, old), stepped, log_alpha), loss


def update(agent: AgentState, batch: Batch, key: jax.Array, target_fn: TargetFn,
           config: Config, auto_alpha=None) -> Tuple[AgentState, Dict[str, jax.Array]]:
  """One gradient step of critics, actor and temperature, then the Polyak target update.

  Order as in the reference code (OfflineRL-Kit): critics on y (critic_loss), actor on the updated
  critics with the pre-step alpha (actor_loss), alpha on the actor's log-probabilities
  (alpha_loss), target params with tau. Returns (agent, metrics): f32 scalars critic_loss,
  actor_loss, alpha_loss, alpha, q_mean, target_mean, entropy, plus target_fn's aux (non-scalars
  averaged).
  auto_alpha: bool scalar, may be traced (default config.agent.auto_alpha): whether this agent
  learns its temperature; where not, log_alpha keeps its parameters and optimiser state and
  alpha_loss is 0. target_fn must see the same flag (train.make_epoch binds it).
  """
  _check_batch(batch)
  k_target, k_actor = jax.random.split(key)
  # Named scopes: the epoch's phases (train.PHASES), for the benchmarks' and profiles' counts;
  # metadata only, the same program.
  with jax.named_scope("critic_update"):
    y, aux = target_fn(agent, batch, k_target)
    y = jax.lax.stop_gradient(y).astype(batch.reward.dtype)
    chex.assert_shape(y, batch.reward.shape)
    critic, q_loss, q = _gradient_step(agent.critic, critic_loss, agent, batch, y)

  temperature = alpha(agent, config, auto_alpha)

  with jax.named_scope("actor_update"):
    actor, pi_loss, logp = _gradient_step(agent.actor, actor_loss, agent, critic.params, batch,
                                          k_actor, temperature, config)
    log_alpha, temperature_loss = _temperature_step(agent.log_alpha, logp, config,
                                                    batch.action.shape[-1], auto_alpha)

  with jax.named_scope("critic_update"):
    target_params = optax.incremental_update(critic.params, agent.target_critic_params,
                                             config.agent.tau)

  new_agent = agent.replace(actor=actor, critic=critic, target_critic_params=target_params,
                            log_alpha=log_alpha)
  metrics = {
      "critic_loss": q_loss, "actor_loss": pi_loss, "alpha_loss": temperature_loss,
      "alpha": temperature, "q_mean": q.mean(), "target_mean": y.mean(), "entropy": -logp.mean(),
  }
  for name, value in aux.items():
    metrics[name] = jnp.mean(value)
  metrics = {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}
  return new_agent, metrics


def make_scan_update(config: Config, target_fn: Optional[TargetFn] = None):
  """A jitted `steps(agent, batches, key) -> (agent, metrics)` running T updates as one lax.scan.

  batches: a Batch whose fields carry a leading step axis [T, B, ...]; metrics come back [T].
  target_fn defaults to `soft_target` with this config. The agent is donated.
  """
  if target_fn is None:
    target_fn = functools.partial(soft_target, config=config)

  def steps(agent, batches, key):
    keys = jax.random.split(key, batches.reward.shape[0])

    def body(carry, inputs):
      batch, k = inputs
      return update(carry, batch, k, target_fn, config)

    return jax.lax.scan(body, agent, (batches, keys))

  return jax.jit(steps, donate_argnums=0)


def _actor_apply(agent_or_params, obs, config: Config):
  if isinstance(agent_or_params, AgentState):
    return agent_or_params.actor.apply_fn(agent_or_params.actor.params, obs)
  params = agent_or_params
  return make_actor(config, actor_action_dim(params)).apply(params, obs)


def policy_sample(agent_or_actor_params, obs: jax.Array, key: jax.Array,
                  config: Config, piece_rows: Optional[int] = None) -> jax.Array:
  """a ~ pi(.|obs) [..., A] in [-1, 1] (stochastic, for rollouts and online data collection).

  Takes an AgentState or the actor's variables dict (agent.actor.params). piece_rows: run the
  actor on obs [B, S] in pieces of that many rows (pieces.map_rows; rollouts); the noise is drawn
  for all rows at once either way.
  """
  if piece_rows is None:
    mean, log_std = _actor_apply(agent_or_actor_params, obs, config)
  else:
    mean, log_std = pieces.map_rows(lambda o: _actor_apply(agent_or_actor_params, o, config),
                                    piece_rows, obs)
  action, _ = sample_tanh_gaussian(mean, log_std, key)
  return action


def policy_mode(agent_or_actor_params, obs: jax.Array, config: Config) -> jax.Array:
  """The deterministic evaluation action tanh(mean) [..., A]."""
  mean, _ = _actor_apply(agent_or_actor_params, obs, config)
  return deterministic_action(mean)
