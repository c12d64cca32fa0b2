"""The device record (benchmarks/device, issue #36) cannot rot: its sizing plans every part within
the budget, `prepare --smoke` makes a kit and `--check` says what is missing, `record --smoke`
runs every part at tiny sizes on the CPU and writes at most 8 files, and a budget too small for
the later parts skips them, names them, and exits 0."""
import json
import os
import re
import subprocess
import sys

import pytest

from benchmarks.device import kit as kit_lib, record, sizing

ROOT = kit_lib.ROOT


def _py(*args, **kw):
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
  return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=ROOT,
                        env=env, **kw)


def _simulate(budget, measured=None, smoke=False, use=None):
  """Plans the parts in order as the record does, each part spending `use(part, plan)` seconds
  (default its whole cap). Returns {part: Plan}."""
  left, done, plans = budget - (0 if smoke else sizing.SETUP_S), [], {}
  for part in sizing.PARTS:
    plan = sizing.plan(part, left, smoke, measured, tuple(done))
    plans[part] = plan
    done.append(part)
    if not plan.skip:
      left -= plan.cap_s if use is None else use(part, plan)
  return plans


def test_the_full_budget_holds_every_required_part_and_100_epochs_of_learning():
  plans = _simulate(480)
  assert all(plans[p].skip is None for p in "abcd"), plans
  assert plans["d"].epochs >= sizing.MIN_EPOCHS
  assert plans["d"].epochs % sizing.EVAL_EVERY == 0
  assert sum(p.cap_s for p in plans.values()) <= 480 - sizing.SETUP_S + 1e-6
  # The 8-minute record on one H100 (the issue): the caps, setup included, end within it.
  assert sizing.SETUP_S + sum(p.cap_s for p in plans.values()) <= 8 * 60


def test_a_faster_measured_epoch_buys_part_d_more_epochs():
  slow = _simulate(480)["d"].epochs
  fast = {"epoch_s": {a: {"4": 0.1 * sizing.epoch_s(a, 4)} for a in sizing.ALGOS}}
  assert sizing.epoch_s("mombo", 4, fast) == pytest.approx(0.1 * sizing.epoch_s("mombo", 4))
  # A count not measured is scaled from the nearest measured one by the H100 record's shape.
  assert sizing.epoch_s("mombo", 16, fast) == pytest.approx(
      0.1 * sizing.epoch_s("mombo", 4) * sizing.lcb_epoch_s(16) / sizing.lcb_epoch_s(4))
  assert _simulate(480, fast)["d"].epochs >= slow
  # With the same time left for it (part c takes what it wants first), part d trains longer.
  assert sizing.plan("d", 400, False, fast).epochs > sizing.plan("d", 400, False).epochs


def test_a_small_budget_skips_the_later_parts_naming_why_never_the_earlier():
  plans = _simulate(120, use=lambda part, plan: plan.cap_s)
  assert plans["a"].skip is None and plans["b"].skip is None
  assert plans["d"].skip and "floor" in plans["d"].skip
  assert plans["e"].skip
  # A higher priority part is not starved to keep time for lower ones.
  assert sizing.plan("a", 11, False).skip is None
  assert "under its" in sizing.plan("d", 100, False).skip


def test_part_d_s_dataset_is_the_paper_s_largest_mombo_lead_that_prepare_can_build():
  from benchmarks.device import learning, prepare
  assert learning.choose() == prepare.DATASET == "hopper-medium-replay"
  # The margins the docstring quotes, from the paper's Table 1 (mombo_jax.report.paper_results).
  assert learning.margin("hopper-medium-replay") == pytest.approx(1.12, abs=0.005)
  assert learning.margin("walker2d-medium") == pytest.approx(2.94, abs=0.005)
  assert learning.margin("halfcheetah-random", "final") == pytest.approx(1.54, abs=0.005)
  assert max(learning.margin(d, "final") for d in learning.CANDIDATES) < 0


def test_record_files_are_few_and_plainly_named():
  names = [n for v in record.FILES.values() for n in v] + [record.RECORD]
  assert len(names) <= record.MAX_FILES
  assert all(re.fullmatch(r"[A-Za-z0-9._-]+", n) for n in names)


