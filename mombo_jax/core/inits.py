"""Initial parameter values of every network, as the reference code (PyTorch) draws them.

Flax's `nn.Dense` defaults (lecun_normal kernel, zero bias) are not what the references use:

- Actor and critics: adinlab/MOMBO `models/nets.py` (MLP, MMDetLayer) and `models/dist.py`
  (TanhDiagGaussian's mu / sigma heads), like OfflineRL-Kit `offlinerlkit/nets/mlp.py` and
  `offlinerlkit/modules/dist_module.py`, build every layer from `torch.nn.Linear` with its default
  `reset_parameters`: kernel `kaiming_uniform_(a=sqrt(5))`, whose bound is
  gain * sqrt(3 / fan_in) with gain = sqrt(2 / (1 + 5)), i.e. U(-1/sqrt(fan_in), 1/sqrt(fan_in));
  bias U(-1/sqrt(fan_in), 1/sqrt(fan_in)). Std of both: 1 / sqrt(3 fan_in), 1/sqrt(3) = 0.58 of
  lecun_normal's.
- Dynamics ensemble: adinlab/MOMBO `models/nets.py` EnsembleLinear (the same as OfflineRL-Kit
  `offlinerlkit/nets/ensemble_linear.py`): kernel `torch.nn.init.trunc_normal_(std=1 / (2
  sqrt(fan_in)))` with its default bounds a=-2, b=2, which are ABSOLUTE values, not multiples of
  std: a N(0, std^2) cut to [-2, 2] (at fan_in 14, hopper's input, that is +-15 std: in effect an
  untruncated normal, unlike Flax's `truncated_normal`, which cuts at +-2 std and so draws 0.88x
  the std it is given); bias zeros
  (torch.zeros, never re-initialised). The learned log-variance bounds start at max 0.5 and min -10
  (adinlab/MOMBO `models/dynamics_model.py`; Config.dynamics.dyn_max_logvar_init /
  dyn_min_logvar_init).

Kernels are Flax's [fan_in, fan_out] (PyTorch's weight is [out, in]; fan_in is `in` in both).
Under nn.vmap (ensemble members) each member's initialiser sees its own unbatched shape.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

# torch.nn.init.trunc_normal_'s default truncation points (absolute values).
TORCH_TRUNC_A = -2.0
TORCH_TRUNC_B = 2.0


def _fan_in(shape) -> int:
  if len(shape) != 2:
    raise ValueError(f"Expected a dense kernel shape [fan_in, fan_out], got {tuple(shape)}.")
  if shape[0] < 1:
    raise ValueError(f"A dense kernel needs fan_in >= 1, got shape {tuple(shape)}.")
  return int(shape[0])


def torch_linear_bound(fan_in: int) -> float:
  """1 / sqrt(fan_in): the half-width of torch.nn.Linear's default kernel and bias draws."""
  return 1.0 / math.sqrt(fan_in)


def torch_linear_kernel(key, shape, dtype=jnp.float32):
  """torch.nn.Linear's default kernel [fan_in, fan_out]: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
  bound = torch_linear_bound(_fan_in(shape))
  return jax.random.uniform(key, shape, dtype, -bound, bound)


def torch_linear_bias(fan_in: int):
  """torch.nn.Linear's default bias initialiser for a layer with `fan_in` inputs:
  init(key, shape [fan_out], dtype) -> U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (the bias shape alone
  does not tell fan_in, hence the factory)."""
  if fan_in < 1:
    raise ValueError(f"torch_linear_bias needs fan_in >= 1, got {fan_in}.")
  bound = torch_linear_bound(fan_in)

  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, -bound, bound)

  return init


def ensemble_linear_std(fan_in: int) -> float:
  """1 / (2 sqrt(fan_in)): the std EnsembleLinear passes to trunc_normal_ (before truncation)."""
  return 1.0 / (2.0 * math.sqrt(fan_in))


def ensemble_linear_kernel(key, shape, dtype=jnp.float32):
  """EnsembleLinear's kernel: N(0, std^2), std = 1 / (2 sqrt(fan_in)), cut to the absolute interval
  [TORCH_TRUNC_A, TORCH_TRUNC_B] = [-2, 2] (torch.nn.init.trunc_normal_'s defaults), not rescaled.

  shape [fan_in, fan_out] (one member's; nn.vmap adds the member axis).
  """
  std = ensemble_linear_std(_fan_in(shape))
  w = jax.random.truncated_normal(key, TORCH_TRUNC_A / std, TORCH_TRUNC_B / std, shape, dtype)
  # The bounds hold in float32 too (trunc_normal_ clamps to [a, b] for the same reason).
  return jnp.clip(w * std, TORCH_TRUNC_A, TORCH_TRUNC_B)


def ensemble_linear_bias(key, shape, dtype=jnp.float32):
  """EnsembleLinear's bias: zeros."""
  del key
  return jnp.zeros(shape, dtype)
