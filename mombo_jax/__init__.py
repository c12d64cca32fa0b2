"""mombo_jax: MOMBO, MOBILE and MOPO for offline RL in JAX/Flax."""
from mombo_jax.moments import mc_moments, mm_linear, mm_relu
from mombo_jax.policy import load_policy   # light: its heavy imports happen on first use

__all__ = ["mm_relu", "mm_linear", "mc_moments", "load_policy"]
__version__ = "0.1.0"
