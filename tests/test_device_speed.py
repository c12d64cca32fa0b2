"""The device record's speed plan cannot rot: `record --smoke --lean_smoke --plan=speed` runs parts
a, b, c (its epoch, traced and summarised per phase, the goals) and v (a variant in a process of
its own) at tiny sizes on the CPU. It needs no kit (the speed plan reads random data); a file of
its own so that the suite's workers run it beside tests/test_device_record.py's learning smoke."""
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


def _files_ok(out):
  files = sorted(os.listdir(out))
  assert len(files) <= record.MAX_FILES - 1
  assert all(re.fullmatch(r"[A-Za-z0-9._-]+", n) for n in files)
  return json.loads((out / record.RECORD).read_text())


@pytest.mark.slow
def test_the_speed_plan_s_smoke_runs_its_parts_on_the_cpu(tmp_path):
  out = tmp_path / "out"
  # --lean_smoke: part b runs one test, part c compiles its epoch program only (no chunk lengths,
  # evaluation share or gradient-step table), part v its baseline, which the compilation cache
  # shares with part c's program; `record --smoke` alone runs them all.
  done = _py("benchmarks.device.record", f"--out={out}", "--smoke", "--lean_smoke", "--plan=speed",
             f"--kit={tmp_path / 'no_kit'}", f"--work={tmp_path / 'work'}", timeout=600)
  assert done.returncode == 0, done.stdout + done.stderr
  rec = _files_ok(out)
  assert rec["plan"] == "speed" and set(rec["planned"]) == set(sizing.PLANS["speed"])
  assert {p: r["status"] for p, r in rec["parts"].items()} == {p: "ok" for p in "abcv"}
  assert rec["skipped"] == {} and rec["exit"] == 0
  assert "mopo" in rec["rates"]["epoch_s"]
  speed = (out / "c_speed.md").read_text()
  assert "| MOPO | 2 |" in speed and "Gradient steps: not timed (--lean)" in speed, speed
  assert "## The goals" in speed
  profile = (out / "c_profile.md").read_text()
  assert re.search(r"^\| rollout \| [\d.]+ \| [\d.]+ \| [1-9]\d* \|$", profile, re.M), profile
  assert re.search(r"^\| critic_update \| [\d.]+ \| [\d.]+ \| [1-9]\d* \|$", profile, re.M)
  assert rec["rates"]["profile"]["2"]["kernels_per_step"] > 0
  assert re.search(r"1 passed", (out / "b_gpu_tests.txt").read_text())
  variants = (out / "v_variants.md").read_text()
  assert re.search(r"^\| baseline \| mopo \| 2 \| defaults \| [\d.]+ \| [\d.]+ \| 1\.000 \|",
                   variants, re.M), variants
  print(f"speed smoke: {rec['wall_s']} s")


