"""Every stop in seconds, and every stop resumes exactly (mombo_jax.signals): dynamics training
stops between device calls of about signals.POLL_SECONDS inside an epoch, the collector's online SAC
between env steps, amid a chunk of gradient steps and amid an evaluation, a recording between its
rounds; what each saves resumes bit for bit (same machine, same process kind)."""
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from mombo_jax import errors, signals
from mombo_jax.collection import dataset_writer, online_sac, recipes, sac_run
from mombo_jax.data import minari_io
from mombo_jax.dynamics import dynamics_training
from mombo_jax.env import envs
from mombo_jax.settings import config as config_lib
from tests.conftest import HANG_S, minari_root_at
from tests.launches import train_run

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _equal(a, b):
  jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), a, b)


def _watch(proc, triggers, sig, delay_s=0.0):
  """Reads proc's output until a line holds one of `triggers` (or the process ended), waits
  delay_s, sends `sig`, waits for the exit; returns (seconds from the signal to the exit, printed
  by the tests as information, its whole output).

  No wall-clock bound is asserted: "within seconds" is shown by what the process did before it
  ended (the stopped epoch or chunk never finished, which takes minutes), so a loaded machine that
  is slow to start, compile or exit cannot fail the test; HANG_S only guards against a hang."""
  import threading
  lines, seen = [], threading.Event()

  def read():
    for line in proc.stdout:
      lines.append(line)
      if any(t in line for t in triggers):
        seen.set()
    seen.set()                                     # ended without the trigger: the asserts say so
  reader = threading.Thread(target=read, daemon=True)
  reader.start()
  seen.wait(HANG_S)
  time.sleep(delay_s)
  t0 = time.monotonic()
  if proc.poll() is None:
    proc.send_signal(sig)
  try:
    proc.wait(timeout=HANG_S)
  except subprocess.TimeoutExpired:
    proc.kill()
    proc.wait()
  latency = time.monotonic() - t0
  reader.join(timeout=HANG_S)
  return latency, "".join(lines)


# ------------------------------------------------------------------------------------- dynamics

def _hetero(n, seed=0):
  from mombo_jax.data.transitions import Transitions
  rng = np.random.default_rng(seed)
  s = rng.uniform(-1, 1, (n, 2)).astype(np.float32)
  a = rng.uniform(-1, 1, (n, 1)).astype(np.float32)
  nxt = s + 0.3 * np.sin(s) + 0.2 * a + 0.05 * rng.normal(size=(n, 2))
  return Transitions(s, a, s[:, 0] + a[:, 0], nxt.astype(np.float32), np.zeros(n, np.float32))


def test_dynamics_stopped_mid_epoch_resumes_bit_for_bit(tmp_path, monkeypatch):
  """A stop inside an epoch (between device calls of its minibatches) checkpoints the state after
  the last whole epoch; the same call resumes there and ends where an uninterrupted call (split
  into other device calls) ends, bit for bit."""
  cfg = config_lib.make_config("hopper-medium", dyn_hidden=(32, 32), dyn_members=3, dyn_elites=2,
                               dyn_weight_decay=(2.5e-5, 5e-5, 1e-4), dyn_batch_size=64,
                               dyn_max_epochs=3, dyn_checkpoint_every_s=1e9)
  data, keys = _hetero(1500), jax.random.split(jax.random.PRNGKey(7), 2)
  whole = dynamics_training.train_seeds(keys, data, cfg, log_fn=lambda _: None)
  monkeypatch.setattr(signals, "POLL_SECONDS", 0.0)       # one minibatch a call: many polls
  epochs, polls = [], []

  def stop_in_epoch_two():               # the 1st poll after epoch 1 ends it; then 3 calls in
    if epochs:
      polls.append(1)
    return len(polls) == 4

  ckpt_dir = str(tmp_path / "partial")
  with pytest.raises(dynamics_training.DynamicsTrainingStopped) as info:
    dynamics_training.train_seeds(keys, data, cfg, log_fn=epochs.append, checkpoint_dir=ckpt_dir,
                                  should_stop=stop_in_epoch_two)
  assert info.value.epoch == 1 and info.value.mid_epoch and len(epochs) == 1
  assert "during epoch 2" in str(info.value)
  lines = []
  resumed = dynamics_training.train_seeds(keys, data, cfg, log_fn=lines.append,
                                          checkpoint_dir=ckpt_dir)
  assert "resumed" in lines[0] and "at epoch 1" in lines[0]
  _equal(whole, resumed)


