"""moment_matching/lowrank.py (issue #49 item 1): the low-rank mode against the plain network (zero
variance), the exact answer (a network without ReLUs), a float64 re-derivation, Monte Carlo on a
tiny ReLU net, and under jit / vmap; critics.ensemble_moments' modes on a CriticEnsemble."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.stats import norm

from mombo_jax.core import algorithms, critics
from mombo_jax.moment_matching import lowrank as lowrank_moments
from mombo_jax.moment_matching.propagate import propagate

S, A, H, B = 5, 2, 24, 6


def _net(seed=0, widths=(H, H, 1)):
  """[(kernel, bias)] of a random ReLU MLP on S + A inputs (kernels ~ N(0, 1 / fan_in))."""
  rng = np.random.default_rng(seed)
  layers, fan_in = [], S + A
  for width in widths:
    layers.append((jnp.asarray(rng.normal(size=(fan_in, width)) / np.sqrt(fan_in), jnp.float32),
                   jnp.asarray(0.3 * rng.normal(size=width), jnp.float32)))
    fan_in = width
  return layers


def _inputs(seed=1, scale=0.5):
  rng = np.random.default_rng(seed)
  x = jnp.asarray(rng.normal(size=(B, S + A)), jnp.float32)
  var = jnp.asarray(scale * np.exp(rng.normal(size=(B, S))), jnp.float32)
  return x, var


def _plain(layers):
  def f(x):
    for j, (kernel, bias) in enumerate(layers):
      x = x @ kernel + bias
      if j < len(layers) - 1:
        x = jax.nn.relu(x)
    return x
  return f


def np_lowrank(layers, x, var, rank=None):
  """The module docstring's recursion in float64, written out independently: (mean, var)."""
  x, var = np.asarray(x, np.float64), np.asarray(var, np.float64)
  w0, b0 = (np.asarray(a, np.float64) for a in layers[0])
  k = var.shape[-1]
  m = x @ w0 + b0
  energy = var * np.sum(w0[:k] ** 2, axis=1)
  loadings, d = [], np.zeros_like(m)
  for row in range(x.shape[0]):
    order = np.argsort(-energy[row], kind="stable")
    kept = order if rank is None else order[:rank]
    dropped = [j for j in range(k) if j not in set(kept)]
    loadings.append(np.sqrt(var[row, kept])[:, None] * w0[kept])
    d[row] = var[row, dropped] @ (w0[dropped] ** 2)
  loadings = np.stack(loadings)                                   # [B, r, F]
  for kernel, bias in layers[1:]:
    kernel, bias = np.asarray(kernel, np.float64), np.asarray(bias, np.float64)
    v = np.sum(loadings**2, axis=1) + d
    s = np.sqrt(v)
    a = m / s
    mean = m * norm.cdf(a) + s * norm.pdf(a)
    second = (m**2 + v) * norm.cdf(a) + m * s * norm.pdf(a)
    loadings = loadings * norm.cdf(a)[:, None, :]
    d = np.maximum(second - mean**2 - np.sum(loadings**2, axis=1), 0.0)
    m, loadings, d = mean @ kernel + bias, loadings @ kernel, d @ kernel**2
  return m, np.sum(loadings**2, axis=1) + d


def test_zero_variance_is_the_plain_network_bit_for_bit():
  layers, (x, var) = _net(), _inputs()
  both = jax.jit(lambda x, v: (_plain(layers)(x),
                               lowrank_moments.mlp_moments(layers, x, v),
                               lowrank_moments.mlp_moments(layers, x, v, rank=2)))
  plain, (m, v), (m2, v2) = both(x, jnp.zeros_like(var))
  np.testing.assert_array_equal(np.asarray(m), np.asarray(plain))
  np.testing.assert_array_equal(np.asarray(m2), np.asarray(plain))
  assert float(jnp.abs(v).max()) == float(jnp.abs(v2).max()) == 0.0


def test_a_network_without_relus_is_exact():
  """Two affine layers: the output covariance W2^T W1_s^T diag(var) W1_s W2 exactly (float64)."""
  (w1, b1), (w2, b2) = _net(widths=(H, 3))
  x, var = _inputs()
  m, loadings, d = lowrank_moments.lowrank_input(x, var, w1, b1)
  m, loadings, d = lowrank_moments.lr_linear(m, loadings, d, w2, b2)
  got = np.asarray(lowrank_moments.total_var(loadings, d), np.float64)
  w = np.asarray(w1, np.float64)[:S] @ np.asarray(w2, np.float64)           # [S, 3]
  exact = np.einsum("bs,sf->bf", np.asarray(var, np.float64), w * w)
  np.testing.assert_allclose(got, exact, rtol=2e-5)
  np.testing.assert_allclose(np.asarray(m), (np.asarray(x) @ w1 + b1) @ w2 + b2, rtol=2e-5,
                             atol=2e-6)
  # The diagonal mode is not exact here: it drops the first layer's correlations.
  _, v_diag = propagate(lambda x: (x @ w1 + b1) @ w2 + b2)(
      (x, jnp.concatenate([var, jnp.zeros((B, A))], -1)))
  assert np.max(np.abs(np.asarray(v_diag) - exact) / exact) > 0.05


