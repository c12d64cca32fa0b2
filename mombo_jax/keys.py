"""A run's key scheme: seed i's dynamics, initialisation and epoch keys. experiments.run and
experiments.train_dynamics both derive them here, so both train identical ensembles and either's
can be reused by the other."""
from __future__ import annotations


def cell_keys(config):
  """The run's key scheme: (dynamics, init, epoch) keys [S] of seeds config.seed ...: seed i's
  are fold_in(PRNGKey(config.seed + i), 0 / 1 / 2)."""
  import jax
  import jax.numpy as jnp
  seeds = jnp.arange(config.seed, config.seed + config.num_seeds)
  seed_keys = jax.vmap(jax.random.PRNGKey)(seeds)
  return tuple(jax.vmap(lambda k, i=i: jax.random.fold_in(k, i))(seed_keys) for i in range(3))
