"""Issue #37 item 2: config.json files written before the Config was made of groups still load,
and a run started before resumes after: tests/data/config_before_groups.json is the config.json
that `experiments.run --env=hopper-random --preset=tiny --seeds=2 --epochs=2` wrote at commit
4a50333 (flat Config, 53 fields), kept byte for byte. No JAX is needed."""
import json
import os

import pytest

from mombo_jax.errors import UserError
from mombo_jax.records import workdir as workdir_lib
from mombo_jax.settings import config as config_lib

OLD = os.path.join(os.path.dirname(__file__), "data", "config_before_groups.json")


@pytest.fixture(scope="module")
def old():
  with open(OLD) as f:
    return json.load(f)


def test_an_old_record_loads_every_setting_into_its_group(old):
  config, dataset = workdir_lib.config_from_record(old)
  assert dataset == "hopper-random"
  settings = config.settings()
  names = set(config_lib.Config.setting_names()) - {"matmul_precision", "moments"}  # added since
  # Every setting the old file holds is read, each into its group, with the value written.
  assert names <= set(old), sorted(names - set(old))
  for name in names:
    want = tuple(old[name]) if isinstance(old[name], list) else old[name]
    assert settings[name] == want, name
  # Written before runs recorded their matmul precision: the float32 it computed at on a CPU.
  assert "matmul_precision" not in old
  assert config.matmul_precision == config_lib.MATMUL_PRECISION_BEFORE_RECORDED == "float32"
  # ... and before they recorded their moment mode: the diagonal, the only one then.
  assert "moments" not in old
  assert config.agent.moments == config_lib.MOMENTS_BEFORE_RECORDED == "diagonal"
  assert config.agent.batch_size == 32 and config.rollout.rollout_batch_size == 64
  assert config.dynamics.dyn_members == 3 and config.dynamics_training.dyn_max_epochs == 2
  assert config.evaluation.eval_every == 1 and config.beta == old["beta"]
  # What the same command builds today is that config.
  assert config == config_lib.make_config("hopper-random", "mombo", "tiny", num_seeds=2, epochs=2)


def test_the_record_written_today_holds_the_same_keys_and_values(old):
  config, dataset = workdir_lib.config_from_record(old)
  new = workdir_lib.config_record(config, dataset)
  # "data": the launch adds it; matmul_precision and moments: recorded since.
  assert new == dict({k: v for k, v in old.items() if k != "data"}, matmul_precision="float32",
                     moments="diagonal")


def test_a_run_started_before_the_groups_resumes_after(old, tmp_path):
  with open(tmp_path / workdir_lib.CONFIG, "w") as f:
    json.dump(old, f, indent=1)
  config, dataset = workdir_lib.config_from_record(old)
  record, notes = workdir_lib.Workdir(str(tmp_path)).check_config(config, dataset)
  assert record["dyn_members"] == 3 and record["matmul_precision"] == "float32"
  assert record["moments"] == "diagonal"
  # Two notes: the moment mode and the precision it goes on at, now recorded.
  assert len(notes) == 2, notes
  assert "moment mode" in notes[0] and "'diagonal'" in notes[0], notes
  assert "matmul precision" in notes[1] and "'float32'" in notes[1], notes
  # Another setting still refuses, naming it by its flat name; TF32 too (the old run's float32).
  with pytest.raises(UserError, match="dyn_lr"):
    workdir_lib.Workdir(str(tmp_path)).check_config(config.replace(dyn_lr=1e-2), dataset)
  with pytest.raises(UserError, match="matmul_precision: 'float32' -> 'tensorfloat32'"):
    workdir_lib.Workdir(str(tmp_path)).check_config(
        config.replace(matmul_precision="tensorfloat32"), dataset)
  # A resume at another moment mode is refused, naming both.
  with pytest.raises(UserError, match="moments: 'diagonal' -> 'lowrank'"):
    workdir_lib.Workdir(str(tmp_path)).check_config(config.replace(moments="lowrank"), dataset)


def test_the_moment_mode_round_trips_and_names_the_workdir_when_not_diagonal(tmp_path):
  config = config_lib.make_config("hopper-random", "mombo", "tiny", moments="lowrank4")
  record = workdir_lib.config_record(config, "hopper-random")
  assert record["moments"] == "lowrank4"
  assert workdir_lib.config_from_record(json.loads(json.dumps(record)))[0] == config
  # A run written with it resumes at it, and refuses the diagonal.
  with open(tmp_path / workdir_lib.CONFIG, "w") as f:
    json.dump(record, f)
  _, notes = workdir_lib.Workdir(str(tmp_path)).check_config(config, "hopper-random")
  assert notes == []
  with pytest.raises(UserError, match="moments: 'lowrank4' -> 'diagonal'"):
    workdir_lib.Workdir(str(tmp_path)).check_config(config.replace(moments="diagonal"),
                                                    "hopper-random")
  name = lambda m: workdir_lib.run_dir("r", "hopper-random", "mombo", "lcb", 0, 1,  # noqa: E731
                                       moments=m)
  assert name("diagonal") == name(None) == os.path.join("r", "hopper-random", "mombo-lcb", "s0x1")
  assert name("lowrank") == os.path.join("r", "hopper-random", "mombo-lcb-lowrank", "s0x1")


@pytest.mark.parametrize("moments, algo, match", [
    ("lowrank0", "mombo", "moments must be diagonal, lowrank, lowrank<k>"),
    ("Lowrank", "mombo", "moments must be diagonal, lowrank, lowrank<k>"),
    ("lowrank", "mopo", "mopo does not moment-match"),
])
def test_a_bad_moment_mode_is_refused_naming_the_choices(moments, algo, match):
  with pytest.raises(ValueError, match=match):
    config_lib.make_config("hopper-random", algo, "tiny", moments=moments)


def test_a_record_from_before_runs_named_their_source_loads_as_its_then_table(old):
  older = {k: v for k, v in old.items() if k not in ("reference", "algo_module")}
  config, _ = workdir_lib.config_from_record(older)
  assert config.reference == "authors"           # references.LEGACY: MOMBO's one table then
  assert config.agent == workdir_lib.config_from_record(old)[0].agent


def test_replace_routes_each_flat_name_to_its_group():
  base = config_lib.Config()
  changed = base.replace(batch_size=64, rollout_length=2, eval_every=3, dyn_members=9,
                         dyn_lr=0.5, beta=2.0)
  assert (changed.agent.batch_size, changed.rollout.rollout_length, changed.evaluation.eval_every,
          changed.dynamics.dyn_members, changed.dynamics_training.dyn_lr, changed.beta) == (
              64, 2, 3, 9, 0.5, 2.0)
  assert base.agent.batch_size == 256                       # frozen: the original is unchanged
  with pytest.raises(ValueError, match="no_such_setting"):
    base.replace(no_such_setting=1)
  with pytest.raises(ValueError, match="batch_size must be a positive integer"):
    base.replace(batch_size=0)                              # checked like any Config
  # Every setting has one group (or is the run's own), and no name is in two groups.
  names = config_lib.Config.setting_names()
  assert len(names) == len(set(names)) == len(base.settings())


def test_training_at_the_full_mode_is_refused_before_any_work(tmp_path):
  """moments=full serves the analyses; a launch refuses it in its preflight, naming the flag."""
  from mombo_jax.run import preflight
  config = config_lib.make_config("hopper-random", "mombo", "tiny", moments="full")
  with pytest.raises(UserError, match="moments=full is for the analyses") as raised:
    preflight.validate(config, "hopper-random", str(tmp_path / "run"))
  assert raised.value.params == ("moments",) and not (tmp_path / "run").exists()
