"""The two halves of one gradient step of each side, for profile.py only: (1) the critic update
with its Bellman target, (2) the actor and temperature updates with the Polyak target update.

Neither implementation exposes these halves as functions, so each is re-written here after the
code it mirrors, line for line in what it computes (same networks, same calls, same order of
arithmetic); the whole step is timed unchanged beside them (profile.py: "gradient step, as in the
epoch"), so that their sum can be checked against it. After a change to mombo_jax/core/sac.py the
`ours_*` halves may need the same change (they call sac's functions, not its update).
"""
import jax
import jax.numpy as jnp
import optax

from mombo_jax.core import sac

# ---- ours: mombo_jax/core/sac.py update, split after the critics' optimiser step ----------------

def ours_critic(agent, batch, key, target_fn, config):
  """sac.update's target + critic loss + critic optimiser step -> (agent, loss)."""
  k_target, _ = jax.random.split(key)
  y, _ = target_fn(agent, batch, k_target)
  y = jax.lax.stop_gradient(y).astype(jnp.float32)

  def loss_fn(params):
    q = agent.critic.apply_fn(params, batch.obs, batch.action)
    return jnp.sum(jnp.mean((q - y[None]) ** 2, axis=1)), q

  (loss, q), grads = jax.value_and_grad(loss_fn, has_aux=True)(agent.critic.params)
  return agent.replace(critic=agent.critic.apply_gradients(grads=grads)), (loss, q.mean(),
                                                                           y.mean())


def ours_actor_alpha(agent, batch, key, config):
  """sac.update's actor loss and step (on the current critics), the temperature step and the
  Polyak update -> (agent, losses)."""
  _, k_actor = jax.random.split(key)
  temperature = sac.alpha(agent, config)

  def actor_loss_fn(params):
    mean, log_std = agent.actor.apply_fn(params, batch.obs)
    action, logp = sac.sample_tanh_gaussian(mean, log_std, k_actor)
    q_pi = sac._critic_values(agent, agent.critic.params, batch.obs, action, batch.obs_var,
                              config).min(0)
    return jnp.mean(temperature * logp - q_pi), logp

  (actor_loss, logp), grads = jax.value_and_grad(actor_loss_fn, has_aux=True)(
      agent.actor.params)
  actor = agent.actor.apply_gradients(grads=grads)
  gap = jax.lax.stop_gradient(logp) + sac.target_entropy(config, batch.action.shape[-1])
  alpha_loss, alpha_grads = jax.value_and_grad(
      lambda p: -jnp.mean(p["log_alpha"] * gap))(agent.log_alpha.params)
  log_alpha = agent.log_alpha.apply_gradients(grads=alpha_grads)
  target = optax.incremental_update(agent.critic.params, agent.target_critic_params,
                                    config.agent.tau)
  return agent.replace(actor=actor, log_alpha=log_alpha, target_critic_params=target), (
      actor_loss, alpha_loss, -logp.mean())


# ---- theirs: unifloral algorithms/mopo.py make_train_step, split the same way ---------------

def theirs_critic(side, agent, batch, rng):
  """make_train_step's "Compute targets" and "Update critics" blocks -> (agent, loss)."""
  actor_apply, q_apply, args = side.actor_net.apply, side.q_net.apply, side.args
  alpha = jnp.exp(side.alpha_net.apply(agent.alpha.params))

  def _sample_next_v(rng, transition):
    next_pi = actor_apply(agent.actor.params, transition.next_obs)
    next_action, log_next_pi = next_pi.sample_and_log_prob(seed=rng)
    next_q = q_apply(agent.vec_q_target.params, transition.next_obs, next_action)
    return next_q.min(-1) - alpha * log_next_pi.sum(-1)

  next_v = jax.vmap(_sample_next_v)(jax.random.split(rng, args.batch_size), batch)
  target = batch.reward + args.gamma * (1 - batch.done) * next_v

  def _q_loss_fn(params):
    q_pred = q_apply(params, batch.obs, batch.action)
    return jnp.square((q_pred - jnp.expand_dims(target, -1))).sum(-1).mean()

  loss, grads = jax.value_and_grad(_q_loss_fn)(agent.vec_q.params)
  return agent._replace(vec_q=agent.vec_q.apply_gradients(grads=grads)), loss


def theirs_actor_alpha(side, agent, batch, rng):
  """make_train_step's "Update alpha", "Update actor" and "Update Q target network" blocks."""
  actor_apply, q_apply, args = side.actor_net.apply, side.q_net.apply, side.args
  rng_alpha, rng_actor = jax.random.split(rng)

  def _alpha_loss_fn(params, rng):
    def _entropy(rng, transition):
      _, log_pi = actor_apply(agent.actor.params, transition.obs).sample_and_log_prob(seed=rng)
      return -log_pi.sum()
    entropy = jax.vmap(_entropy)(jax.random.split(rng, args.batch_size), batch).mean()
    return side.alpha_net.apply(params) * (entropy + batch.action.shape[-1])

  alpha_loss, grads = jax.value_and_grad(_alpha_loss_fn)(agent.alpha.params, rng_alpha)
  agent = agent._replace(alpha=agent.alpha.apply_gradients(grads=grads))
  alpha = jnp.exp(side.alpha_net.apply(agent.alpha.params))

  def _actor_loss(params, rng):
    def _loss(rng, transition):
      action, log_pi = actor_apply(params, transition.obs).sample_and_log_prob(seed=rng)
      q = q_apply(agent.vec_q.params, transition.obs, action)
      return -jnp.min(q) + alpha * log_pi.sum(), q.std()
    loss, q_std = jax.vmap(_loss)(jax.random.split(rng, args.batch_size), batch)
    return loss.mean(), q_std.mean()

  (actor_loss, _), grads = jax.value_and_grad(_actor_loss, has_aux=True)(agent.actor.params,
                                                                          rng_actor)
  agent = agent._replace(actor=agent.actor.apply_gradients(grads=grads))
  target = optax.incremental_update(agent.vec_q.params, agent.vec_q_target.params,
                                    args.polyak_step_size)
  agent = agent._replace(vec_q_target=agent.vec_q_target.replace(
      step=agent.vec_q_target.step + 1, params=target))
  return agent, (actor_loss, alpha_loss)
