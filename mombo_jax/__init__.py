"""mombo_jax: MOMBO, MOBILE and MOPO for offline RL in JAX/Flax."""
from mombo_jax.moments import mc_moments, mm_linear, mm_relu

__all__ = ["mm_relu", "mm_linear", "mc_moments"]
__version__ = "0.1.0"