def _synthetic_hopper(n_episodes, length=1000):
  """hopper-random-shaped random transitions (obs 11, action 3) in the current Minari root: only
  the size matters here."""
  rng = np.random.default_rng(0)
  eps = [dict(observations=rng.normal(size=(length + 1, 11)).astype(np.float32),
              actions=rng.uniform(-1, 1, (length, 3)).astype(np.float32),
              rewards=rng.normal(size=length), terminations=np.zeros(length, bool),
              truncations=np.arange(length) == length - 1) for _ in range(n_episodes)]
  dataset_writer.write_dataset("hopper-random", eps,
                               dataset_writer.DatasetMetadata("synthetic", "synthetic"),
                               overwrite=True)


@pytest.mark.slow
def test_sigterm_mid_dynamics_epoch_stops_within_seconds(tmp_path):
  """experiments.train_dynamics at the quick preset's ensemble (7 x 4 x 200) on 80k transitions,
  4 seeds: an epoch takes minutes on this CPU; SIGTERM in the first epoch ends the process within
  seconds (143, no traceback), with the state before that epoch saved for the same command."""
  with minari_root_at(tmp_path / "minari"):
    _synthetic_hopper(80)
  env = dict(os.environ, MINARI_DATASETS_PATH=str(tmp_path / "minari"), PYTHONUNBUFFERED="1")
  cmd = [sys.executable, "-m", "experiments.train_dynamics", "--env=hopper-random",
         "--preset=quick", "--seeds=4", f"--workdir={tmp_path / 'dyn'}"]
  proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  # The progress line of the epoch's pace comes once its minibatches run (compiled); before this
  # change the first line came at the end of the first epoch (minutes).
  latency, out = _watch(proc, ("minibatches an epoch", "dynamics epoch 1:"), signal.SIGTERM)
  print(f"dynamics: SIGTERM -> exit in {latency:.1f} s")
  assert proc.returncode == 143, out
  assert "minibatches an epoch" in out and "dynamics epoch 1:" not in out, out
  assert "Traceback" not in out and "the same command resumes" in out, out
  import glob

  from mombo_jax.storage import checkpoint
  found = glob.glob(str(tmp_path / "dyn" / "seed0x4*.partial"))   # <path>.partial (workdir)
  assert len(found) == 1, found
  partial = checkpoint.RunCheckpointer(found[0])
  assert partial.latest_step() == 0          # the state before the stopped epoch
  partial.close()


# ------------------------------------------------------------------------------------ collector

class _Poll:
  """should_stop for train_sac: records who polled (the enclosing function names), fires on poll
  number `at` (None: never)."""

  def __init__(self, at=None):
    self.at, self.callers, self.signum = at, [], signal.SIGTERM

  def __call__(self):
    frame = sys._getframe(1)
    names = (frame.f_code.co_name, frame.f_back.f_code.co_name)
    self.callers.append("eval" if "run_episodes" in names else
                        "train" if "train_chunk" in names else "step")
    return self.at is not None and len(self.callers) == self.at


def _tiny_sac(workdir=None, should_stop=None):
  config = online_sac.online_config("hopper", (16, 16), 32)
  schedule = sac_run.SacSchedule(300, start_steps=100, eval_every=150, eval_episodes=2, seed=3,
                                    train_every=100, checkpoint_every=10**6, log_every=10**6)
  return sac_run.train_sac(
      lambda: envs.make_env("hopper-random", max_episode_steps=40), config, schedule,
      sac_run.MediumPoint(-1e9, consecutive=1), workdir=workdir, log_fn=lambda *_: None,
      should_stop=should_stop)


