"""Moment matching vs Monte Carlo (mombo_jax.analysis.mm_vs_mc, experiments.mm_vs_mc): with a linear
critic, where moment matching is exact, the Monte Carlo estimates converge to the MM mean with an
error that shrinks like sqrt(v / N); the script runs end to end on a run folder."""
import csv
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from mombo_jax.analysis import mm_vs_mc, trained
from mombo_jax.core.critics import MMCritic
from tests.conftest import HANG_S
from tests.conftest_runs import tiny_run  # noqa: F401  (session fixture)

NS = (2, 10, 100, 1000, 10000)


@pytest.fixture(scope="module")
def linear_setup():
  """A critic with no hidden layer (Q = w . [s, a] + b) and a batch of next-state Gaussians."""
  critic = MMCritic(hidden_dims=())
  k_init, k_mu, k_var, k_a = jax.random.split(jax.random.PRNGKey(3), 4)
  batch, obs_dim, action_dim = 3, 5, 2
  mu = jax.random.normal(k_mu, (batch, obs_dim))
  var = jax.random.uniform(k_var, (batch, obs_dim), minval=0.2, maxval=2.0)
  action = jax.random.uniform(k_a, (batch, action_dim), minval=-1, maxval=1)
  params = jax.jit(critic.init)(k_init, mu, action)      # one compilation, not op by op
  return critic, params, mu, var, action


def test_mm_is_exact_for_a_linear_critic(linear_setup):
  critic, params, mu, var, action = linear_setup
  m, v = critic.apply(params, mu, action, var)
  w = np.asarray(params["params"]["MMDense_0"]["kernel"], np.float64)[:, 0]
  b = float(params["params"]["MMDense_0"]["bias"][0])
  x = np.concatenate([np.asarray(mu, np.float64), np.asarray(action, np.float64)], axis=1)
  np.testing.assert_allclose(m, x @ w + b, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(v, np.asarray(var, np.float64) @ w[:mu.shape[1]] ** 2, rtol=1e-5)


def test_mc_converges_to_the_mm_mean_like_one_over_sqrt_n(linear_setup):
  """For a linear Q, an N-sample estimate is exactly N(m, v / N): the standardised errors
  z = (estimate - m) / sqrt(v / N) over all repeats and states are standard normal for every N.
  Their sum of squares is chi-square with R*B degrees of freedom and their mean is N(0, 1/(R*B));
  the bounds are those distributions' 1e-6 quantiles, not fixed digits."""
  critic, params, mu, var, action = linear_setup
  m, v = (np.asarray(x, np.float64) for x in critic.apply(params, mu, action, var))
  q_fn = lambda obs, act: critic.apply(params, obs, act)  # noqa: E731
  repeats = 100
  dof = repeats * mu.shape[0]
  lo, hi = stats.chi2.ppf(1e-6, dof) / dof, stats.chi2.ppf(1 - 1e-6, dof) / dof
  z_bound = stats.norm.isf(1e-6 / 2) / np.sqrt(dof)
  # One compilation for all N.
  draw = jax.jit(lambda key: {n: mm_vs_mc.mc_estimates(q_fn, mu, var, action,
                                                       jax.random.fold_in(key, n), n, repeats)
                              for n in NS})
  estimates = draw(jax.random.PRNGKey(0))
  rms = {}
  for n in NS:
    est = np.asarray(estimates[n], np.float64)
    assert est.shape == (repeats, mu.shape[0])
    z = (est - m) / np.sqrt(v / n)
    assert lo <= np.mean(z ** 2) <= hi, (n, np.mean(z ** 2))
    assert abs(np.mean(z)) <= z_bound, (n, np.mean(z))
    rms[n] = np.sqrt(np.mean((est - m) ** 2))
  # Hence the raw error shrinks like 1/sqrt(N): 10000 samples are sqrt(5000) ~ 70x closer than 2,
  # up to the chi-square slack of the two draws.
  assert rms[10000] / rms[2] <= np.sqrt(hi / lo) * np.sqrt(2 / 10000)
  assert rms[10000] / rms[2] >= np.sqrt(lo / hi) * np.sqrt(2 / 10000)


def test_member_q_picks_each_states_critic(tiny_run):
  workdir, state = tiny_run
  run = trained.load_run(workdir)
  nets = run.nets[1]
  obs = jnp.asarray(np.random.default_rng(0).normal(size=(4, 11)), jnp.float32)
  action = jnp.zeros((4, 3))
  both = nets.q(obs, action)                                       # [2, 4]
  member = jnp.array([0, 1, 1, 0])
  got = mm_vs_mc.member_q_fn(nets, member)(obs, action)
  np.testing.assert_array_equal(got, both[member, jnp.arange(4)])
  # The loader hands back seed 1's target critic exactly as the run state holds it.
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, b[1]), nets.target_critic,
               state.agent.target_critic_params)
  # It read the networks and the dynamics only (a partial restore), and says how much of the
  # checkpoint that is, and the process's peak memory.
  size = lambda tree: sum(x.nbytes for x in jax.tree.leaves(tree))  # noqa: E731
  agent = state.agent
  assert run.bytes_read == size((agent.actor.params, agent.critic.params,
                                 agent.target_critic_params, agent.log_alpha.params,
                                 state.dynamics))
  assert run.bytes_total == size(state) > 2 * run.bytes_read      # the rings are the bulk
  assert run.peak_rss > 2**20
  line = run.memory_line()
  assert line.startswith(f"read {run.bytes_read / 2**20:.1f} MiB of the checkpoint's "
                         f"{run.bytes_total / 2**20:.1f} MiB (networks and dynamics; ring buffers "
                         "and optimiser states skipped); peak memory "), line
  assert line.endswith(" MiB")



