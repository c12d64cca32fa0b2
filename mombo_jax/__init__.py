"""mombo_jax: MOMBO, MOBILE and MOPO for offline RL in JAX/Flax.

The public API is importable from here, lazily (a run in one call: `mombo_jax.fit(env, algo=...,
seeds=..., workdir=..., **settings)`, run/fit.py): `import mombo_jax` imports none of JAX's heavy
neighbours (orbax, minari, gymnasium); each name loads its module on first use. The package's
layers (docs/architecture.md) are its subpackages.
"""
import importlib

__version__ = "0.1.0"

# name -> the module that defines it (imported on first access)
_API = {
    "mm_relu": "mombo_jax.moment_matching.moments",
    "mm_linear": "mombo_jax.moment_matching.moments",
    "mm_leaky_relu": "mombo_jax.moment_matching.moments",
    "mc_moments": "mombo_jax.moment_matching.monte_carlo",
    "propagate": "mombo_jax.moment_matching.propagate",
    "moment_matching_bound": "mombo_jax.moment_matching.bounds",
    "relu_moment_matching_bound": "mombo_jax.moment_matching.bounds",
    "load_policy": "mombo_jax.analysis.policy",
    "Transitions": "mombo_jax.data.transitions",
    "load_transitions": "mombo_jax.data.transitions",
    "normalized_score": "mombo_jax.data.scores",
    "ref_scores": "mombo_jax.data.scores",
    "termination_fn": "mombo_jax.core.termination",
    "model_done": "mombo_jax.core.termination",
    "make_epoch": "mombo_jax.core.train",
    "fit": "mombo_jax.run.fit",
}

__all__ = sorted(_API)


def __getattr__(name):
  module = _API.get(name)
  if module is None:
    raise AttributeError(f"module 'mombo_jax' has no attribute {name!r}")
  value = getattr(importlib.import_module(module), name)
  globals()[name] = value          # later accesses skip this function
  return value


def __dir__():
  return sorted(set(globals()) | set(_API))
