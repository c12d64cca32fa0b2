"""The paper's Figure 1 on a trained run: moment matching vs Monte Carlo estimates of the
next-state value E[Q(s', a')], s' ~ the elite's next-state Gaussian (experiments.mm_vs_mc is its
CLI). This module owns the estimators, their timing, and the experiment on a run folder: its
states, its files (mm_vs_mc.png, mm_vs_mc.csv, mm_vs_mc_estimates.csv) and its printed summary.

Shapes: B = states, S = obs dim, A = action dim, E = critics, N = Monte Carlo samples, R = repeats.
"""
from __future__ import annotations

import dataclasses
import os
import time
from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mombo_jax.analysis.trained import SeedNets, load_data, load_run
from mombo_jax.core import dynamics
from mombo_jax.errors import InvalidArgument
from mombo_jax.records import outputs
from mombo_jax.report import labels


def elite_gaussian(nets: SeedNets, obs, action, elite_rank: int = 0):
  """The next-state Gaussian (mean, var) [B, S] of one elite (rank 0 = best holdout loss)."""
  s_mean, s_var, _, _ = dynamics.predict(nets.dyn, obs, action, nets.config)
  member = nets.dyn.elites[elite_rank]
  return s_mean[member], s_var[member]


def mm_value(nets: SeedNets, mean, var, next_action):
  """MOMBO's next-state value: the MM moments of the target critic with the smaller MM mean, as
  in targets._mm_min (at nets.config.agent.moments' mode). Returns (member j* [B] int, mean [B],
  var [B])."""
  m, v = nets.q(mean, next_action, var)                               # [E, B]
  j = jnp.argmin(m, axis=0)
  rows = jnp.arange(m.shape[1])
  return j, m[j, rows], v[j, rows]


def member_q_fn(nets: SeedNets, member) -> Callable:
  """q(obs [..., B, S], action [..., B, A]) -> [..., B]: target critic member[b] for state b
  (the ensemble is evaluated whole, as in the target)."""
  member = jnp.asarray(member)

  def q(obs, action):
    values = nets.q(obs, action)                                      # [E, ..., B]
    idx = jnp.broadcast_to(member, values.shape[1:])[None]
    return jnp.take_along_axis(values, idx, axis=0)[0]

  return q


def mc_estimates(q_fn: Callable, mean, var, action, key, n: int, repeats: int):
  """[R, B] Monte Carlo estimates of E[q(s', a)], s' ~ N(mean, diag var) [B, S], each the average
  of n samples; the R repeats use independent samples (sequential, so memory is one repeat's)."""
  keys = jax.random.split(key, repeats)
  return jax.lax.map(lambda k: mc_estimate(q_fn, mean, var, action, k, n), keys)


def mc_estimate(q_fn: Callable, mean, var, action, key, n: int):
  """[B] one Monte Carlo estimate of E[q(s', a)] from n samples of s' ~ N(mean, diag var)."""
  eps = jax.random.normal(key, (n,) + mean.shape, mean.dtype)
  samples = mean + jnp.sqrt(var) * eps                                 # [n, B, S]
  return jnp.mean(q_fn(samples, jnp.broadcast_to(action, (n,) + action.shape)), axis=0)


def time_call(fn: Callable, *args, number: int = 5) -> float:
  """Median wall-clock seconds of fn(*args), after one warm-up call (compilation), each call
  waited for with block_until_ready."""
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(number):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  return float(np.median(times))