def test_sac_stopped_between_steps_amid_gradient_steps_or_an_evaluation_resumes_bit_for_bit(
    tmp_path, monkeypatch):
  """The collector's SAC loop stopped between env steps, amid a chunk's gradient steps and amid an
  evaluation: each checkpoints where it is (env mid-episode, RNGs, the chunk's progress) and the
  resume ends exactly where an uninterrupted run ends (final and medium actors, evaluations,
  replay rows)."""
  monkeypatch.setattr(signals, "POLL_SECONDS", 0.0)       # one update a device call
  dry = _Poll()
  straight = _tiny_sac(should_stop=dry)
  kinds = np.asarray(dry.callers)
  # A poll of each kind well inside the run: the 30th gradient-step poll of the second chunk
  # (step 200), the 20th poll inside the second evaluation (step 300), a step poll at step 250.
  train_polls = np.flatnonzero(kinds == "train")
  picks = {"train": train_polls[train_polls > np.flatnonzero(kinds == "eval")[0]][30],
           "eval": np.flatnonzero(kinds == "eval")[-20],
           "step": np.flatnonzero(kinds == "step")[250]}
  for kind, at in picks.items():
    work = str(tmp_path / kind)
    with pytest.raises(errors.Interrupted) as info:
      _tiny_sac(work, _Poll(at + 1))
    assert info.value.signum == signal.SIGTERM
    assert ("gradient steps due there" in info.value.where) == (kind == "train"), info.value.where
    assert ("evaluation" in info.value.where) == (kind == "eval"), info.value.where
    resumed = _tiny_sac(work)
    assert resumed.steps_done == straight.steps_done == 300
    assert resumed.evals == straight.evals and resumed.medium_step == straight.medium_step == 150
    _equal(resumed.final_actor, straight.final_actor)
    _equal(resumed.medium_actor, straight.medium_actor)
    _equal(resumed.replay, straight.replay)


def test_a_stopped_recording_writes_nothing(tmp_path):
  """A stop while recording (here a random dataset) raises Interrupted before anything is
  written; recording again gives what an uninterrupted build gives (the episodes are seeded)."""
  polls = []
  with minari_root_at(tmp_path):
    with pytest.raises(errors.Interrupted, match="recording"):
      recipes.build_random("hopper-random", steps=300, log_fn=lambda *_: None,
                           should_stop=lambda: polls.append(1) or len(polls) == 100)
    assert not minari_io.exists_locally("hopper-random")


