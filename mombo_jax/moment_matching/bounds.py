"""The paper's section 4 bounds as numbers: how far moment matching's Gaussian can be from a ReLU
network's true output distribution (1-Wasserstein), and the two suboptimality theorems built on it.

API (the paper's numbering: Lemma 1 is "Moment matching", mm_relu; Theorem 1 is Jin et al.'s)
  relu_moment_matching_bound(mean, var) -> bound [...]     Lemma 2 "Moment matching bound"
  moment_matching_bound(layers, mean, var, norm, apply_fn) -> MLPBound
                                                            Lemma 3 "Moment matching MLP bound"
  mlp_layers(layers) -> [(kernel [I, O], bias [O]), ...]      a plain MLP's layers, checked
  layer_norm(kernel, norm) -> []                               ||A_l|| (see "norm" below)
  sampling_pevi_bound(norms, num_samples, delta, r_max, gamma, horizon)
                                          Theorem 2 "Suboptimality of sampling-based PEVI"
  mm_pevi_bound(w1, horizon)   Theorem 3 "Suboptimality of moment matching-based PEVI algorithms"

Per ReLU (X ~ N(mu, s^2), Y = max(0, X), X~ ~ N(m, v) with m = E[Y], v = Var[Y], mm_relu):
  W1(Y, X~) <= G + |mu - m| + |s - sqrt(v)|,  G = int_{-inf}^0 F_X~(u) du = E[max(0, -X~)],
so G is mm_relu's mean at (-m, v): the stable closed form of sqrt(v) phi(m/sqrt(v)) - m Phi(-m/
sqrt(v)) (exactly 0 at v = 0). The other two terms are the Gaussian W1 bound |dmu| + |dsigma|.

For an L-layer ReLU MLP, x @ A_1 + b_1 -> relu -> ... -> x @ A_L + b_L, with the moment-matched
pass (mm_linear, mm_relu) giving X~_l = N(m_l, v_l) after hidden layer l and its pre-activation
moments (pm_l, pv_l):
  W1(true output, N(m_L, v_L)) <= sum_{l=1}^{L-1} (G_l + C_l) prod_{j=l+1}^{L} ||A_j||,
  G_l = sum over the layer's units of G(X~_l),
  C_l = sum over the layer's units of |pm_l - m_l| + |sqrt(pv_l) - sqrt(v_l)|.
The per-unit terms are summed (an L1 ground metric on a layer's units), so ||A|| is the matching
operator norm, ||A||_{1->1} = max_i sum_o |A[i, o]| for x @ A (norm="operator", the default: the
Lipschitz constant the proof's step W1(x A) <= ||A|| W1(x) needs); norm="entrywise" takes
sum |A[i, o]|, the literal "L1-norm" of a matrix, which is larger (a looser, equally valid bound).
With the operator norm the bound covers the output vector's W1 under the L1 metric, so it bounds
each output's own 1-D W1 too (for a critic, the one output). A network with no hidden layer
(L = 1) is exact: the bound is 0. What it assumes, as the paper's proof does: the input is the
diagonal Gaussian N(mean, var) itself, and summing the units' terms treats a layer's units as one
L1 distance although the true units are correlated (the tests find the bound above Monte Carlo's
W1 in every case tried; it is far above it: benchmarks/bench_mm_bounds.txt). It does not vanish at
zero input variance, where moment matching is exact: C charges a unit whose pre-activation mean pm
is negative |pm| (the Lemma compares the pre-activation with the ReLU's output), so a network with
dead units has a bound of the order of the sum of their |pm| times the later layers' norms.

Shapes: B... = batch dims of the input, I / O = a layer's input / output size.
"""
from __future__ import annotations

import math
from typing import Mapping, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
from scipy import special

from mombo_jax.moment_matching import mlp_trace
from mombo_jax.moment_matching.moments import mm_linear, mm_relu

NORMS = ("operator", "entrywise")


