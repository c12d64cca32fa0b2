"""Grid axes in one program (experiments.run --datasets / --betas): every (dataset, beta, seed) cell
trains in one compiled epoch, each (dataset, beta) in a workdir of its own that resumes alone and
holds what a single run of that cell gives."""
import dataclasses
import os
import shutil

import jax
import numpy as np
import pytest

from mombo_jax.collection import dataset_writer
from mombo_jax.core import buffer, train as train_lib
from mombo_jax.data import minari_io, names
from mombo_jax.errors import UserError
from mombo_jax.records.workdir import LOCK, Workdir
from mombo_jax.run import run_specs, run_state
from mombo_jax.settings import config as config_lib
from tests.launches import train_grid, train_run

# One hidden layer a network: the programs compile faster; the grid's claims do not depend on depth.
TINY = dict(epochs=2, steps_per_epoch=5, rollout_batch_size=32, eval_every=1, eval_episodes=1,
            actor_hidden=(8,), critic_hidden=(8,), dyn_hidden=(8,), dyn_weight_decay=(2.5e-5, 1e-4))
SHORT = "mombo/hopper/short-random-v0"     # a shorter second hopper dataset (padded in the stack)


@pytest.fixture(scope="module")
def datasets(hopper_random_2000):
  """hopper-random (2,000 steps) and SHORT, its first episodes (< 1,000 steps)."""
  episodes = minari_io.read_episodes(hopper_random_2000)
  keep, n = [], 0
  for ep in episodes:
    if n + len(ep["rewards"]) > 900:
      break
    keep.append(ep)
    n += len(ep["rewards"])
  dataset_writer.write_dataset(SHORT, keep, dataset_writer.DatasetMetadata(
      "test: the first episodes of hopper-random", "uniform random", env_name="hopper"),
      overwrite=True)
  return hopper_random_2000, SHORT


def _specs(root, datasets, betas, **kw):
  return run_specs.plan_runs("hopper-random", "mombo", "tiny", dict(TINY, **kw), datasets, betas,
                            root=str(root))


def _agent(workdir):
  state, _ = run_state.restore(Workdir(workdir))
  return state.agent


def test_stack_pads_with_nan_and_sampling_stays_inside_each_dataset():
  rng = np.random.default_rng(0)

  def batch(n, value):
    x = np.full((n, 2), value, np.float32)
    r = np.full(n, value, np.float32)
    return buffer.Batch(obs=x, action=x[:, :1], reward=r, next_obs=x, done=0 * r, obs_var=0 * x,
                        next_obs_mean=x, next_obs_var=0 * x, reward_mean=r, reward_var=0 * r)
  stacked, sizes = buffer.stack([batch(50, 1.0), batch(7, 2.0)])
  assert stacked.obs.shape == (2, 50, 2) and sizes.tolist() == [50, 7]
  assert np.isnan(stacked.reward[1, 7:]).all() and not np.isnan(stacked.reward[1, :7]).any()
  ring = buffer.init_ring(4, 2, 1)                 # empty: every row of a batch is real
  sample = jax.jit(lambda k, d, n: buffer.sample_mixed(stacked, ring, k, 64, 32, d, n))
  for seed in range(20):
    rows = sample(jax.random.PRNGKey(int(rng.integers(1 << 30))), 1, 7)
    np.testing.assert_array_equal(rows.reward, 2.0)     # only dataset 1's own 7 rows
    rows = sample(jax.random.PRNGKey(seed), 0, 50)
    np.testing.assert_array_equal(rows.reward, 1.0)


def test_runs_that_cannot_share_a_program_are_refused(tmp_path):
  with pytest.raises(UserError, match="buffer_retain_epochs"):    # the mixed datasets
    run_specs.check_runs(run_specs.plan_runs("hopper-random", "mombo", "tiny", {},
                                           ["hopper-random", "hopper-random-medium-1pct"], None,
                                           root=str(tmp_path)))
  # An env's four D4RL datasets differ in settings each cell carries (train.CELL_SETTINGS):
  # one program per algorithm.
  for env in names.ENVS:
    for algo in config_lib.ALGOS:
      run_specs.check_runs(run_specs.plan_runs(
          f"{env}-random", algo, "paper", {},
          [f"{env}-{q}" for q in ("random", "medium", "medium-replay", "medium-expert")], None,
          root=str(tmp_path)))
  with pytest.raises(UserError, match="repeat"):
    _specs(tmp_path, ["hopper-random"], [1.0, 1.0])
  # Betas alone differ: one program.
  run_specs.check_runs(_specs(tmp_path, ["hopper-random"], [0.5, 2.0]))


