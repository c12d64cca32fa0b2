"""Several processes, one program (mombo_jax.run.distributed): two CPU processes on localhost joined
by jax.distributed train the seeds of one run as one process does, write the outputs once, and leave
a checkpoint that a run of another process count resumes. Joining is bounded: a process whose peers
never come ends in one line at --init_timeout, a stop signal while waiting ends it at once, and
once joined the run's own SIGTERM handler is back (JAX's preemption notifier takes it over)."""
import json
import os
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest

from mombo_jax.run import distributed, runner
from mombo_jax.settings import config as config_lib
from mombo_jax.storage import checkpoint
from tests.conftest import HANG_S

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = dict(epochs=2, steps_per_epoch=5, rollout_batch_size=32, eval_every=1, eval_episodes=1)
FLAGS = ["--env=hopper-random", "--preset=tiny", "--seeds=2", "--compilation_cache="] + [
    f"--{k}={v}" for k, v in TINY.items()]


def _free_port() -> int:
  return _free_ports(1)[0]


def _free_ports(n: int) -> list:
  """n distinct free ports (held together while picked, so none repeats)."""
  socks = [socket.socket() for _ in range(n)]
  try:
    for s in socks:
      s.bind(("localhost", 0))
    return [s.getsockname()[1] for s in socks]
  finally:
    for s in socks:
      s.close()


def _launch(args, env):
  return subprocess.Popen([sys.executable, "-m", "experiments.run", *args], cwd=_ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_two_processes_train_as_one_and_resume_in_one(hopper_random_2000, minari_root, tmp_path):
  config = config_lib.make_config("hopper-random", "mombo", preset="tiny", num_seeds=2, **TINY)
  dyn = str(tmp_path / "dynamics")
  # One process, all epochs (it trains the dynamics the two processes then read).
  single = runner.train_run(config, "hopper-random", str(tmp_path / "single"), dynamics_dir=dyn)

  # Two processes, one CPU device each, one seed each: stopped after epoch 1 ...
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
           if not f.startswith("--xla_force_host_platform_device_count")]
  env = dict(os.environ, MINARI_DATASETS_PATH=str(minari_root), JAX_PLATFORMS="cpu",
             XLA_FLAGS=" ".join(flags))
  workdir = tmp_path / "multi"
  port = _free_port()
  procs = [_launch(FLAGS + [f"--workdir={workdir}", f"--dynamics_dir={dyn}", "--stop_after=1",
                            f"--coordinator_address=localhost:{port}", "--num_processes=2",
                            f"--process_id={i}"], env) for i in (0, 1)]
  outs = [p.communicate(timeout=HANG_S)[0] for p in procs]
  assert [p.returncode for p in procs] == [0, 0], "\n".join(outs)
  assert "sharded over 2 cpu device(s) of 2 processes, 1 per device" in outs[0], outs[0]
  assert "epoch 1/2" in outs[0] and "epoch 1/2" not in outs[1]     # process 0 alone speaks
  assert sorted(os.listdir(workdir / "checkpoints")) == ["1"]
  # Written without a gather: each process wrote the shards on its device (its own OCDBT
  # folder), and the manifest lists a CRC32 per shard, one seed each, for every leaf (all have
  # the seed axis first); a gathered state would be host copies, one CRC32 a leaf.
  step = workdir / "checkpoints" / "1"
  body = json.loads((step / "meta" / "metadata").read_text())
  assert body["format"] == checkpoint.FORMAT_SHARDED and len(body["leaves"]) > 50
  for path, shape, _, _, crcs, _ in body["leaves"]:
    assert [block[0] for block, _ in crcs] == [[0, 1], [1, 2]], path
    assert all(block[1:] == [[0, n] for n in shape[1:]] for block, _ in crcs), path
  assert {"ocdbt.process_0", "ocdbt.process_1"} <= set(os.listdir(step / "state"))
  # ... and resumed by ONE process: the checkpoint holds every seed, whoever wrote it.
  resumed = runner.train_run(config, "hopper-random", str(workdir), dynamics_dir=dyn)
  for key in ("final_normalized_score", "aulc"):
    np.testing.assert_allclose(resumed[key], single[key], rtol=1e-4, err_msg=key)
  rows = (workdir / "metrics.csv").read_text().splitlines()
  assert len(rows) == 1 + 2 * 2                                      # header + 2 epochs x 2 seeds
  assert json.loads((workdir / "summary.json").read_text())["epochs"] == [1, 2]


def test_initialize_refuses_partial_flags_and_is_a_no_op_without_them():
  assert distributed.initialize() is False and not distributed.is_multiprocess()
  assert distributed.is_main()
  with pytest.raises(ValueError, match="go together"):
    distributed.initialize("localhost:1234", None, 0)
  with pytest.raises(ValueError, match="must be in"):
    distributed.initialize("localhost:1234", 2, 2)
  assert distributed.agree(True) and not distributed.agree(False)
  tree = {"a": np.arange(3.0)}
  np.testing.assert_array_equal(distributed.to_host(tree)["a"], tree["a"])


