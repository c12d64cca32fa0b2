"""How tight the paper's moment matching bounds are (moment_matching/bounds.py; the numbers in
docs/moment_matching.md, "The paper's bounds"): the cases tests/test_mm_bounds.py checks, with
their bound / truth ratios.

  python3 -m benchmarks.bench_mm_bounds [--out=benchmarks/bench_mm_bounds.txt] [--samples=20000]

Part 1, Lemma 2 "Moment matching bound" per ReLU (the paper's numbering): X ~ N(mu, sd^2) on a
grid; the bound against the exact W1(max(0, X), N(m, v)) (quadrature, float64) and against Monte
Carlo's. Part 1b: the bound / exact ratio as a function of t = mu / sd alone (it is scale-free),
t from -3 to 3: the per-ReLU figure docs/moment_matching.md quotes.
Part 2, Lemma 3 "Moment matching MLP bound": ReLU MLPs (input 5, output 2, torch.nn.Linear's init
U(+-1/sqrt(fan_in)) for weights and biases), 1-3 hidden layers of width 4, 32, 128, inputs
N(x, var I) with x ~ N(0, I), var in {0, 1e-3, 1e-1, 1e1}, 3 rows each; the bound (operator L1
norms) against the 1-D W1 of --samples Monte Carlo outputs per output and row from the MM
Gaussian; "margin" is 3x the samples' own W1 error (sampling_margin), the slack the tests allow;
"ratio" = bound / empirical W1 over rows and outputs (min, median).
"""
import argparse

import jax
import jax.numpy as jnp
import numpy as np
from scipy import integrate, stats

from benchmarks.common import Record, record_start
from mombo_jax.moment_matching import bounds
from mombo_jax.moment_matching.moments import mm_relu


def exact_relu_w1(mu, sd, m, v):
  """W1(max(0, X), N(m, v)), X ~ N(mu, sd^2), by quadrature of |F_Y - F_X~|."""
  s = np.sqrt(v)
  f_x = (lambda u: float(u >= m)) if s == 0 else (lambda u: stats.norm.cdf((u - m) / s))
  f_y = lambda u: (u >= 0) * stats.norm.cdf((u - mu) / sd)                 # noqa: E731
  lo, hi = min(mu - 12 * sd, m - 12 * s), max(mu + 12 * sd, m + 12 * s)
  return integrate.quad(lambda u: abs(f_y(u) - f_x(u)), lo, hi, points=[0.0, m], limit=400)[0]


def mlp(key, sizes):
  layers = []
  for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
    k1, k2, key = jax.random.split(key, 3)
    lim = 1.0 / np.sqrt(fan_in)
    layers.append((jax.random.uniform(k1, (fan_in, fan_out), minval=-lim, maxval=lim),
                   jax.random.uniform(k2, (fan_out,), minval=-lim, maxval=lim)))
  return layers


def forward(layers, x):
  for i, (kernel, bias) in enumerate(layers):
    x = x @ kernel + bias
    if i < len(layers) - 1:
      x = jax.nn.relu(x)
  return x


