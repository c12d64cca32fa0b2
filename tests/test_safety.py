"""Run safety (issue #20): one writer per workdir and per dynamics ensemble, a run that knows its
data, no empty folders after a refusal, checkpoint faults in one line, eval changes on record.

The lock tests use real processes: a holder that takes the lock through the library (what
experiments.run does first) and real experiments.run / train_dynamics launches against it. No test
here compiles a train step.
"""
import errno
import json
import os
import signal
import subprocess
import sys

import pytest

from mombo_jax.dynamics import reuse
from mombo_jax.errors import UserError
from mombo_jax.records.workdir import Workdir
from mombo_jax.run import run_dataset, run_state, runner
from mombo_jax.settings import config as config_lib
from mombo_jax.storage import checkpoint, locks
from tests.conftest import HANG_S

DATASET = "hopper-random"
TINY = dict(epochs=2, steps_per_epoch=5, rollout_batch_size=32, eval_every=1, eval_episodes=1)


def _config(algo="mombo", **kw):
  return config_lib.make_config(DATASET, algo, preset="tiny", **{**TINY, **kw})


def _env(**extra):
  return dict(os.environ, PYTHONUNBUFFERED="1", **extra)


def _hold(folder, name=".lock"):
  """A real second process holding the lock of `folder` until killed."""
  code = ("import sys, time; from mombo_jax.storage import locks; "
          f"locks.FolderLock({str(folder)!r}, {name!r}).acquire(); print('held', flush=True); "
          "time.sleep(600)")
  proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                          env=_env())
  assert proc.stdout.readline().strip() == "held"
  return proc


def _one_error_line(out):
  lines = [line for line in out.stderr.strip().splitlines() if line.strip()]
  assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr
  assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr
  return lines[0]


def _run(args, minari, timeout=HANG_S):
  return subprocess.run([sys.executable, "-m", "experiments.run"] + args, capture_output=True,
                        text=True, timeout=timeout, env=_env(MINARI_DATASETS_PATH=str(minari)))


def test_a_second_launch_on_a_held_workdir_is_refused_at_once_naming_the_holder(tmp_path):
  """Two launches on one workdir, with another config or the same: the second is refused before
  any work, naming the holder's PID; the holder's files are untouched. kill -9 of the holder
  leaves no stale lock: the next launch gets past the lock (and here stops at the missing
  dataset, removing nothing of the run)."""
  workdir = tmp_path / "run"
  holder = _hold(workdir)
  try:
    (workdir / "config.json").write_text("{\"marker\": 1}")
    for algo in ("mombo", "mobile"):
      out = _run([f"--algo={algo}", "--env=hopper-random", "--preset=tiny",
                  f"--workdir={workdir}"], tmp_path / "no_data")
      line = _one_error_line(out)
      assert "in use by another launch" in line and f"PID {holder.pid}" in line, line
      assert (workdir / "config.json").read_text() == "{\"marker\": 1}"
  finally:
    holder.send_signal(signal.SIGKILL)
    holder.wait()
  out = _run(["--env=hopper-random", "--preset=tiny", "--nobuild_missing",
              f"--workdir={workdir}"], tmp_path / "no_data")
  line = _one_error_line(out)
  assert "in use" not in line and "hopper-random" in line, line
  assert (workdir / "config.json").read_text() == "{\"marker\": 1}"


def test_train_dynamics_respects_a_held_ensemble(tmp_path):
  """A dynamics ensemble being trained by one launch is not trained (or read) by a second."""
  dyn = tmp_path / "dyn"
  config = config_lib.make_config("hopper-random", "mombo", "tiny")    # train_dynamics' config
  holder = _hold(dyn, os.path.basename(reuse.dynamics_path(str(dyn), config)) + ".lock")
  try:
    out = subprocess.run([sys.executable, "-m", "experiments.train_dynamics",
                          "--env=hopper-random", "--seeds=1", "--preset=tiny", f"--workdir={dyn}"],
                         capture_output=True, text=True, timeout=HANG_S,
                         env=_env(MINARI_DATASETS_PATH=str(tmp_path / "no_data")))
  finally:
    holder.send_signal(signal.SIGKILL)
    holder.wait()
  line = _one_error_line(out)
  assert "in use by another launch" in line and f"PID {holder.pid}" in line, line


def test_lock_is_reentrant_in_one_process_and_cleans_only_what_it_created(tmp_path):
  wd = Workdir(str(tmp_path / "a" / "b" / "run"))
  first = wd.lock().acquire()
  second = wd.lock().acquire()       # a grid's groups sharing a folder: counted, not refused
  info = json.loads(open(first.path).read())
  assert info["pid"] == os.getpid() and info["host"]
  second.release(cleanup=True)
  assert os.path.isdir(wd.path)      # still held by `first`
  first.release(cleanup=True)
  assert not (tmp_path / "a").exists()
  # A folder that held something before is never removed.
  os.makedirs(wd.path)
  lock = wd.lock().acquire()
  lock.release(cleanup=True)
  assert os.path.isdir(wd.path)
  assert locks.check_locks_work(str(tmp_path))