class MLPBound(NamedTuple):
  """moment_matching_bound's answer.

  mean, var: [B..., O] the moment-matched output (what `propagate` returns for the MLP).
  w1: [B...] Lemma 3's bound on W1(true output, N(mean, var)) per input row.
  g, c: [L-1, B...] per hidden layer, the summed G and C terms.
  norms: [L] ||A_l|| per layer (the `norm` chosen).
  """
  mean: jnp.ndarray
  var: jnp.ndarray
  w1: jnp.ndarray
  g: jnp.ndarray
  c: jnp.ndarray
  norms: jnp.ndarray


def relu_moment_matching_bound(mean, var):
  """Lemma 2 "Moment matching bound" elementwise: an upper bound [...] on W1(max(0, X), N(m, v)) for
  X ~ N(mean, var) [...] and (m, v) = mm_relu(mean, var), its moment-matched Gaussian."""
  mean, var = jnp.asarray(mean), jnp.asarray(var)
  chex.assert_equal_shape([mean, var])
  m, v = mm_relu(mean, var)
  return _g(m, v) + jnp.abs(mean - m) + jnp.abs(jnp.sqrt(var) - jnp.sqrt(v))


def _g(m, v):
  """G(X~) = int_{-inf}^0 F_X~(u) du = E[max(0, -X~)] for X~ ~ N(m, v) (elementwise)."""
  return mm_relu(-m, v)[0]


def layer_norm(kernel, norm: str = "operator"):
  """||A|| [] of a kernel [I, O] used as x @ kernel: "operator" max_i sum_o |A[i, o]| (its
  Lipschitz constant from L1 to L1), "entrywise" sum |A[i, o]|."""
  chex.assert_rank(kernel, 2)
  if norm == "operator":
    return jnp.max(jnp.sum(jnp.abs(kernel), axis=1))
  if norm == "entrywise":
    return jnp.sum(jnp.abs(kernel))
  raise ValueError(f"norm={norm!r}: choose one of {NORMS}.")


def mlp_layers(layers) -> list:
  """[(kernel [I, O], bias [O]), ...] of a plain MLP, given either that list (kernel as x @ kernel,
  Flax's layout) or a Flax variables / params dict of Dense layers only ({"params": {"Dense_0":
  {"kernel", "bias"}, ...}}, any names ending in _<index>, taken in index order: the order Flax
  built them in, which is the call order only when each layer is built where it is called, so
  moment_matching_bound takes a dict only with apply_fn, and reads the order from it). Raises
  ValueError naming the problem for anything else (a layer without a bias or with more parameters,
  a kernel that is not 2-D, sizes that do not chain). That the activation between the layers is
  ReLU cannot be read from parameters: pass apply_fn to moment_matching_bound to have it checked."""
  if isinstance(layers, Mapping):
    layers = _dict_pairs(layers)
  layers = [(jnp.asarray(k), jnp.asarray(b)) for k, b in layers]
  if not layers:
    raise ValueError("moment_matching_bound: no layers given.")
  for i, (kernel, bias) in enumerate(layers):
    if kernel.ndim != 2 or bias.shape != kernel.shape[1:]:
      raise ValueError(
          f"moment_matching_bound: layer {i} has kernel {kernel.shape} and bias {bias.shape}; "
          "expected kernel [I, O] and bias [O] (for an ensemble, pass one member's layers).")
    if i and kernel.shape[0] != layers[i - 1][0].shape[1]:
      raise ValueError(
          f"moment_matching_bound: layer {i} takes {kernel.shape[0]} inputs but layer {i - 1} "
          f"gives {layers[i - 1][0].shape[1]}: the layers do not chain as an MLP.")
  return layers


def _dict_pairs(layers) -> list:
  """[(kernel, bias)] of a Flax dict of Dense layers, in the index order of their names."""
  tree = layers.get("params", layers)
  pairs = []
  for name in sorted(tree, key=_layer_index):
    leaf = tree[name]
    if not isinstance(leaf, Mapping) or set(leaf) != {"kernel", "bias"}:
      got = sorted(leaf) if isinstance(leaf, Mapping) else type(leaf).__name__
      raise ValueError(
          f"moment_matching_bound: {name!r} is not a Dense layer (its parameters are {got}, not "
          "exactly kernel and bias): the bound is the paper's for a plain ReLU MLP of Dense "
          "layers. Pass the MLP's layers as a list of (kernel, bias) pairs instead.")
    pairs.append((leaf["kernel"], leaf["bias"]))
  return pairs


