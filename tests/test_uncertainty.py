"""The uncertainty-quantifier experiment (mombo_jax.analysis.uncertainty_runs, quantifier_quality;
the paper's Table 2, docs/protocol.md "Table 2 (uncertainty quantifiers): the reading"): the scores
on known Bellman errors, the definition against a closed form (linear critic, Gaussian policy and
model), U against what the run's own target subtracts, the two alternative readings (the real
reward in B^ Q; MOMBO's U as eq. (1)) against hand computations, and the experiment end to end on a
run folder in both --states modes, with the paper's numbers beside ours."""
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.stats import norm

from mombo_jax.analysis import quantifier_quality, trained, uncertainty_runs
from mombo_jax.core import buffer, dynamics, targets, termination
from tests.conftest import HANG_S
from tests.conftest_runs import tiny_run  # noqa: F401  (session fixture)


def test_accuracy_and_tightness_on_known_bellman_errors():
  u = np.array([1.0, 1.5, 0.5, 3.0, 0.0])
  exact = np.array([0.0, 1.0, 2.0, -1.0, 4.0])
  sample = np.array([1.0, -1.0, 2.0, 1.0, 4.25])
  # |B Q - B^ Q| = [1, 2, 0, 2, 0.25]: U = 1 equals its error and counts as accurate (>=).
  out = quantifier_quality.bellman_metrics(u, exact, sample)
  np.testing.assert_array_equal(out["accuracy"], [1, 0, 1, 1, 0])
  np.testing.assert_array_equal(out["tightness"], [0.0, -0.5, 0.5, 1.0, -0.25])
  assert out["accuracy_mean"] == 0.6
  assert out["tightness_mean"] == pytest.approx(0.15, abs=1e-15)
  # Random batch: a direct recomputation.
  rng = np.random.default_rng(0)
  u, exact, sample = rng.exponential(size=100), rng.normal(size=100), rng.normal(size=100)
  out = quantifier_quality.bellman_metrics(u, exact, sample)
  assert out["accuracy_mean"] == np.mean([ui >= abs(e - s) for ui, e, s in zip(u, exact, sample)])
  assert out["tightness_mean"] == pytest.approx(np.mean(u - np.abs(exact - sample)), rel=1e-12)


def test_scores_average_each_draw_and_scale_u_by_beta():
  """Draws are scored one by one (then averaged), never through their mean; U as trained is
  beta * u, the unscaled scores use u itself."""
  exact = np.array([0.0, 10.0])
  sample = np.array([[1.0, 10.0], [-1.0, 13.0], [0.5, 10.5]])          # [M=3, B=2]
  u = np.array([[0.6, 1.0], [0.6, 1.0], [0.6, 1.0]])
  out = quantifier_quality.quantifier_scores(exact, sample, u, scale=2.0)
  # errors [[1, 0], [1, 3], [0.5, 0.5]]; U = 1.2 and 2.0; the mean draw of tuple 0 has error 1/6.
  np.testing.assert_allclose(out["accuracy"], [1.0, 2 / 3])
  np.testing.assert_allclose(out["tightness"], [1.2 - 2.5 / 3, 2.0 - 3.5 / 3])
  np.testing.assert_allclose(out["accuracy_unscaled"], [1 / 3, 2 / 3])
  np.testing.assert_allclose(out["tightness_unscaled"], [0.6 - 2.5 / 3, 1.0 - 3.5 / 3])
  np.testing.assert_allclose(out["penalty"], [1.2, 2.0])
  np.testing.assert_allclose(out["bellman_error"], [2.5 / 3, 3.5 / 3])
  assert out["accuracy_mean"] == pytest.approx(5 / 6)
  assert out["tightness_mean"] == pytest.approx(out["penalty_mean"] - out["bellman_error_mean"])


@pytest.mark.parametrize("length, kept", [(25, [9, 19, 24]), (20, [9, 19]), (5, [4]), (1, [0]),
                                          (0, [])])
def test_every_tenth_transition_and_the_last(length, kept):
  assert quantifier_quality.selected_steps(length).tolist() == kept


