"""mombo_jax.propagate: exactness (zero variance, the hand-written mm_linear / mm_relu chain, the
critic's own moment-matched path), composition with jit / vmap / grad, float64, the errors.

Monte Carlo agreement is in tests/test_propagate_mc.py. Bit-for-bit equalities compare two
programs built from the same operations in the same order (as tests/test_critics_mm.py does for the
critic), not a float against a stored number, at one matmul precision (the session's float32,
tests/conftest.py; at TF32 too: test_the_critic_path_is_propagate_bit_for_bit_at_tf32_too).
Agreements of differently built computations use tests/matmul_precision.py's tolerance.
"""
import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mombo_jax
from mombo_jax.core.critics import CriticEnsemble
from mombo_jax.errors import InvalidArgument
from mombo_jax.moment_matching.moments import mm_leaky_relu, mm_linear, mm_relu
from mombo_jax.moment_matching.propagate import PropagateError, propagate
from tests import matmul_precision

IN, HID, OUT, B = 5, 8, 2, 4
DOTS = 3                 # MLP's dots, at most HID wide


def _assert_close(got, want):
  """Two evaluations of MLP's moments (mean, var) agree up to their dots' rounding at the matmul
  precision in use (tests/matmul_precision.py): XLA may compute them otherwise (a batched dot
  against one row per call; on a GPU even at another precision)."""
  for g, w in zip(got, want, strict=True):
    matmul_precision.assert_close(g, w, DOTS, HID)


class MLP(nn.Module):
  """A Flax MLP written the usual way; `act` picks the spelling of the activation."""
  act: str = "relu"

  @nn.compact
  def __call__(self, x):
    for width in (HID, HID):
      x = nn.Dense(width)(x)
      x = {"relu": nn.relu, "leaky": nn.leaky_relu, "maximum": lambda y: jnp.maximum(y, 0.0),
           "where": lambda y: jnp.where(y > 0, y, 0.0)}[self.act](x)
    return nn.Dense(OUT)(x)


def _hand_chain(params, mean, var, act=mm_relu):
  """The same network written by hand with mm_linear / mm_relu (what core/critics.py does)."""
  layers = params["params"]
  for i in range(3):
    mean, var = mm_linear(mean, var, layers[f"Dense_{i}"]["kernel"], layers[f"Dense_{i}"]["bias"])
    if i < 2:
      mean, var = act(mean, var)
  return mean, var


def _inputs(dtype=jnp.float32, seed=0):
  rng = np.random.default_rng(seed)
  x = jnp.asarray(rng.normal(size=(B, IN)), dtype)
  var = jnp.asarray(rng.uniform(0.01, 2.0, size=(B, IN)), dtype)
  return x, var


@pytest.fixture(scope="module")
def mlp():
  x, var = _inputs()
  params = MLP().init(jax.random.PRNGKey(0), x)
  return params, x, var


def _loss(fn):
  """A scalar of both moments, so gradients see the mean and the variance paths."""
  return lambda params, m, v: jnp.sum(fn(params, m, v)[0] * 1.5 + fn(params, m, v)[1] * 0.7)


def test_flax_mlp_equals_the_hand_written_chain_bit_for_bit_with_gradients(mlp):
  params, x, var = mlp
  auto = lambda p, m, v: propagate(MLP().apply, argnums=1)(p, (m, v))  # noqa: E731
  got = jax.jit(auto)(params, x, var)
  want = jax.jit(_hand_chain)(params, x, var)
  chex.assert_shape(got, ((B, OUT), (B, OUT)))
  for g, w in zip(got, want):
    np.testing.assert_array_equal(g, w)
  g_auto = jax.jit(jax.grad(_loss(auto), argnums=(0, 1, 2)))(params, x, var)
  g_hand = jax.jit(jax.grad(_loss(_hand_chain), argnums=(0, 1, 2)))(params, x, var)
  chex.assert_trees_all_equal(g_auto, g_hand)
  assert float(jnp.max(jnp.abs(g_auto[2]))) > 0    # the variance path is differentiated


@pytest.mark.parametrize("act", ["relu", "leaky", "maximum", "where"])
def test_every_relu_spelling_gives_the_hand_chain(mlp, act):
  params, x, var = mlp
  got = propagate(MLP(act).apply, argnums=1)(params, (x, var))
  moments = mm_leaky_relu if act == "leaky" else mm_relu
  want = _hand_chain(params, x, var, moments)
  _assert_close(got, want)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("act", ["relu", "leaky"])
def test_zero_variance_is_the_plain_function_bit_for_bit(dtype, act):
  with jax.enable_x64(dtype == np.float64):
    x, _ = _inputs(dtype)
    net = MLP(act)
    params = jax.tree.map(lambda p: p.astype(dtype), net.init(jax.random.PRNGKey(1), x))
    mean, var = jax.jit(propagate(net.apply, argnums=1))(params, (x, jnp.zeros_like(x)))
    plain = jax.jit(net.apply)(params, x)
    assert mean.dtype == var.dtype == dtype
    np.testing.assert_array_equal(mean, plain)
    np.testing.assert_array_equal(var, np.zeros_like(var))