@pytest.mark.parametrize("rank", [None, 3, 1])
def test_matches_its_float64_derivation(rank):
  layers, (x, var) = _net(widths=(H, H, 1)), _inputs()
  m, v = lowrank_moments.mlp_moments(layers, x, var, rank=rank)
  want_m, want_v = np_lowrank(layers, x, var, rank)
  np.testing.assert_allclose(np.asarray(m), want_m, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(np.asarray(v), want_v, rtol=1e-4, atol=1e-6)


def test_rank_truncation_keeps_the_first_layers_variances():
  (w1, b1), (x, var) = _net()[0], _inputs()
  full = lowrank_moments.total_var(*lowrank_moments.lowrank_input(x, var, w1, b1)[1:])
  for rank in (1, 3, S, S + 4):
    m, loadings, d = lowrank_moments.lowrank_input(x, var, w1, b1, rank=rank)
    assert loadings.shape == (B, min(rank, S), H)
    np.testing.assert_allclose(np.asarray(lowrank_moments.total_var(loadings, d)),
                               np.asarray(full), rtol=1e-5)


def test_within_tolerance_of_monte_carlo_on_a_tiny_relu_net_where_the_diagonal_is_not():
  layers, (x, var) = _net(seed=3), _inputs(seed=4, scale=1.0)
  eps = jax.random.normal(jax.random.PRNGKey(0), (100_000, B, S))
  xs = x + jnp.concatenate([jnp.sqrt(var) * eps, jnp.zeros((100_000, B, A))], -1)
  q = np.asarray(_plain(layers)(xs)[..., 0], np.float64)
  mc_mean, mc_std = q.mean(0), q.std(0)               # sampling error ~0.3% of the std
  m, v = lowrank_moments.mlp_moments(layers, x, var)
  err = np.abs(np.asarray(m[..., 0]) - mc_mean) / mc_std
  ratio = np.sqrt(np.asarray(v[..., 0])) / mc_std
  assert err.max() < 0.1 and 0.85 < ratio.min() and ratio.max() < 1.15, (err, ratio)
  md, vd = propagate(_plain(layers))((x, jnp.concatenate([var, jnp.zeros((B, A))], -1)))
  ratio_diag = np.sqrt(np.asarray(vd[..., 0])) / mc_std
  assert np.max(np.abs(np.log(ratio_diag))) > 2 * np.max(np.abs(np.log(ratio))), ratio_diag


def test_jit_and_vmap_give_the_eager_answer():
  layers, (x, var) = _net(), _inputs()
  eager = lowrank_moments.mlp_moments(layers, x, var, rank=3)
  mapped = jax.jit(jax.vmap(lambda x, v: lowrank_moments.mlp_moments(layers, x, v, rank=3)))(
      x[:, None], var[:, None])
  for a, b in zip(eager, mapped):
    np.testing.assert_allclose(np.asarray(b)[:, 0], np.asarray(a), rtol=1e-5, atol=1e-7)


def test_the_modes_of_a_critic_ensemble():
  """critics.ensemble_moments: diagonal is the critic's own MM path; lowrank / full at zero
  variance give the plain critic bit for bit (under vmap over elites, jitted, as the targets run
  them); with variance, full rank lowrank and full agree closely and differ from the diagonal."""
  ens = critics.CriticEnsemble((H, H), 2)
  rng = np.random.default_rng(5)
  obs = jnp.asarray(rng.normal(size=(B, S)), jnp.float32)
  action = jnp.asarray(np.tanh(rng.normal(size=(B, A))), jnp.float32)
  var = jnp.asarray(0.3 * np.exp(rng.normal(size=(B, S))), jnp.float32)
  params = ens.init(jax.random.PRNGKey(0), obs, action)
  obs2, var2 = jnp.stack([obs, obs]), jnp.stack([jnp.zeros_like(var), var])

  def run(mode):
    parsed = algorithms.parse_moments(mode)
    return jax.vmap(lambda o, v: critics.ensemble_moments(ens.apply, params, o, action, v,
                                                          parsed))(obs2, var2)

  out = jax.jit(lambda: ({m: run(m) for m in ("diagonal", "lowrank", "lowrank2", "full")},
                         jax.vmap(lambda o: ens.apply(params, o, action))(obs2)))
  modes, plain = out()
  for mode, (mean, v) in modes.items():
    assert mean.shape == v.shape == (2, 2, B)
    np.testing.assert_array_equal(np.asarray(mean[0]), np.asarray(plain[0]), err_msg=mode)
    assert float(jnp.abs(v[0]).max()) == 0.0, mode
  diag, low, full = (np.asarray(modes[m][1][1]) for m in ("diagonal", "lowrank", "full"))
  off = lambda v: np.abs(np.log(v / full))  # noqa: E731
  assert np.median(off(low)) < 0.1 and np.median(off(low)) < 0.5 * np.median(off(diag))
  with pytest.raises(ValueError, match="kind diagonal, lowrank or full"):
    critics.ensemble_moments(ens.apply, params, obs, action, var, ("low", None))


def test_the_mode_names_parse():
  assert algorithms.parse_moments("diagonal") == ("diagonal", None)
  assert algorithms.parse_moments("lowrank") == ("lowrank", None)
  assert algorithms.parse_moments("lowrank12") == ("lowrank", 12)
  assert algorithms.parse_moments("full") == ("full", None)
  for bad in ("lowrank0", "lowrank-1", "lowrank 3", "", None, 3):
    with pytest.raises(ValueError, match="moments must be"):
      algorithms.parse_moments(bad)