def test_definition_against_a_closed_form():
  """Linear critic q(s, a) = w.s + c a + b0, Gaussian policy a ~ N(K.s, sp^2), Gaussian model
  s^' ~ N(mu, diag v), r^ ~ N(mu_r, vr), d^ = 0. Then
    B Q  = r + g (1-d) (w + c K).s'_real + g (1-d) b0                       (exact),
    B^ Q ~ N(m, s2), m = mu_r + g ((w + c K).mu + b0), s2 = vr + g^2 (sum (w + c K)^2 v + c^2 sp^2),
  so D = B Q - B^ Q ~ N(delta = B Q - m, s2) and, for a fixed U,
    accuracy  = P(|D| <= U) = Phi((U - delta) / s) - Phi((-U - delta) / s),
    tightness = U - E|D|,  E|D| = s sqrt(2/pi) exp(-delta^2 / 2 s2) + delta (1 - 2 Phi(-delta / s)).
  Both are checked, with U as trained (beta u) and unscaled (u), within Monte Carlo tolerances
  (B x M = 19,200 draws: 5+ standard errors)."""
  rng = np.random.default_rng(0)
  B, S, M, P = 48, 2, 400, 1000
  g, beta, sp, c, b0 = 0.9, 1.7, 0.5, 0.8, 0.5
  w, K = np.array([1.0, -2.0]), np.array([0.5, -0.3])
  f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
  obs, action = rng.normal(size=(B, S)), rng.uniform(-1, 1, size=(B, 1))
  reward, next_obs = rng.normal(size=B), rng.normal(size=(B, S))
  done = (np.arange(B) < 8).astype(float)                        # terminal rows: B Q = r
  mu = 0.7 * obs + 0.3 * action + 0.2 * next_obs                 # model mean, off the real s'
  v = rng.uniform(0.05, 0.6, size=(B, S))
  mu_r, vr = reward + rng.normal(scale=0.7, size=B), 0.3
  u = rng.uniform(0.1, 2.0, size=B)                              # U / beta, one per tuple

  def policy_fn(o, key):
    return (o @ f32(K))[..., None] + sp * jax.random.normal(key, o.shape[:-1] + (1,))

  def q_fn(o, a):
    return o @ f32(w) + c * a[..., 0] + b0

  def draw_fn(o, a, key):
    k_s, k_r = jax.random.split(key)
    nxt = f32(mu) + jnp.sqrt(f32(v)) * jax.random.normal(k_s, o.shape)
    r = f32(mu_r) + np.sqrt(vr) * jax.random.normal(k_r, o.shape[:1])
    return nxt, r, jnp.zeros(o.shape[:1]), f32(u)

  gaps = jax.jit(lambda key: quantifier_quality.bellman_gaps(
      policy_fn, q_fn, draw_fn, quantifier_quality.Tuples(
          f32(obs), f32(action), f32(reward), f32(next_obs), f32(done)), key,
      gamma=g, num_draws=M, num_policy=P))(jax.random.PRNGKey(0))
  assert gaps["sample"].shape == gaps["u"].shape == (M, B) and gaps["exact"].shape == (B,)

  wk = w + c * K
  exact = reward + g * (1 - done) * (next_obs @ wk + b0)
  # B Q's own Monte Carlo error: g c sp / sqrt(P) per live tuple.
  np.testing.assert_allclose(np.asarray(gaps["exact"]), exact, atol=6 * g * c * sp / np.sqrt(P))
  np.testing.assert_array_equal(np.asarray(gaps["exact"])[:8], np.float32(reward[:8]))
  m = mu_r + g * (mu @ wk + b0)
  s = np.sqrt(vr + g**2 * ((wk**2 * v).sum(-1) + c**2 * sp**2))
  delta = exact - m
  abs_err = s * np.sqrt(2 / np.pi) * np.exp(-delta**2 / (2 * s**2)) + delta * (
      1 - 2 * norm.cdf(-delta / s))

  def accuracy(bound):
    return norm.cdf((bound - delta) / s) - norm.cdf((-bound - delta) / s)

  got = quantifier_quality.quantifier_scores(gaps["exact"], gaps["sample"], gaps["u"], beta)
  for suffix, bound in (("", beta * u), ("_unscaled", u)):
    want_acc, want_tight = accuracy(bound), bound - abs_err
    assert 0.2 < want_acc.mean() < 0.9                            # neither score is trivial
    assert got[f"accuracy{suffix}_mean"] == pytest.approx(want_acc.mean(), abs=0.02), suffix
    assert got[f"tightness{suffix}_mean"] == pytest.approx(want_tight.mean(), abs=0.05), suffix
    # Per tuple: within 5 standard errors of M draws (the bound for accuracy is 0.5 / sqrt(M)).
    np.testing.assert_allclose(got[f"accuracy{suffix}"], want_acc, atol=5 * 0.5 / np.sqrt(M))
    # sd(|D|) <= s, as E|D| >= |delta|.
    assert np.all(np.abs(got[f"tightness{suffix}"] - want_tight) <= 5 * s / np.sqrt(M)), suffix
  # Averaging B^ Q over the draws first (the removed definition) drops the single-sample error:
  # its tightness is U - |delta|, off the closed form by E|D| - |delta|, far beyond the tolerance.
  averaged = quantifier_quality.quantifier_scores(gaps["exact"], np.asarray(gaps["sample"]).mean(0),
                                        u, beta)
  assert averaged["tightness_mean"] > (beta * u - abs_err).mean() + 0.2