@pytest.mark.slow
def test_grid_runs_equal_single_launches_and_resume_alone(datasets, tmp_path):
  """2 datasets x 2 betas x 1 seed in one program, stopped after one of two epochs. Then one run
  (the padded dataset, the second beta) resumes alone to the end and equals a single run of it;
  a grid holding that finished run is refused, and the grid resumes together (its copy of the
  run equals the single launch too).

  The run that resumes alone is a copy of the grid run's workdir, so that the grid then resumes
  whole: the same four cells, the program compiled once (a C-cell program compiles per C)."""
  specs = _specs(tmp_path / "grid", list(datasets), [0.5, 3.0])
  assert [os.path.relpath(g.workdir, tmp_path / "grid") for g in specs] == [
      os.path.join("hopper-random", "mombo-elite_spread-beta0.5", "s0x1"),
      os.path.join("hopper-random", "mombo-elite_spread-beta3", "s0x1"),
      os.path.join(SHORT.replace("/", "_"), "mombo-elite_spread-beta0.5", "s0x1"),
      os.path.join(SHORT.replace("/", "_"), "mombo-elite_spread-beta3", "s0x1")]
  assert train_grid(specs, stop_after=1) == [None] * 4
  cell = specs[3]                            # a run of one seed: one cell
  assert cell.config.beta == 3.0 and cell.dataset == SHORT
  alone = dataclasses.replace(cell, workdir=str(tmp_path / "alone"))
  shutil.copytree(cell.workdir, alone.workdir, ignore=shutil.ignore_patterns(LOCK))
  summary = train_run(alone.config, alone.dataset, alone.workdir, alone.dynamics_dir)
  single = tmp_path / "single"
  fresh = train_run(cell.config, cell.dataset, str(single), cell.dynamics_dir)
  alone_agent, single_agent = _agent(alone.workdir), _agent(str(single))
  # Same data, keys and beta; vmap widths differ (4 cells vs 1), so XLA may fuse differently.
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5),
               alone_agent, single_agent)
  assert summary["final_normalized_score_mean"] == pytest.approx(
      fresh["final_normalized_score_mean"], abs=1.0)

  # A grid of runs at different epochs is refused (the finished one: epochs differ).
  with pytest.raises(UserError, match="different epochs"):
    train_grid(specs[:3] + [alone])
  resumed = train_grid(specs)
  assert all(s is not None and not s["diverged"] for s in resumed)
  # The grid's own copy of the run, both epochs in the 4-cell program, holds the single run too.
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5),
               _agent(cell.workdir), single_agent)
  # Different betas trained different critics on the same data and seed.
  a, b = _agent(specs[0].workdir), _agent(specs[1].workdir)
  assert not all(np.allclose(x, y) for x, y in zip(jax.tree.leaves(a.critic.params),
                                                   jax.tree.leaves(b.critic.params)))
  for g in specs + [alone]:
    assert Workdir(g.workdir).finished()


@pytest.mark.slow
def test_runs_of_an_envs_datasets_settings_train_as_single_launches(datasets, tmp_path):
  """Groups differing in what an env's D4RL datasets differ in (rollout length 5 vs 1, real ratio
  0.05 vs 0.5, learned vs fixed alpha: train.CELL_SETTINGS, each cell reads its own) train in one
  program, stopped after one of two epochs. Each workdir then resumes alone (the k=1 run's
  checkpoint holds its own, shorter ring: what a plain run of it saves) and equals a single run.

  Two runs, one differing in all three settings: one grid compile and one plain-run compile per
  run (the first run's is test_grid_runs_equal_single_launches_and_resume_alone's)."""
  dyn_dir = str(tmp_path / "dynamics")       # the settings leave the dynamics alike: train once
  variants = {"paper": {}, "other": dict(rollout_length=1, real_ratio=0.5, auto_alpha=False)}
  specs = [run_specs.RunSpec(config_lib.make_config("hopper-random", "mombo", "tiny",
                                                    **dict(TINY, beta=3.0, **kw)),
                             SHORT, str(tmp_path / "grid" / name), dyn_dir)
            for name, kw in variants.items()]
  run_specs.check_runs(specs)
  assert train_grid(specs, stop_after=1) == [None] * 2
  short = specs[1].config
  wd = Workdir(specs[1].workdir)
  state, _ = run_state.restore(wd, run_state.state_template(wd, short))
  assert state.buffer.data.reward.shape == (1, train_lib.capacity(short))
  assert train_lib.capacity(short) < train_lib.capacity(specs[0].config)
  for g, name in zip(specs, variants):
    assert train_run(g.config, g.dataset, g.workdir, g.dynamics_dir) is not None  # alone
    single = str(tmp_path / "single" / name)
    train_run(g.config, g.dataset, single, g.dynamics_dir)
    # Same data, keys and settings; vmap widths differ (2 cells vs 1), so XLA may fuse differently.
    for a, b in zip(jax.tree.leaves(_agent(g.workdir)), jax.tree.leaves(_agent(single)),
                    strict=True):
      np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5, err_msg=name)
  assert float(np.asarray(_agent(specs[1].workdir).log_alpha.params["log_alpha"])[0]) == 0.0


def test_the_log_names_the_variant_and_every_beta_of_a_grid():
  mombo = config_lib.make_config("hopper-medium-replay", "mombo", target="lcb")
  assert (run_specs.describe_algorithm(mombo)
          == "MOMBO, target lcb (the paper's eq. (1)), beta 0.15")
  assert run_specs.describe_algorithm(mombo, [0.15, 1.0]).endswith("betas 0.15, 1")
  assert (run_specs.describe_algorithm(config_lib.make_config("hopper-random", "mopo"))
          == "MOPO, lambda 1")