def test_float64_matches_the_float64_hand_chain():
  with jax.enable_x64(True):
    x, var = _inputs(np.float64)
    params = jax.tree.map(lambda p: p.astype(np.float64), MLP().init(jax.random.PRNGKey(2), x))
    got = propagate(MLP().apply, argnums=1)(params, (x, var))
    want = _hand_chain(params, x, var)
    assert got[0].dtype == np.float64
    chex.assert_trees_all_close(got, want, rtol=1e-13, atol=1e-15)


def test_composes_with_jit_and_vmap(mlp):
  params, x, var = mlp
  fn = propagate(MLP().apply, argnums=1)
  batched = fn(params, (x, var))
  per_row = jax.vmap(lambda m, v: fn(params, (m, v)))(x, var)
  jitted = jax.jit(fn)(params, (x, var))
  _assert_close(per_row, batched)
  _assert_close(jitted, batched)


def test_critic_moment_matched_path_is_propagate_on_the_plain_critic():
  """The project's MM critic (CriticEnsemble with obs_var) equals propagate on the plain critic,
  forward and gradients, bit for bit: one way the project does moment matching."""
  net = CriticEnsemble((16, 16), 2)
  rng = np.random.default_rng(3)
  obs = jnp.asarray(rng.normal(size=(B, 6)), jnp.float32)
  act = jnp.asarray(rng.uniform(-1, 1, size=(B, 3)), jnp.float32)
  obs_var = jnp.asarray(rng.uniform(0.0, 0.5, size=(B, 6)), jnp.float32)
  params = net.init(jax.random.PRNGKey(3), obs, act)
  own = lambda p, o, v: net.apply(p, o, act, v)  # noqa: E731
  auto = lambda p, o, v: propagate(net.apply, argnums=1)(p, (o, v), act)  # noqa: E731
  got, want = jax.jit(auto)(params, obs, obs_var), jax.jit(own)(params, obs, obs_var)
  chex.assert_shape(got, ((2, B), (2, B)))
  chex.assert_trees_all_equal(got, want)
  g_auto = jax.jit(jax.grad(_loss(auto), argnums=(0, 1, 2)))(params, obs, obs_var)
  g_own = jax.jit(jax.grad(_loss(own), argnums=(0, 1, 2)))(params, obs, obs_var)
  chex.assert_trees_all_equal(g_auto, g_own)


def test_the_critic_path_is_propagate_bit_for_bit_at_tf32_too():
  """The equality above does not rest on float32: with every dot's inputs rounded to TF32
  (matmul_precision.emulate_tf32, what a GPU's tensor cores take), both paths round the same
  operands, and still agree bit for bit, while either differs from its float32 self."""
  net = CriticEnsemble((16, 16), 2)
  rng = np.random.default_rng(5)
  obs = jnp.asarray(rng.normal(size=(B, 6)), jnp.float32)
  act = jnp.asarray(rng.uniform(-1, 1, size=(B, 3)), jnp.float32)
  obs_var = jnp.asarray(rng.uniform(0.1, 0.5, size=(B, 6)), jnp.float32)
  params = net.init(jax.random.PRNGKey(5), obs, act)
  own = lambda p: net.apply(p, obs, act, obs_var)  # noqa: E731
  auto = lambda p: propagate(net.apply, argnums=1)(p, (obs, obs_var), act)  # noqa: E731
  (got, n_auto), (want, n_own) = (matmul_precision.emulate_tf32(f)(params) for f in (auto, own))
  assert n_own == 6 and n_auto >= n_own              # 3 layers' mean and variance dots
  chex.assert_trees_all_equal(got, want)
  assert not np.array_equal(want[0], jax.jit(own)(params)[0])


def test_two_random_values_are_combined_as_independent():
  rng = np.random.default_rng(4)
  mx, vx, my, vy = (jnp.asarray(rng.uniform(0.1, 2.0, size=3), jnp.float32) for _ in range(4))
  fn = propagate(lambda x, y: {"sum": x + y, "prod": x * y, "diff": x - 2.0 * y}, argnums=(0, 1))
  out = fn((mx, vx), (my, vy))
  chex.assert_trees_all_close(out["sum"], (mx + my, vx + vy), rtol=1e-6)
  chex.assert_trees_all_close(out["diff"], (mx - 2 * my, vx + 4 * vy), rtol=1e-6)
  chex.assert_trees_all_close(out["prod"], (mx * my, vx * vy + vx * my**2 + vy * mx**2),
                              rtol=1e-6)