def test_exact_backup_uses_the_real_next_state_and_the_policy_mean(tiny_run):
  """B Q on a terminal row is the reward exactly; on a live row it is r + g * the mean over
  policy samples of min_j Q'(s', a'), here recomputed with the same policy draws."""
  workdir, _ = tiny_run
  nets = trained.load_run(workdir).nets[0]
  policy_fn, q_fn, _ = quantifier_quality.seed_functions(nets)
  rng = np.random.default_rng(1)
  next_obs = jnp.asarray(rng.normal(size=(3, 11)), jnp.float32)
  reward = jnp.array([1.0, -2.0, 0.5])
  done = jnp.array([1.0, 0.0, 0.0])
  key = jax.random.PRNGKey(5)
  got = quantifier_quality.exact_bellman(policy_fn, q_fn, reward, next_obs, done, key,
                               gamma=nets.config.agent.gamma, num_policy=64)
  assert float(got[0]) == 1.0
  actions, _ = nets.policy(jnp.broadcast_to(next_obs, (64, 3, 11)), key)
  q = np.asarray(nets.q(jnp.broadcast_to(next_obs, (64, 3, 11)), actions)).min(axis=0)
  want = np.asarray(reward) + nets.config.agent.gamma * q.mean(axis=0)
  np.testing.assert_allclose(np.asarray(got)[1:], want[1:], rtol=1e-5, atol=1e-6)


def test_u_is_what_the_runs_target_subtracts(tiny_run):
  """A model draw is a rollout row (dynamics.step with a random elite, d^ the termination fn),
  and its U, for MOMBO's lcb (U from the draw's own elite Gaussian) and elite_spread modes on the
  run's networks, is y(beta=0) - y(beta=1) of the run's own target on that row with the same key
  (model rows: past the target's leading real rows). Every mode and MOBILE: tests/test_targets.py.
  """
  workdir, _ = tiny_run
  nets = trained.load_run(workdir).nets[1]
  rng = np.random.default_rng(2)
  obs = jnp.asarray(rng.normal(scale=0.1, size=(8, 11)) + np.r_[1.25, np.zeros(10)], jnp.float32)
  action = jnp.asarray(rng.uniform(-1, 1, size=(8, 3)), jnp.float32)
  term_fn = termination.termination_fn(nets.config.env_name)
  modes = ("lcb", "elite_spread")

  @jax.jit
  def run(nets, obs, action, key):                # one compilation (eager MM costs more)
    row, u = quantifier_quality.model_draw(nets, obs, action, key)
    k_step, k_u = jax.random.split(key)
    step = dynamics.step(nets.dyn, obs, action, k_step, nets.config)
    out = {}
    for mode in modes:
      cfg = nets.config.replace(target=mode, clip_target_min=None)
      mode_nets = nets.replace(config=cfg)
      y = [targets.get_target(cfg)(mode_nets.agent(), row, k_u, dyn=nets.dyn, config=cfg,
                                   term_fn=term_fn, beta=b)[0] for b in (0.0, 1.0)]
      out[mode] = (y[0] - y[1], quantifier_quality.penalty(mode_nets, row, k_u))
    return row, u, quantifier_quality.penalty(nets, row, k_u, scaled=True), step, out

  row, u, scaled, step, out = run(nets, obs, action, jax.random.PRNGKey(3))
  np.testing.assert_array_equal(np.asarray(row.next_obs), np.asarray(step.next_obs))
  np.testing.assert_array_equal(np.asarray(row.reward), np.asarray(step.reward))
  np.testing.assert_array_equal(np.asarray(row.next_obs_var), np.asarray(step.next_obs_var))
  np.testing.assert_array_equal(np.asarray(row.done),
                                np.asarray(term_fn(obs, action, step.next_obs), np.float32))
  np.testing.assert_allclose(np.asarray(scaled), nets.config.beta * np.asarray(u), rtol=1e-6)
  if nets.config.target in out:
    np.testing.assert_array_equal(np.asarray(u), np.asarray(out[nets.config.target][1]))
  n_real = int(8 * nets.config.rollout.real_ratio)
  for mode, (diff, u) in out.items():
    diff, u = np.asarray(diff), np.asarray(u)
    assert u.shape == (8,) and np.all(u[n_real:] > 0), mode
    np.testing.assert_allclose(diff[n_real:], u[n_real:], rtol=1e-4, atol=1e-5, err_msg=mode)


