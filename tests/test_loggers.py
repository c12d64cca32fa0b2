"""The loggers besides metrics.csv (mombo_jax.run.loggers, experiments.run --log): names validated
before any work, TensorBoard event files and an offline W&B run read back, and a resumed run that
appends without duplicating a step. launch.train_runs with --log=tensorboard end to end:
test_run.py."""
import glob
import json
import os
import struct

import pytest

from mombo_jax.errors import UserError
from mombo_jax.run import loggers
from tests.conftest import HANG_S

RECORD = dict(dataset="hopper-random", algo="mombo", target="elite_spread", beta=0.5,
              steps_per_epoch=10, seed=3, num_seeds=2, epochs=3, data={"transitions": 2000})
SEEDS = (3, 4)


def _rows(epochs, launch=0):
  """metrics.csv rows of `epochs` for both seeds; `launch` marks which launch wrote them."""
  return [dict(epoch=e, step=10 * e, seed=s, return_mean=100.0 * e + s, normalized_score=e + launch,
               diverged=0.0, critic_loss=0.5 / e, q_mean=2.0 * e, **{"rollout/penalty": 0.1},
               q_bound=50.0, overestimated=0.0)
          for e in epochs for s in SEEDS]


def _launch(workdir, kinds, epochs, resume_epoch=0, history=(), launch=0):
  """One launch's loggers: open at `resume_epoch`, one write per evaluation, close."""
  run = loggers.RunLoggers(kinds, group="grid")
  run.open(str(workdir), RECORD, SEEDS, list(history), resume_epoch)
  try:
    for e in epochs:
      run.write(_rows([e], launch))
  finally:
    run.close()


# ------------------------------------------------------------------------------------ names

def test_parse_keeps_csv_first_and_refuses_unknown_or_empty_names():
  assert loggers.parse("tensorboard") == ("csv", "tensorboard")
  assert loggers.parse(["wandb", "csv", "wandb"]) == ("csv", "wandb")
  assert loggers.parse(" csv ") == ("csv",)
  with pytest.raises(UserError, match=r"unknown logger\(s\) tensorbord; valid: csv, tensorboard, "
                     "wandb"):
    loggers.parse("csv,tensorbord")
  for empty in ("", [], ",", None):
    with pytest.raises(UserError, match="`log_to` is empty"):
      loggers.parse(empty)


def test_a_missing_package_names_the_extra_to_install(monkeypatch):
  import importlib.util
  find_spec = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == "tensorboardX" else find_spec(name, *a))
  with pytest.raises(UserError, match=r"pip install -e \.\[tensorboard\]") as e:
    loggers.parse("csv,tensorboard")
  assert "\n" not in str(e.value)
  assert loggers.parse("wandb") == ("csv", "wandb")


def test_tensorboardx_needs_no_tensorflow(tmp_path):
  # tensorboardX imports torch and tensorflow when they happen to be installed (CI's Python has
  # torch), so the property is checked with both made unimportable: it still imports and writes.
  import subprocess
  import sys
  code = (
      "import sys\n"
      "class Block:\n"
      "  def find_spec(self, name, path=None, target=None):\n"
      "    if name.split('.')[0] in ('tensorflow', 'torch'):\n"
      "      raise ImportError('blocked: ' + name)\n"
      "sys.meta_path.insert(0, Block())\n"
      "from tensorboardX import SummaryWriter\n"
      f"w = SummaryWriter({str(tmp_path)!r}); w.add_scalar('x', 1.0, 0); w.close()\n"
      "print(any(m.split('.')[0] in ('tensorflow', 'torch') for m in sys.modules))\n")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_S)
  assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr
  assert glob.glob(os.path.join(tmp_path, "*tfevents*"))


# ------------------------------------------------------------------------------ TensorBoard

def _events(path):
  """Every Event of the TensorBoard run in `path`, in file order."""
  from tensorboardX.proto import event_pb2
  out = []
  for name in sorted(glob.glob(os.path.join(path, "*tfevents*"))):
    data = open(name, "rb").read()
    pos = 0
    while pos < len(data):
      (n,) = struct.unpack("<Q", data[pos:pos + 8])
      out.append(event_pb2.Event.FromString(data[pos + 12:pos + 12 + n]))
      pos += 16 + n
  return out