@pytest.mark.slow
def test_sigterm_mid_sac_chunk_stops_within_seconds_and_resumes_bit_for_bit(tmp_path):
  """experiments.collect, SIGTERM amid a chunk of ~1500 gradient steps (seconds of device work in
  one call before this change; SIGTERM then killed the process and lost the steps since the last
  checkpoint): exit 143 within seconds, a checkpoint amid the chunk, and the same command builds
  the dataset an uninterrupted build writes, bit for bit."""
  args = ["--env=hopper-medium-replay", "--steps=50", "--sac_steps=1600", "--start_steps=100",
          "--eval_every=1600", "--eval_episodes=1", "--medium_fraction=-1",
          "--medium_consecutive=1", "--checkpoint_every=100000", "--log_every=1599",
          "--hidden=128,128", "--batch_size=128", "--num_envs=2", "--max_episode_steps=40",
          "--train_every=1600"]

  def launch(name):
    env = dict(os.environ, MINARI_DATASETS_PATH=str(tmp_path / name), HF_HUB_OFFLINE="1",
               PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "experiments.collect", *args,
                             f"--workdir={tmp_path / (name + '_work')}"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

  straight = launch("straight")
  out = straight.communicate(timeout=HANG_S)[0]
  assert straight.returncode == 0, out
  proc = launch("stopped")
  # Step 1599's line comes just before the chunk of step 1600; the signal 0.5 s later lands inside.
  latency, out = _watch(proc, ("SAC step 1599/",), signal.SIGTERM, delay_s=0.5)
  print(f"collector: SIGTERM -> exit in {latency:.1f} s")
  assert proc.returncode == 143 and "Traceback" not in out, out
  assert "gradient steps due there" in out and "resumes exactly" in out, out
  again = launch("stopped")
  out = again.communicate(timeout=HANG_S)[0]
  assert again.returncode == 0 and "resumed the SAC run at step 1600" in out, out
  from mombo_jax.data import transitions as transitions_lib
  read = {}
  for name in ("straight", "stopped"):
    with minari_root_at(tmp_path / name):
      read[name] = transitions_lib.load_transitions("hopper-medium-replay")
    path = tmp_path / (name + "_work") / "hopper" / "actors" / "expert.msgpack"
    read[name + "_actor"] = path.read_bytes()
  assert len(read["stopped"].rewards) == 1600
  _equal(read["straight"], read["stopped"])
  assert read["straight_actor"] == read["stopped_actor"]


# ----------------------------------------------------------------------------------- training

class _Flag:
  """A StopFlag set from a timer (SIGTERM's number), remembering when."""

  def __init__(self):
    self.signum, self.at = None, None

  def set(self):
    self.at, self.signum = time.monotonic(), signal.SIGTERM

  def __call__(self):
    return self.signum is not None


def test_a_stop_during_an_evaluation_does_not_wait_for_it_and_resumes_bit_for_bit(
    hopper_random_2000, tmp_path, monkeypatch):
  """A stop request while the background evaluation of epoch 1 still runs (each env step made to
  take 0.5 s) abandons it within a step instead of waiting for it (counted in env steps begun
  after the request, not in seconds, so that a loaded machine cannot fail it); the launch resumes
  at epoch 1 (its checkpoint holds what its rows need), writes that evaluation's rows and ends
  with the metrics, summary and parameters of an uninterrupted run."""
  import threading

  from mombo_jax.env import env_pool
  from mombo_jax.records.workdir import Workdir
  from mombo_jax.run import run_state
  cfg = config_lib.make_config(hopper_random_2000, "mombo", preset="tiny", epochs=2,
                               steps_per_epoch=5, rollout_batch_size=32, eval_every=1,
                               eval_episodes=1)
  dyn = str(tmp_path / "dynamics")
  straight = train_run(cfg, hopper_random_2000, str(tmp_path / "straight"), dynamics_dir=dyn,
                              eval_workers=1)
  flag, step, steps = _Flag(), env_pool.EnvPool.step, []

  def slow_step(self, *args, **kwargs):
    if not steps:                        # the first evaluation's first step: stop 0.5 s later
      threading.Timer(0.5, flag.set).start()
    steps.append(flag())                 # was the stop already requested when this step began?
    time.sleep(0.5)
    return step(self, *args, **kwargs)

  monkeypatch.setattr(env_pool.EnvPool, "step", slow_step)
  stopped = str(tmp_path / "stopped")
  with pytest.raises(errors.Interrupted) as info:
    train_run(cfg, hopper_random_2000, stopped, dynamics_dir=dyn, should_stop=flag,
                     eval_workers=1)
  begun_after = sum(steps)
  assert begun_after <= 1, f"{begun_after} env steps begun after the stop request"
  assert "the resume starts at epoch 1, whose evaluation was still running" in info.value.where
  monkeypatch.undo()
  resumed = train_run(cfg, hopper_random_2000, stopped, dynamics_dir=dyn, eval_workers=1)
  assert resumed == straight
  assert (tmp_path / "straight" / "metrics.csv").read_text() == \
      (tmp_path / "stopped" / "metrics.csv").read_text()
  _equal(run_state.restore(Workdir(str(tmp_path / "straight")))[0],
         run_state.restore(Workdir(stopped))[0])


def test_a_launch_passes_its_stop_on_to_the_collector_it_started(tmp_path):
  """signals.run_child (experiments.run --build_missing running experiments.collect): a SIGTERM
  sent to the launch alone reaches the child as a stop request (SIGUSR1 to its StopFlag), which
  stops as from a first signal (143) and is not taken as a second one (no abort)."""
  import threading

  from mombo_jax import signals
  ready = tmp_path / "ready"
  child = ("import sys, time\nfrom mombo_jax import signals\nf = signals.StopFlag()\nf.install()\n"
           f"open({str(ready)!r}, 'w').close()\n"
           "while not f():\n  time.sleep(0.02)\nf._passed_on(None, None)\n"   # a 2nd: no abort
           "sys.exit(128 + f.signum)\n")
  flag = _Flag()

  def stop_once_ready():
    while not ready.exists():
      time.sleep(0.02)
    flag.set()
  threading.Thread(target=stop_once_ready, daemon=True).start()
  code = signals.run_child([sys.executable, "-c", child], flag)
  # Passed on at once: the child polls every 0.02 s and ends only on the passed-on request (it has
  # no other way out), so its exit code is the proof; no wall-clock bound (a loaded machine).
  assert code == 128 + signal.SIGTERM