def test_lean_smoke_is_refused_without_smoke(tmp_path, capsys):
  with pytest.raises(SystemExit):
    record.main([f"--out={tmp_path / 'out'}", "--lean_smoke"])
  assert "--lean_smoke trims the smoke record: pass it with --smoke." in capsys.readouterr().err
  assert not (tmp_path / "out").exists()             # refused before any work


@pytest.fixture(scope="module")
def smoke_kit(tmp_path_factory):
  kit = tmp_path_factory.mktemp("kit")
  done = _py("benchmarks.device.prepare", "--smoke", "--no_wheels", f"--kit={kit}", timeout=300)
  assert done.returncode == 0, done.stdout + done.stderr
  assert "[prepare] ready" in done.stdout
  assert re.search(r'^run: command=".*benchmarks\.device\.record --out=\$OUT .*timeout_s=540$',
                   done.stdout, re.M), done.stdout
  return str(kit)


def test_prepare_check_names_what_is_missing(tmp_path, smoke_kit):
  empty = _py("benchmarks.device.prepare", "--check", f"--kit={tmp_path}", timeout=120)
  assert empty.returncode == 1
  assert "missing: the wheel of mujoco" in empty.stdout
  assert "missing: the dataset hopper-medium-replay" in empty.stdout
  ready = _py("benchmarks.device.prepare", "--check", "--smoke", "--no_wheels",
              f"--kit={smoke_kit}", timeout=120)
  assert ready.returncode == 0, ready.stdout
  manifest = kit_lib.read_manifest(smoke_kit)
  assert manifest["dataset"] == "hopper-random" and manifest["transitions"] == 2000


@pytest.mark.slow
def test_the_smoke_record_runs_every_part_on_the_cpu(smoke_kit, tmp_path):
  out = tmp_path / "out"
  # --lean_smoke: part c compiles its epoch program only, not the gradient-step table's too (that
  # second compile was a fifth of the test's time); `record --smoke` alone still times it.
  done = _py("benchmarks.device.record", f"--out={out}", "--smoke", "--lean_smoke",
             f"--kit={smoke_kit}", f"--work={tmp_path / 'work'}", timeout=600)
  assert done.returncode == 0, done.stdout + done.stderr
  files = sorted(os.listdir(out))
  assert len(files) <= record.MAX_FILES
  assert all(re.fullmatch(r"[A-Za-z0-9._-]+", n) for n in files)
  rec = json.loads((out / record.RECORD).read_text())
  assert {p: r["status"] for p, r in rec["parts"].items()} == {p: "ok" for p in sizing.PARTS}
  assert rec["skipped"] == {} and rec["exit"] == 0
  assert "mopo" in rec["rates"]["epoch_s"]
  speed = (out / "c_speed.md").read_text()
  assert "| MOPO | 2 |" in speed and "Gradient steps: not timed (--no_steps)" in speed, speed
  assert re.search(r"\d+ passed", (out / "b_gpu_tests.txt").read_text())
  learning = (out / "d_learning.md").read_text()
  assert re.search(r"^\| MOPO \| 2 \(2 evaluations\) \|.*\| 31\.7 \+- 0\.1 \| 28\.6 \+- 1\.4 \|$",
                   learning, re.M), learning          # ours beside the paper's Table 1
  assert (out / "d_curves.png").stat().st_size > 0
  assert "Accuracy" in (out / "e_uncertainty.md").read_text()
  print(f"smoke record: {rec['wall_s']} s")


def test_a_budget_too_small_for_the_later_parts_skips_and_names_them(smoke_kit, tmp_path):
  out = tmp_path / "out"
  done = _py("benchmarks.device.record", f"--out={out}", "--smoke", "--budget_s=20",
             f"--kit={smoke_kit}", f"--work={tmp_path / 'work'}", timeout=300)
  assert done.returncode == 0, done.stdout + done.stderr
  rec = json.loads((out / record.RECORD).read_text())
  assert list(rec["parts"]) == ["a"] and rec["parts"]["a"]["status"] == "ok"
  assert sorted(rec["skipped"]) == ["b", "c", "d", "e"]
  for part in "bcde":
    assert f"part {part}: SKIPPED: " in done.stdout
  assert (out / "a_facts.txt").exists() and not (out / "c_speed.md").exists()
