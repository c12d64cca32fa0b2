"""Part b of the device record: correctness on the GPU. The tests that cover the vmapped cells
(core/cell_layout.py; an end-to-end vmapped run with a grid, a stop and a resume), sharding over
devices and the moment-matching primitives, run there by pytest, its summary line last.

On the GPU the cells are vmapped by default (the layout every GPU user runs); on the CPU the same
tests run in CI looped, and tests/test_vmap_run.py runs the vmapped layout end to end there too.
Several pytest workers share the one GPU (XLA_PYTHON_CLIENT_PREALLOCATE=false: none takes most of
its memory up front); the tests are compile-bound, and the device's host has 16 cores.
"""
import os
import signal
import subprocess
import sys

from benchmarks.device import kit as kit_lib

SELECTION = ("tests/test_cell_layout.py", "tests/test_vmap_run.py", "tests/test_sharding.py",
             "tests/test_moments.py", "tests/test_critics_mm.py")
# The smoke's: the layout tests alone (seconds on the CPU); the lean smoke's (the test suite's,
# which runs that file itself): one of them, the part's machinery only.
SMOKE_SELECTION = ("tests/test_cell_layout.py",)
LEAN_SELECTION = ("tests/test_cell_layout.py::"
                  "test_the_layout_is_loop_on_cpu_unless_the_environment_says",)


def main():
  args = kit_lib.part_args(__doc__, {"--lean": dict(action="store_true",
                                                    help="The test suite's smoke: one test.")})
  selection = (LEAN_SELECTION if args.lean else SMOKE_SELECTION) if args.smoke else SELECTION
  workers = 0 if args.smoke else max(1, min(4, (os.cpu_count() or 1) // 4))
  cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
         "-n", str(workers), "-rfE", "--durations=5", *selection]
  env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
  print(f"# Device record, part b: the GPU tests\n$ {' '.join(cmd[2:])}", flush=True)
  # pytest's own output streams into this part's file (record.run_part); the summary line is last.
  proc = subprocess.Popen(cmd, env=env, cwd=kit_lib.ROOT)
  try:
    rc = proc.wait(timeout=max(args.soft_s, 1.0))
  except subprocess.TimeoutExpired:   # Ctrl-C's way: pytest still prints what ran and failed
    print(f"\n[part b] {args.soft_s:.0f} s reached: interrupting pytest", flush=True)
    proc.send_signal(signal.SIGINT)
    rc = proc.wait()
  print(f"\npytest exit status {rc}", flush=True)
  kit_lib.write_rates(args.work, "b", {"tests_exit": rc})
  sys.exit(0 if rc == 0 else 1)


if __name__ == "__main__":
  main()
