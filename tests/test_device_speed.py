"""The device record's speed plan cannot rot: `record --smoke --lean_smoke --plan=speed` runs parts
a, b, c (its epoch, traced and summarised per phase, the goals) and v (a variant in a process of
its own) at tiny sizes on the CPU. It needs no kit (the speed plan reads random data); a file of
its own so that the suite's workers run it beside tests/test_device_record.py's learning smoke."""
import re

import pytest

from benchmarks.device import kit as kit_lib, sizing
from tests.conftest import HANG_S
from tests.device_record_helpers import files_ok, run_module

ROOT = kit_lib.ROOT






@pytest.mark.slow
def test_the_speed_plan_s_smoke_runs_its_parts_on_the_cpu(tmp_path):
  out = tmp_path / "out"
  # --lean_smoke: part b runs one test, part c compiles its epoch program only (no chunk lengths,
  # evaluation share or gradient-step table), part v its baseline, which the compilation cache
  # shares with part c's program; `record --smoke` alone runs them all.
  done = run_module("benchmarks.device.record", f"--out={out}", "--smoke", "--lean_smoke",
                    "--plan=speed", f"--kit={tmp_path / 'no_kit'}", f"--work={tmp_path / 'work'}",
                    timeout=HANG_S)
  assert done.returncode == 0, done.stdout + done.stderr
  rec = files_ok(out)
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


