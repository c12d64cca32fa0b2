"""Issue #26 item 2: a saved dynamics ensemble is reused only by a run that would have trained the
same one. The reuse key and the folder name hold every training setting
(reuse.TRAINING_FIELDS); a run of other settings trains its own beside a saved ensemble
(a paper-preset run next to a quick-preset ensemble); an unfinished training of other settings is
refused; a save from before the key held the settings is refused naming the fix; a resumed run
takes its ensembles from its own checkpoint. No test trains a real ensemble beyond two tiny epochs:
saved ensembles are untrained ones of the right shapes, and training is stubbed where only whether
it happens matters."""
import dataclasses
import os
import shutil

import jax
import numpy as np
import pytest

from mombo_jax.core import dynamics, key_scheme
from mombo_jax.data import provenance
from mombo_jax.data.transitions import Transitions
from mombo_jax.dynamics import dynamics_store, dynamics_training, reuse, saved_dynamics
from mombo_jax.errors import UserError
from mombo_jax.records import workdir as workdir_lib
from mombo_jax.settings import config as config_lib, groups
from mombo_jax.settings.config import Config
from mombo_jax.storage import checkpoint
from tests.conftest_runs import DATASET, tiny_run  # noqa: F401

# One valid other value per training setting, for the tiny preset's config.
FLIPS = dict(dyn_members=4, dyn_elites=1, dyn_hidden=(16, 16),
             dyn_weight_decay=(1e-5, 1e-5, 1e-5), dyn_lr=3e-4, dyn_batch_size=128,
             dyn_holdout_ratio=0.1, dyn_max_holdout=500, dyn_improvement=0.02, dyn_patience=7,
             dyn_max_epochs=None, dyn_max_logvar_init=1.0, dyn_min_logvar_init=-5.0,
             dyn_logvar_coef=0.02)


def _tiny(**kw):
  return config_lib.make_config("hopper-random", "mopo", "tiny", **kw)


def _transitions(n=300, seed=0):
  """n random hopper-shaped transitions (obs 11, action 3), in memory."""
  rng = np.random.default_rng(seed)
  obs = rng.normal(size=(n, 11)).astype(np.float32)
  return Transitions(obs, rng.uniform(-1, 1, (n, 3)).astype(np.float32),
                     rng.normal(size=n).astype(np.float32), obs + 0.1, np.zeros(n, np.float32))


def _untrained(config, obs_dim=11, act_dim=3):
  """An untrained DynamicsState [S] of config's shapes (what a saved ensemble holds)."""
  keys = key_scheme.cell_keys(config)[0]
  return jax.vmap(lambda k: dynamics.init_state(k, obs_dim, act_dim, config))(keys)


def _key(config, transitions, dataset="hopper-random"):
  return reuse.reuse_key(config, transitions,
                                  provenance.dataset_identity(dataset, transitions))


def test_every_dynamics_field_is_listed_once():
  """The reuse key holds exactly the settings of the two dynamics groups (the ensemble's shape and
  its training): every dyn_* setting but how often training is checkpointed, a field of the run;
  FLIPS covers every one of them."""
  dyn = {f for f in Config.setting_names() if f.startswith("dyn_")}
  training = set(reuse.TRAINING_FIELDS)
  assert training == dyn - {"dyn_checkpoint_every_s"}
  assert "dyn_checkpoint_every_s" in {f.name for f in dataclasses.fields(Config)}
  assert set(reuse.training_settings(Config())) == training | {
      reuse.TRAINING_CODE_FIELD}
  assert set(FLIPS) == training


@pytest.mark.parametrize("field", sorted(FLIPS))
def test_each_training_setting_changes_the_key_and_the_folder(field):
  base = _tiny()
  other = base.replace(**{field: FLIPS[field]})
  data = _transitions(20)
  meta = {reuse.REUSE_KEY_FIELD: _key(base, data)}
  assert reuse.reuse_mismatch(meta, _key(base, data)) == {}
  differs = reuse.reuse_mismatch(meta, _key(other, data))
  assert set(differs) == {field}, differs
  assert field in reuse.format_mismatch(differs)
  assert reuse.dynamics_path("d", other) != reuse.dynamics_path("d", base)


