"""checkpoint.py: bit-exact round trips, atomic writes, pruning, corruption and template errors."""
import json
import os
import zlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.training import train_state

from mombo_jax import checkpoint as ckpt

NUM_SEEDS = 3


def _init(key):
  """One seed's state: a TrainState (adam) after one update, so the optimiser moments are set."""
  model = nn.Dense(4)
  params = model.init(key, jnp.zeros((1, 3)))
  state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(1e-2))
  grads = jax.tree.map(lambda p: jnp.sin(p * 7.0 + 1.0), params)
  return state.apply_gradients(grads=grads)


@pytest.fixture(scope="module")
def tree():
  keys = jax.random.split(jax.random.PRNGKey(42), NUM_SEEDS)     # raw uint32 keys [S, 2]
  return {
      "agent": jax.vmap(_init)(keys),
      "key": keys,
      "typed_key": jax.random.split(jax.random.key(7), NUM_SEEDS),
      "host": np.arange(6, dtype=np.float32).reshape(2, 3) / 7.0,
      "epoch": 5,
      "misc": [1.5, (None, jnp.int32(3))],
      "empty": {},
  }


def _leaves(t):
  """Flat list of (type, numpy view) with typed keys turned into their key data."""
  out = []
  for leaf in jax.tree.leaves(t):
    if hasattr(leaf, "dtype") and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
      out.append(("key", str(jax.random.key_impl(leaf)), np.asarray(jax.random.key_data(leaf))))
    else:
      out.append((type(leaf), None, np.asarray(leaf)))
  return out


def _assert_bit_exact(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for (ta, ia, xa), (tb, ib, xb) in zip(_leaves(a), _leaves(b)):
    assert ta == tb and ia == ib
    assert xa.dtype == xb.dtype and xa.shape == xb.shape
    assert xa.tobytes() == xb.tobytes()


def _biggest_state_file(path):
  files = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(path, "state")) for f in fs]
  return max(files, key=os.path.getsize)


def test_round_trip_bit_exact(tree, tmp_path):
  path = tmp_path / "ck"
  ckpt.save_pytree(path, tree, {"config": {"env": "hopper-random"}, "epoch": np.int64(5)})
  restored, meta = ckpt.load_pytree(path, template=tree)
  _assert_bit_exact(tree, restored)
  assert meta == {"config": {"env": "hopper-random"}, "epoch": 5}
  assert isinstance(restored["agent"], train_state.TrainState)
  assert restored["agent"].apply_fn is tree["agent"].apply_fn       # static fields: from template
  assert restored["agent"].params["params"]["kernel"].shape[0] == NUM_SEEDS
  # Raw uint32 PRNG keys produce the same random numbers after the round trip.
  np.testing.assert_array_equal(jax.random.normal(restored["key"][1], (3,)),
                                jax.random.normal(tree["key"][1], (3,)))


def test_eval_shape_template(tree, tmp_path):
  """A template from jax.eval_shape (no real arrays), as a resuming run would build it."""
  path = tmp_path / "ck"
  ckpt.save_pytree(path, tree)
  restored, _ = ckpt.load_pytree(path, template=jax.eval_shape(lambda: tree))
  np.testing.assert_array_equal(np.asarray(restored["key"]), np.asarray(tree["key"]))
  assert restored["agent"].opt_state[0].mu["params"]["bias"].dtype == jnp.float32
  np.testing.assert_array_equal(restored["agent"].opt_state[0].nu["params"]["bias"],
                                tree["agent"].opt_state[0].nu["params"]["bias"])


def test_load_without_template_gives_numpy_dicts(tree, tmp_path):
  path = tmp_path / "ck"
  ckpt.save_pytree(path, tree)
  raw, _ = ckpt.load_pytree(path)
  kernel = raw["agent"]["params"]["params"]["kernel"]
  assert isinstance(kernel, np.ndarray)
  np.testing.assert_array_equal(kernel, tree["agent"].params["params"]["kernel"])
  assert raw["agent"]["opt_state"]["0"]["count"].dtype == np.int32
  assert raw["misc"]["1"]["0"] is None and raw["empty"] == {}
  assert raw["key"].dtype == np.uint32
  np.testing.assert_array_equal(jax.random.key_data(raw["typed_key"]),
                                jax.random.key_data(tree["typed_key"]))