def mm_vs_mc(nets: SeedNets, obs, key, ns: Sequence[int] = (2, 10, 100, 1000, 10000),
             repeats: int = 50, elite_rank: int = 0, timing_calls: int = 5) -> dict:
  """The paper's Figure 1 experiment on states obs [B, S].

  a ~ pi(s); (mu, var) = the elite's next-state Gaussian; a' ~ pi(mu) (as in the MOMBO target;
  the same a' for every estimator, so only s' is random); j* = the target critic with the smaller
  MM mean. MM: (m, v) of Q_j*(s', a') in one MM pass. MC: for each N, `repeats` independent
  estimates mean_{i<=N} Q_j*(s'_i, a'), s'_i ~ N(mu, var).
  Returns dict(mm_mean [B], mm_var [B], member [B], estimates {N: [R, B]},
  seconds {"MM" or N: seconds per call for all B states}, num_states B).
  """
  k_a, k_next, k_mc = jax.random.split(key, 3)
  obs = jnp.asarray(obs, jnp.float32)
  action, _ = nets.policy(obs, k_a)
  mu, var = elite_gaussian(nets, obs, action, elite_rank)
  next_action, _ = nets.policy(mu, k_next)
  # Everything is an argument of the jitted calls (nothing folded in as a constant), so MM and MC
  # are timed on equal terms.
  mm = jax.jit(mm_value)
  member, mm_mean, mm_var = mm(nets, mu, var, next_action)
  out = dict(mm_mean=np.asarray(mm_mean), mm_var=np.asarray(mm_var), member=np.asarray(member),
             estimates={}, seconds={"MM": time_call(mm, nets, mu, var, next_action,
                                                    number=timing_calls)},
             num_states=int(obs.shape[0]))
  args = (nets, member, mu, var, next_action)
  for i, n in enumerate(ns):
    n = int(n)
    k = jax.random.fold_in(k_mc, i)
    repeated = jax.jit(lambda nets, member, m, v, a, k, n=n: mc_estimates(
        member_q_fn(nets, member), m, v, a, k, n, repeats))
    out["estimates"][n] = np.asarray(repeated(*args, k))
    one = jax.jit(lambda nets, member, m, v, a, k, n=n: mc_estimate(
        member_q_fn(nets, member), m, v, a, k, n))
    out["seconds"][n] = time_call(one, *args, k, number=timing_calls)
  return out


def mm_vs_mc_rows(result: dict) -> tuple:
  """(summary rows, raw rows) for the CSVs: one summary row per (method, state) with the mean and
  std over repeats of the estimates, |mean - MM mean|, the MM mean / std and seconds per call;
  raw rows hold every estimate."""
  summary, raw = [], []
  for b in range(result["num_states"]):
    m, s = float(result["mm_mean"][b]), float(np.sqrt(result["mm_var"][b]))
    summary.append(dict(method="MM", n_samples=0, state=b, estimate_mean=m, estimate_std=0.0,
                        abs_error_vs_mm=0.0, mm_mean=m, mm_std=s, critic=int(result["member"][b]),
                        seconds_per_call=result["seconds"]["MM"]))
    for n, est in result["estimates"].items():
      summary.append(dict(method="MC", n_samples=n, state=b,
                          estimate_mean=float(est[:, b].mean()),
                          estimate_std=float(est[:, b].std()),
                          abs_error_vs_mm=float(abs(est[:, b].mean() - m)), mm_mean=m, mm_std=s,
                          critic=int(result["member"][b]), seconds_per_call=result["seconds"][n]))
      raw += [dict(n_samples=n, state=b, repeat=r, estimate=float(est[r, b]))
              for r in range(est.shape[0])]
  return summary, raw