def _layer_index(name: str) -> int:
  tail = name.rsplit("_", 1)[-1]
  if not tail.isdigit():
    raise ValueError(
        f"moment_matching_bound: cannot order the layer {name!r} (expected Flax names such as "
        "Dense_0, Dense_1, ...). Pass the MLP's layers as a list of (kernel, bias) pairs.")
  return int(tail)


def moment_matching_bound(layers, mean, var, norm: str = "operator",
                          apply_fn=None) -> MLPBound:
  """Lemma "Moment matching MLP bound" (the paper's Lemma 3) for a ReLU MLP at the diagonal
  Gaussian input N(mean, var) [B..., I]: its moment-matched output and the bound on the W1
  distance of the network's true output distribution from it (MLPBound, module docstring).

  layers: a list of (kernel [I, O], bias [O]) pairs in call order, read as relu(x @ A_1 + b_1)
    ... x @ A_L + b_L (your statement that this is the network: parameters cannot show it); or
    a Flax variables dict of Dense layers, which needs apply_fn: a dict says neither the order its
    layers are called in (Flax numbers them as built, not as called) nor the activation.
  apply_fn: fn(x [B..., I]) -> [B..., O], the network as you call it (concrete inputs only:
    refused under jit). It is traced and the MLP read from it as it runs (mlp_trace.py: dot,
    add, relu, ..., dot); anything else on the way (tanh, a normalisation, a skip connection)
    raises ValueError naming it, and so do layers that are not the ones it uses. The layers read
    are then checked against apply_fn's output at the mean.
  Outside jit, mean and var are checked first (finite, var >= 0: ValueError otherwise); under jit
  they cannot be, and the bound is computed as given (mm_relu reads a negative var as 0). var is
  a diagonal: a covariance [B..., I, I] is refused (the Lemma is for a diagonal input).
  """
  if norm not in NORMS:
    raise ValueError(f"moment_matching_bound: norm={norm!r}; choose one of {NORMS}.")
  if isinstance(layers, Mapping) and apply_fn is None:
    _dict_pairs(layers)                      # a dict of other layers: named first
    raise ValueError(
        "moment_matching_bound: a Flax params dict says neither the order its layers are called "
        "in (Flax numbers them as built: in nn.Dense(1)(nn.relu(nn.Dense(16)(x))) Dense_0 is the "
        "last layer called) nor the activation between them. Pass apply_fn=lambda x: "
        "model.apply(params, x) to have the network read as it runs, or a list of (kernel, "
        "bias) pairs in call order.")
  mean, var = jnp.asarray(mean), jnp.asarray(var)
  _check_shapes(mean, var)
  traced = isinstance(mean, jax.core.Tracer) or isinstance(var, jax.core.Tracer)
  if apply_fn is not None:
    if traced:
      raise ValueError("moment_matching_bound: apply_fn is checked on concrete inputs; call it "
                       "outside jit, or leave apply_fn out under jit.")
    layers = _the_layers_it_runs(layers, mlp_trace.read_mlp(apply_fn, mean))
  layers = mlp_layers(layers)
  if mean.shape[-1] != layers[0][0].shape[0]:
    raise ValueError(f"moment_matching_bound: the input has {mean.shape[-1]} features but the "
                     f"first layer takes {layers[0][0].shape[0]}.")
  if not traced:
    _check_moments(mean, var)
  if apply_fn is not None:
    _check_is_the_mlp(layers, mean, apply_fn)
  m, v = mean, var
  gs, cs = [], []
  for kernel, bias in layers[:-1]:
    pm, pv = mm_linear(m, v, kernel, bias)
    m, v = mm_relu(pm, pv)
    gs.append(jnp.sum(_g(m, v), axis=-1))
    cs.append(jnp.sum(jnp.abs(pm - m) + jnp.abs(jnp.sqrt(pv) - jnp.sqrt(v)), axis=-1))
  m, v = mm_linear(m, v, *layers[-1])
  norms = jnp.stack([layer_norm(k, norm) for k, _ in layers])
  batch = mean.shape[:-1]
  if not gs:                                       # one affine layer: moment matching is exact
    zeros = jnp.zeros((0,) + batch, m.dtype)
    return MLPBound(m, v, jnp.zeros(batch, m.dtype), zeros, zeros, norms)
  g, c = jnp.stack(gs), jnp.stack(cs)              # [L-1, B...]
  # tail[l] = prod_{j > l} ||A_j|| (0-based): the factor of hidden layer l's terms.
  tail = jnp.flip(jnp.cumprod(jnp.flip(norms[1:])))
  w1 = jnp.tensordot(tail, g + c, axes=1)
  return MLPBound(m, v, w1, g, c, norms)


