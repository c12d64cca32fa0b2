"""The uncertainty-quantifier experiment (experiments.uncertainty, mombo_jax.analysis): accuracy and
tightness on batches with known Bellman errors, the transitions kept from an episode, and the
experiment end to end on a run folder."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mombo_jax import analysis
from tests.conftest_runs import tiny_run  # noqa: F401  (session fixture)


def test_accuracy_and_tightness_on_known_bellman_errors():
  u = np.array([1.0, 1.5, 0.5, 3.0, 0.0])
  exact = np.array([0.0, 1.0, 2.0, -1.0, 4.0])
  sample = np.array([1.0, -1.0, 2.0, 1.0, 4.25])
  # |B Q - B^ Q| = [1, 2, 0, 2, 0.25]: U = 1 equals its error and counts as accurate (>=).
  out = analysis.bellman_metrics(u, exact, sample)
  np.testing.assert_array_equal(out["accuracy"], [1, 0, 1, 1, 0])
  np.testing.assert_array_equal(out["tightness"], [0.0, -0.5, 0.5, 1.0, -0.25])
  assert out["accuracy_mean"] == 0.6
  assert out["tightness_mean"] == pytest.approx(0.15, abs=1e-15)
  # Random batch: a direct recomputation.
  rng = np.random.default_rng(0)
  u, exact, sample = rng.exponential(size=100), rng.normal(size=100), rng.normal(size=100)
  out = analysis.bellman_metrics(u, exact, sample)
  assert out["accuracy_mean"] == np.mean([ui >= abs(e - s) for ui, e, s in zip(u, exact, sample)])
  assert out["tightness_mean"] == pytest.approx(np.mean(u - np.abs(exact - sample)), rel=1e-12)


@pytest.mark.parametrize("length, kept", [(25, [9, 19, 24]), (20, [9, 19]), (5, [4]), (1, [0]),
                                          (0, [])])
def test_every_tenth_transition_and_the_last(length, kept):
  assert analysis.selected_steps(length).tolist() == kept


def test_terminal_rows_bootstrap_nothing_and_the_policy_mean_is_used(tiny_run):
  """B^ Q on a terminal row is the reward exactly; on a live row it is r + g * the mean over
  policy samples of min_j Q'(s', a'), here recomputed with the same policy draws."""
  workdir, _ = tiny_run
  nets = analysis.load_run(workdir).nets[0]
  rng = np.random.default_rng(1)
  next_obs = jnp.asarray(rng.normal(size=(3, 11)), jnp.float32)
  reward = jnp.array([1.0, -2.0, 0.5])
  done = jnp.array([1.0, 0.0, 0.0])
  key = jax.random.PRNGKey(5)
  got = analysis.sample_bellman(nets, reward, next_obs, done, key, num_policy=64)
  assert float(got[0]) == 1.0
  actions, _ = nets.policy(jnp.broadcast_to(next_obs, (64, 3, 11)), key)
  q = np.asarray(nets.q(jnp.broadcast_to(next_obs, (64, 3, 11)), actions)).min(axis=0)
  want = np.asarray(reward) + nets.config.gamma * q.mean(axis=0)
  np.testing.assert_allclose(np.asarray(got)[1:], want[1:], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_experiment_end_to_end(tiny_run, tmp_path):
  from experiments import uncertainty
  workdir, _ = tiny_run
  assert uncertainty.find_run_dirs([workdir, workdir + "/"]) == [workdir]
  with pytest.raises(ValueError, match=f"No runs.*found under {tmp_path}"):
    uncertainty.find_run_dirs([str(tmp_path)])
  rows = uncertainty.evaluate_runs([workdir], episodes=2, num_samples=50, max_episode_steps=30,
                                   log=lambda *a: None)
  assert [r["seed"] for r in rows] == [0, 1] and {r["algo"] for r in rows} == {"MOMBO"}
  for r in rows:
    n = r["transitions"]
    assert 2 <= n <= 2 * 4                      # <= 30 steps: 9, 19, 29 or the last; 2 episodes
    assert abs(r["accuracy"] * n - round(r["accuracy"] * n)) < 1e-9   # a fraction of n
    # tightness = mean U - mean |B Q - B^ Q|
    assert r["tightness"] == pytest.approx(r["penalty_mean"] - r["bellman_error_mean"], rel=1e-5,
                                           abs=1e-6)
    assert r["penalty_mean"] > 0
  text = uncertainty.table_markdown(rows)
  acc = np.array([r["accuracy"] for r in rows])
  assert f"{acc.mean():.2f} ± {acc.std():.2f}" in text