def test_the_alternative_readings_on_a_hand_computed_case():
  """Deterministic pieces (policy a = K.s, linear q, a model that always draws (mu, mu_r, d^)):
  B^ Q with the real reward is r + g (1-d^) q(mu, K.mu) and B^ Q with the model's r^ the same with
  mu_r, for every draw; the draw's u_eq1 passes through, and each reading's scores are
  quantifier_scores of its own (B^ Q, U)."""
  B, M, g, beta = 4, 3, 0.9, 2.0
  w, K = np.array([1.0, -2.0], np.float32), np.array([0.5, -0.3], np.float32)
  obs = np.array([[0.1, 0.2], [1.0, -1.0], [0.5, 0.5], [-0.3, 0.0]], np.float32)
  action = np.zeros((B, 1), np.float32)
  reward = np.array([1.0, -0.5, 2.0, 0.0], np.float32)           # the tuples' real rewards
  next_obs = obs + 0.1
  done = np.zeros(B, np.float32)
  mu = obs * 0.5
  mu_r = np.array([0.3, 0.3, -1.0, 4.0], np.float32)             # the model's rewards
  done_hat = np.array([0.0, 1.0, 0.0, 0.0], np.float32)          # row 1: the model terminates
  u = np.array([0.5, 0.5, 0.5, 0.5], np.float32)
  u_eq1 = np.array([0.0, 1.0, 2.0, 3.0], np.float32)

  policy_fn = lambda o, key: (o @ K)[..., None]                  # noqa: E731
  q_fn = lambda o, a: o @ w + a[..., 0]                          # noqa: E731

  def draw_fn(o, a, key):
    return quantifier_quality.Draw(jnp.asarray(mu), jnp.asarray(mu_r), jnp.asarray(done_hat),
                                   jnp.asarray(u), jnp.asarray(u_eq1))

  tuples = quantifier_quality.Tuples(obs, action, reward, next_obs, done)
  gaps = quantifier_quality.bellman_gaps(policy_fn, q_fn, draw_fn, tuples, jax.random.PRNGKey(0),
                                         gamma=g, num_draws=M, num_policy=5)
  q_hat = (1 - done_hat) * (mu @ w + mu @ K)
  np.testing.assert_allclose(gaps["sample_real_reward"], np.broadcast_to(reward + g * q_hat,
                                                                         (M, B)), rtol=1e-6)
  np.testing.assert_allclose(gaps["sample"], np.broadcast_to(mu_r + g * q_hat, (M, B)), rtol=1e-6)
  np.testing.assert_array_equal(gaps["u_eq1"], np.broadcast_to(u_eq1, (M, B)))
  np.testing.assert_allclose(gaps["exact"], reward + g * (next_obs @ w + next_obs @ K), rtol=1e-6)
  got = quantifier_quality.reading_scores({k: np.asarray(v) for k, v in gaps.items()}, beta)
  for reading, (sample, bound) in (("real_reward", ("sample_real_reward", "u")),
                                   ("eq1", ("sample", "u_eq1"))):
    want = quantifier_quality.quantifier_scores(gaps["exact"], gaps[sample], gaps[bound], beta)
    for k in ("accuracy", "tightness", "accuracy_unscaled", "tightness_unscaled"):
      np.testing.assert_allclose(got[f"{k}_{reading}"], want[k], err_msg=(reading, k))
      assert got[f"{k}_{reading}_mean"] == pytest.approx(want[f"{k}_mean"]), (reading, k)
  err_real = np.abs(np.asarray(gaps["exact"]) - (reward + g * q_hat))
  assert got["bellman_error_real_reward_mean"] == pytest.approx(err_real.mean(), rel=1e-6)
  assert got["penalty_eq1_mean"] == pytest.approx(beta * u_eq1.mean())
  # A 4-tuple draw (no u_eq1) scores the real-reward reading only.
  plain = quantifier_quality.bellman_gaps(
      policy_fn, q_fn, lambda o, a, k: draw_fn(o, a, k)[:4], tuples, jax.random.PRNGKey(0),
      gamma=g, num_draws=M, num_policy=5)
  assert "u_eq1" not in plain and "sample_real_reward" in plain
  assert not any(k.endswith("_eq1") for k in quantifier_quality.reading_scores(
      {k: np.asarray(v) for k, v in plain.items()}, beta))


