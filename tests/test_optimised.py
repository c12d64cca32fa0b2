"""The bit-identity claims again, with XLA's optimisations on.

The suite compiles with XLA's backend optimisations off (conftest: JAX_DISABLE_MOST_OPTIMIZATIONS=1,
for compile time), so each claim that two computations give the same numbers compares programs
compiled unoptimised. The programs users run are optimised, and an optimising compiler fuses and
reorders each program its own way: the tests marked bit_identity (sharded vs one device, per-cell
vs plain program, chunk vs single epochs, a chunk resumed from a state) run once more here, in a
pytest subprocess with JAX_DISABLE_MOST_OPTIMIZATIONS=0 and a compilation cache of its own. Every
marked test must run there and pass.

Left to the unoptimised suite, for time (an optimised compile of a whole run costs more than
this file's budget): the claims between two runs of one compiled program on the same bits (a run
resumed from its checkpoint, test_run; stops resumed, test_stops; a diverged seed's neighbour in
one epoch, test_train), which optimisation does not make differ, and two claims between programs
of a kind the marked ones cover at less cost: a grid cell vs its single run (test_grid; per-cell
vs plain here), two processes vs one (test_distributed; 4 devices vs 1 here) and dynamics seeds
vmapped vs alone (test_dynamics). The vmapped cell layout's closeness to the one-cell program
(test_train) is a tolerance claim, not bit identity: unmarked, unoptimised only.

One child session per marked file, each in a test file of its own (this one: test_train.py's;
tests/test_optimised_sharding.py: test_sharding.py's): pytest-xdist hands out whole files
(--dist loadfile), so two files run on two workers at once where one file would bound the
suite's wall time alone. test_the_marked_tests_cover_each_kind_of_claim checks that every file
with a marked test has its runner.
"""
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ElementTree

import pytest

from tests import conftest
from tests.conftest import HANG_S

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
# The marker line, any further one-line decorators, then the test function.
_MARKED = re.compile(rf"@pytest\.mark\.{conftest.BIT_IDENTITY}\n(?:@.*\n)*def (test_\w+)")


def marked_tests() -> dict:
  """{test file name: [names of its test functions marked bit_identity]}, read from the files."""
  found = {}
  for name in sorted(os.listdir(TESTS)):
    if name.startswith("test_") and name.endswith(".py"):
      with open(os.path.join(TESTS, name)) as f:
        names = _MARKED.findall(f.read())
      if names:
        found[name] = names
  return found


def _child_env(cache: str) -> dict:
  """This environment for a pytest session of its own: optimisations on, its own compilation cache
  (conftest's session cache is this session's, removed by whichever controller made it; a name
  from PYTEST_XDIST_TESTRUNUID would be this session's too), this checkout first on the path."""
  env = {k: v for k, v in os.environ.items()
         if not k.startswith("PYTEST_") and k != "MOMBO_JAX_TEST_CACHE"}
  env.update(JAX_DISABLE_MOST_OPTIMIZATIONS="0", JAX_COMPILATION_CACHE_DIR=cache,
             PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
  return env


def outcomes(junit_xml: str) -> dict:
  """{test function name: [failure / error / skipped tags of its cases]} from pytest's JUnit XML
  (parametrised cases under their function's name)."""
  ran = {}
  for case in ElementTree.parse(junit_xml).getroot().iter("testcase"):
    bad = [c.tag for c in case if c.tag in ("failure", "error", "skipped")]
    ran.setdefault(case.get("name").split("[")[0], []).extend(bad)
  return ran


# {runner test file: the files with marked tests whose child session it runs}. A file that gains a
# marked test joins a runner's tuple, or gets a runner file of its own (a slow one: its own).
RUNNERS = {"test_optimised.py": ("test_train.py",),
           "test_optimised_sharding.py": ("test_sharding.py",)}


def test_the_marked_tests_cover_each_kind_of_claim():
  marked = marked_tests()
  assert set(marked) >= {"test_sharding.py", "test_train.py"}, marked
  # Each file with a marked test is run by exactly one runner, and each runner exists.
  assert sorted(f for files in RUNNERS.values() for f in files) == sorted(marked), marked
  assert all(os.path.exists(os.path.join(TESTS, runner)) for runner in RUNNERS), RUNNERS
  names = {n for names in marked.values() for n in names}
  assert {"test_seeds_sharded_over_4_devices_train_as_on_1",                    # sharded
          "test_cells_differing_in_their_datasets_settings_train_as_their_single_programs",
          "test_a_chunk_trains_as_one_call_per_epoch",                          # chunk
          "test_a_chunk_continued_where_another_stopped_is_one_chunk_bit_for_bit"} <= names, names


def run_optimised(runner, tmp_path):
  """Runs the marked tests of RUNNERS[runner] (file names in tests/) in a pytest child session
  with XLA's optimisations on; asserts that each of them ran there and passed."""
  if conftest.xla_optimised():
    pytest.skip("this session compiles with XLA's optimisations on: the marked tests ran so")
  files = RUNNERS[runner]
  marked = {f: names for f, names in marked_tests().items() if f in files}
  assert sorted(marked) == sorted(files), (files, marked)     # each file has a marked test
  junit = str(tmp_path / "junit.xml")
  proc = subprocess.run(
      [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-o",
       "addopts=", "--strict-markers", "-rfEs", "--durations=5", "-m", conftest.BIT_IDENTITY,
       f"--junitxml={junit}", *[os.path.join("tests", f) for f in marked]],
      cwd=ROOT, env=_child_env(str(tmp_path / "jit")), capture_output=True, text=True,
      timeout=HANG_S)
  out = proc.stdout + proc.stderr
  assert "XLA optimisations: on" in out, out[-3000:]           # conftest's report header
  assert proc.returncode == 0, out[-8000:]
  ran = outcomes(junit)
  assert set(ran) == {n for names in marked.values() for n in names}, (sorted(ran), marked)
  assert not any(ran.values()), ran                           # none failed, none skipped


@pytest.mark.slow
def test_bit_identity_claims_hold_with_xla_optimisations_on(tmp_path):
  run_optimised(os.path.basename(__file__), tmp_path)