def test_a_resume_on_other_data_is_refused(hopper_random_2000, tmp_path):
  """config.json records the dataset's identity; a run whose data changed (rebuilt by
  experiments.collect --overwrite, say) is refused after the data loads, whatever else was
  deleted, and nothing is written."""
  config = _config()
  wd = Workdir(str(tmp_path / "run"))
  record, _ = wd.check_config(config, DATASET)
  record["data"] = {"dataset": "mujoco/hopper/random-v0", "num_transitions": 5000,
                    "fingerprint": "00000000"}
  wd.write_config(record)
  before = open(wd.file("config.json")).read()
  with pytest.raises(UserError, match="trained on other data.*num_transitions: 5000 -> 2000"):
    runner.train_run(config, DATASET, wd.path)
  assert open(wd.file("config.json")).read() == before
  assert not os.path.exists(wd.dynamics_dir)
  # The identity check itself: same data passes and is recorded; unknown data (old run) noted.
  same = dict(record["data"])
  assert wd.check_data(dict(record), same) == (dict(record, data=same), [])
  fresh, notes = Workdir(str(tmp_path / "other")).check_data({"x": 1}, same)
  assert fresh["data"] == same and notes == []


def test_checkpoints_without_config_json_are_refused(tmp_path):
  os.makedirs(tmp_path / "checkpoints" / "3")
  with pytest.raises(UserError, match="checkpoints but .*config.json is missing"):
    Workdir(str(tmp_path)).check_config(_config(), DATASET)


def test_a_refused_grid_leaves_no_folder_and_stale_saves_are_removed(hopper_random_2000,
                                                                     tmp_path):
  """A --datasets grid refused when its second dataset is missing creates no cell folder; an
  unfinished checkpoint folder a killed save left is removed by the next launch (holding the
  lock), a reader never removes it."""
  from mombo_jax.run import groups as groups_lib
  root = tmp_path / "runs"
  groups = groups_lib.plan_groups("hopper-random", "mombo", "tiny", dict(TINY),
                                  ["hopper-random", "hopper-medium"], None, str(root))
  with pytest.raises(UserError, match="hopper-medium"):
    runner.train_grid(groups, build_missing=False)
  assert not root.exists(), list(root.rglob("*"))
  wd = Workdir(str(tmp_path / "run"))
  tmp = os.path.join(wd.checkpoints, "4.orbax-checkpoint-tmp-1234")
  os.makedirs(tmp)
  reader = run_state.checkpointer(wd, keep=None)
  reader.close()
  assert os.path.isdir(tmp)
  with pytest.raises(UserError, match="other"):       # refused later: the tmp is gone anyway
    wd.write_config({"dataset": "x", "data": {"dataset": "other", "num_transitions": 1,
                                              "fingerprint": "0"}})
    runner.train_run(_config(), DATASET, wd.path)
  assert not os.path.exists(tmp)


def test_a_half_deleted_step_is_removed_in_one_line_before_orbax_sees_it(tmp_path, capsys,
                                                                          caplog):
  """A launch killed while Orbax deleted an old step left that step half-deleted: the next
  launch (the lock holder) removes it before Orbax lists it, in one note line, and reading the
  run afterwards logs none of Orbax's "Metadata file does not exist" warnings."""
  import shutil

  import numpy as np
  wd = Workdir(str(tmp_path / "run"))
  ckpt = run_state.checkpointer(wd)
  state = {"w": np.arange(4, dtype=np.float32)}
  for step in (10, 20, 30):
    ckpt.save(step, state, {"epoch": step})
  ckpt.close()
  step20 = os.path.join(wd.checkpoints, "20")
  os.remove(os.path.join(step20, "_CHECKPOINT_METADATA"))   # deleted file by file, cut off
  shutil.rmtree(os.path.join(step20, "state"))
  wd.write_config({"dataset": "x"})
  capsys.readouterr()
  with pytest.raises(UserError, match="another config"):    # refused after the clean-up
    runner.train_run(_config(), DATASET, wd.path)
  notes = [line for line in capsys.readouterr().out.splitlines() if step20 in line]
  assert notes == [f"note: removed {step20}, checkpoint step 20 a stopped launch left "
                   "half-deleted (no _CHECKPOINT_METADATA, state/_METADATA)."], notes
  assert not os.path.exists(step20)
  caplog.clear()
  reader = run_state.checkpointer(wd, keep=None)
  restored, meta = reader.restore(state)
  assert reader.steps() == [10, 30] and meta["step"] == 30
  reader.close()
  assert not [r for r in caplog.records if "Metadata file does not exist" in r.getMessage()]
  # Unfinished saves and intact steps are told apart from it; a writer says what it removed.
  os.makedirs(os.path.join(wd.checkpoints, "40.orbax-checkpoint-tmp-7"))
  lines = []
  writer = checkpoint.RunCheckpointer(wd.checkpoints, log=lines.append)
  writer.close()
  assert lines == [f"note: removed {wd.checkpoints}/40.orbax-checkpoint-tmp-7, an unfinished "
                   "checkpoint a stopped launch left."]
  assert sorted(os.listdir(wd.checkpoints)) == ["10", "30"]


