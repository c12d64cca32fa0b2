"""Shared fixtures. Tests never touch the network: Minari is pointed at a temporary folder."""
import contextlib
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402


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
  from mombo_jax import recipes
  recipes.build_random("hopper-random", steps=2000, seed=0, log_fn=lambda *a: None)
  return "hopper-random"