def test_refuses_overwrite(tmp_path):
  path = tmp_path / "ck"
  ckpt.save_pytree(path, {"x": np.zeros(2, np.float32)}, {"v": 1})
  with pytest.raises(ckpt.CheckpointError, match="already exists"):
    ckpt.save_pytree(path, {"x": np.ones(2, np.float32)}, {"v": 2})
  assert ckpt.load_pytree(path)[1] == {"v": 1}
  ckpt.save_pytree(path, {"x": np.ones(2, np.float32)}, {"v": 2}, overwrite=True)
  tree, meta = ckpt.load_pytree(path)
  assert meta == {"v": 2} and tree["x"].tolist() == [1.0, 1.0]
  assert sorted(os.listdir(tmp_path)) == ["ck"]                      # no temp dirs left behind


def test_bad_metadata_writes_nothing(tmp_path):
  with pytest.raises(ckpt.CheckpointError, match="JSON"):
    ckpt.save_pytree(tmp_path / "ck", {"x": np.zeros(1)}, {"f": object()})
  assert os.listdir(tmp_path) == []


def test_crash_mid_write_leaves_no_valid_looking_checkpoint(tmp_path, monkeypatch):
  runs = ckpt.RunCheckpointer(tmp_path, keep=3)
  runs.save(1, {"x": np.zeros(2, np.float32)})

  def boom(_):
    raise OSError("disk full")
  monkeypatch.setattr(ckpt, "_manifest", boom)       # dies after Orbax wrote, before the commit
  with pytest.raises(ckpt.CheckpointError, match="disk full"):
    runs.save(2, {"x": np.ones(2, np.float32)})
  with pytest.raises(ckpt.CheckpointError, match="disk full"):
    runs.save(1, {"x": np.ones(2, np.float32)})      # overwriting keeps the old one intact
  monkeypatch.undo()
  assert runs.latest_step() == 1
  assert sorted(os.listdir(runs.directory)) == ["step_000000001"]
  state, meta = runs.restore()
  assert state["x"].tolist() == [0.0, 0.0] and meta["step"] == 1


def test_leftover_temp_dir_is_ignored_and_cleaned(tmp_path):
  runs = ckpt.RunCheckpointer(tmp_path)
  runs.save(3, {"x": np.zeros(1, np.float32)})
  stale = os.path.join(runs.directory, ".step_000000004.tmp-deadbeef")
  os.makedirs(os.path.join(stale, "state"))
  assert runs.latest_step() == 3
  ckpt.RunCheckpointer(tmp_path)
  assert not os.path.exists(stale)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "delete", "header"])
