"""workdir.Workdir, the one owner of a run on disk: config.json round trip and refusals, restores
against the typed template (whole and partial: run_state), finding runs, the layout's names."""
import json
import os

import jax
import numpy as np
import pytest

from mombo_jax.core import key_scheme, train as train_lib
from mombo_jax.dynamics import reuse
from mombo_jax.errors import UserError
from mombo_jax.records import run_search, workdir as workdir_lib
from mombo_jax.records.workdir import Workdir
from mombo_jax.run import run_state
from mombo_jax.settings import config as config_lib
from tests.conftest_runs import DATASET, tiny_run  # noqa: F401


def _equal(a, b):
  a, b = jax.tree.leaves(a), jax.tree.leaves(b)
  assert len(a) == len(b)
  for x, y in zip(a, b):
    if jax.dtypes.issubdtype(getattr(x, "dtype", None), jax.dtypes.prng_key):
      x, y = jax.random.key_data(x), jax.random.key_data(y)
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_config_round_trip_and_refusals(tmp_path):
  wd = Workdir(str(tmp_path / "run"))
  config = config_lib.make_config(DATASET, "mombo", "tiny", num_seeds=2)
  with pytest.raises(UserError, match="config.json is missing"):
    wd.read_config()
  record, notes = wd.check_config(config, DATASET)
  assert notes == [] and not os.path.exists(wd.file(workdir_lib.CONFIG))   # wrote nothing
  wd.write_config(record)
  assert wd.read_config() == (config, DATASET)
  with pytest.raises(UserError, match=r"another config \(beta: 4\.5 -> 2\.0\)"):
    wd.check_config(config_lib.make_config(DATASET, "mombo", "tiny", num_seeds=2, beta=2.0),
                    DATASET)
  (tmp_path / "run" / "config.json").write_text("{not json")
  with pytest.raises(UserError, match="unreadable.*delete that file"):
    wd.check_config(config, DATASET)


def test_layout_names():
  assert workdir_lib.run_dir("runs", "mujoco/hopper/medium-v0", "mombo", "lcb", 3, 4, 0.5) == \
      os.path.join("runs", "mujoco_hopper_medium-v0", "mombo-lcb-beta0.5", "s3x4")
  assert workdir_lib.run_dir("r", "hopper-random", "mopo", "lcb", 0, 1) == \
      os.path.join("r", "hopper-random", "mopo", "s0x1")
  # A source other than the algorithm's default names the folder; the default keeps the name.
  assert workdir_lib.run_dir("r", "hopper-random", "mobile", "lcb", 0, 1, reference="authors") == \
      os.path.join("r", "hopper-random", "mobile-authors", "s0x1")
  assert workdir_lib.run_dir("r", "hopper-random", "mobile", "lcb", 0, 1, 2.0,
                             "offlinerl_kit") == os.path.join("r", "hopper-random", "mobile-beta2",
                                                              "s0x1")
  wd = Workdir("w")
  assert wd.dynamics_dir == os.path.join("w", "dynamics")
  assert Workdir("w", "shared").dynamics_dir == "shared"
  config = config_lib.make_config(DATASET, "mombo", "tiny", seed=2, num_seeds=3)
  # The ensembles' folder names the seeds and the training settings (reuse.settings_tag).
  assert reuse.dynamics_path("d", config) == os.path.join("d", "seed2x3-cap2-") + \
      reuse.settings_tag(config).split("-")[1]
  assert reuse.legacy_dynamics_path("d", config) == os.path.join("d", "seed2x3")


def test_cell_keys_are_per_seed():
  """Seed i's keys do not depend on how many seeds a launch trains (a 1-seed run of seed 1
  trains what seed 1 of a 2-seed run trains)."""
  two = key_scheme.cell_keys(config_lib.make_config(DATASET, "mombo", "tiny", num_seeds=2))
  one = key_scheme.cell_keys(config_lib.make_config(DATASET, "mombo", "tiny", seed=1))
  for a, b in zip(two, one):
    assert a.shape[0] == 2 and b.shape[0] == 1
    np.testing.assert_array_equal(np.asarray(a[1]), np.asarray(b[0]))
  assert not np.array_equal(np.asarray(two[0]), np.asarray(two[1]))   # dynamics != init keys


def test_restore_whole_and_partial_against_the_template(tiny_run):
  workdir, state = tiny_run
  wd = Workdir(workdir)
  template = run_state.state_template(wd)
  assert isinstance(template, train_lib.CellState)
  assert jax.tree.structure(template) == jax.tree.structure(state)
  restored, meta = run_state.restore(wd)
  assert isinstance(restored, train_lib.CellState) and meta["epoch"] == 2
  _equal(restored, state)
  # Only the actors (analysis, policy export): a sub-tree of the saved state.
  actors, _ = run_state.restore(wd, {"agent": {"actor": {"params": template.agent.actor.params}}},
                                partial=True)
  _equal(actors["agent"]["actor"]["params"], state.agent.actor.params)
  with pytest.raises(UserError, match="no checkpoints folder"):
    run_state.restore(Workdir(os.path.dirname(workdir)), template)


def test_find_runs_and_name_what_is_missing(tmp_path, tiny_run):
  workdir, _ = tiny_run
  found, warnings = run_search.find_runs([workdir],
                                         need=(workdir_lib.CONFIG, workdir_lib.CHECKPOINTS))
  assert found == [os.path.normpath(workdir)] and warnings == []
  half = tmp_path / "runs" / "half"
  half.mkdir(parents=True)
  (half / "config.json").write_text(json.dumps({}))
  found, warnings = run_search.find_runs([str(tmp_path / "runs")])
  assert found == [] and len(warnings) == 1
  assert "missing metrics.csv, summary.json (unfinished run?)" in warnings[0]
  with pytest.raises(UserError, match="is not a folder"):
    run_search.find_runs([str(tmp_path / "nowhere")])


def test_an_older_runs_rollout_penalty_is_read_under_its_name_of_today(tmp_path):
  """Runs before the rename logged the rollouts' reward penalty as rollout/mopo_penalty for every
  algorithm penalising the reward: metrics.csv's readers (the report, a resume) see
  rollout/penalty, and a resumed run writes its rows back under that one name."""
  wd = Workdir(str(tmp_path))
  (tmp_path / "metrics.csv").write_text(
      "epoch,step,seed,normalized_score,rollout/mopo_penalty\n1,10,0,3.5,0.25\n")
  rows = wd.read_rows()
  assert rows == [{"epoch": 1, "step": 10, "seed": 0, "normalized_score": 3.5,
                   "rollout/penalty": 0.25}]
  wd.write_rows(rows + [dict(rows[0], epoch=2, step=20)])
  assert (tmp_path / "metrics.csv").read_text().splitlines()[0] == \
      "epoch,step,seed,normalized_score,rollout/penalty"


def test_a_run_below_the_papers_budget_is_marked_on_its_learning_curve():
  """A smoke run's learning_curve.png says so under its title, as report.md marks its cells;
  a run at the paper's budget has no note."""
  tiny = workdir_lib.config_record(config_lib.make_config("hopper-random", "mopo", "tiny"),
                                   "hopper-random")
  assert workdir_lib.budget_note(tiny) == ("§ below the paper's budget: 40 gradient steps per "
                                           "seed (paper: 3,000,000)")
  paper = workdir_lib.config_record(config_lib.make_config("hopper-random", "mombo"),
                                    "hopper-random")
  assert workdir_lib.budget_note(paper) is None
  assert workdir_lib.budget_note({"env": "hopper-random"}) is None      # too old to tell
