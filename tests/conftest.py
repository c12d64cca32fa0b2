"""Shared fixtures. Tests never touch the network: Minari is pointed at a temporary folder."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def minari_root(tmp_path_factory):
  """A session-wide MINARI_DATASETS_PATH so tests build their tiny datasets once."""
  root = tmp_path_factory.mktemp("minari")
  old = os.environ.get("MINARI_DATASETS_PATH")
  os.environ["MINARI_DATASETS_PATH"] = str(root)
  yield root
  if old is None:
    os.environ.pop("MINARI_DATASETS_PATH", None)
  else:
    os.environ["MINARI_DATASETS_PATH"] = old
