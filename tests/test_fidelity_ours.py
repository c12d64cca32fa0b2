"""The fidelity harness's own side (benchmarks/fidelity/ours.py, no torch): our update driven by the
draws `ours.draws` says our key makes equals the product's `sac.update` with that key, for every
algorithm the harness compares, so the harness cannot drift from the product silently. And the
harness refuses a reference checkout at another commit, or a wrong folder, in one line."""
import os
import subprocess

import jax
import numpy as np
import pytest

from benchmarks.fidelity import ours, reference, rows
from mombo_jax.core import sac, targets

# Tiny networks; 40 rows so that the batch has 2 real rows (real_ratio 0.05).
TINY = dict(actor_hidden=(8,), critic_hidden=(8,), dyn_hidden=(8,), dyn_weight_decay=(0.0, 0.0),
            batch_size=40,
            mobile_num_samples=3)


def _close(a, b):
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["mombo", "mombo-lcb", "mobile", "mopo"])
def test_our_step_with_our_draws_is_the_products_update(kind):
  setup, agent = ours.init(kind, **TINY)
  batch = ours.step_batch(ours.batches(setup, 1), 0)
  key = jax.random.PRNGKey(3)
  target_fn = targets.bind(setup.config, setup.dyn, setup.term_fn)
  want, metrics = jax.jit(lambda a, b, k: sac.update(a, b, k, target_fn, setup.config))(
      agent, batch, key)
  got, out = ours.step(setup, agent, batch, ours.draws(setup, key))
  jax.tree.map(_close, got.actor.params, want.actor.params)
  jax.tree.map(_close, got.critic.params, want.critic.params)
  jax.tree.map(_close, got.target_critic_params, want.target_critic_params)
  jax.tree.map(_close, got.log_alpha.params, want.log_alpha.params)
  for name in ("critic_loss", "actor_loss", "alpha_loss", "alpha"):
    _close(out[name], metrics[name])
  _close(out["y"].mean(), metrics["target_mean"])
  # The parameters moved, so the comparison above could fail.
  assert not np.allclose(want.critic.params["params"]["members"]["MMDense_0"]["kernel"],
                         agent.critic.params["params"]["members"]["MMDense_0"]["kernel"])
  if kind != "mopo":   # the product's own penalty function with the target's key
    k_target = jax.random.split(key)[0]
    penalty_fn = targets.get_penalty(setup.config)
    penalty = jax.jit(lambda a, b, k: penalty_fn(a, b, k, dyn=setup.dyn, config=setup.config,
                                                 term_fn=setup.term_fn))(agent, batch, k_target)
    _close(out["penalty"], penalty)


def test_other_draws_change_the_step():
  """The draws are used: other noise gives another update (so the equality above is no accident
  of unused draws)."""
  setup, agent = ours.init("mobile", **TINY)
  batch = ours.step_batch(ours.batches(setup, 1), 0)
  noise = ours.draws(setup, jax.random.PRNGKey(3))
  other = dict(noise, samples=noise["samples"] * 2.0)
  _, a = ours.step(setup, agent, batch, noise)
  _, b = ours.step(setup, agent, batch, other)
  assert not np.allclose(a["penalty"], b["penalty"])


def _git(folder, *args):
  subprocess.run(["git", "-C", folder, *args], check=True, capture_output=True,
                 env=dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t",
                          GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t"))


def test_a_reference_at_another_commit_is_refused_in_one_line(tmp_path):
  folder = str(tmp_path / "OfflineRL-Kit")
  os.makedirs(os.path.join(folder, "offlinerlkit", "policy", "model_based"))
  with open(os.path.join(folder, "offlinerlkit", "policy", "model_based", "mobile.py"), "w") as f:
    f.write("# not theirs\n")
  _git(folder, "init", "-q")
  _git(folder, "add", ".")
  _git(folder, "commit", "-q", "-m", "x")
  with pytest.raises(SystemExit) as e:
    reference.check("mobile", folder)
  message = str(e.value)
  assert "\n" not in message and "43ec147" in message and "checkout" in message


def test_a_wrong_folder_is_refused_in_one_line(tmp_path):
  with pytest.raises(SystemExit) as e:
    reference.check("mombo", str(tmp_path))
  message = str(e.value)
  assert "\n" not in message and "079def7" in message and "git clone" in message


def test_rows_verdicts_and_float64_settling_float32():
  """A float64 difference of definition FAILs unless named; a float32 row above float32's rounding
  takes its float64 twin's verdict (float64 decides what is a definition)."""
  f64 = rows.row("agent x float64", "q", 100, [1.0, 2.0], [1.0, 2.0 + 1e-6], "float64")
  assert f64["verdict"] == "FAIL" and f64["max_rel"] == pytest.approx(5e-7, rel=1e-3)
  assert rows.row("agent x float64", "q", 100, [1.0], [1.0 + 1e-6], "float64",
                  "theirs.py:1 differs")["verdict"] == "named"
  twin = rows.row("agent x float64", "p", 100, [1.0], [1.0 + 1e-15], "float64")
  f32 = rows.row("agent x float32", "p", 100, [1.0], [1.01], "float32")
  alone = rows.row("agent y float32", "p", 100, [1.0], [1.01], "float32")
  settled = rows.settle_float32([twin, f32, alone])
  assert [r["verdict"] for r in settled] == ["rounding", "rounding", "FAIL"]
  assert "float32 rounding" in settled[1]["note"]
