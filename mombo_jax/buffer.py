"""Batches of transitions and the fixed-capacity synthetic ring buffer (a pytree, never mutated).

Batch fields, per row (B rows; S = obs dim, A = action dim):
  obs [B, S], action [B, A], reward [B] (the sampled reward; MOPO: already penalised),
  next_obs [B, S] (the sampled next state; real data: the recorded one), done [B] float32 (1 = terminal),
  obs_var [B, S] (variance of the state itself: 0 for real rows and at a rollout's first step),
  next_obs_mean [B, S], next_obs_var [B, S], reward_mean [B], reward_var [B]
  (the Gaussian of the elite that produced the row; real rows: mean = recorded value, var = 0).
"""
import chex
import flax.struct as struct
import jax
import jax.numpy as jnp
import numpy as np


class Batch(struct.PyTreeNode):
  obs: jax.Array
  action: jax.Array
  reward: jax.Array
  next_obs: jax.Array
  done: jax.Array
  obs_var: jax.Array
  next_obs_mean: jax.Array
  next_obs_var: jax.Array
  reward_mean: jax.Array
  reward_var: jax.Array


def from_transitions(transitions) -> Batch:
  """Real data (data.Transitions, numpy) -> Batch with zero variances, float32."""
  obs = np.asarray(transitions.observations, np.float32)
  next_obs = np.asarray(transitions.next_observations, np.float32)
  reward = np.asarray(transitions.rewards, np.float32)
  return Batch(
      obs=jnp.asarray(obs), action=jnp.asarray(transitions.actions, jnp.float32),
      reward=jnp.asarray(reward), next_obs=jnp.asarray(next_obs),
      done=jnp.asarray(transitions.terminals, jnp.float32),
      obs_var=jnp.zeros_like(obs), next_obs_mean=jnp.asarray(next_obs),
      next_obs_var=jnp.zeros_like(next_obs), reward_mean=jnp.asarray(reward),
      reward_var=jnp.zeros_like(reward))
