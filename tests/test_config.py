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
  assert config_lib.make_config("halfcheetah-random", "mopo").beta == 0.5   # OfflineRL-Kit
  assert config_lib.make_config("hopper-medium", "mombo").beta == 3.0
  mopo = config_lib.make_config("walker2d-medium-replay", "mopo")
  assert mopo.deterministic_backup is False and mopo.clip_target_min is None
  cfg = config_lib.make_config("hopper-random")
  assert cfg.alpha_max == 1.0 and cfg.rollout_obs_limit == 100.0
  assert hash(cfg) == hash(dataclasses.replace(cfg))            # frozen and hashable