def test_tensorboard_one_series_per_metric_and_seed(tmp_path):
  _launch(tmp_path, ("tensorboard",), [1, 2, 3])
  assert sorted(os.listdir(tmp_path / "tb")) == ["seed3", "seed4"]
  for s in SEEDS:
    series = loggers.read_tensorboard(str(tmp_path / "tb" / f"seed{s}"))
    assert set(series) == {"eval/return_mean", "eval/normalized_score", "health/diverged",
                           "health/overestimated", "health/q_bound", "train/critic_loss",
                           "train/q_mean", "rollout/penalty"}
    assert series["eval/return_mean"] == [(10, 100.0 + s), (20, 200.0 + s), (30, 300.0 + s)]
    assert [v for _, v in series["train/critic_loss"]] == pytest.approx([0.5, 0.25, 0.5 / 3])
    # Dataset, beta and seed: in the text tab and the HParams dashboard, once, at step 0.
    events = _events(str(tmp_path / "tb" / f"seed{s}"))
    tags = [(v.tag, e.step) for e in events for v in e.summary.value]
    text = [e for e in events for v in e.summary.value if v.tag == "run/text_summary"]
    assert len(text) == 1 and text[0].step == 0
    said = text[0].summary.value[0].tensor.string_val[0].decode()
    assert "hopper-random" in said and "beta **0.5**" in said and f"seed **{s}**" in said
    assert ("_hparams_/session_start_info", 0) in tags


def test_tensorboard_resume_appends_without_duplicated_steps(tmp_path):
  """Launch 0 logs epochs 1-3 but its last checkpoint is epoch 1 (killed); launch 1 resumes at 1
  and stops after epoch 2; launch 2 resumes at 2 and finishes. Each step shows once, from the
  launch whose checkpoint the run continued from."""
  _launch(tmp_path, ("tensorboard",), [1, 2, 3], launch=0)
  _launch(tmp_path, ("tensorboard",), [2], resume_epoch=1, history=_rows([1], 0), launch=1)
  path = str(tmp_path / "tb" / "seed3")
  # Epoch 3 of the killed launch is gone (its purge step), epoch 2 is launch 1's.
  assert loggers.read_tensorboard(path)["eval/normalized_score"] == [(10, 1.0), (20, 3.0)]
  _launch(tmp_path, ("tensorboard",), [3], resume_epoch=2,
          history=_rows([1], 0) + _rows([2], 1), launch=2)
  series = loggers.read_tensorboard(path)
  assert series["eval/normalized_score"] == [(10, 1.0), (20, 3.0), (30, 5.0)]
  assert not any(tag.endswith("#duplicate") for tag in series), series
  assert [v.tag for e in _events(path) for v in e.summary.value].count("run/text_summary") == 1
  # TensorBoard honours the purge through each relaunch's SessionLog START at E*steps + 1.
  starts = [e.step for e in _events(path) if e.HasField("session_log")]
  assert starts == [11, 21]


def test_tensorboard_switched_on_at_a_resume_gets_the_history(tmp_path):
  _launch(tmp_path, ("tensorboard",), [3], resume_epoch=2, history=_rows([1, 2]))
  assert [s for s, _ in loggers.read_tensorboard(
      str(tmp_path / "tb" / "seed4"))["eval/return_mean"]] == [10, 20, 30]


# ---------------------------------------------------------------------------------------- W&B

def _wandb_records(path):
  """The Records of a .wandb file (wandb's LevelDB-style log: 7-byte file header, then 32 KiB
  blocks of chunks with a 7-byte header: crc32, length, type FULL 1 / FIRST 2 / MIDDLE 3 /
  LAST 4). wandb 0.31 ships no Python reader; its protobufs do the rest."""
  from wandb.proto import wandb_internal_pb2
  data = open(path, "rb").read()
  assert data[:4] == b":W&B"
  pos, block, pending, out = 7, 32768, b"", []
  while pos + 7 <= len(data):
    if block - pos % block < 7:               # a block's tail too short for a header: padding
      pos += block - pos % block
      continue
    _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
    chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
    if kind in (2, 3):
      pending += chunk
    elif kind in (1, 4):
      out.append(wandb_internal_pb2.Record.FromString(pending + chunk))
      pending = b""
  return out