def test_eq1_u_is_the_mm_std_of_the_min_target_critic(tiny_run):
  """MOMBO's U as eq. (1) on a model row, sqrt(var_r + g^2 (1-d) v*), recomputed by hand from the
  run's target critics (v* the MM variance of the critic with the smaller MM mean at (mu_s',
  a' ~ pi(mu_s')) with input variance var_s'); 0 for a zero-variance model; for a lcb run it is
  the run's own U, for the released code's elite_spread another number."""
  workdir, _ = tiny_run
  nets = trained.load_run(workdir).nets[0]
  g = nets.config.agent.gamma
  rng = np.random.default_rng(4)
  B = 6
  obs = jnp.asarray(rng.normal(scale=0.1, size=(B, 11)) + np.r_[1.25, np.zeros(10)], jnp.float32)
  action = jnp.asarray(rng.uniform(-1, 1, size=(B, 3)), jnp.float32)
  mean = obs + 0.01
  var = jnp.asarray(rng.uniform(0.01, 0.2, size=(B, 11)), jnp.float32)
  reward_var = jnp.asarray(rng.uniform(0.0, 0.5, size=B), jnp.float32)
  done = jnp.asarray([0, 0, 0, 0, 1, 0], jnp.float32)

  def rows(var, reward_var):
    zeros = jnp.zeros_like(obs)
    return buffer.Batch(obs=obs, action=action, reward=jnp.zeros(B), next_obs=mean, done=done,
                        obs_var=zeros, next_obs_mean=mean, next_obs_var=var,
                        reward_mean=jnp.zeros(B), reward_var=reward_var)

  lcb = nets.replace(config=nets.config.replace(target="lcb"))

  @jax.jit
  def run(nets, lcb, key):
    a, _ = nets.policy(mean, key)                 # the a' the target draws with the same key
    m, v = nets.q(mean, a, obs_var=var)           # [E, B] MM moments of the target critics
    own = quantifier_quality.model_draw(lcb, obs, action, key, eq1=True)
    spread = quantifier_quality.model_draw(nets, obs, action, key, eq1=True)
    return (quantifier_quality.penalty_eq1(nets, rows(var, reward_var), key),
            quantifier_quality.penalty_eq1(nets, rows(jnp.zeros_like(var), jnp.zeros(B)), key),
            m, v, own, spread)

  got, zero, m, v, own, spread = run(nets, lcb, jax.random.PRNGKey(7))
  v_star = np.take_along_axis(np.asarray(v), np.argmin(np.asarray(m), 0)[None], 0)[0]
  want = np.sqrt(np.asarray(reward_var) + g**2 * (1 - np.asarray(done)) * v_star)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5)
  assert float(np.asarray(got)[4]) == pytest.approx(float(np.sqrt(reward_var[4])), rel=1e-6)
  np.testing.assert_array_equal(np.asarray(zero), np.zeros(B, np.float32))   # no variance: 0
  _, u_lcb, u_eq1 = own
  np.testing.assert_array_equal(np.asarray(u_lcb), np.asarray(u_eq1))
  _, u_spread, u_eq1_spread = spread
  np.testing.assert_array_equal(np.asarray(u_eq1_spread), np.asarray(u_eq1))  # same row, key
  assert not np.allclose(np.asarray(u_spread), np.asarray(u_eq1))


def test_policy_states_are_recorded_in_the_runs_dataset_env(tiny_run, monkeypatch):
  """--states=policy steps the env of the run's dataset (envs.eval_env_spec: D4RL's walker model
  for an imported D4RL walker, tests/test_eval_env.py), not the bare env name."""
  workdir, _ = tiny_run
  seen = []

  class Stop(Exception):
    pass

  def fake(nets, env_name, *args, **kwargs):
    seen.append(env_name)
    raise Stop

  monkeypatch.setattr(quantifier_quality, "real_transitions", fake)
  with pytest.raises(Stop):
    uncertainty_runs.evaluate_runs([workdir], uncertainty_runs.TupleSource(states="policy"),
                                   log=lambda *_: None)
  assert seen == [trained.load_run(workdir).dataset] == ["hopper-random"]


def test_dataset_states_are_one_fixed_draw():
  from mombo_jax.data import transitions as transitions_lib
  n = 50
  t = transitions_lib.Transitions(observations=np.arange(n * 2, dtype=np.float32).reshape(n, 2),
                       actions=np.zeros((n, 1), np.float32), rewards=np.arange(n, dtype=np.float32),
                       next_observations=np.ones((n, 2), np.float32),
                       terminals=(np.arange(n) % 7 == 0).astype(np.float32))
  a, b = (quantifier_quality.dataset_states(t, 10, seed=0) for _ in range(2))
  assert len(a["index"]) == 10 and len(set(a["index"].tolist())) == 10
  np.testing.assert_array_equal(a["index"], b["index"])
  np.testing.assert_array_equal(a["reward"], a["index"].astype(np.float32))
  np.testing.assert_array_equal(a["done"], (a["index"] % 7 == 0).astype(np.float32))
  assert len(quantifier_quality.dataset_states(t, 1000)["index"]) == n   # all of a smaller one


def _blocks(text):
  """{block title: its markdown} of a rendered table."""
  return {part.split("\n", 1)[0]: part for part in text.split("\n## ")[1:]}