def _check_shapes(mean, var):
  ms, vs = tuple(mean.shape), tuple(var.shape)
  if ms and vs == ms + ms[-1:]:
    raise ValueError(
        f"moment_matching_bound: var has shape {vs}, a covariance over the input's last axis; "
        f"the paper's Lemma 3 bounds a diagonal Gaussian input (var of mean's shape {ms}). For "
        "the moments under a full covariance use mombo_jax.propagate(fn, covariance='full') (no "
        "bound); jnp.diagonal(cov, axis1=-2, axis2=-1) gives the bound of the input without its "
        "correlations.")
  if vs != ms:
    raise ValueError(f"moment_matching_bound: var has shape {vs} but mean {ms}; pass one "
                     "variance per input entry (var of mean's shape).")


def _the_layers_it_runs(given, ran):
  """The given layers (a list in call order, or a Flax dict in any order) as apply_fn runs them,
  [(kernel, bias)] in call order; ValueError when they are not the layers apply_fn uses."""
  if isinstance(given, Mapping):
    tree = given.get("params", given)
    pool = {name: (np.asarray(leaf.get("kernel")), np.asarray(leaf.get("bias")))
            for name, leaf in tree.items() if isinstance(leaf, Mapping)}
    order = []
    for i, (kernel, bias) in enumerate(ran):
      names = [n for n, (k, b) in pool.items() if n not in order and k.shape == kernel.shape
               and np.array_equal(k, kernel) and b.shape == bias.shape and np.array_equal(b, bias)]
      if not names:
        raise ValueError(f"moment_matching_bound: layer {i} that apply_fn calls (kernel "
                         f"{kernel.shape}) is not one of the params' layers {sorted(pool)}: "
                         "apply_fn must run the params passed.")
      order.append(names[0])
    unused = sorted(set(pool) - set(order))
    if unused:
      raise ValueError(f"moment_matching_bound: apply_fn does not use the params' {unused}; "
                       "the bound covers the network apply_fn runs, with every layer given.")
    return [(tree[n]["kernel"], tree[n]["bias"]) for n in order]
  given = mlp_layers(given)
  if len(given) != len(ran) or any(
      np.shape(k) != r[0].shape or not np.allclose(np.asarray(k), r[0])
      or not np.allclose(np.asarray(b), r[1]) for (k, b), r in zip(given, ran)):
    raise ValueError(f"moment_matching_bound: the layers given are not the {len(ran)} layers "
                     "apply_fn runs, in its call order; pass those (or the params dict).")
  return given


def _check_moments(mean, var):
  bad = [name for name, x in (("mean", mean), ("var", var)) if not bool(jnp.all(jnp.isfinite(x)))]
  if bad:
    raise ValueError(f"moment_matching_bound: {' and '.join(bad)} has NaN or infinite entries.")
  if bool(jnp.any(var < 0)):
    raise ValueError(f"moment_matching_bound: var has negative entries (min "
                     f"{float(jnp.min(var)):.3g}); a variance is >= 0.")


