"""The per-run config: the paper's tables, and every field refused up front when it is invalid."""
import dataclasses
import math

import pytest

from mombo_jax.data import names
from mombo_jax.settings import config as config_lib, references


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
  assert mopo.agent.deterministic_backup is False and mopo.agent.clip_target_min is None
  cfg = config_lib.make_config("hopper-random")
  assert cfg.agent.alpha_max == 1.0 and cfg.rollout.rollout_obs_limit == 100.0
  assert hash(cfg) == hash(dataclasses.replace(cfg))            # frozen and hashable


def test_each_algorithm_runs_its_own_references_settings():
  make = config_lib.make_config
  # MOMBO (adinlab/MOMBO configs/gym): the released code's variant, fixed alpha on hopper-medium.
  mombo = make("hopper-medium-replay", "mombo")
  assert mombo.target == "elite_spread" and mombo.beta == 0.15
  assert mombo.agent.auto_alpha is False and mombo.agent.alpha == 0.2
  assert make("halfcheetah-medium-expert", "mombo").rollout.real_ratio == 0.5
  assert make("walker2d-medium", "mombo").dynamics_training.dyn_max_epochs == 30
  # MOBILE (yihaosun1124/mobile configs/gym): its own betas, the same extras.
  assert make("hopper-medium", "mobile").beta == 1.5
  assert make("hopper-medium", "mobile").agent.auto_alpha is False
  assert make("walker2d-random", "mobile").beta == 2.0
  # MOPO (OfflineRL-Kit run_mopo.py): learned alpha, real ratio 0.05, its own lambda and k; no
  # extras inherited from MOMBO / MOBILE.
  mopo = make("hopper-medium-replay", "mopo")
  assert mopo.beta == 2.5 and mopo.agent.auto_alpha is True
  hcme = make("halfcheetah-medium-expert", "mopo")
  assert hcme.beta == 2.5 and hcme.rollout.real_ratio == 0.05
  assert make("walker2d-medium", "mopo").dynamics_training.dyn_max_epochs is None
  assert make("walker2d-random", "mopo").rollout.rollout_length == 1      # tianheyu927/mopo
  # Every D4RL task (data/names.py) is in every table.
  for algo, table in config_lib.TASKS.items():
    assert set(table) == set(names.D4RL_TASKS), algo


def test_schedule_spans_the_papers_run_apart_from_the_stop():
  make = config_lib.make_config
  short = make("hopper-medium-replay", "mombo", epochs=300)
  assert short.schedule_epochs == 3000
  assert short.schedule_steps == 3000 * short.steps_per_epoch
  assert make("hopper-random-medium-1pct", "mombo").schedule_epochs == 2000   # the mixed runs
  # The smaller presets span their own --epochs; 0 / None on the command line does the same.
  quick = make("hopper-random", "mombo", "quick")
  assert (quick.schedule_epochs is None
          and quick.schedule_steps == quick.epochs * quick.steps_per_epoch)
  assert make("hopper-random", schedule_epochs=None, epochs=7).schedule_steps == 7 * 1000
  with pytest.raises(ValueError, match="schedule_epochs"):
    make("hopper-random", epochs=4000)
  with pytest.raises(ValueError, match="schedule_epochs"):
    make("hopper-random", schedule_epochs=0)


def test_mobile_defaults_to_offlinerl_kits_run_mobile():
  """The paper's MOBILE column is OfflineRL-Kit's logs: run_example/run_mobile.py's suggested hypers
  and argparse defaults are MOBILE's default settings."""
  make = config_lib.make_config
  hcme = make("halfcheetah-medium-expert", "mobile")
  assert hcme.reference == "offlinerl_kit"
  assert hcme.beta == 2.0 and hcme.rollout.real_ratio == 0.05 and hcme.agent.auto_alpha is True
  hmr = make("hopper-medium-replay", "mobile")            # alpha fixed on hopper-medium only
  assert hmr.beta == 0.1 and hmr.agent.auto_alpha is True
  hm = make("hopper-medium", "mobile")
  assert hm.beta == 1.5 and hm.agent.auto_alpha is False and hm.agent.alpha == 0.2
  wmr = make("walker2d-medium-replay", "mobile")
  assert wmr.rollout.rollout_length == 1 and wmr.beta == 0.5
  # --dynamics-max-epochs 30 on every task, the mixed datasets included.
  for env in ("hopper-random", "walker2d-medium", "halfcheetah-medium-expert",
              "hopper-random-medium-1pct"):
    assert make(env, "mobile").dynamics_training.dyn_max_epochs == 30, env
  # The preset's cap wins.
  assert make("hopper-random", "mobile", "quick").dynamics_training.dyn_max_epochs == 2
  for env, row in references.MOBILE_OFFLINERL_KIT.items():
    config = make(env, "mobile")
    assert {k: config.settings()[k] for k in row} == row, env


def test_reference_authors_gives_the_mobile_authors_table():
  make = lambda env: config_lib.make_config(env, "mobile", reference="authors")  # noqa: E731
  hcme = make("halfcheetah-medium-expert")
  assert hcme.reference == "authors" and hcme.beta == 1.0 and hcme.rollout.real_ratio == 0.5
  assert make("hopper-medium-replay").agent.auto_alpha is False
  assert make("hopper-random").dynamics_training.dyn_max_epochs is None
  assert make("walker2d-medium").dynamics_training.dyn_max_epochs == 30
  for env, row in references.MOBILE_AUTHORS.items():
    config = make(env)
    assert {k: config.settings()[k] for k in row} == row, env
  # Every source has every D4RL task (the expert datasets reuse medium-expert's row).
  for algo, sources in references.SOURCES.items():
    for name, src in sources.items():
      assert set(src.tasks) == set(names.D4RL_TASKS), (algo, name)
  assert config_lib.TASKS["mobile"] is references.MOBILE_OFFLINERL_KIT
  assert {a: config_lib.make_config("hopper-random", a).reference for a in config_lib.ALGOS} == \
      {"mombo": "authors", "mobile": "offlinerl_kit", "mopo": "offlinerl_kit"}