def test_table_has_the_papers_numbers_beside_the_as_trained_blocks():
  """Table 2's own numbers (paper_results) stand in their own columns beside the as-trained
  accuracy and tightness on the paper's datasets only, never in the U / beta blocks, with the
  note saying what they compare with; ours keep the bold / underline rule to themselves."""
  from mombo_jax.report import paper_results
  rows = [dict(run="r", env="hopper", dataset=dataset, algo=algo, target="", states="policy",
               seed=seed, epoch=1, beta=2.0, transitions=10, draws=5, num_policy=7,
               accuracy=0.1 * (seed + 1), tightness=-1.0 - seed, accuracy_unscaled=0.05,
               tightness_unscaled=-2.0, penalty_mean=2.0, penalty_unscaled_mean=1.0,
               bellman_error_mean=3.0)
          for dataset in ("hopper-random", "mujoco/hopper/expert-v0")
          for algo in ("MOBILE", "MOMBO (elite_spread)") for seed in (0, 1)]
  text = uncertainty_runs.table_markdown(rows)
  blocks = _blocks(text)
  for metric, title in uncertainty_runs.METRICS[:2]:
    header, paper_row, other_row = [line for line in blocks[title].splitlines()
                                    if line.startswith(("| Dataset type", "| random",
                                                        "| mujoco"))]
    assert header.endswith("| MOBILE | MOBILE (paper) | MOMBO (elite_spread) | MOMBO (paper) |")
    cells = [c.strip() for c in paper_row.split("|")[1:-1]]
    for col, algo in ((3, "MOBILE"), (5, "MOMBO")):
      mean, std = paper_results.uncertainty("hopper-random", algo, metric)
      assert cells[col] == f"{mean:.3f} ± {std:.3f}", (metric, algo)
    assert "**" not in cells[3] + cells[5]          # references, not in the table rule
    assert [c.strip() for c in other_row.split("|")[1:-1]][3] == "–"   # no Table 2 number
  for _, title in uncertainty_runs.METRICS[2:]:
    assert "(paper)" not in blocks[title], title
  assert "the paper's Table 2" in text and "*U / beta* blocks" in text
  assert "Table 1 for D4RL" not in text          # writer.py's note on the score tables is replaced


def test_reduced_runs_are_marked_as_in_the_report_and_never_bold_beside_the_paper():
  """A run below the paper's setup (rows' `below`, paper_setup.shortfalls as report.md reads it)
  is marked § with its footnote in every block, and takes no bold or underline beside the
  paper's Table 2 columns; the same rows at the paper's setup are bold there."""
  def rows(below):
    return [dict(run="r", env="hopper", dataset="hopper-random", algo="MOMBO (elite_spread)",
                 target="elite_spread", states="policy", seed=seed, epoch=1, beta=2.0,
                 transitions=10, draws=5, num_policy=7, accuracy=0.8 + 0.05 * seed,
                 tightness=-1.0, accuracy_unscaled=0.5, tightness_unscaled=-2.0, penalty_mean=2.0,
                 penalty_unscaled_mean=1.0, bellman_error_mean=3.0, below=below)
            for seed in (0, 1)]
  short = "60 gradient steps (paper: 3,000,000)"
  reduced, full = (_blocks(uncertainty_runs.table_markdown(rows(b))) for b in (short, ""))
  title = uncertainty_runs.METRICS[0][1]
  ours = [line for line in reduced[title].splitlines() if line.startswith("| random")][0]
  cell = [c.strip() for c in ours.split("|")[1:-1]][2]
  assert cell.startswith("0.825 ± 0.025") and "§" in cell and "**" not in cell, cell
  assert f"§ MOMBO (elite_spread) on hopper-random: below the paper's setup: {short}." in \
      reduced[title]
  ours = [line for line in full[title].splitlines() if line.startswith("| random")][0]
  assert [c.strip() for c in ours.split("|")[1:-1]][2].startswith("**0.825 ± 0.025**")


def test_no_block_bolds_a_reduced_cell_the_alternative_readings_included():
  """Every block of a table of runs below the paper's setup (the U / beta blocks and the
  alternative readings', eq. (1) and the real reward, which have no paper column) leaves the §
  cells and the summary rows unbolded (the 2026-11-27 device record bolded `0.195 ± 0.040 §`)."""
  readings = {k: 0.3 + 0.01 * i for i, k in enumerate(uncertainty_runs.READING_COLUMNS)}
  rows = [dict(run="r", env="hopper", dataset="hopper-random", algo=algo, target="",
               states="policy", seed=seed, epoch=1, beta=2.0, transitions=10, draws=5,
               num_policy=7, accuracy=0.8 + 0.05 * seed + 0.01 * a, tightness=-1.0 - a,
               accuracy_unscaled=0.5 + a, tightness_unscaled=-2.0, penalty_mean=2.0,
               penalty_unscaled_mean=1.0, bellman_error_mean=3.0,
               below="60 gradient steps (paper: 3,000,000)",
               **{k: v + 0.02 * a + 0.01 * seed for k, v in readings.items()})
          for a, algo in enumerate(("MOPO", "MOMBO (elite_spread)")) for seed in (0, 1)]
  blocks = _blocks(uncertainty_runs.table_markdown(rows))
  titles = [t for t, _, _, _ in uncertainty_runs.READING_BLOCKS]
  eq1 = [t for t in blocks if "eq. (1)" in t]
  assert len(eq1) == 4, list(blocks)
  for title, text in blocks.items():
    cells = [c for line in text.splitlines()[1:] if line.startswith("| ")
             for c in line.split("|")[3:]]        # past the row's two labels
    assert cells and not any("**" in c for c in cells), (title, text)
  assert set(titles) <= set(blocks)