def _check_is_the_mlp(layers, mean, apply_fn):
  x = np.asarray(mean, np.float64)
  for i, (kernel, bias) in enumerate(layers):
    x = x @ np.asarray(kernel, np.float64) + np.asarray(bias, np.float64)
    if i < len(layers) - 1:
      x = np.maximum(x, 0.0)
  got = np.asarray(apply_fn(mean), np.float64)
  scale = 1e-4 * (1.0 + np.max(np.abs(x)))
  if got.shape != x.shape or not np.allclose(got, x, rtol=1e-3, atol=scale):
    raise ValueError(
        "moment_matching_bound: apply_fn is not the ReLU MLP its layers make (relu(x @ A + b) "
        "between Dense layers, the last layer linear): at the input mean it returns "
        f"{got.shape} values up to {np.max(np.abs(got - x)) if got.shape == x.shape else 'n/a'} "
        "away from that MLP's. The paper's bound holds for a plain ReLU MLP only.")


def sampling_pevi_bound(norms, num_samples: int, delta: float, r_max: float, gamma: float,
                        horizon: int):
  """Theorem 2 "Suboptimality of sampling-based PEVI": with probability >= 1 - delta,
  SubOpt <= 2 H prod_l ||A_l|| sqrt(-8 log(delta / 4) R_max^2 / (floor(N / 2) (1 - gamma)^2)).
  norms: [L] or [..., L] the layers' norms; returns [] or [...]."""
  if int(num_samples) < 2:
    raise ValueError(f"num_samples={num_samples}: the theorem needs N >= 2 (floor(N / 2) >= 1).")
  if not 0.0 < delta < 1.0:
    raise ValueError(f"delta={delta}: the error tolerance must lie in (0, 1).")
  if not 0.0 <= gamma < 1.0:
    raise ValueError(f"gamma={gamma}: the theorem needs a discount in [0, 1).")
  if r_max < 0 or horizon < 1:
    raise ValueError(f"r_max={r_max}, horizon={horizon}: need r_max >= 0 and horizon >= 1.")
  radius = math.sqrt(-8.0 * math.log(delta / 4.0) * r_max ** 2
                     / ((int(num_samples) // 2) * (1.0 - gamma) ** 2))
  return 2.0 * horizon * jnp.prod(jnp.asarray(norms), axis=-1) * radius


def mm_pevi_bound(w1, horizon: int):
  """Theorem 3 "Suboptimality of moment matching-based PEVI algorithms": SubOpt <= 2 H w1, w1
  Lemma 3 "Moment matching MLP bound" (MLPBound.w1); deterministic (no delta)."""
  if horizon < 1:
    raise ValueError(f"horizon={horizon}: need horizon >= 1.")
  return 2.0 * horizon * jnp.asarray(w1)


def w1_to_gaussian(samples, mean, var):
  """The 1-D W1 distance [...] between the empirical distribution of samples [N, ...] and
  N(mean, var) [...]: int |F_N - F| by the sorted-sample formula, each order statistic against the
  Gaussian quantile at its midpoint (exact up to O(sd / N) quantisation)."""
  x = np.sort(np.asarray(samples, np.float64), axis=0)
  n = x.shape[0]
  q = special.ndtri((np.arange(n) + 0.5) / n).reshape((n,) + (1,) * (x.ndim - 1))
  ref = np.asarray(mean, np.float64) + np.sqrt(np.asarray(var, np.float64)) * q
  return np.mean(np.abs(x - ref), axis=0)


def sampling_margin(samples):
  """A bound [...] on the sampling error E W1(F_N, F) of N samples [N, ...] (1-D, per column):
  int sqrt(F (1 - F) / N) du, with F the empirical cdf (del Barrio, Gine, Matran 1999)."""
  x = np.sort(np.asarray(samples, np.float64), axis=0)
  n = x.shape[0]
  f = (np.arange(1, n) / n).reshape((n - 1,) + (1,) * (x.ndim - 1))
  return np.sum(np.sqrt(f * (1 - f) / n) * np.diff(x, axis=0), axis=0)