def test_a_source_an_algorithm_lacks_is_refused_naming_the_valid_ones():
  make = config_lib.make_config
  with pytest.raises(ValueError, match=r"Unknown reference 'authors' for mopo; choose one of "
                                       r"offlinerl_kit \(default"):
    make("hopper-random", "mopo", reference="authors")
  with pytest.raises(ValueError, match=r"for mobile; choose one of offlinerl_kit .*, authors "):
    make("hopper-random", "mobile", reference="kit")
  with pytest.raises(ValueError, match="Unknown reference 'offlinerl_kit' for mombo"):
    make("hopper-random", "mombo", reference="offlinerl_kit")
  with pytest.raises(ValueError, match="Unknown reference 'authors' for mopo"):
    config_lib.Config(algo="mopo", reference="authors")
  assert config_lib.Config().reference is None              # built by hand: no table


def test_paper_preset_evaluates_at_each_references_cadence():
  """adinlab/MOMBO evaluates every 50 epochs, yihaosun1124/mobile every 10; OfflineRL-Kit every
  epoch, which this project replaces by 10 (a documented choice: docs/protocol.md)."""
  make = config_lib.make_config
  assert make("hopper-medium", "mombo").evaluation.eval_every == 50
  assert make("hopper-random-medium-1pct", "mombo").evaluation.eval_every == 50
  assert make("hopper-medium", "mobile", reference="authors").evaluation.eval_every == 10
  assert make("hopper-medium", "mobile").evaluation.eval_every == 10
  assert make("hopper-medium", "mopo").evaluation.eval_every == 10
  for algo, sources in references.SOURCES.items():
    for name, src in sources.items():
      assert make("walker2d-medium", algo, reference=name).evaluation.eval_every == src.eval_every
      assert src.eval_every == src.reference_eval_every or src.reference_eval_every == 1, name
  assert references.SOURCES["mombo"]["authors"].reference_eval_every == 50
  assert references.SOURCES["mobile"]["authors"].reference_eval_every == 10
  assert references.SOURCES["mobile"]["offlinerl_kit"].reference_eval_every == 1
  # Presets and flags still win.
  assert make("hopper-medium", "mombo", "quick").evaluation.eval_every == 5
  assert make("hopper-medium", "mombo", eval_every=7).evaluation.eval_every == 7


def test_config_json_names_the_source_and_old_records_keep_theirs(tmp_path):
  """config.json records `reference`; a record written before it existed is read as the table it
  came from (MOBILE: its authors'), so a resume with today's default is refused, not silently
  continued under another table, and the report labels the difference."""
  from mombo_jax.errors import UserError
  from mombo_jax.records import workdir as workdir_lib
  from mombo_jax.report import labels
  make = config_lib.make_config
  kit = make("halfcheetah-medium-expert", "mobile", "tiny")
  authors = make("halfcheetah-medium-expert", "mobile", "tiny", reference="authors")
  record = workdir_lib.config_record(kit, kit.env)
  assert record["reference"] == "offlinerl_kit"
  assert workdir_lib.config_from_record(record) == (kit, kit.env)
  old = {k: v for k, v in workdir_lib.config_record(authors, kit.env).items() if k != "reference"}
  assert workdir_lib.config_from_record(old)[0] == authors
  wd = workdir_lib.Workdir(str(tmp_path / "mobile"))
  wd.write_config(old)
  with pytest.raises(UserError, match=r"reference: 'authors' -> 'offlinerl_kit'.*Pass "
                                      r"--reference=authors to continue it"):
    wd.check_config(kit, kit.env)
  new, notes = wd.check_config(authors, kit.env)
  assert new["reference"] == "authors" and any("'authors'" in n for n in notes)
  assert wd.read_record()["reference"] == "authors"       # what the report reads
  setups = [labels.setup_of(wd.read_record()), labels.setup_of(record)]
  assert "reference" in labels._differing(setups)
  # An old MOMBO record is today's MOMBO table: it resumes.
  mombo = make("hopper-random", "mombo", "tiny")
  wd = workdir_lib.Workdir(str(tmp_path / "mombo"))
  wd.write_config({k: v for k, v in workdir_lib.config_record(mombo, mombo.env).items()
                   if k != "reference"})
  assert wd.check_config(mombo, mombo.env)[0]["reference"] == "authors"


def test_the_paper_preset_runs_the_papers_four_seeds():
  """The paper's protocol is 4 seeds (its Table 1); the quick and tiny presets keep one, and an
  explicit num_seeds wins (experiments.run's --seeds defaults to the preset's)."""
  assert config_lib.make_config("hopper-random", preset="paper").num_seeds == 4
  assert config_lib.make_config("hopper-random", "mopo").num_seeds == 4
  assert config_lib.make_config("hopper-random", preset="quick").num_seeds == 1
  assert config_lib.make_config("hopper-random", preset="tiny").num_seeds == 1
  assert config_lib.make_config("hopper-random", preset="paper", num_seeds=2).num_seeds == 2
