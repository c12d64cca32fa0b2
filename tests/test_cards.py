"""Dataset cards: the numbers against a direct computation on a tiny dataset."""
import os
import re

import numpy as np

from mombo_jax.collection import cards, d4rl
from mombo_jax.data import minari_io, scores
from mombo_jax.data.minari_io import read_episodes
from tests.conftest import HANG_S
from tests.test_import_d4rl import _arrays, _write


def test_card_numbers_match_a_direct_computation(minari_root, tmp_path):
  dataset_id = "test-cards/hopper/medium-replay-v2"
  d4rl.import_file(_write(tmp_path / "f.hdf5", _arrays()), "hopper-medium-replay",
                          dataset_id, log_fn=lambda *_: None)
  card_dir = os.path.join(minari_io.datasets_root(), dataset_id)
  # Written by the importer already, beside the data.
  assert os.path.isfile(os.path.join(card_dir, "dataset_card.md"))
  assert os.path.getsize(os.path.join(card_dir, "returns_hist.png")) > 0
  episodes = read_episodes(dataset_id)
  returns = np.array([float(np.sum(e["rewards"], dtype=np.float64)) for e in episodes])
  stats = cards.episode_stats(dataset_id)
  np.testing.assert_allclose(stats["returns"], returns, rtol=1e-6)
  np.testing.assert_array_equal(stats["lengths"], [len(e["rewards"]) for e in episodes])
  text = cards.card_text(dataset_id, stats)
  assert f"- transitions: {sum(len(e['rewards']) for e in episodes)}" in text
  assert f"- episodes: {len(episodes)}" in text
  row = re.search(r"\| return \| (.*) \|", text).group(1).split(" | ")
  q = np.percentile(returns, [0, 25, 50, 75, 100])
  want = [returns.mean(), returns.std(), q[0], q[1], q[2], q[3], q[4]]
  np.testing.assert_allclose([float(x) for x in row], want, atol=0.051)
  norm = re.search(r"\| normalised return \| (.*) \|", text).group(1).split(" | ")
  np.testing.assert_allclose(float(norm[0]), scores.normalized_score(dataset_id, returns).mean(),
                             atol=0.051)
  # Compared with D4RL's published hopper-medium-replay-v2.
  assert "| D4RL v2 | 402000 | 467.3 | 511.0 |" in text
  assert "recipe: d4rl-import" in text
  out = cards.write_card(dataset_id, str(tmp_path / "card"))
  assert open(out).read() == text


def test_provenance_lines_saved_actors_and_medium_point():
  prov = {"actors": {"medium": {"path": "benchmarks/datasets/hopper/medium.msgpack",
                                "sha256": "ab" * 32, "sac_step": 190000}},
          "medium_point": {"medium_step": 190000, "medium_consecutive": 2, "eval_episodes": 10,
                           "medium_return": 1078.1, "qualifying_evals": [[180000, 1101.25],
                                                                         [190000, 1234.0]]}}
  lines = cards._provenance_lines(prov)
  assert lines == [
      f"- recorded from the medium actor `benchmarks/datasets/hopper/medium.msgpack` (sha256 "
      f"`{'ab' * 32}`, SAC step 190000)",
      "- SAC medium point: step 190000, after 2 evaluation(s) in a row of 10 episodes >= 1078.1 "
      "(1101.2 at step 180000, 1234.0 at step 190000)"]
  assert cards._provenance_lines({"recipe": "random"}) == []   # older datasets: nothing more


def test_describe_writes_the_card_into_a_folder(minari_root, tmp_path):
  """`experiments.describe --env=<name> --out=<folder>` (--env: another name for --dataset)
  writes the same card as cards.card_text, and the histogram, into the folder."""
  import subprocess
  import sys
  dataset_id = "test-cards/hopper/medium-v2"
  d4rl.import_file(_write(tmp_path / "f.hdf5", _arrays()), "hopper-medium", dataset_id,
                          log_fn=lambda *_: None)
  out = tmp_path / "card"
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  run = subprocess.run([sys.executable, "-m", "experiments.describe", f"--env={dataset_id}",
                        f"--out={out}"], cwd=repo, capture_output=True, text=True, timeout=HANG_S,
                       env=dict(os.environ, MINARI_DATASETS_PATH=str(minari_root)))
  assert run.returncode == 0, run.stderr
  assert (out / "dataset_card.md").read_text() == cards.card_text(dataset_id)
  assert (out / "returns_hist.png").stat().st_size > 0
  assert "Generated from the data by `python -m experiments.describe" in run.stdout