def relu_ratio_by_t(out):
  """Part 1b: bound / exact W1 against t = mu / sd. Both scale with sd at fixed t (X -> c X
  scales Y, its MM Gaussian and every term of the bound by c), so the ratio is a function of t
  alone: this sweep gives its range over any band of t, e.g. the kink's |t| <= 1."""
  ts = np.round(np.arange(-3.0, 3.0 + 1e-9, 0.25), 2)
  bound = np.asarray(bounds.relu_moment_matching_bound(ts.astype(np.float32), np.ones_like(ts,
                                                        np.float32)), np.float64)
  m, v = (np.asarray(x, np.float64) for x in mm_relu(jnp.asarray(ts, jnp.float32),
                                                     jnp.ones(ts.shape, jnp.float32)))
  ratio = np.array([bound[i] / exact_relu_w1(float(t), 1.0, m[i], v[i]) for i, t in enumerate(ts)])
  out("Part 1b: Lemma 2's bound / exact W1 by t = mu / sd (sd = 1; the ratio depends on t only)")
  out("| t | " + " | ".join(f"{t:g}" for t in ts) + " |")
  out("|---|" + "---|" * len(ts))
  out("| bound / exact | " + " | ".join(f"{r:.3g}" for r in ratio) + " |")
  for band in (1.0, 2.0):
    inside = np.abs(ts) <= band
    lo, hi = np.argmin(np.where(inside, ratio, np.inf)), np.argmax(np.where(inside, ratio, -1))
    out(f"|t| <= {band:g}: {ratio[lo]:.3g}x (t = {ts[lo]:g}) to {ratio[hi]:.3g}x (t = {ts[hi]:g})")


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--samples", type=int, default=20000)
  p.add_argument("--out", default=None)
  args = p.parse_args()
  out = Record(args.out)
  record_start(out, "bench_mm_bounds", "the paper's W1 bounds against the truth", args)
  out("")
  out("Part 1: Lemma 2 'Moment matching bound' per ReLU")
  out("| mu | sd | bound | exact W1 | MC W1 (margin) | bound / exact |")
  out("|---|---|---|---|---|---|")
  mus, sds = np.meshgrid([-2.0, -0.5, 0.0, 0.5, 2.0], [0.03, 0.3, 1.0, 3.0], indexing="ij")
  mus, sds = mus.ravel().astype(np.float32), sds.ravel().astype(np.float32)
  bound = np.asarray(bounds.relu_moment_matching_bound(mus, sds ** 2))
  m, v = (np.asarray(x, np.float64) for x in mm_relu(jnp.asarray(mus), jnp.asarray(sds ** 2)))
  y = np.maximum(mus + sds * np.asarray(jax.random.normal(jax.random.PRNGKey(0),
                                                          (args.samples, mus.size))), 0)
  emp, margin = bounds.w1_to_gaussian(y, m, v), 3 * bounds.sampling_margin(y)
  for i in range(mus.size):
    exact = exact_relu_w1(float(mus[i]), float(sds[i]), m[i], v[i])
    ratio = f"{bound[i] / exact:.3g}" if exact > 1e-8 else "(truth ~0)"
    out(f"| {mus[i]:g} | {sds[i]:g} | {bound[i]:.4g} | {exact:.4g} | {emp[i]:.4g} "
        f"({margin[i]:.2g}) | {ratio} |")
  out("")
  relu_ratio_by_t(out)
  out("")
  out("Part 2: Lemma 3 'Moment matching MLP bound' (operator L1 norms)")
  out("| depth | width | input var | norms | bound (rows) | max MC W1 (margin) "
      "| ratio min / median | bound >= MC - margin |")
  out("|---|---|---|---|---|---|---|---|")
  din, dout = 5, 2
  variances = (0.0, 1e-3, 1e-1, 1e1)
  for depth in (1, 2, 3):
    for width in (4, 32, 128):
      layers = mlp(jax.random.PRNGKey(10 * depth + width), [din] + [width] * depth + [dout])
      mean = jax.random.normal(jax.random.PRNGKey(7), (3, din))
      for var_value in variances:
        var = jnp.full_like(mean, var_value)
        r = bounds.moment_matching_bound(layers, mean, var)
        eps = jax.random.normal(jax.random.PRNGKey(1), (args.samples,) + mean.shape)
        ys = np.asarray(forward(layers, mean + jnp.sqrt(var) * eps))
        emp = bounds.w1_to_gaussian(ys, r.mean, r.var)
        margin = 3 * bounds.sampling_margin(ys)
        w1 = np.asarray(r.w1)[:, None]
        ok = bool(np.all(w1 >= emp - margin))
        ratio = w1 / emp if np.all(emp > 0) else None
        ratios = f"{ratio.min():.3g} / {np.median(ratio):.3g}" if ratio is not None else \
            "(MM exact)"
        out(f"| {depth} | {width} | {var_value:g} | "
            f"{' x '.join(f'{n:.3g}' for n in np.asarray(r.norms))} | "
            f"{', '.join(f'{b:.3g}' for b in w1[:, 0])} | {emp.max():.3g} ({margin.max():.2g}) | "
            f"{ratios} | {ok} |")


if __name__ == "__main__":
  main()
