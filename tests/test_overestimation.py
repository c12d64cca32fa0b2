"""Overestimation made visible: the return bound max|r| / (1 - gamma) of a dataset, the per-seed
watch of the critics' mean Q against it (flagged once, never a divergence), and what a run reports
(progress line, metrics.csv, summary.json) when it fires."""
import json
import os

import numpy as np
import pytest

from mombo_jax.core import buffer
from mombo_jax.records import outputs
from mombo_jax.run import overestimation
from tests.launches import train_run


def _batch(rewards):
  r = np.asarray(rewards, np.float32)
  x = np.zeros((len(r), 2), np.float32)
  return buffer.Batch(obs=x, action=x[:, :1], reward=r, next_obs=x, done=0 * r, obs_var=x,
                      next_obs_mean=x, next_obs_var=x, reward_mean=r, reward_var=0 * r)


def test_return_bound_ignores_the_nan_padding_of_stacked_datasets():
  assert overestimation.return_bound([1.0, -3.0, 2.0], 0.99) == pytest.approx(300.0)
  stacked, sizes = buffer.stack([_batch([0.5, -2.0, 1.0, 0.0, 0.1]), _batch([0.25, -0.1])])
  assert np.isnan(stacked.reward[1, 2:]).all()
  bounds = overestimation.return_bound(stacked.reward, 0.9)
  assert bounds.shape == (2,) and np.isfinite(bounds).all()
  np.testing.assert_allclose(bounds, [20.0, 2.5], rtol=1e-6)
  # Degenerate inputs: gamma = 1 bounds nothing; a dataset of padding only has no bound.
  assert overestimation.return_bound([1.0, 2.0], 1.0) == np.inf
  assert np.isnan(overestimation.return_bound([np.nan, np.nan], 0.99))


def test_the_flag_fires_once_per_seed_and_keeps_the_largest_q():
  watch = overestimation.OverestimationWatch([3, 4], bound=100.0)
  assert not watch.update(3, 1, 50.0)
  assert not watch.update(4, 1, 99.0)
  assert watch.update(3, 2, 150.0)              # first time past the bound: reported
  assert not watch.update(3, 3, 300.0)          # already flagged: not again
  assert not watch.update(3, 4, 20.0)           # back below: the flag stays
  assert not watch.update(4, 2, np.nan)         # a NaN (diverging seed) is not a measurement
  assert not watch.update(4, 3, 100.0)          # equal to the bound is not past it
  assert watch.flagged() == [3]
  s = watch.summary([3, 4])
  assert s["q_bound"] == 100.0
  assert s["q_mean_last"] == [20.0, 100.0] and s["q_mean_max"] == [300.0, 100.0]
  assert s["overestimated"] == [True, False] and s["overestimated_epoch"] == [2, None]
  assert not overestimation.overestimates(np.inf, 100.0)
  assert overestimation.overestimates(101.0, 100.0)
  # Saved in a checkpoint's metadata and restored: the same record, no second warning.
  again = overestimation.OverestimationWatch(
      [3, 4], 100.0, json.loads(json.dumps(list(watch.per_seed.values()))))
  assert again.summary([3, 4]) == s and not again.update(3, 5, 500.0)
  # A fresh seed's record; an unmeasured seed reads None, and an infinite bound is None in JSON.
  fresh = overestimation.OverestimationWatch([7], np.inf).summary([7])
  assert fresh == dict(q_bound=None, q_mean_last=[None], q_mean_max=[None],
                       overestimated=[False], overestimated_epoch=[None])


def test_watch_rebuilt_from_metrics_rows_of_an_older_checkpoint():
  rows = [dict(epoch=2, seed=0, q_mean=30.0), dict(epoch=1, seed=0, q_mean=5.0),
          dict(epoch=1, seed=1, q_mean=1.0), dict(epoch=2, seed=1, q_mean=2.0)]
  watch = overestimation.OverestimationWatch.from_rows([0, 1], 10.0, rows)
  s = watch.summary([0, 1])
  assert s["q_mean_last"] == [30.0, 2.0] and s["q_mean_max"] == [30.0, 2.0]
  assert s["overestimated_epoch"] == [2, None]


def test_summary_and_metrics_csv_carry_the_watch(tmp_path):
  rows = [dict(epoch=1, step=5, seed=s, normalized_score=1.0, q_mean=q)
          for s, q in ((0, 1.0), (1, 50.0))]
  watch = overestimation.OverestimationWatch.from_rows([0, 1], 10.0, rows)
  summary = outputs.summarise(rows, [0, 1], (), watch)
  assert summary["overestimated"] == [False, True] and summary["q_bound"] == 10.0
  json.dumps(summary, allow_nan=False)                 # strict JSON: no NaN / Infinity
  assert "overestimated" not in outputs.summarise(rows, [0, 1])   # the old call still works
  # metrics.csv of a run resumed from before the new columns: every column, "nan" where missing.
  path = os.path.join(tmp_path, "metrics.csv")
  outputs.write_rows(path, rows + [dict(rows[0], epoch=2, q_bound=10.0, overestimated=0.0)])
  back = outputs.read_rows(path)
  assert list(back[0]) == ["epoch", "step", "seed", "normalized_score", "q_mean", "q_bound",
                           "overestimated"]
  assert np.isnan(back[0]["q_bound"]) and back[2]["q_bound"] == 10.0


@pytest.mark.slow
def test_a_run_flags_critics_above_a_tiny_bound(hopper_random_2000, tmp_path, monkeypatch, capsys):
  """A run whose bound is forced below any Q (shifted by -1e6: an untrained critic's mean Q may
  have either sign): every seed passes it, each is warned about once, flagged in metrics.csv and
  summary.json, and the run finishes as usual (no divergence)."""
  from mombo_jax.settings import config as config_lib
  real_bound = overestimation.return_bound
  monkeypatch.setattr(overestimation, "return_bound",
                      lambda rewards, gamma: real_bound(rewards, gamma) - 1e6)
  config = config_lib.make_config("hopper-random", "mombo", preset="tiny", epochs=2,
                                  steps_per_epoch=5, rollout_batch_size=32, eval_every=1,
                                  eval_episodes=1, num_seeds=2)
  summary = train_run(config, hopper_random_2000, str(tmp_path / "w"),
                             dynamics_dir=str(tmp_path / "dyn"))
  out = capsys.readouterr().out
  warnings = [l for l in out.splitlines() if l.startswith("warning: seed")]
  assert len(warnings) == 2, out                         # once per seed, not once per epoch
  assert all("hopper-random beta=" in l and "return bound" in l for l in warnings)
  assert "OVERESTIMATED seeds [0, 1]" in out and "q_mean [" in out
  assert summary["overestimated"] == [True, True] and not summary["diverged"]
  assert summary["overestimated_epoch"] == [1, 1]
  assert summary["q_bound"] < -1e5
  assert all(q > summary["q_bound"] for q in summary["q_mean_max"])
  rows = outputs.read_rows(str(tmp_path / "w" / "metrics.csv"))
  assert all(r["overestimated"] == 1.0 for r in rows)