def test_load_seed_refuses_a_seed_or_elite_the_run_lacks(tiny_run):
  workdir, _ = tiny_run
  with pytest.raises(ValueError, match=r"seed_index=2: the run has 2 seed\(s\)"):
    mm_vs_mc.load_seed(workdir, seed_index=2)
  with pytest.raises(ValueError, match="elite_rank=-1: the model has"):
    mm_vs_mc.load_seed(workdir, elite_rank=-1)

def test_the_figure_and_console_name_the_target_and_define_spread(tiny_run, tmp_path,
                                                                  monkeypatch):
  """The figure's title and the first console line name the algorithm as the reports do (MOMBO
  with its target), and "spread" is defined where it is shown (estimates faked: no compilation)."""
  import matplotlib.pyplot as plt
  workdir, _ = tiny_run
  run = trained.load_run(workdir)
  rng = np.random.default_rng(0)
  fake = dict(mm_mean=np.array([1.0, 2.0]), mm_var=np.array([0.1, 0.2]), member=np.array([0, 1]),
              estimates={2: rng.normal(size=(4, 2)), 10: rng.normal(size=(4, 2))},
              seconds={"MM": 1e-3, 2: 2e-3, 10: 3e-3}, num_states=2)
  monkeypatch.setattr(mm_vs_mc, "mm_vs_mc", lambda *a, **k: dict(fake))
  figures = []
  monkeypatch.setattr(plt, "close", figures.append)
  result = mm_vs_mc.run_experiment(run, trained.load_data(run), str(tmp_path), [2, 10],
                                   mm_vs_mc.Protocol(num_states=2, repeats=4))
  title = f"MOMBO ({run.config.target}) on hopper-random, seed 0, epoch 2"
  assert run.config.target and result["title"] == title
  (fig,) = figures
  assert fig._suptitle.get_text() == title
  assert any(ax.get_ylabel() == "spread: std of the MC estimates over repeats" for ax in fig.axes)
  lines = mm_vs_mc.summary_lines(result, str(tmp_path))
  assert lines[0] == f"MM vs MC estimates of E[Q(s', a')]: {title}."
  assert lines[1].startswith("spread = std of a state's 4 repeated MC estimates (each the mean of "
                             "N samples), averaged over the states"), lines[1]
  assert lines[2].startswith("N=     2: spread of estimates ")
  # Bias and sampling error named apart: the spread is MC's sampling error, |mean - MM| is MM's
  # bias against the MC truth (with the MC mean's own error), and a line gives the bias.
  assert "sampling error" in lines[1] and "moment matching's bias against the MC truth" in lines[1]
  assert "(sampling error)" in lines[2] and "(MM's bias)" in lines[2]
  est = fake["estimates"][10]
  bias = np.abs(est.mean(axis=0) - fake["mm_mean"]).mean()
  assert lines[4].startswith(f"MM's bias against the MC truth (N=10): {bias:.3g} +- "
                             f"{est.std(axis=0).mean() / 2:.2g};"), lines[4]


@pytest.mark.slow
def test_script_end_to_end(tiny_run, tmp_path):
  workdir, _ = tiny_run
  out = subprocess.run(
      [sys.executable, "-m", "experiments.mm_vs_mc", f"--run={workdir}", "--num_states=2",
       "--repeats=16", "--n_samples=2,100", f"--out={tmp_path}"],
      capture_output=True, text=True, timeout=HANG_S, env=dict(os.environ))
  assert out.returncode == 0, out.stdout + out.stderr
  assert f"{workdir}: read " in out.stdout and "of the checkpoint's" in out.stdout, out.stdout
  assert (tmp_path / "mm_vs_mc.png").stat().st_size > 10_000
  with open(tmp_path / "mm_vs_mc.csv") as f:
    rows = list(csv.DictReader(f))
  assert [(r["method"], r["n_samples"]) for r in rows] == [("MM", "0"), ("MC", "2"),
                                                           ("MC", "100")] * 2
  for r in rows:
    assert all(np.isfinite(float(r[k])) for k in ("estimate_mean", "estimate_std", "mm_mean",
                                                   "seconds_per_call"))
    assert float(r["seconds_per_call"]) > 0
  # Spread over repeats shrinks with N (the expected ratio is sqrt(50) ~ 7; with 16 repeats a
  # ratio below 2 needs an F(15, 15) draw above 12.5: p ~ 1e-5).
  for b in ("0", "1"):
    spread = {r["n_samples"]: float(r["estimate_std"]) for r in rows
              if r["state"] == b and r["method"] == "MC"}
    assert spread["100"] < spread["2"] / 2
  with open(tmp_path / "mm_vs_mc_estimates.csv") as f:
    assert len(list(csv.DictReader(f))) == 2 * 2 * 16
  bad = subprocess.run([sys.executable, "-m", "experiments.mm_vs_mc", f"--run={tmp_path}"],
                       capture_output=True, text=True, timeout=HANG_S)
  assert bad.returncode != 0 and "Traceback" not in bad.stderr and "config.json" in bad.stderr
