"""Networks: a critic whose one set of parameters runs plain or moment-matching, the critic
ensemble (nn.vmap over a leading member axis) and the tanh-Gaussian actor.

Every layer starts as torch.nn.Linear does (kernel and bias U(+-1/sqrt(fan_in)), inits.py), as the
references' actor and critics do. Knows moments, nothing of RL losses.
"""
from typing import List, Optional, Sequence, Tuple

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp

from mombo_jax.core import inits, rewrites
from mombo_jax.moment_matching import lowrank as lowrank_moments
from mombo_jax.moment_matching.moments import mm_linear, mm_relu
from mombo_jax.moment_matching.propagate import propagate

# Kernels with at most this many output features (the critics' scalar heads) get their weight
# gradient as XLA:CPU's gemv on x in place instead of x^T written out (0: never; the benchmark's
# switch). Read when the backward is traced.
GEMV_FEATURES = 1


def matmul(x, kernel):
  """x [..., I] @ kernel [I, F] -> [..., F], as lax.dot_general computes it (the same forward
  program as `x @ kernel` and nn.Dense's). Its gradients: rewrites.in_effect().critic_matmul,
  'rewrite' (on CPU: written out for Eigen's dots, _matmul_bwd) or 'jax' (elsewhere: JAX's own
  transpose rule); read when traced."""
  if rewrites.in_effect().critic_matmul == "jax":
    return _dot(x, kernel)
  return _rewritten(x, kernel)


def _dot(x, kernel):
  return jax.lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())))


@jax.custom_vjp
def _rewritten(x, kernel):
  return _dot(x, kernel)


def _matmul_fwd(x, kernel):
  return _rewritten(x, kernel), (x, kernel)


def _matmul_bwd(residuals, g):
  """dx [..., I] = g @ kernel^T; dkernel [I, F] = x^T g with x as the left operand (F > 1), or
  x's rows contracted in place (F <= GEMV_FEATURES).

  Why: JAX's own transpose of dot_general computes g^T x [F, I] and transposes it. Plain, XLA
  folds that transpose into the dot; under a vmap of size 1 on top of the critics' member axis
  (the cell axis of cells_program.make_cells_chunk with one cell per device: every 1-seed run) it
  does not, and XLA:CPU then reads every weight gradient through a transpose in the optimiser's
  update (a MOPO epoch 0.93x the time without it: benchmarks/bench_epoch_changes.txt). Written as
  x^T g, the batched dot's output is already [..., I, F], whatever batch axes vmap adds in front.
  """
  x, kernel = residuals
  rows, grads = x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1])
  # kernel^T [F, I] and x^T [I, R] written out (the barriers keep XLA from folding them back into
  # the dots' dimension numbers): Eigen's dots of [I, R] x [R, F] and [R, F] x [F, I] run faster
  # than those contracting both operands' first or last axes, more than the transposes cost
  # (a MOPO epoch 0.98x).
  kernel_t = jax.lax.optimization_barrier(kernel.T)
  dx = jax.lax.dot_general(g, kernel_t, (((g.ndim - 1,), (0,)), ((), ())))
  if kernel.shape[-1] <= GEMV_FEATURES:
    # A scalar head's weight gradient is a matrix-vector product, which XLA:CPU runs as its own
    # gemv reading x in place, ~4x faster than writing x^T out first; from 2 features on, Eigen's
    # dot of x^T written out wins again (benchmarks/bench_head_grad.txt).
    dkernel = jax.lax.dot_general(rows, grads, (((0,), (0,)), ((), ())))
    return dx, dkernel
  rows_t = jax.lax.optimization_barrier(rows.T)
  dkernel = jax.lax.dot_general(rows_t, grads, (((1,), (0,)), ((), ())))
  return dx, dkernel


_rewritten.defvjp(_matmul_fwd, _matmul_bwd)


def _dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
  """nn.Dense's dot_general hook: its one call, x [..., I] @ kernel [I, F], through `matmul`."""
  if dimension_numbers != (((lhs.ndim - 1,), (0,)), ((), ())) or precision is not None \
      or preferred_element_type is not None:
    raise ValueError(f"critics._dot_general serves nn.Dense's x @ kernel only, got dimension "
                     f"numbers {dimension_numbers}, precision {precision}.")
  return matmul(lhs, rhs)