def test_empty_lists_are_refused_in_one_line(tmp_path):
  for flag in ("--betas=", "--datasets="):
    out = _run(["--env=hopper-random", flag, f"--workdir={tmp_path / 'w'}"], tmp_path / "none",
               timeout=HANG_S)
    line = _one_error_line(out)
    assert flag in line and "empty" in line
  assert not (tmp_path / "w").exists()
  from mombo_jax.run import groups as groups_lib
  with pytest.raises(UserError, match="empty"):
    groups_lib.plan_groups("hopper-random", "mombo", "tiny", {}, None, [], str(tmp_path))


def test_eval_changes_are_recorded_in_config_json(tmp_path):
  wd = Workdir(str(tmp_path))
  wd.write_config(wd.check_config(_config(), DATASET)[0])
  record, notes = wd.check_config(_config(eval_episodes=3), DATASET)
  assert record["eval_changes"][-1]["field"] == "eval_episodes"
  assert (record["eval_changes"][-1]["from"], record["eval_changes"][-1]["to"]) == (1, 3)
  wd.write_config(record)
  record, _ = wd.check_config(_config(eval_episodes=3, eval_every=2), DATASET)
  assert [c["field"] for c in record["eval_changes"]] == ["eval_episodes", "eval_every"]


def test_a_failed_checkpoint_save_is_one_error_and_leaves_nothing(tmp_path, monkeypatch):
  """Disk full during a save: CheckpointError naming the OS's cause; the unfinished step folder
  is removed and the earlier checkpoint restores."""
  import numpy as np
  import orbax.checkpoint as ocp

  from mombo_jax.storage import checkpoint
  ckpt = checkpoint.RunCheckpointer(str(tmp_path / "ck"))
  state = {"w": np.arange(4, dtype=np.float32)}
  ckpt.save(1, state, {"epoch": 1})

  def full(self, step, *a, **k):
    os.makedirs(os.path.join(str(self.directory), f"{step}.orbax-checkpoint-tmp-99"))
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
  monkeypatch.setattr(ocp.CheckpointManager, "save", full)
  with pytest.raises(checkpoint.CheckpointError, match="No space left on device") as e:
    ckpt.save(2, state, {"epoch": 2})
  assert "\n" not in str(e.value)
  assert sorted(os.listdir(tmp_path / "ck")) == ["1"]
  monkeypatch.undo()
  restored, meta = ckpt.restore(state)
  assert meta["step"] == 1 and np.array_equal(restored["w"], state["w"])
  ckpt.close()


def test_ctrl_c_while_the_collector_builds_data_is_an_interrupt(monkeypatch, tmp_path):
  """The collector (a child in the same process group) stops on Ctrl-C with 130: the launch then
  stops as interrupted (exit 130 with the resume command), not as a failed build."""
  from mombo_jax.errors import Interrupted
  from tests.conftest import minari_root_at
  monkeypatch.setattr(run_dataset, "run_child", lambda *a, **k: 130)
  with minari_root_at(tmp_path / "empty"):
    with pytest.raises(Interrupted, match="building hopper-random") as e:
      run_dataset.load_or_build("hopper-random", _config(), True, 100)
  assert e.value.signum == signal.SIGINT


def test_a_save_that_cannot_fit_is_refused_before_orbax_writes(tmp_path, monkeypatch):
  """Less free space than the state's raw size: refused in one line with both sizes, before
  Orbax writes anything (its mid-write failures come with pages of tensorstore noise)."""
  import collections

  import numpy as np

  from mombo_jax.storage import checkpoint, checkpoint_files
  ckpt = checkpoint.RunCheckpointer(str(tmp_path / "ck"))
  usage = collections.namedtuple("usage", "total used free")
  monkeypatch.setattr(checkpoint_files.shutil, "disk_usage", lambda p: usage(10**9, 10**9, 1000))
  with pytest.raises(checkpoint.CheckpointError, match=r"needs up to .* MiB.*No space left"):
    ckpt.save(1, {"w": np.zeros(10_000, np.float32)}, {"epoch": 1})
  assert os.listdir(tmp_path / "ck") == []
  ckpt.close()


def test_a_second_sweep_into_one_folder_is_refused(tmp_path):
  """sweep.json has one writer: a sweep into a folder another sweep holds is refused naming it,
  before any cell is launched."""
  from mombo_jax.run import sweep
  holder = _hold(tmp_path / "out", ".sweep.lock")
  launched = []
  try:
    with pytest.raises(UserError, match=f"in use by another launch: PID {holder.pid}"):
      sweep.run_sweep([], str(tmp_path / "out"), runner=launched.append, log=lambda m: None)
  finally:
    holder.send_signal(signal.SIGKILL)
    holder.wait()
  assert launched == [] and not (tmp_path / "out" / "sweep.json").exists()