def test_plain_jnp_network_deterministic_outputs_and_max_with_a_constant():
  """An Equinox-style function of a single vector: W @ x, a max against a non-zero constant, a
  deterministic second output (variance 0)."""
  rng = np.random.default_rng(5)
  w = jnp.asarray(rng.normal(size=(4, 3)), jnp.float32)
  b = jnp.asarray(rng.normal(size=4), jnp.float32)

  def fn(x, scale):
    h = w @ x + b
    return jnp.maximum(h, 0.25), scale * 2.0

  x, var = jnp.asarray([0.3, -1.0, 2.0], jnp.float32), jnp.asarray([0.5, 0.1, 1.0], jnp.float32)
  (m, v), (s, s_var) = propagate(fn)((x, var), jnp.float32(3.0))
  m_ref, v_ref = mm_relu(w @ x + b - 0.25, (w * w) @ var)
  chex.assert_trees_all_close((m, v), (m_ref + 0.25, v_ref), rtol=1e-6, atol=1e-7)
  assert float(s) == 6.0 and float(s_var) == 0.0


def test_unsupported_layer_names_the_primitive_and_the_users_line(mlp):
  params, x, var = mlp

  class Tanh(nn.Module):
    @nn.compact
    def __call__(self, x):
      return jnp.tanh(nn.Dense(3)(x))   # the line the error must name

  tanh_params = Tanh().init(jax.random.PRNGKey(0), x)
  with pytest.raises(PropagateError) as err:
    propagate(Tanh().apply, argnums=1)(tanh_params, (x, var))
  first, source, todo, supported = str(err.value).splitlines()
  assert "`tanh`" in first and "test_propagate.py" in first, first
  assert "jnp.tanh(nn.Dense(3)(x))" in source and todo.startswith("What to do:"), (source, todo)
  assert supported.startswith("Supported:") and "relu" in err.value.supported
  with pytest.raises(PropagateError, match="`argmax`"):
    propagate(lambda v: v[jnp.argmax(v)])((x[0], var[0]))
  with pytest.raises(PropagateError, match="comparison"):
    propagate(lambda v: v > 0)((x, var))
  with pytest.raises(PropagateError, match="`jax.nn.softmax` at .*test_propagate.py.*`reduce_max`"):
    propagate(jax.nn.softmax)((x, var))   # a library function as fn: it and the call are named


def test_bad_arguments_say_what_to_pass(mlp):
  params, x, var = mlp
  with pytest.raises(InvalidArgument, match=r"\(mean, var\) pair"):
    propagate(MLP().apply, argnums=1)(params, x)
  with pytest.raises(InvalidArgument, match="covariance"):
    propagate(MLP().apply, covariance="banded")
  with pytest.raises(InvalidArgument, match="argnums"):
    propagate(MLP().apply, argnums=3)(params, (x, var))


def test_public_and_lazy():
  assert mombo_jax.propagate is propagate


def test_full_covariance_is_exact_through_affine_maps_and_plain_at_zero():
  rng = np.random.default_rng(6)
  w1 = jnp.asarray(rng.normal(size=(3, 4)), jnp.float32)
  w2 = jnp.asarray(rng.normal(size=(4, 2)), jnp.float32)
  fn = lambda x: (x @ w1 + 1.0) @ w2 * 0.5  # noqa: E731
  root = rng.normal(size=(3, 3))
  cov = jnp.asarray(root @ root.T, jnp.float32)
  x = jnp.asarray(rng.normal(size=(2, 3)), jnp.float32)
  mean, out_cov = jax.jit(propagate(fn, covariance="full"))((x, jnp.broadcast_to(cov, (2, 3, 3))))
  lin = np.asarray(w1 @ w2) * 0.5
  chex.assert_shape(out_cov, (2, 2, 2))
  np.testing.assert_allclose(out_cov, np.broadcast_to(lin.T @ np.asarray(cov) @ lin, (2, 2, 2)),
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(mean, jax.jit(fn)(x))
  # Zero covariance through a relu network: the plain output, covariance exactly 0.
  net = MLP()
  params = net.init(jax.random.PRNGKey(0), x)
  m0, c0 = jax.jit(propagate(net.apply, argnums=1, covariance="full"))(params, (x, 0 * x))
  np.testing.assert_array_equal(m0, jax.jit(net.apply)(params, x))
  np.testing.assert_array_equal(c0, np.zeros((2, OUT, OUT)))
  g = jax.jit(jax.grad(lambda p: jnp.sum(propagate(net.apply, argnums=1, covariance="full")(
      p, (x, jnp.ones_like(x)))[1])))(params)
  assert all(bool(jnp.all(jnp.isfinite(leaf))) for leaf in jax.tree.leaves(g))


def test_relu_covariance_choice_is_checked_and_dvi_is_plain_at_zero():
  x = jnp.ones((2, IN))
  net = MLP()
  params = net.init(jax.random.PRNGKey(0), x)
  with pytest.raises(InvalidArgument, match="relu_covariance='dvi' applies to covariance='full'"):
    propagate(net.apply, argnums=1, relu_covariance="dvi")
  with pytest.raises(InvalidArgument, match="relu_covariance='exact' is not one of"):
    propagate(net.apply, argnums=1, covariance="full", relu_covariance="exact")
  m0, c0 = jax.jit(propagate(net.apply, argnums=1, covariance="full",
                             relu_covariance="dvi"))(params, (x, 0 * x))
  np.testing.assert_array_equal(m0, jax.jit(net.apply)(params, x))
  np.testing.assert_array_equal(c0, np.zeros((2, OUT, OUT)))