class MMDense(nn.Module):
  """Dense layer that maps either an array or a diagonal Gaussian (mean, var).

  __call__(x [..., I]) -> (y [..., F], None)
  __call__(x [..., I], var [..., K]) -> (mean [..., F], var [..., F]), K <= I: var holds the
  variances of the first K inputs and the other I - K inputs are exact (zero variance), so their
  kernel rows stay out of the variance matmul (the critic's actions).

  Initial values: torch.nn.Linear's (adinlab/MOMBO models/nets.py MMDetLayer wraps an nn.Linear;
  inits.torch_linear_kernel / torch_linear_bias).
  """
  features: int
  kernel_init: nn.initializers.Initializer = inits.torch_linear_kernel

  @nn.compact
  def __call__(self, x, var=None):
    kernel = self.param("kernel", self.kernel_init, (x.shape[-1], self.features), jnp.float32)
    bias = self.param("bias", inits.torch_linear_bias(x.shape[-1]), (self.features,), jnp.float32)
    if var is None:
      return matmul(x, kernel) + bias, None
    chex.assert_equal_shape_prefix([x, var], x.ndim - 1)
    num_var = var.shape[-1]
    if num_var > x.shape[-1]:
      raise ValueError(f"MMDense got variances for {num_var} inputs but only {x.shape[-1]} inputs; "
                       "pass var [..., K] with K <= the input size.")
    if num_var == x.shape[-1]:
      # The mean path is the plain path verbatim, so zero variance reproduces it bit for bit.
      return mm_linear(x, var, kernel, bias, product=matmul)
    rows = kernel[:num_var]
    return matmul(x, kernel) + bias, var @ (rows * rows)


class MMCritic(nn.Module):
  """Q(s, a) as a ReLU MLP with a linear scalar head.

  __call__(obs [..., S], action [..., A]) -> q [...]
  __call__(obs, action, obs_var [..., S]) -> (mean [...], var [...]): moment-matched through the
  same parameters; the action enters with zero variance.
  """
  hidden_dims: Sequence[int] = (256, 256)

  @nn.compact
  def __call__(self, obs, action, obs_var: Optional[jax.Array] = None):
    chex.assert_equal_shape_prefix([obs, action], obs.ndim - 1)
    x = jnp.concatenate([obs, action], axis=-1)
    var = None
    if obs_var is not None:
      chex.assert_equal_shape([obs, obs_var])
      # The action inputs come after the state's and have zero variance: MMDense leaves their
      # kernel rows out of the variance matmul (23 -> 17 rows at walker2d's sizes).
      var = obs_var
    for width in self.hidden_dims:
      x, var = MMDense(width)(x, var)
      if var is None:
        x = nn.relu(x)
      else:
        x, var = mm_relu(x, var)
    x, var = MMDense(1)(x, var)
    if var is None:
      return x[..., 0]
    return x[..., 0], var[..., 0]


class CriticEnsemble(nn.Module):
  """`num_critics` MMCritics with a leading parameter axis.

  Returns q [E, ...] (plain) or (mean [E, ...], var [E, ...]) (moment matching).
  """
  hidden_dims: Sequence[int] = (256, 256)
  num_critics: int = 2

  @nn.compact
  def __call__(self, obs, action, obs_var=None):
    # Every member sees the same inputs. They are broadcast to the member axis rather than shared
    # (in_axes=None): with shared inputs XLA merges the members' first layers into one
    # [B, S+A] @ [S+A, E*H] matmul whose [B, E, H] output then needs a transpose in every consumer
    # (~4% of a MOMBO training step on CPU, where the moment-matched layer has many consumers).
    size = self.num_critics
    tile = lambda x: None if x is None else jnp.broadcast_to(x, (size,) + x.shape)  # noqa: E731
    ensemble = nn.vmap(MMCritic, variable_axes={"params": 0}, split_rngs={"params": True},
                       in_axes=0, out_axes=0, axis_size=size)
    return ensemble(self.hidden_dims, name="members")(tile(obs), tile(action), tile(obs_var))


def ensemble_layers(params) -> List[Tuple[jax.Array, jax.Array]]:
  """[(kernel [E, I, F], bias [E, F])] of a CriticEnsemble's variables, in call order."""
  tree = params["params"]["members"]
  return [(tree[f"MMDense_{i}"]["kernel"], tree[f"MMDense_{i}"]["bias"]) for i in range(len(tree))]


def _mlp(layers):
  """The plain critic MLP on x [..., I] -> [...], for propagate's full mode."""
  def f(x):
    for j, (kernel, bias) in enumerate(layers):
      x = matmul(x, kernel) + bias
      if j < len(layers) - 1:
        x = jax.nn.relu(x)
    return x[..., 0]
  return f