def plot_mm_vs_mc(result: dict, path: str, title: str = "", max_states: int = 3):
  """Figure 1 of the paper, per state: the spread of the MC estimates (violins over repeats) for
  each N beside the MM estimate (line) and the MM Gaussian of Q (+-1 std band); then the spread of
  the estimates against N with the MM prediction sqrt(v / N); and the seconds per estimate."""
  # matplotlib only when the figure is drawn, its backend set first
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # after the backend is set
  ns = sorted(result["estimates"])
  states = list(range(min(max_states, result["num_states"])))
  fig, axes = plt.subplots(1, len(states) + 2, figsize=(4.2 * (len(states) + 2), 3.8))
  for ax, b in zip(axes, states):
    m, s = result["mm_mean"][b], np.sqrt(result["mm_var"][b])
    data = [result["estimates"][n][:, b] for n in ns]
    ax.violinplot(data, positions=range(len(ns)), showmeans=True)
    ax.axhline(m, color="C3", lw=1.5, label=f"MM estimate {m:.3g}")
    ax.axhspan(m - s, m + s, color="C3", alpha=0.12, label=f"MM Gaussian ±1 std ({s:.2g})")
    ax.set_xticks(range(len(ns)), [str(n) for n in ns])
    ax.set(xlabel="Monte Carlo samples N", ylabel="estimate of E[Q(s', a')]", title=f"state {b}")
    ax.legend(fontsize=7)
  ax = axes[len(states)]
  for b in states:
    spread = [result["estimates"][n][:, b].std() for n in ns]
    line, = ax.loglog(ns, spread, "o-", label=f"state {b}: MC spread (std over repeats)")
    ax.loglog(ns, np.sqrt(result["mm_var"][b] / np.asarray(ns, float)), "--",
              color=line.get_color(), lw=1, label="MM sqrt(v / N)")
  ax.set(xlabel="N", ylabel="spread: std of the MC estimates over repeats",
         title="MC error vs N")
  ax.legend(fontsize=6)
  ax = axes[-1]
  labels = ["MM"] + [str(n) for n in ns]
  secs = [result["seconds"]["MM"]] + [result["seconds"][n] for n in ns]
  ax.bar(range(len(labels)), np.asarray(secs) / result["num_states"] * 1e3,
         color=["C3"] + ["C0"] * len(ns))
  ax.set_yscale("log")
  ax.set_xticks(range(len(labels)), labels)
  ax.set(xlabel="estimator (MC: N)", ylabel="ms per estimate (per state)",
         title=f"cost ({result['num_states']} states per call)")
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


# ------------------------------------------------------------------------ the experiment on a run

def load_seed(run_dir: str, seed_index: int = 0, elite_rank: int = 0, log=print):
  """(the trained run, its dataset's Transitions) once the run is known to have seed
  `seed_index` and elite `elite_rank`; ValueError if not or if the dataset was rebuilt or replaced
  since the run trained on it (trained.check_data), FileNotFoundError (a DatasetNotFoundError
  among them) for a missing run file or dataset. log: one line, what reading
  the checkpoint read and the peak memory (TrainedRun.memory_line)."""
  trained = load_run(run_dir)
  if not 0 <= seed_index < len(trained.nets):
    raise InvalidArgument(f"seed_index={seed_index}: the run has {len(trained.nets)} seed(s).",
                          params=("seed_index",))
  elites = int(trained.nets[seed_index].dyn.elites.shape[0])
  if not 0 <= elite_rank < elites:
    raise InvalidArgument(f"elite_rank={elite_rank}: the model has {elites} elites.",
                          params=("elite_rank",))
  transitions = load_data(trained)
  log(f"{run_dir}: {trained.memory_line()}")
  return trained, transitions


@dataclasses.dataclass(frozen=True)
class Protocol:
  """Where and how often run_experiment estimates: at num_states distinct dataset states (drawn
  with `seed`), with seed seed_index's networks and its elite of rank elite_rank (0 = best
  holdout loss), each Monte Carlo estimate repeated `repeats` times."""
  num_states: int = 4
  repeats: int = 50
  seed_index: int = 0
  elite_rank: int = 0
  seed: int = 0
  moments: Optional[str] = None   # the moment mode of MM (core/algorithms.py; None: the run's)