def test_cli_refuses_partial_flags_in_one_line(tmp_path):
  def cli(*args, env=None):
    return subprocess.Popen([sys.executable, "-m", "experiments.run", *args,
                             f"--workdir={tmp_path / 'w'}"], cwd=_ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  # --distributed outside a cluster (the second): one line naming the flags to pass instead.
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  for k in [k for k in env if k.startswith(("SLURM_", "OMPI_", "TPU_"))]:
    del env[k]
  partial, outside = cli("--process_id=0"), cli("--distributed", env=env)   # side by side
  _, stderr = partial.communicate(timeout=HANG_S)
  assert partial.returncode != 0
  assert stderr.strip().splitlines()[-1].startswith("error: --coordinator_address"), stderr
  _, stderr = outside.communicate(timeout=HANG_S)
  err = stderr.strip().splitlines()
  assert outside.returncode != 0 and len(err) == 1, stderr
  assert err[0].startswith("error: --distributed found no cluster") and "--process_id" in err[0]
  assert not (tmp_path / "w").exists()


def _cpu_env():
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  for k in [k for k in env if "_proxy" in k.lower()]:     # JAX warns about each on stderr
    del env[k]
  return env


def _waiting(proc, port, process_id):
  """Reads proc's stdout up to its 'waiting for' line (the test's cue that it is waiting)."""
  line = proc.stdout.readline().strip()
  assert line == f"waiting for 2 processes at localhost:{port} (process {process_id}) ...", line


def _run_alone(process_id, port, *extra):
  return subprocess.Popen([sys.executable, "-m", "experiments.run", "--num_processes=2",
                           f"--coordinator_address=localhost:{port}",
                           f"--process_id={process_id}", *extra], cwd=_ROOT, env=_cpu_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_process_whose_peers_never_come_ends_in_one_line_at_init_timeout(tmp_path):
  # Process 0 alone (no one connects) and process 1 alone (no coordinator), side by side.
  ports = _free_ports(2)
  procs = [_run_alone(i, ports[i], "--init_timeout=2", f"--workdir={tmp_path / 'w'}")
           for i in (0, 1)]
  for i, p in enumerate(procs):
    _waiting(p, ports[i], i)
  outs = [p.communicate(timeout=HANG_S) for p in procs]
  # Ended by --init_timeout=2, not by anything else: its own exit code and the "waited 2 s" below
  # (no wall-clock bound here: a loaded machine may take long to start or end a process).
  assert [p.returncode for p in procs] == [distributed.EXIT_INIT_TIMEOUT] * 2, outs
  for _, err in outs:
    assert len(err.strip().splitlines()) == 1, err         # no C++ stack, no traceback
    assert "--init_timeout" in err, err
  assert outs[0][1].startswith(f"error: process 0 waited 2 s at localhost:{ports[0]} for "
                               "process(es) 1 (--num_processes=2)"), outs[0][1]
  assert outs[1][1].startswith(f"error: process 1 waited 2 s for the coordinator at localhost:"
                               f"{ports[1]} (process 0 of --num_processes=2) and nothing "
                               "answers there"), outs[1][1]
  assert not (tmp_path / "w").exists()


def test_sigterm_and_sigint_while_waiting_end_at_once():
  ports = _free_ports(2)
  procs = [_run_alone(i, ports[i], "--init_timeout=120") for i in (0, 1)]
  for i, (p, sig) in enumerate(zip(procs, (signal.SIGTERM, signal.SIGINT))):
    _waiting(p, ports[i], i)
    p.send_signal(sig)
  # "At once": each ends by its signal (143 / 130 and the line below), not by its
  # --init_timeout=120, which would end it with EXIT_INIT_TIMEOUT: no wall-clock bound needed.
  outs = [p.communicate(timeout=HANG_S)[1] for p in procs]
  assert [p.returncode for p in procs] == [143, 130], outs
  for err, name in zip(outs, ("SIGTERM", "SIGINT")):
    assert err.strip().splitlines() == [err.strip()] and err.startswith(
        f"{name} received while waiting for the other processes"), err


def test_coordinator_port_in_use_is_refused_in_one_line():
  # JAX's coordinator service crashes (segmentation fault) on a port already taken.
  with socket.socket() as taken:
    taken.bind(("", 0))
    taken.listen()
    port = taken.getsockname()[1]
    proc = _run_alone(0, port, "--init_timeout=60")
    out, err = proc.communicate(timeout=HANG_S)
  assert proc.returncode == 1 and not out, (out, err)
  assert err.strip().splitlines() == [f"error: --coordinator_address=localhost:{port}: port "
                                      f"{port} is already in use on this host, where process 0 "
                                      "serves the coordinator; pass a free port (the same on "
                                      "every process)."], err


_JOIN_THEN_SIGTERM = """
import os, signal, sys, time
from mombo_jax.run import distributed
got = []
signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
distributed.initialize(sys.argv[1], 2, int(sys.argv[2]), timeout=60)
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.2)
print(distributed.process_count(), got)
"""


def test_joined_processes_keep_their_sigterm_handler():
  # JAX's preemption notifier takes SIGTERM over when the processes join: the run's stop flag
  # would never hear a cluster's preemption.
  port = _free_port()
  procs = [subprocess.Popen([sys.executable, "-c", _JOIN_THEN_SIGTERM, f"localhost:{port}", str(i)],
                            cwd=_ROOT, env=_cpu_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True) for i in (0, 1)]
  outs = [p.communicate(timeout=HANG_S)[0] for p in procs]
  assert [p.returncode for p in procs] == [0, 0], outs
  assert [o.strip().splitlines()[-1] for o in outs] == ["2 [15]"] * 2, outs
