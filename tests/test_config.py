"""The per-run config: the paper's tables, and every field refused up front when it is invalid."""
import dataclasses
import math

import pytest

from mombo_jax import config as config_lib


@pytest.mark.parametrize("override, field", [
    (dict(epochs=-1), "epochs"), (dict(steps_per_epoch=0), "steps_per_epoch"),
    (dict(eval_every=0), "eval_every"), (dict(eval_episodes=0), "eval_episodes"),
    (dict(rollout_length=0), "rollout_length"), (dict(rollout_batch_size=0), "rollout_batch_size"),
    (dict(beta=math.nan), "beta"), (dict(beta=math.inf), "beta"), (dict(beta=-1.0), "beta"),
    (dict(real_ratio=1.5), "real_ratio"), (dict(real_ratio=math.nan), "real_ratio"),
    (dict(num_seeds=0), "num_seeds"), (dict(seed=-1), "seed"), (dict(gamma=1.5), "gamma"),
    (dict(actor_lr=0.0), "actor_lr"), (dict(dyn_max_epochs=0), "dyn_max_epochs"),
    (dict(critic_hidden=()), "critic_hidden"), (dict(alpha_max=0.0), "alpha_max"),
    (dict(rollout_obs_limit=-1.0), "rollout_obs_limit"), (dict(max_abs_loss=0.0), "max_abs_loss"),
    (dict(epochs=2.5), "epochs"), (dict(dyn_elites=9), "dyn_elites"),
])
def test_invalid_fields_are_refused_naming_the_field(override, field):
  with pytest.raises(ValueError, match=field):
    config_lib.make_config("hopper-random", "mombo", **override)


def test_unknown_names_are_refused():
  with pytest.raises(ValueError, match="Unknown dataset name"):
    config_lib.make_config("hopper-randm")
  with pytest.raises(ValueError, match="Unknown algo"):
    config_lib.make_config("hopper-random", "sac")
  with pytest.raises(ValueError, match="Unknown config field"):
    config_lib.make_config("hopper-random", "mombo", betta=1.0)
  with pytest.raises(ValueError, match="dyn_elites must be >= 2"):
    config_lib.make_config("hopper-random", "mobile", dyn_elites=1)


def test_paper_tables_and_reference_defaults():
  assert config_lib.make_config("halfcheetah-random", "mopo").beta == 0.5   # tianheyu927/mopo
  assert config_lib.make_config("hopper-medium", "mombo").beta == 3.0
  mopo = config_lib.make_config("walker2d-medium-replay", "mopo")
  assert mopo.deterministic_backup is False and mopo.clip_target_min is None
  cfg = config_lib.make_config("hopper-random")
  assert cfg.alpha_max == 1.0 and cfg.rollout_obs_limit == 100.0
  assert hash(cfg) == hash(dataclasses.replace(cfg))            # frozen and hashable


def test_each_algorithm_runs_its_own_references_settings():
  make = config_lib.make_config
  # MOMBO (adinlab/MOMBO configs/gym): the released code's variant, fixed alpha on hopper-medium.
  mombo = make("hopper-medium-replay", "mombo")
  assert mombo.target == "elite_spread" and mombo.beta == 0.15
  assert mombo.auto_alpha is False and mombo.alpha == 0.2
  assert make("halfcheetah-medium-expert", "mombo").real_ratio == 0.5
  assert make("walker2d-medium", "mombo").dyn_max_epochs == 30
  # MOBILE (yihaosun1124/mobile configs/gym): its own betas, the same extras.
  assert make("hopper-medium", "mobile").beta == 1.5
  assert make("hopper-medium", "mobile").auto_alpha is False
  assert make("walker2d-random", "mobile").beta == 2.0
  # MOPO (OfflineRL-Kit run_mopo.py): learned alpha, real ratio 0.05, its own lambda and k; no
  # extras inherited from MOMBO / MOBILE.
  mopo = make("hopper-medium-replay", "mopo")
  assert mopo.beta == 2.5 and mopo.auto_alpha is True
  hcme = make("halfcheetah-medium-expert", "mopo")
  assert hcme.beta == 2.5 and hcme.real_ratio == 0.05
  assert make("walker2d-medium", "mopo").dyn_max_epochs is None
  assert make("walker2d-random", "mopo").rollout_length == 1      # tianheyu927/mopo
  # Every D4RL task is in every table.
  for algo, table in config_lib.TASKS.items():
    assert set(table) == set(config_lib.MOMBO_TASKS), algo


def test_schedule_spans_the_papers_run_apart_from_the_stop():
  make = config_lib.make_config
  short = make("hopper-medium-replay", "mombo", epochs=300)
  assert short.schedule_epochs == 3000
  assert short.schedule_steps == 3000 * short.steps_per_epoch
  assert make("hopper-random-medium-1pct", "mombo").schedule_epochs == 2000   # the mixed runs
  # The smaller presets span their own --epochs; 0 / None on the command line does the same.
  quick = make("hopper-random", "mombo", "quick")
  assert quick.schedule_epochs is None and quick.schedule_steps == quick.epochs * quick.steps_per_epoch
  assert make("hopper-random", schedule_epochs=None, epochs=7).schedule_steps == 7 * 1000
  with pytest.raises(ValueError, match="schedule_epochs"):
    make("hopper-random", epochs=4000)
  with pytest.raises(ValueError, match="schedule_epochs"):
    make("hopper-random", schedule_epochs=0)
