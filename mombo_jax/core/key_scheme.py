"""A run's key scheme: experiments.run and experiments.train_dynamics derive seed i's dynamics key
the same way, so both train identical ensembles and either's can be reused by the other."""
import jax
import jax.numpy as jnp


def cell_keys(config):
  """The run's key scheme: (dynamics, init, epoch) keys [S] of seeds config.seed ...: seed i's
  are fold_in(PRNGKey(config.seed + i), 0 / 1 / 2)."""
  seeds = jnp.arange(config.seed, config.seed + config.num_seeds)
  seed_keys = jax.vmap(jax.random.PRNGKey)(seeds)
  return tuple(jax.vmap(lambda k, i=i: jax.random.fold_in(k, i))(seed_keys) for i in range(3))