def test_table_has_the_readings_blocks_and_columns(tmp_path):
  """The alternatives' columns (uncertainty_runs.READING_COLUMNS) go to the CSV after the chosen
  reading's; uncertainty.md gets their blocks, the paper's Table 2 numbers beside the as-trained
  ones only; MOMBO's U as eq. (1) is MOMBO's (–, never a number, for MOBILE); no background
  document is cited."""
  import csv

  from mombo_jax.report import paper_results
  base = dict(run="r", env="hopper", dataset="hopper-random", target="", states="policy", epoch=1,
              beta=2.0, transitions=10, draws=5, num_policy=7, accuracy=0.5, tightness=-1.0,
              accuracy_unscaled=0.05, tightness_unscaled=-2.0, penalty_mean=2.0,
              penalty_unscaled_mean=1.0, bellman_error_mean=3.0)
  readings = dict(accuracy_real_reward=0.7, tightness_real_reward=0.25,
                  accuracy_unscaled_real_reward=0.125, tightness_unscaled_real_reward=-0.75,
                  bellman_error_real_reward_mean=1.75, accuracy_eq1=0.375, tightness_eq1=-1.5,
                  accuracy_unscaled_eq1=0.0625, tightness_unscaled_eq1=-2.25,
                  penalty_eq1_mean=1.5, penalty_unscaled_eq1_mean=0.75)
  assert set(readings) == set(uncertainty_runs.READING_COLUMNS)
  rows = []
  for algo in ("MOBILE", "MOMBO (elite_spread)"):
    for seed in (0, 1):
      extra = dict(readings)
      if algo == "MOBILE":
        extra.update({k: float("nan") for k in readings if "eq1" in k})
      rows.append(dict(base, algo=algo, seed=seed, **extra))
  csv_path, md_path = uncertainty_runs.write_outputs(rows, str(tmp_path), "policy")
  with open(csv_path) as f:
    header = next(csv.reader(f))
  assert header[-len(readings):] == list(uncertainty_runs.READING_COLUMNS)
  assert header.index("bellman_error_mean") < header.index("accuracy_real_reward")
  with open(md_path) as f:
    text = f.read()
  assert "SPEC" not in text and "shared/" not in text
  assert 'docs/protocol.md, "Table 2 (uncertainty quantifiers): the reading"' in text
  blocks = _blocks(text)
  for title, metric, column, paper in uncertainty_runs.READING_BLOCKS:
    lines = [line for line in blocks[title].splitlines() if line.startswith(("| Dataset type",
                                                                             "| random"))]
    header, row = lines
    cells = [c.strip() for c in row.split("|")[1:-1]]
    if paper:
      assert header.endswith("| MOBILE | MOBILE (paper) | MOMBO (elite_spread) | MOMBO (paper) |")
      mean, std = paper_results.uncertainty("hopper-random", "MOMBO", metric)
      assert cells[5] == f"{mean:.3f} ± {std:.3f}", title
      ours = cells[4]
    else:
      assert "(paper)" not in header, title
      ours = cells[3]
    assert ours.strip("*<u/>").startswith(f"{readings[column]:.3f} ± 0.000"), (title, ours)
    if "eq1" in column:
      assert cells[2] == "–", title               # MOBILE has no eq. (1) U
    else:
      assert cells[2].strip("*<u/>").startswith(f"{readings[column]:.3f}"), title
  mean_rows = [line for line in blocks["Mean U and Bellman error"].splitlines()
               if line.startswith("| hopper-random")]
  assert mean_rows[0].startswith("| hopper-random | MOBILE |") and mean_rows[0].count("| – ") == 2
  assert "| 1.5 ± 0 | 0.75 ± 0 | 1.75 ± 0 |" in mean_rows[1]
  # Rows without the columns (a CSV of an older version) get no readings' blocks.
  plain = [{k: v for k, v in r.items() if k not in readings} for r in rows]
  assert "real reward" not in "".join(_blocks(uncertainty_runs.table_markdown(plain)))


def test_help_describes_the_definition():
  out = subprocess.run([sys.executable, "-m", "experiments.uncertainty", "--help"],
                       capture_output=True, text=True, timeout=HANG_S)
  text = out.stdout + out.stderr
  for needle in ("Uncertainty quantifier", "docs/protocol.md", "B^ Q", "--states", "--draws",
                 "--num_policy", "--num_states", "unscaled", "real_reward", "eq1",
                 "accuracy_real_reward", "penalty_eq1_mean"):
    assert needle in text, needle
  # The project's own docs are cited, never its background inputs.
  assert "SPEC" not in text and "shared/" not in text


