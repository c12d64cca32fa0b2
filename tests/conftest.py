"""Shared fixtures. Tests never touch the network: Minari is pointed at a temporary folder."""
import contextlib
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _session_compilation_cache():
  """One JAX persistent compilation cache per test session, shared by the xdist workers and the
  entry points the tests launch (compilation_cache.DEFAULT_COMPILATION_CACHE reads the same
  variable): many
  tests compile the same tiny programs, and a cache hit skips XLA (the suite's largest cost).
  Set before jax is imported; removed when the session ends (pytest_unconfigure)."""
  path = os.environ.get("MOMBO_JAX_TEST_CACHE")          # the controller's, inherited by workers
  if path is None:
    if "JAX_COMPILATION_CACHE_DIR" in os.environ:
      return                                # the caller's own cache: left as it is
    import tempfile
    uid = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid{os.getpid()}"
    path = os.path.join(tempfile.gettempdir(), f"mombo_jax_test_jit_{uid}")
  os.makedirs(path, exist_ok=True)
  os.environ["JAX_COMPILATION_CACHE_DIR"] = path
  os.environ["MOMBO_JAX_TEST_CACHE"] = path


_session_compilation_cache()
# XLA's backend optimisations cost most of a tiny test program's compile and buy nothing at these
# sizes: off for the session and the entry points it launches (what a test compares is compiled
# under the same setting on both sides). JAX_DISABLE_MOST_OPTIMIZATIONS=0 turns them back on; the
# tests marked bit_identity run again with them on in any case (tests/test_optimised.py).
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
# Every float32 matmul the tests trace themselves at full float32 on every backend, as the
# package's programs compute by default (Config.matmul_precision, pinned where they are traced):
# JAX's default on a GPU with tensor cores is TF32, at which two paths of the same network agree
# to ~1e-3, not 1e-6 (issue #43). Agreement tests derive their tolerance from the precision in use
# (tests/matmul_precision.py), so JAX_DEFAULT_MATMUL_PRECISION=tensorfloat32 runs them at TF32.
os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "float32")

import pytest  # noqa: E402

BIT_IDENTITY = "bit_identity"
# A subprocess's timeout in a test is a guard against a hang, never a claim about speed: a child
# that is merely slow (CI under other load ran the suite 3x slower than on a quiet machine) must
# never reach it. Speed is measured in benchmarks/, not asserted in tests.
HANG_S = 1800


def pytest_configure(config):
  config.addinivalue_line(
      "markers", f"{BIT_IDENTITY}: a claim that two computations give the same numbers (sharded vs "
      "one device, per-cell vs plain program, chunk vs single epochs, resume); run once more with "
      "XLA's optimisations on by tests/test_optimised.py")


# The test files that take longest, longest first: pytest-xdist hands out whole files
# (--dist loadfile) in the collection's order (setup.cfg: --no-loadscope-reorder). Its own order,
# most tests first, put the few-test files holding the slowest tests (test_optimised 2 tests,
# test_sharding 2, test_vmap_run 1, test_stops 7, test_distributed 7) last, where each ran alone
# on one core while the other idled. Longest first, the short files fill in behind. The order
# comes from per-test times of `.ci/run` on a quiet 2-core AMD EPYC (device smoke 94 s, optimised
# child session 192 s before its split in two, docs example 76 s, test_sharding 58 s, test_grid
# 57 s a test, test_vmap_run 49 s) and per-file runs (-n 0, load ~9 on 2 cores: test_stops 145 s,
# test_distributed 124 s, test_train 86 s). A scheduling hint only: a missing file is not moved.
SLOWEST_FILES = ("test_device_record.py", "test_device_speed.py", "test_run.py", "test_grid.py",
                 "test_optimised.py", "test_optimised_sharding.py", "test_algorithms.py",
                 "test_sharding.py", "test_stops.py", "test_distributed.py", "test_vmap_run.py",
                 "test_train.py")


def pytest_collection_modifyitems(config, items):
  """Orders the test files: SLOWEST_FILES first, in their order, then the others by their number
  of tests, most first (xdist's default order); each file's tests stay together, in their order."""
  files = {}
  for item in items:
    files.setdefault(item.path.name, []).append(item)

  def rank(name):
    if name in SLOWEST_FILES:
      return (0, SLOWEST_FILES.index(name))
    return (1, -len(files[name]))
  items[:] = [item for name in sorted(files, key=rank) for item in files[name]]


def xla_optimised() -> bool:
  """Whether this process compiles with XLA's optimisations (JAX_DISABLE_MOST_OPTIMIZATIONS, read
  by jax at import)."""
  import jax
  return not jax.config.read("jax_disable_most_optimizations")


def pytest_report_header(config):
  return f"XLA optimisations: {'on' if xla_optimised() else 'off'}"


@contextlib.contextmanager
def minari_root_at(path):
  """Points MINARI_DATASETS_PATH at `path` for the duration, then restores it."""
  old = os.environ.get("MINARI_DATASETS_PATH")
  os.environ["MINARI_DATASETS_PATH"] = str(path)
  try:
    yield path
  finally:
    if old is None:
      os.environ.pop("MINARI_DATASETS_PATH", None)
    else:
      os.environ["MINARI_DATASETS_PATH"] = old


@pytest.fixture(scope="session")
def minari_root(tmp_path_factory):
  """A session-wide MINARI_DATASETS_PATH so tests build their tiny datasets once."""
  with minari_root_at(tmp_path_factory.mktemp("minari")) as root:
    yield root


@pytest.fixture(scope="session")
def hopper_random_2000(minari_root):
  """`hopper-random`, 2,000 uniform-random steps (seed 0), in the session's Minari root: built once
  and shared by every test module that trains on it."""
  from mombo_jax.collection import recipes
  recipes.build_random("hopper-random", steps=2000, seed=0, log_fn=lambda *a: None)
  return "hopper-random"


def pytest_unconfigure(config):
  """The session's compilation cache goes with the session (the controller removes it)."""
  path = os.environ.get("MOMBO_JAX_TEST_CACHE")
  if path and not hasattr(config, "workerinput"):
    import shutil
    shutil.rmtree(path, ignore_errors=True)
