"""Several processes, one program (mombo_jax.distributed): two CPU processes on localhost joined by
jax.distributed train the seeds of one run as one process does, write the outputs once, and leave
a checkpoint that a run of another process count resumes."""
import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from mombo_jax import config as config_lib, distributed, runner

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = dict(epochs=2, steps_per_epoch=5, rollout_batch_size=32, eval_every=1, eval_episodes=1)
FLAGS = ["--env=hopper-random", "--preset=tiny", "--seeds=2", "--compilation_cache="] + [
    f"--{k}={v}" for k, v in TINY.items()]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _launch(args, env):
  return subprocess.Popen([sys.executable, "-m", "experiments.run", *args], cwd=_ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_two_processes_train_as_one_and_resume_in_one(hopper_random_2000, minari_root, tmp_path):
  config = config_lib.make_config("hopper-random", "mombo", preset="tiny", num_seeds=2, **TINY)
  dyn = str(tmp_path / "dynamics")
  # One process, all epochs (it trains the dynamics the two processes then read).
  single = runner.train(config, "hopper-random", str(tmp_path / "single"), dynamics_dir=dyn)

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
  outs = [p.communicate(timeout=300)[0] for p in procs]
  assert [p.returncode for p in procs] == [0, 0], "\n".join(outs)
  assert "sharded over 2 cpu device(s) of 2 processes, 1 per device" in outs[0], outs[0]
  assert "epoch 1/2" in outs[0] and "epoch 1/2" not in outs[1]     # process 0 alone speaks
  assert sorted(os.listdir(workdir / "checkpoints")) == ["1"]
  # ... and resumed by ONE process: the checkpoint holds every seed, whoever wrote it.
  resumed = runner.train(config, "hopper-random", str(workdir), dynamics_dir=dyn)
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
  out = subprocess.run([sys.executable, "-m", "experiments.run", "--process_id=0",
                        f"--workdir={tmp_path / 'w'}"], cwd=_ROOT, capture_output=True, text=True,
                       timeout=120)
  assert out.returncode != 0
  assert out.stderr.strip().splitlines()[-1].startswith("error: --coordinator_address"), out.stderr
  assert not (tmp_path / "w").exists()
  # --distributed outside a cluster: one line naming the flags to pass instead.
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  for k in [k for k in env if k.startswith(("SLURM_", "OMPI_", "TPU_"))]:
    del env[k]
  out = subprocess.run([sys.executable, "-m", "experiments.run", "--distributed",
                        f"--workdir={tmp_path / 'w'}"], cwd=_ROOT, capture_output=True, text=True,
                       timeout=120, env=env)
  err = out.stderr.strip().splitlines()
  assert out.returncode != 0 and len(err) == 1, out.stderr
  assert err[0].startswith("error: --distributed found no cluster") and "--process_id" in err[0]
  assert not (tmp_path / "w").exists()
