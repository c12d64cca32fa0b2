"""One copy of "actor variables -> policy" (actor_policy): the actor's layers looked up by their
names, one cache of jitted functions shared by evaluation, exported policies and recordings, the
numpy actor of the online loop agreeing with them; saved actors written through atomic.py."""
import errno
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mombo_jax.collection import recording, saved_actors
from mombo_jax.collection.online_sac import online_config
from mombo_jax.core import actor_policy, critics, sac
from mombo_jax.storage import atomic

HIDDEN, OBS, ACT = (8, 8), 5, 3


@pytest.fixture(scope="module")
def params():
  actor = critics.TanhGaussianActor(HIDDEN, ACT)
  return actor.init(jax.random.PRNGKey(0), jnp.zeros((1, OBS), jnp.float32))


def test_the_actor_layers_are_named_in_one_place(params):
  hidden, mean, log_std = critics.actor_layer_names(len(HIDDEN))
  # The names checkpoints and saved actors hold (Flax's former automatic names): unchanged.
  assert set(params["params"]) == set(hidden + [mean, log_std])
  assert hidden == ["Dense_0", "Dense_1"] and (mean, log_std) == ("Dense_2", "Dense_3")
  layers, (w_mean, _), (w_std, _) = sac.actor_layers(params)
  assert [w.shape for w, _ in layers] == [(OBS, 8), (8, 8)]
  assert w_mean.shape == w_std.shape == (HIDDEN[-1], ACT)


def test_one_cache_of_jitted_functions_per_actor_shape(params):
  a = actor_policy.ActorShape.of([8, 8], 3, -5, 2)
  b = actor_policy.ActorShape.of((8, 8), 3.0, -5.0, 2.0)
  assert a == b and actor_policy.actor_functions(a) is actor_policy.actor_functions(b)
  config = online_config("hopper", HIDDEN, 4)
  shape = actor_policy.ActorShape.from_config(config, params)
  assert shape == actor_policy.ActorShape.of(HIDDEN, ACT, config.agent.log_std_min,
                                             config.agent.log_std_max)
  fns = actor_policy.actor_functions(shape)
  obs = np.random.default_rng(0).standard_normal((4, OBS)).astype(np.float32)
  mode = np.asarray(fns.mode(params, obs))
  # Two seeds stacked: the evaluation's vmapped call gives each seed's own actions.
  stacked = jax.tree.map(lambda x: jnp.stack([x, x]), params)
  per_seed = np.asarray(fns.mode_per_seed(stacked, jnp.stack([obs, obs])))
  np.testing.assert_allclose(per_seed, np.stack([mode, mode]), atol=1e-6)
  # The recordings' policy runs the same cached functions.
  np.testing.assert_allclose(recording.sac_policy(params, config, 0, True)(obs), mode, atol=1e-6)
  sampled = recording.sac_policy(params, config, 0, False)(obs)
  assert sampled.shape == (4, ACT) and np.all(np.abs(sampled) <= 1)
  assert jax.tree.structure(fns.init_shapes(OBS)) == jax.tree.structure(params)


def test_the_numpy_actor_agrees_with_the_jitted_one(params):
  obs = np.random.default_rng(1).standard_normal(OBS).astype(np.float32)
  fns = actor_policy.actor_functions(actor_policy.ActorShape.of(HIDDEN, ACT, -5.0, 2.0))
  want = np.asarray(fns.mode(params, obs[None]))[0]
  got = actor_policy.numpy_actor(params, -5.0, 2.0)(obs)
  np.testing.assert_allclose(got, want, atol=1e-5)
  draw = actor_policy.numpy_actor(params, -5.0, 2.0)(obs, np.random.default_rng(0))
  assert draw.shape == (ACT,) and np.all(np.abs(draw) <= 1)


def test_a_saved_actor_is_written_atomically(params, tmp_path, monkeypatch):
  """saved_actors writes through atomic.py: a refused rename is one WriteError and leaves no
  temporary file (it once had its own copy of the atomic write, which let the OSError out)."""
  info = saved_actors.network_info("hopper", online_config("hopper", HIDDEN, 4), params)
  assert info["obs_dim"] == OBS and info["action_dim"] == ACT
  sidecar = saved_actors.save_actor(str(tmp_path), "medium", params, info)
  assert sidecar["bytes"] == os.path.getsize(tmp_path / sidecar["weights"])

  def full(src, dst):
    raise OSError(errno.ENOSPC, "No space left on device")
  monkeypatch.setattr(os, "replace", full)
  with pytest.raises(atomic.WriteError, match="No space left on device; free some space"):
    saved_actors.save_actor(str(tmp_path / "other"), "medium", params, info)
  assert not [f for f in os.listdir(tmp_path / "other") if ".tmp" in f]