def _wandb_history(path):
  """(run record, [{key: value} of each history row]) of one offline run folder."""
  (name,) = glob.glob(os.path.join(path, "*.wandb"))
  records = _wandb_records(name)
  run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
  rows = [{i.key or ".".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
          for r in records if r.WhichOneof("record_type") == "history"]
  return run, rows


@pytest.fixture
def wandb_offline(monkeypatch, tmp_path):
  """No W&B mode, key or settings of the machine: the loggers' default (offline) is under test,
  and nothing is written outside tmp_path."""
  for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_DIR"):
    monkeypatch.delenv(name, raising=False)
  for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
    monkeypatch.setenv(name, str(tmp_path / "wandb_home" / name.lower()))
  monkeypatch.setenv("WANDB_X_DISABLE_STATS", "true")      # no system-metrics sampler thread
  yield
  import wandb
  wandb.teardown()                  # the wandb-core service this process started


def test_wandb_offline_one_run_per_seed_resumed_without_duplicated_steps(tmp_path, wandb_offline):
  workdir = tmp_path / "run"
  _launch(workdir, ("wandb",), [1, 2, 3], launch=0)        # killed; its checkpoint: epoch 1
  ids = json.loads((workdir / "wandb" / "runs.json").read_text())
  assert ids["group"] == "grid" and set(ids["ids"]) == {"3", "4"}
  _launch(workdir, ("wandb",), [2, 3], resume_epoch=1, history=_rows([1], 0), launch=1)
  assert json.loads((workdir / "wandb" / "runs.json").read_text()) == ids   # same runs, same group
  folders = sorted(glob.glob(str(workdir / "wandb" / "offline-run-*")))
  # One folder per cell: the killed launch's were superseded by the resume's, which holds the
  # whole history (epoch 1 replayed from metrics.csv, 2-3 written anew), each step once.
  assert sorted(_folder_id(f) for f in folders) == sorted(ids["ids"].values())
  for s in SEEDS:
    (folder,) = [f for f in folders if _folder_id(f) == ids["ids"][str(s)]]
    run, rows = _wandb_history(folder)
    assert run.run_id == ids["ids"][str(s)] and run.run_group == "grid"
    assert "hopper-random" in run.display_name and "beta=0.5" in run.display_name
    config = {u.key: json.loads(u.value_json) for u in run.config.update}
    assert config["dataset"] == "hopper-random" and config["beta"] == 0.5
    assert config["seed"] == s and config["data"] == {"transitions": 2000}
    assert [r["_step"] for r in rows] == [10, 20, 30]
    assert [r["epoch"] for r in rows] == [1, 2, 3]
    assert [r["eval/normalized_score"] for r in rows] == [1, 3, 4]      # launch 0's 1, launch 1's
    assert [r["eval/return_mean"] for r in rows] == [100 + s, 200 + s, 300 + s]
    assert rows[0]["train/critic_loss"] == 0.5 and rows[0]["rollout/penalty"] == 0.1
  # A row at or below a step the run already holds (replayed, or on the server when online) is
  # skipped, not sent twice.
  run = loggers.RunLoggers(("wandb",), group="grid")
  run.open(str(workdir), RECORD, SEEDS, _rows([1, 2, 3], 1), 3)
  run.write(_rows([3], 1))
  run.close()
  folders = sorted(glob.glob(str(workdir / "wandb" / "offline-run-*")))
  assert len(folders) == 2
  for folder in folders:
    assert [r["_step"] for r in _wandb_history(folder)[1]] == [10, 20, 30]


def _folder_id(folder):
  return os.path.basename(folder).split("-")[3]      # offline-run-<time>-<id>[-<n>]