def test_corrupt_checkpoint_clear_error(tmp_path, damage):
  path = str(tmp_path / "ck")
  ckpt.save_pytree(path, {"w": np.linspace(0, 1, 4096, dtype=np.float32)})
  victim = _biggest_state_file(path)
  if damage == "truncate":
    with open(victim, "r+b") as f:
      f.truncate(os.path.getsize(victim) // 2)
  elif damage == "garbage":
    size = os.path.getsize(victim)
    with open(victim, "r+b") as f:
      f.seek(size // 2)
      f.write(b"\x13\x37" * 8)
  elif damage == "delete":
    os.remove(victim)
  else:
    header = os.path.join(path, "checkpoint.json")
    with open(header, "r+b") as f:
      f.truncate(os.path.getsize(header) - 20)
  with pytest.raises(ckpt.CorruptCheckpointError) as info:
    ckpt.load_pytree(path)
  message = str(info.value)
  assert path in message and "Delete" in message
  if damage != "header":
    assert os.path.relpath(victim, path) in message


def test_orbax_failure_is_wrapped(tmp_path):
  """Even when the manifest matches (say, files from another Orbax version), an Orbax error comes
  back as a CorruptCheckpointError naming the path, not as a bare tensorstore traceback."""
  path = str(tmp_path / "ck")
  ckpt.save_pytree(path, {"w": np.ones(8, np.float32)})
  header_file = os.path.join(path, "checkpoint.json")
  with open(header_file) as f:
    header = json.load(f)
  for rel in list(header["body"]["files"]):
    if os.path.basename(rel).endswith("METADATA") or "manifest" in rel:
      os.remove(os.path.join(path, rel))
      del header["body"]["files"][rel]
  header["crc32"] = zlib.crc32(json.dumps(header["body"], sort_keys=True).encode())
  with open(header_file, "w") as f:
    json.dump(header, f)
  with pytest.raises(ckpt.CorruptCheckpointError, match="could not be read by Orbax") as info:
    ckpt.load_pytree(path)
  assert path in str(info.value)


def test_template_mismatch(tree, tmp_path):
  path = str(tmp_path / "ck")
  ckpt.save_pytree(path, tree)
  fewer_seeds = jax.tree.map(lambda x: x, tree)
  fewer_seeds["agent"] = jax.vmap(_init)(jax.random.split(jax.random.PRNGKey(0), NUM_SEEDS - 1))
  with pytest.raises(ckpt.TemplateMismatchError) as info:
    ckpt.load_pytree(path, template=fewer_seeds)
  message = str(info.value)
  assert path in message and "workdir" in message
  assert ("agent/params/params/kernel: shape (3, 3, 4) in checkpoint, (2, 3, 4) in template"
          in message)
  other = dict(tree, extra=np.zeros(2, np.float32))
  del other["host"]
  with pytest.raises(ckpt.TemplateMismatchError) as info:
    ckpt.load_pytree(path, template=other)
  assert "extra is not in the checkpoint" in str(info.value)
  assert "host is not in the template" in str(info.value)
  with pytest.raises(ckpt.TemplateMismatchError, match="dtype float32 in checkpoint, float16"):
    ckpt.load_pytree(path, template=dict(tree, host=tree["host"].astype(np.float16)))


def test_run_checkpointer_keeps_last_and_falls_back(tmp_path):
  runs = ckpt.RunCheckpointer(tmp_path / "run", keep=3)
  assert runs.latest_step() is None
  with pytest.raises(ckpt.CheckpointError, match="No checkpoint"):
    runs.restore()
  template = {"w": np.zeros(3, np.float32), "key": jax.random.PRNGKey(0)}
  for step in (10, 20, 30, 40, 50):
    runs.save(step, {"w": np.full(3, step, np.float32), "key": jax.random.PRNGKey(step)},
              {"epoch": step})
  assert runs.steps() == [30, 40, 50] and runs.latest_step() == 50
  state, meta = runs.restore(template)
  assert meta == {"epoch": 50, "step": 50} and state["w"].tolist() == [50.0] * 3
  np.testing.assert_array_equal(state["key"], jax.random.PRNGKey(50))
  assert runs.restore(template, step=30)[1]["step"] == 30

  with open(_biggest_state_file(runs.path(50)), "r+b") as f:
    f.truncate(1)
  with pytest.warns(ckpt.CheckpointWarning) as record:
    state, meta = runs.restore(template)
  messages = [str(w.message) for w in record]
  assert any("corrupt checkpoint at step 50" in m and "truncated" in m for m in messages)
  assert any("Fell back to checkpoint step 40" in m for m in messages)
  assert meta["step"] == 40 and state["w"].tolist() == [40.0] * 3
  with pytest.raises(ckpt.CorruptCheckpointError):
    runs.restore(template, step=50)                  # an explicit step never falls back

  # The next save keeps the one just written plus the newest others.
  runs.save(45, {"w": np.zeros(3, np.float32), "key": jax.random.PRNGKey(45)})
  assert runs.steps() == [40, 45, 50]

  for step in runs.steps():
    os.remove(_biggest_state_file(runs.path(step)))
  with pytest.warns(ckpt.CheckpointWarning):
    with pytest.raises(ckpt.CheckpointError, match="Every checkpoint .* is corrupt"):
      runs.restore(template)
