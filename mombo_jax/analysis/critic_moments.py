"""The moments `propagate` gives for a trained run's critic against Monte Carlo: at dataset states,
the distribution of Q(s', a') with s' ~ the elite's next-state Gaussian (the protocol of
analysis/mm_vs_mc.py and analysis/pevi_bounds.py), its mean and standard deviation by the diagonal
mode (MOMBO's, the paper's Algorithm 1), by the full-covariance mode, by the low-rank mode
(moment_matching/lowrank.py, any rank) and by Monte Carlo sampling, per target critic; and a figure
of the sampled distribution with the diagonal and full Gaussians.

Shapes: B = states, S = obs dim, A = action dim, E = critics, N = samples.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from mombo_jax.analysis.pevi_bounds import critic_inputs, member_layers
from mombo_jax.analysis.trained import SeedNets
from mombo_jax.core import algorithms
from mombo_jax.moment_matching import lowrank as lowrank_moments
from mombo_jax.moment_matching.propagate import propagate


def _mlp(layers):
  def f(x):
    for j, (kernel, bias) in enumerate(layers):
      x = x @ kernel + bias
      if j < len(layers) - 1:
        x = jax.nn.relu(x)
    return x[..., 0]
  return f


def moments_vs_mc(nets: SeedNets, obs, key, num_samples: int = 100_000,
                  modes=("diag", "full")) -> dict:
  """Per target critic e and state b: <mode>_mean, <mode>_std for each of `modes` ("diag" or
  "diagonal": propagate's diagonal mode; "full": its full covariance; "lowrank" / "lowrank<k>":
  lowrank_moments.mlp_moments), mc_mean, mc_std [E, B] (MC over num_samples draws of s';
  float32) and samples [E, 512, B], the first 512 draws for plotting. The inputs are
  pevi_bounds.critic_inputs' ([s', a'], a' exact)."""
  x, x_var, _ = critic_inputs(nets, jnp.asarray(obs, jnp.float32), key)
  num_state = np.shape(obs)[-1]
  num_critics = nets.target_critic["params"]["members"]["MMDense_0"]["kernel"].shape[0]
  out = {k: [] for k in [f"{m}_{s}" for m in modes for s in ("mean", "std")]
         + ["mc_mean", "mc_std", "samples"]}
  eps = jax.random.normal(jax.random.fold_in(key, 2), (num_samples,) + x.shape)
  for e in range(num_critics):
    layers = member_layers(nets, e)
    f = _mlp(layers)
    for mode in modes:
      basis = "pca" if mode.endswith("pca") else "dims"
      kind, rank = algorithms.parse_moments("diagonal" if mode == "diag"
                                            else mode.replace("pca", ""))
      if kind == "lowrank":
        m, v = jax.jit(lambda x, v, rank=rank: lowrank_moments.mlp_moments(
            layers, x, v, rank=rank, basis=basis))(x, x_var[..., :num_state])
        m, v = m[..., 0], v[..., 0]
      else:
        m, v = jax.jit(propagate(f, covariance=kind))((x, x_var))
      out[f"{mode}_mean"].append(np.asarray(m, np.float64))
      out[f"{mode}_std"].append(np.sqrt(np.asarray(v, np.float64)))
    q = np.asarray(jax.jit(f)(x + jnp.sqrt(x_var) * eps), np.float64)         # [N, B]
    for name, value in (("mc_mean", q.mean(0)), ("mc_std", q.std(0)), ("samples", q[:512])):
      out[name].append(np.asarray(value, np.float64))
  result = {k: np.stack(v) for k, v in out.items()}
  result["num_samples"] = int(num_samples)
  return result


def plot_moments(result: dict, path: str, title: str = "", max_states: int = 4, member: int = 0):
  """Per state: a histogram of Q(s', a') samples of critic `member` with the diagonal and the
  full-covariance Gaussians (and Monte Carlo's mean) drawn over it."""
  # matplotlib only when the figure is drawn, its backend set first
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # after the backend is set
  states = range(min(max_states, result["mc_mean"].shape[1]))
  fig, axes = plt.subplots(1, len(states), figsize=(4.2 * len(states), 3.6), squeeze=False)
  for ax, b in zip(axes[0], states):
    q = result["samples"][member, :, b]
    heights = ax.hist(q, bins=40, density=True, color="0.75", label=f"{len(q)} MC samples")[0]
    lo, hi = np.percentile(q, [0.5, 99.5])
    grid = np.linspace(lo - 0.2 * (hi - lo), hi + 0.2 * (hi - lo), 400)
    for mode, color in (("diag", "C3"), ("full", "C0")):
      mu, sd = result[f"{mode}_mean"][member, b], result[f"{mode}_std"][member, b]
      dens = np.exp(-0.5 * ((grid - mu) / sd) ** 2) / (sd * np.sqrt(2 * np.pi))
      ax.plot(grid, dens, color=color, label=f"{mode}: mean {mu:.3g}, std {sd:.3g}")
    ax.axvline(result["mc_mean"][member, b], color="k", lw=1,
               label=f"MC: mean {result['mc_mean'][member, b]:.3g}, "
                     f"std {result['mc_std'][member, b]:.3g}")
    # A too-narrow Gaussian is a spike: the axis stays at the samples' scale (spike clipped).
    ax.set_ylim(0, 2.0 * heights.max())
    ax.set(xlabel="Q(s', a')", ylabel="density", title=f"state {b}, critic {member}")
    ax.legend(fontsize=7)
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
