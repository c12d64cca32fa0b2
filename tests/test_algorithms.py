"""Algorithms as values (mombo_jax.core.algorithms) and the epoch's settings (epoch_settings.EpochSettings).

A toy algorithm registered from outside the package trains end to end with the tiny preset, its
compiled epoch built from its EpochSettings alone (so the epoch reads nothing else of the
Config); online SAC's settings are plain SAC's, with no faked dataset name."""
import dataclasses
import json
import os

import numpy as np
import pytest

from mombo_jax.core import algorithms, targets
from mombo_jax.core.epoch_settings import epoch_settings
from mombo_jax.run import runner
from mombo_jax.settings import config as config_lib
from mombo_jax.records.workdir import run_dir


# --- a toy algorithm, as a user writes it (docs/architecture.md, "Add an algorithm") -----------
def bonus_target(agent, batch, key, *, dyn, config, term_fn, beta=None, real_rows=None,
                 auto_alpha=None):
  """Plain SAC's target plus a constant bonus of 0.1 per row."""
  y, aux = targets.plain(agent, batch, key, dyn=dyn, config=config, term_fn=term_fn,
                         auto_alpha=auto_alpha)
  return y + 0.1, aux


TOY = algorithms.register(algorithms.Algorithm("toy_bonus", bonus_target, references="mopo"))
# ------------------------------------------------------------------------------------------------

TINY = dict(epochs=1, steps_per_epoch=3, rollout_batch_size=16, eval_every=1, eval_episodes=1,
            dyn_max_epochs=1, actor_hidden=(8, 8), critic_hidden=(8, 8), dyn_hidden=(8, 8),
            dyn_weight_decay=(2.5e-5, 5e-5, 1e-4))


def test_registry_gives_records_and_refuses_unknown_names():
  assert config_lib.make_config("hopper-random", "mombo", target="lcb").algorithm is \
      algorithms.MOMBO_LCB
  assert algorithms.get("mopo").penalize_reward
  assert algorithms.get("mombo", "mixture").min_elites == 2
  with pytest.raises(ValueError, match="Unknown algo 'nope'; choose one of mombo, mobile, mopo"):
    algorithms.get("nope")
  with pytest.raises(ValueError, match="Unknown target 'x' for mombo"):
    algorithms.get("mombo", "x")
  with pytest.raises(ValueError, match="registered already"):
    algorithms.register(dataclasses.replace(TOY, coefficient="lambda"))
  assert algorithms.register(TOY) is TOY                      # the same record again: no-op
  with pytest.raises(ValueError, match="Unknown algo 'sac'"):  # online SAC's record: not offline
    config_lib.make_config("hopper-random", "sac")


def test_one_label_builder():
  assert [algorithms.label("mombo", "lcb", f) for f in ("name", "title", "column")] == \
      ["mombo-lcb", "mombo (lcb)", "MOMBO (lcb)"]
  assert algorithms.label("mobile", "elite_spread", "column") == "MOBILE"
  assert algorithms.label("mombo", None, "column") == "MOMBO (target?)"
  assert algorithms.label("unregistered", "lcb") == "unregistered"      # a foreign run's record
  assert TOY.label == "toy_bonus"


def test_epoch_settings_hold_what_the_epoch_computes_with():
  """Configs that differ only in what the compiled epoch never reads (seeds, evaluation, the
  dataset of one env, the reference source, the dynamics' training) give one EpochSettings;
  a setting the epoch reads, or the algorithm, gives another; the cells' own settings are None."""
  a = config_lib.make_config("hopper-random", "mobile", "tiny")
  same = config_lib.make_config("hopper-medium", "mobile", "tiny", reference="authors",
                                beta=a.beta, seed=3, num_seeds=2, eval_every=7, dyn_lr=1e-2,
                                dyn_max_epochs=9, real_ratio=a.real_ratio,
                                rollout_length=a.rollout_length, auto_alpha=a.auto_alpha,
                                alpha=a.alpha)
  assert epoch_settings(a) == epoch_settings(same)
  assert not hasattr(epoch_settings(a), "env")          # no faked dataset name
  for change in (dict(gamma=0.9), dict(actor_lr=1e-3), dict(algo="mopo")):
    assert epoch_settings(a) != epoch_settings(
        dataclasses.replace(a, **change))
  cells = epoch_settings(a, ("rollout_length", "real_ratio"))
  assert (cells.beta, cells.real_ratio, cells.rollout_length) == (None, None, a.rollout_length)


def test_a_registered_toy_algorithm_trains_with_the_tiny_preset(hopper_random_2000, tmp_path):
  """The toy algorithm, registered above from outside the package, through runner.train_run (the
  library path of experiments.run): one epoch and its evaluation, its compiled epoch built from
  its EpochSettings alone (train.make_cells_chunk); its label names the workdir, its config.json
  records it, its results are finite."""
  config = config_lib.make_config(hopper_random_2000, "toy_bonus", preset="tiny", **TINY)
  assert config.reference == "offlinerl_kit"           # MOPO's tables, as it asked
  assert epoch_settings(config).algorithm is TOY
  workdir = run_dir(str(tmp_path), hopper_random_2000, "toy_bonus", config.target, config.seed,
                    config.num_seeds)
  assert os.path.join(hopper_random_2000, TOY.label, "s0x1") in workdir
  summary = runner.train_run(config, hopper_random_2000, workdir)
  with open(os.path.join(workdir, "config.json")) as f:
    assert json.load(f)["algo"] == "toy_bonus"
  assert np.isfinite(summary["final_normalized_score"]).all()
  with open(os.path.join(workdir, "metrics.csv")) as f:
    rows = f.read().splitlines()
  assert len(rows) >= 2 and "nan" not in rows[-1]


def test_online_sac_is_plain_sac_with_its_own_env():
  from mombo_jax.collection import online_sac
  settings = online_sac.online_config("hopper", (16, 16), 32)
  assert settings.algorithm is algorithms.SAC and algorithms.SAC.penalty is None
  assert settings.env_name == "hopper" and not hasattr(settings, "env")
