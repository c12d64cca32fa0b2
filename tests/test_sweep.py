"""mombo_jax/sweep.py (behind experiments.sweep): the grid of cells, shared dynamics,
skip-when-finished, failure and interruption records; one real tiny sweep through the CLI."""
import json
import os
import subprocess
import sys

import pytest

from mombo_jax import errors, sweep

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUDGET = dict(preset="tiny", epochs=1, steps_per_epoch=5, rollout_batch_size=32, eval_episodes=1,
              dynamics_max_epochs=2)


def _cells(out, envs=("hopper-random", "walker2d-random"), algos=("mombo", "mopo"), **budget):
  return sweep.plan(list(envs), list(algos), seeds=2, seed=0, out=str(out),
                    budget={**BUDGET, **budget}, python="python3")


def test_plan_is_dataset_major_with_shared_dynamics(tmp_path):
  cells = _cells(tmp_path)
  assert [(c.env, c.algo) for c in cells] == [
      ("hopper-random", "mombo"), ("hopper-random", "mopo"),
      ("walker2d-random", "mombo"), ("walker2d-random", "mopo")]
  assert cells[0].workdir == str(tmp_path / "hopper-random" / "mombo-elite_spread" / "s0x2")
  assert cells[1].workdir == str(tmp_path / "hopper-random" / "mopo" / "s0x2")
  assert cells[0].dynamics_dir == cells[1].dynamics_dir != cells[2].dynamics_dir
  cmd = cells[1].command
  assert cmd[:3] == ("python3", "-m", "experiments.run")
  for flag in ("--env=hopper-random", "--algo=mopo", "--seeds=2", "--seed=0", "--preset=tiny",
               "--epochs=1", "--dynamics_max_epochs=2", f"--dynamics_dir={cells[1].dynamics_dir}"):
    assert flag in cmd, (flag, cmd)
  assert _cells(tmp_path, target="mixture")[0].workdir.endswith(os.path.join("mombo-mixture", "s0x2"))


@pytest.mark.parametrize("bad, match", [
    (dict(envs=("hopper-foo",)), "Unknown dataset name 'hopper-foo'"),
    (dict(algos=("mombo", "sac")), "Unknown algo 'sac'"),
    (dict(epochs=-1), "epochs"),
    (dict(envs=()), "--envs is required"),
    (dict(algos=("mopo", "mopo")), "must not repeat"),
])
def test_plan_refuses_bad_input_before_anything_runs(tmp_path, bad, match):
  with pytest.raises(errors.UserError, match=match):
    _cells(tmp_path / "out", **bad)
  assert not os.path.exists(tmp_path / "out")


def test_run_records_statuses_skips_finished_cells_and_stops_after_an_interrupt(tmp_path):
  cells = _cells(tmp_path)
  codes = {("hopper-random", "mombo"): 0, ("hopper-random", "mopo"): 1,
           ("walker2d-random", "mombo"): sweep.EXIT_DIVERGED, ("walker2d-random", "mopo"): 0}
  launched = []

  def runner(cell):
    launched.append((cell.env, cell.algo))
    code = codes[(cell.env, cell.algo)]
    if code in (0, sweep.EXIT_DIVERGED):      # experiments.run writes summary.json then
      os.makedirs(cell.workdir, exist_ok=True)
      with open(os.path.join(cell.workdir, "summary.json"), "w") as f:
        f.write("{}")
    return code

  result = sweep.run_sweep(cells, str(tmp_path), runner=runner, log=lambda *_: None)
  assert launched == list(codes)
  assert [e["status"] for e in result["cells"]] == ["finished", "failed", "diverged", "finished"]
  assert result["status"] == "failed" and sweep.exit_code(result) == 1
  assert json.loads((tmp_path / "sweep.json").read_text()) == result

  # Again: only the failed cell is launched (the others have their summary.json).
  launched.clear()
  codes[("hopper-random", "mopo")] = 0
  result = sweep.run_sweep(cells, str(tmp_path), runner=runner, log=lambda *_: None)
  assert launched == [("hopper-random", "mopo")]
  assert [e["status"] for e in result["cells"]] == ["skipped", "finished", "skipped", "skipped"]
  assert sweep.exit_code(result) == 0

  # An interrupted cell stops the sweep: later cells are not launched.
  fresh = _cells(tmp_path / "other")
  launched.clear()
  result = sweep.run_sweep(fresh, str(tmp_path / "other"), runner=lambda c: launched.append(c)
                           or 130, log=lambda *_: None)
  assert len(launched) == 1
  assert [e["status"] for e in result["cells"]] == ["interrupted"] + ["not started"] * 3
  assert sweep.exit_code(result) == 130


@pytest.mark.slow
def test_cli_runs_a_tiny_sweep_and_skips_it_when_run_again(minari_root, hopper_random_2000,
                                                           tmp_path):
  out = tmp_path / "sweep"
  cmd = [sys.executable, "-m", "experiments.sweep", "--envs=hopper-random", "--algos=mopo",
         "--seeds=1", f"--out={out}"] + [f"--{k}={v}" for k, v in BUDGET.items()]
  env = dict(os.environ, MINARI_DATASETS_PATH=str(minari_root), HF_HUB_OFFLINE="1")
  first = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
  workdir = out / "hopper-random" / "mopo" / "s0x1"
  assert (workdir / "summary.json").exists() and (out / "hopper-random" / "dynamics").is_dir()
  assert "sweep finished: 1 finished" in first.stdout
  again = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
  assert again.returncode == 0 and "skipped" in again.stdout and "1 skipped" in again.stdout
  bad = subprocess.run(cmd[:3] + ["--envs=hopper-foo", f"--out={out}"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120)
  assert bad.returncode == 1 and bad.stderr.strip().startswith("error:")
  assert "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