def ensemble_moments(apply_fn, params, obs, action, obs_var, mode=("diagonal", None)):
  """(mean [E, ...], var [E, ...]) of a CriticEnsemble's Q(obs, action) at obs ~ N(obs,
  diag(obs_var)), action exact, by a moment mode: mode = (kind, rank), a moments setting parsed by
  algorithms.parse_moments (Config.moments_mode; this module cannot import the registry, which
  imports the targets that import it). "diagonal" is
  apply_fn(params, obs, action, obs_var) itself (MMCritic's path, the paper's); "lowrank[<k>]"
  lowrank_moments.mlp_moments per member (the mean path the plain layers' own matmuls, so zero
  variance gives the plain critic); "full" propagate(..., covariance="full") per member.
  obs, obs_var [..., S], action [..., A]."""
  kind, rank = mode
  if kind not in ("diagonal", "lowrank", "full"):
    raise ValueError(f"ensemble_moments: mode must be (kind, rank) with kind diagonal, lowrank or "
                     f"full (algorithms.parse_moments), got {mode!r}.")
  if kind == "diagonal":
    return apply_fn(params, obs, action, obs_var)
  chex.assert_equal_shape([obs, obs_var])
  layers = ensemble_layers(params)
  size = layers[0][0].shape[0]
  x = jnp.concatenate([obs, action], axis=-1)
  # Broadcast to the member axis, as CriticEnsemble does, so that the mean path is its program.
  tile = lambda v: jnp.broadcast_to(v, (size,) + v.shape)  # noqa: E731
  if kind == "lowrank":
    def member(layers, x, var):
      mean, var = lowrank_moments.mlp_moments(layers, x, var, rank=rank, product=matmul)
      return mean[..., 0], var[..., 0]
  else:
    def member(layers, x, var):
      full_var = jnp.concatenate([var, jnp.zeros_like(action)], axis=-1)
      return propagate(_mlp(layers), covariance="full", check_values=False)((x, full_var))
  return jax.vmap(member)(layers, tile(x), tile(obs_var))


def _torch_dense(features: int, x, name: Optional[str] = None):
  """nn.Dense(features)(x) [..., F] initialised as torch.nn.Linear(x.shape[-1], features); called
  inside a compact module, so Flax names it Dense_<i> there unless `name` is given."""
  return nn.Dense(features, kernel_init=inits.torch_linear_kernel,
                  bias_init=inits.torch_linear_bias(x.shape[-1]), name=name,
                  dot_general=_dot_general)(x)


def actor_layer_names(num_hidden: int) -> Tuple[List[str], str, str]:
  """(hidden layers, mean head, log-std head): the names of TanhGaussianActor's Dense layers, the
  one place that spells them. They are the names Flax gave the layers when they were unnamed
  (Dense_<i> in call order), kept so that every checkpoint and saved actor still loads."""
  names = [f"Dense_{i}" for i in range(num_hidden + 2)]
  return names[:num_hidden], names[num_hidden], names[num_hidden + 1]


class TanhGaussianActor(nn.Module):
  """pi(a | s): ReLU MLP -> (mean [..., A], log_std [..., A]) of the pre-tanh Gaussian.

  log_std is clamped to [log_std_min, log_std_max]. Layers (named by actor_layer_names: hidden,
  mean head, log-std head) start as torch.nn.Linear does: adinlab/MOMBO models/nets.py MLP
  and models/dist.py TanhDiagGaussian (mu and sigma are nn.Linear, conditioned_sigma=True).
  """
  hidden_dims: Sequence[int]
  action_dim: int
  log_std_min: float = -5.0
  log_std_max: float = 2.0

  @nn.compact
  def __call__(self, obs):
    hidden, mean_head, log_std_head = actor_layer_names(len(self.hidden_dims))
    x = obs
    for width, name in zip(self.hidden_dims, hidden):
      x = nn.relu(_torch_dense(width, x, name))
    mean = _torch_dense(self.action_dim, x, mean_head)
    log_std = jnp.clip(_torch_dense(self.action_dim, x, log_std_head), self.log_std_min,
                       self.log_std_max)
    return mean, log_std


def sample_tanh_gaussian(mean, log_std, key):
  """Reparameterised a = tanh(mean + std * eps) and log pi(a|s) [...] with the tanh correction."""
  return tanh_gaussian(mean, log_std, jax.random.normal(key, mean.shape, mean.dtype))


def tanh_gaussian(mean, log_std, eps):
  """sample_tanh_gaussian with its standard-normal draw eps [..., A] given (the fidelity harness,
  benchmarks/fidelity/ours.py, hands the reference's sampler the same eps)."""
  pre = mean + jnp.exp(log_std) * eps
  action = jnp.tanh(pre)
  log_prob = jnp.sum(-0.5 * eps**2 - log_std - 0.5 * jnp.log(2 * jnp.pi), axis=-1)
  log_prob -= jnp.sum(jnp.log(1.0 - action**2 + 1e-6), axis=-1)
  return action, log_prob


def deterministic_action(mean):
  """The evaluation action tanh(mean)."""
  return jnp.tanh(mean)