def test_what_does_not_change_the_ensemble_changes_neither():
  base = _tiny()
  data = _transitions(20)
  same = [base.replace(dyn_checkpoint_every_s=1.0),        # how often it is saved
          base.replace(beta=9.0, epochs=7, algo="mombo", reference="authors")]
  for config in same:
    assert _key(config, data) == _key(base, data)
    assert reuse.dynamics_path("d", config) == reuse.dynamics_path("d", base)
  ints, floats = _tiny(dyn_lr=1, dyn_improvement=0), _tiny(dyn_lr=1.0, dyn_improvement=0.0)
  assert _key(ints, data) == _key(floats, data)
  assert reuse.dynamics_path("d", ints) == reuse.dynamics_path("d", floats)
  name = os.path.basename(reuse.dynamics_path("d", _tiny(seed=2, num_seeds=3)))
  assert name.startswith("seed2x3-cap2-") and len(name) == len("seed2x3-cap2-") + 8
  assert "-nocap-" in reuse.dynamics_path("d", _tiny(dyn_max_epochs=None))


def test_the_matmul_precision_keys_an_ensemble_only_when_not_float32():
  """On a GPU an ensemble trained with TF32 inputs is not the float32 one: tensorfloat32 joins the
  key and the folder name. float32, which every ensemble saved before it was a setting was trained
  at (on a CPU), stays out of both, so those keep their folder names and are reused; a whole key
  without it reads as float32, so neither precision takes the other's ensemble."""
  base, tf32 = _tiny(), _tiny(matmul_precision="tensorfloat32")
  before = dict(groups.to_json(base.dynamics), **groups.to_json(base.dynamics_training))
  before[reuse.TRAINING_CODE_FIELD] = reuse.TRAINING_CODE
  assert reuse.training_settings(base) == before           # the key before issue #43
  assert reuse.training_settings(tf32) == dict(before, matmul_precision="tensorfloat32")
  assert reuse.dynamics_path("d", tf32) != reuse.dynamics_path("d", base)
  data = _transitions(20)
  saved = {p: {saved_dynamics.REUSE_KEY_FIELD: _key(c, data)} for p, c in
           (("float32", base), ("tensorfloat32", tf32))}
  assert reuse.reuse_mismatch(saved["float32"], _key(base, data)) == {}
  assert reuse.reuse_mismatch(saved["float32"], _key(tf32, data)) == {
      "matmul_precision": ("float32", "tensorfloat32")}
  assert reuse.reuse_mismatch(saved["tensorfloat32"], _key(base, data)) == {
      "matmul_precision": ("tensorfloat32", "float32")}
  assert "matmul_precision='tensorfloat32'" in reuse.describe_settings(tf32)


def test_the_moment_mode_keys_no_ensemble():
  """--moments changes MOMBO's targets only (issue #49): runs of every mode reuse one ensemble."""
  diagonal = config_lib.make_config("hopper-random", "mombo", "tiny")
  for moments in ("lowrank", "lowrank3"):
    other = diagonal.replace(moments=moments)
    assert reuse.training_settings(other) == reuse.training_settings(diagonal)
    assert reuse.dynamics_path("d", other) == reuse.dynamics_path("d", diagonal)


def test_a_paper_run_next_to_a_quick_ensemble_trains_its_own(tmp_path, monkeypatch):
  """The quick preset caps dynamics training at 2 epochs; a paper-preset run of the same task,
  seeds and data must not reuse that ensemble: it trains its own in another folder (named by its
  settings) and says why in a note; the quick ensemble stays as it was."""
  data = _transitions()
  quick = config_lib.make_config("hopper-random", "mombo", "quick")
  # The same seeds (the paper preset's default is the paper's 4; the quick preset's 1).
  paper = config_lib.make_config("hopper-random", "mombo", "paper", num_seeds=quick.num_seeds)
  assert quick.dynamics_training.dyn_max_epochs != paper.dynamics_training.dyn_max_epochs
  dyn_dir = str(tmp_path / "dynamics")
  quick_path = reuse.dynamics_path(dyn_dir, quick)
  saved_dynamics.save(quick_path, _untrained(quick), quick, reuse_key=_key(quick, data))
  trained = []

  def train_seeds(keys, transitions, config, **kw):
    trained.append(config)
    return _untrained(config)

  monkeypatch.setattr(dynamics_training, "train_seeds", train_seeds)
  lines = []
  dynamics_store.get_dynamics(paper, data, "hopper-random", dyn_dir,
                              console=dynamics_store.Console(lines.append))
  assert ([c.dynamics_training.dyn_max_epochs for c in trained]
          == [paper.dynamics_training.dyn_max_epochs])
  paper_path = reuse.dynamics_path(dyn_dir, paper)
  assert paper_path != quick_path and os.path.isdir(paper_path)
  note = next(line for line in lines if line.startswith("note:"))
  assert quick_path in note and "dyn_max_epochs: saved 2, now None" in note
  _, meta = saved_dynamics.load(quick_path)                      # untouched
  assert reuse.reuse_mismatch(meta, _key(quick, data)) == {}
  # Each is reused by a run of its own settings; nothing is trained again.
  for config in (quick, paper):
    lines.clear()
    dynamics_store.get_dynamics(config, data, "hopper-random", dyn_dir,
                                console=dynamics_store.Console(lines.append))
    assert lines == [f"Reusing the dynamics ensembles in "
                     f"{reuse.dynamics_path(dyn_dir, config)}."]
  assert len(trained) == 1