def run_experiment(trained, transitions, out: str, ns: Sequence[int],
                   protocol: Protocol = Protocol()) -> dict:
  """mm_vs_mc on `num_states` distinct dataset states (observations [num_states, S], drawn with
  `seed`) of seed `seed_index` of a loaded run (the fields of `protocol`); writes mm_vs_mc.csv
  (summary rows), mm_vs_mc_estimates.csv (every estimate) and mm_vs_mc.png into `out`. Returns
  mm_vs_mc's dict, plus "title" (the run: its algorithm label with MOMBO's target, dataset, seed,
  epoch) and "repeats". protocol.moments, when not the diagonal, is named in the title."""
  num_states, repeats, seed_index, elite_rank, seed, moments = (
      protocol.num_states, protocol.repeats, protocol.seed_index, protocol.elite_rank,
      protocol.seed, protocol.moments)
  rng = np.random.default_rng(seed)
  idx = rng.choice(len(transitions.observations), num_states, replace=False)
  obs = np.asarray(transitions.observations[idx], np.float32)
  nets = trained.nets[seed_index].with_moments(moments)
  result = mm_vs_mc(nets, obs, jax.random.PRNGKey(seed), ns, repeats, elite_rank)
  os.makedirs(out, exist_ok=True)
  summary, raw = mm_vs_mc_rows(result)
  outputs.write_rows(os.path.join(out, "mm_vs_mc.csv"), summary)
  outputs.write_rows(os.path.join(out, "mm_vs_mc_estimates.csv"), raw)
  # The algorithm as every report labels it: MOMBO's target is part of it (labels.algo_label).
  mode = nets.config.agent.moments
  result["title"] = (f"{labels.algo_label(trained.config.settings())} on "
                     f"{trained.dataset}, seed {trained.seeds[seed_index]}, epoch {trained.epoch}"
                     + ("" if mode == "diagonal" else f", MM by the {mode} moment mode"))
  result["repeats"] = int(repeats)
  plot_mm_vs_mc(result, os.path.join(out, "mm_vs_mc.png"), result["title"])
  return result


def summary_lines(result: dict, out: str) -> list:
  """What experiments.mm_vs_mc prints: what was estimated (the run's algorithm with MOMBO's
  target, dataset, seed, epoch: run_experiment's title) and what "spread" means; per N the mean
  over states of the estimates' spread (MC's sampling error) and of |mean - MM| (MM's bias against
  the MC truth, +- the MC mean's own error), the seconds per call against MM's; then the bias at
  the largest N, MM's cost and the files written."""
  mm_ms = result["seconds"]["MM"] * 1e3
  repeats = result.get("repeats") or next(iter(result["estimates"].values())).shape[0]
  lines = [f"MM vs MC estimates of E[Q(s', a')]: {result['title']}."] if result.get("title") else []
  lines.append(f"spread = std of a state's {repeats} repeated MC estimates (each the mean of N "
               "samples), averaged over the states: MC's sampling error, which falls as "
               "1/sqrt(N); |mean - MM| = distance of their mean from the MM estimate: moment "
               "matching's bias against the MC truth (their mean over all repeats is the truth "
               "up to spread/sqrt(repeats), given as +-), which no N removes.")
  bias = None
  for n in sorted(result["estimates"]):
    est = result["estimates"][n]                       # [R, B]
    err = np.abs(est.mean(axis=0) - result["mm_mean"]).mean()
    spread = est.std(axis=0).mean()
    bias = (n, err, spread / np.sqrt(est.shape[0]))
    lines.append(f"N={n:>6}: spread of estimates {spread:.4g} (sampling error), |mean - MM| "
                 f"{err:.3g} +- {bias[2]:.2g} (MM's bias), {result['seconds'][n] * 1e3:.3g} ms "
                 f"per call ({result['seconds'][n] * 1e3 / mm_ms:.3g}x MM)")
  if bias is not None:
    lines.append(f"MM's bias against the MC truth (N={bias[0]}): {bias[1]:.3g} +- {bias[2]:.2g}; "
                 "the MC spread above is sampling error, which more samples reduce, the bias is "
                 "moment matching's own (a Gaussian carried through the critic).")
  lines.append(f"MM: {mm_ms:.3g} ms per call for {result['num_states']} states; wrote "
               f"{os.path.join(out, 'mm_vs_mc.png')}, mm_vs_mc.csv, mm_vs_mc_estimates.csv")
  return lines