@pytest.mark.slow
@pytest.mark.parametrize("states", ["policy", "dataset"])
def test_experiment_end_to_end(tiny_run, tmp_path, states):
  from mombo_jax.report import paper_results
  workdir, _ = tiny_run
  assert uncertainty_runs.find_run_dirs([workdir, workdir + "/"]) == [workdir]
  with pytest.raises(ValueError, match=f"No runs.*found under {tmp_path}"):
    uncertainty_runs.find_run_dirs([str(tmp_path)])
  draws = 20
  # 8 tuples either way (<= 8 policy tuples pad to 8), so both modes share one compilation.
  lines = []
  rows = uncertainty_runs.evaluate_runs(
      [workdir], uncertainty_runs.TupleSource(states=states, episodes=2, max_episode_steps=30,
                                              num_states=8),
      uncertainty_runs.Scoring(draws=draws, num_policy=50), log=lines.append)
  # One line per run: what its partial restore read of the checkpoint, and the peak memory.
  assert lines[0].startswith(f"{workdir}: read ") and "MiB of the checkpoint's" in lines[0]
  assert "ring buffers and optimiser states skipped); peak memory" in lines[0], lines
  assert [r["seed"] for r in rows] == [0, 1] and len({r["algo"] for r in rows}) == 1
  assert rows[0]["algo"].startswith("MOMBO") and {r["states"] for r in rows} == {states}
  for r in rows:
    n = r["transitions"]
    if states == "policy":
      assert 2 <= n <= 2 * 4                    # <= 30 steps: 9, 19, 29 or the last; 2 episodes
    else:
      assert n == 8
    for k in ("accuracy", "accuracy_unscaled"):  # a fraction of n * draws
      assert abs(r[k] * n * draws - round(r[k] * n * draws)) < 1e-6 and 0 <= r[k] <= 1
    # tightness = mean U - mean |B Q - B^ Q|, as trained and unscaled
    assert r["tightness"] == pytest.approx(r["penalty_mean"] - r["bellman_error_mean"], rel=1e-5,
                                           abs=1e-6)
    assert r["tightness_unscaled"] == pytest.approx(
        r["penalty_unscaled_mean"] - r["bellman_error_mean"], rel=1e-5, abs=1e-6)
    assert r["penalty_mean"] == pytest.approx(r["beta"] * r["penalty_unscaled_mean"], rel=1e-5)
    assert r["penalty_mean"] > 0 and np.isfinite(r["bellman_error_mean"])
    # The alternative readings, on the same draws: the real reward in B^ Q (U unchanged), and
    # MOMBO's U as eq. (1) (B^ Q unchanged).
    assert list(r)[-len(uncertainty_runs.READING_COLUMNS):] == list(
        uncertainty_runs.READING_COLUMNS)
    assert r["tightness_real_reward"] == pytest.approx(
        r["penalty_mean"] - r["bellman_error_real_reward_mean"], rel=1e-5, abs=1e-6)
    assert r["tightness_eq1"] == pytest.approx(
        r["penalty_eq1_mean"] - r["bellman_error_mean"], rel=1e-5, abs=1e-6)
    assert r["tightness_unscaled_eq1"] == pytest.approx(
        r["penalty_unscaled_eq1_mean"] - r["bellman_error_mean"], rel=1e-5, abs=1e-6)
    assert r["penalty_eq1_mean"] == pytest.approx(r["beta"] * r["penalty_unscaled_eq1_mean"],
                                                  rel=1e-5)
    assert r["penalty_unscaled_eq1_mean"] > 0 and np.isfinite(r["bellman_error_real_reward_mean"])
    assert r["penalty_unscaled_eq1_mean"] != pytest.approx(r["penalty_unscaled_mean"])
  text = uncertainty_runs.table_markdown(rows)
  acc = np.array([r["accuracy"] for r in rows])
  assert f"{acc.mean():.3f} ± {acc.std():.3f}" in text
  assert f"states={states}" in text and "Accuracy (U / beta)" in text and "U / beta" in text
  # hopper-random is one of the paper's datasets: its Table 2 numbers sit beside ours.
  blocks = _blocks(text)
  for metric, title in uncertainty_runs.METRICS[:2]:
    mean, std = paper_results.uncertainty("hopper-random", "MOMBO", metric)
    assert "| MOMBO (paper) |" in blocks[title] and f"{mean:.3f} ± {std:.3f}" in blocks[title]
  assert uncertainty_runs.output_names(states) == (
      ("uncertainty.csv", "uncertainty.md") if states == "policy" else
      ("uncertainty_dataset.csv", "uncertainty_dataset.md"))
  csv_path, md_path = uncertainty_runs.write_outputs(rows, str(tmp_path / "out"), states)
  assert (os.path.basename(csv_path), os.path.basename(md_path)) == uncertainty_runs.output_names(
      states)
  with open(md_path) as f:
    assert f.read() == text
  with open(csv_path) as f:
    assert len(f.read().strip().splitlines()) == 1 + len(rows)
  if states == "dataset":
    from mombo_jax.data import transitions as transitions_lib
    picked = quantifier_quality.dataset_states(
        transitions_lib.load_transitions(rows[0]["dataset"]), 8, 0)
    assert len(picked["index"]) == 8             # the same 8 for every seed and algorithm
  assert os.path.isdir(workdir)