def test_a_legacy_save_is_refused_naming_the_fix(tmp_path, monkeypatch):
  """An ensemble saved where (and as) earlier versions saved it, its reuse key without the
  training settings, is not reused: one line naming it and the fix (delete it)."""
  data = _transitions()
  config = _tiny()
  dyn_dir = str(tmp_path / "dynamics")
  legacy = reuse.legacy_dynamics_path(dyn_dir, config)
  old_key = {k: v for k, v in _key(config, data).items()
             if k not in reuse.training_settings(config)
             or k in ("dyn_members", "dyn_elites", "dyn_hidden")}
  saved_dynamics.save(legacy, _untrained(config), config, reuse_key=old_key)
  _, meta = saved_dynamics.load(legacy)
  assert reuse.is_legacy(meta)
  monkeypatch.setattr(dynamics_training, "train_seeds", None)   # never reached
  with pytest.raises(UserError) as e:
    dynamics_store.get_dynamics(config, data, "hopper-random", dyn_dir,
                                console=dynamics_store.Console(lambda _: None))
  line = str(e.value)
  assert "\n" not in line and legacy in line and "delete them" in line
  assert "did not record their training settings" in line and "not reused" in line
  assert reuse.dynamics_path(dyn_dir, config) in line
  with pytest.raises(UserError, match="delete them"):
    dynamics_store.check_legacy_dynamics(dyn_dir, config)
  shutil.rmtree(legacy)
  os.makedirs(legacy + ".partial")                               # an unfinished legacy training
  with pytest.raises(UserError, match=r"seed0x1\.partial.*delete them"):
    dynamics_store.check_legacy_dynamics(dyn_dir, config)


def test_an_unfinished_training_of_other_settings_is_refused(tmp_path):
  """<path>.partial resumes only under the settings it was started with: the same checkpoint
  folder under another learning rate (same shapes, so its state would restore) is refused naming
  the field."""
  data = _transitions(200)
  config = _tiny(dyn_max_epochs=4, dyn_checkpoint_every_s=0.0)
  keys = key_scheme.cell_keys(config)[0]
  ckpt = str(tmp_path / "partial")
  with pytest.raises(dynamics_training.DynamicsTrainingStopped):
    dynamics_training.train_seeds(keys, data, config, log_fn=lambda _: None,
                                  checkpoint_dir=ckpt, should_stop=lambda: True,
                                  reuse_key=_key(config, data))
  other = config.replace(dyn_lr=config.dynamics_training.dyn_lr / 2)
  with pytest.raises(checkpoint.CheckpointError, match="another setup.*dyn_lr"):
    dynamics_training.train_seeds(keys, data, other, log_fn=lambda _: None, checkpoint_dir=ckpt,
                                  reuse_key=_key(other, data))


def test_a_resume_takes_its_dynamics_from_its_checkpoint(tiny_run, tmp_path,  # noqa: F811
                                                        monkeypatch):
  """A run with checkpoints needs no saved ensemble (its CellState holds the dynamics): resuming
  neither trains nor reads one, and a legacy save in its dynamics folder does not stop it."""
  from mombo_jax.run import host_run, launch as launch_lib, resume
  from mombo_jax.run.run_specs import RunSpec
  workdir, state = tiny_run
  run = str(tmp_path / "run")
  shutil.copytree(workdir, run)
  config, dataset = workdir_lib.Workdir(run).read_config()
  dyn_dir = str(tmp_path / "dynamics")
  legacy = os.path.join(dyn_dir, f"seed{config.seed}x{config.num_seeds}")
  os.makedirs(legacy)                                   # a legacy save's folder, never opened
  monkeypatch.setattr(resume, "get_dynamics", None)
  monkeypatch.setattr(dynamics_training, "train_seeds", None)
  lines = []
  monkeypatch.setattr(resume, "log", lines.append)
  monkeypatch.setattr(host_run, "log", lines.append)
  launch = launch_lib.Launch([RunSpec(config, dataset, run, dyn_dir)],
                             launch_lib.LaunchOptions(build_steps=1))
  try:
    launch.plan()
    launch.prepare()
  finally:
    launch.release()
  for r in launch.runs:
    r.ckpt.close()
  assert any("dynamics ensembles come from its checkpoint" in line for line in lines)
  assert any(line.startswith("Resumed from") for line in lines)
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(launch.program.state.dynamics),
               jax.device_get(state.dynamics))
  assert os.listdir(legacy) == []
