"""checkpoint.py: bit-exact round trips, atomic writes, pruning, corruption and template errors,
partial restores."""
import asyncio
import json
import os
import sys
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.training import train_state

from mombo_jax.storage import checkpoint as ckpt, checkpoint_files

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
      "misc": [0.1, (None, jnp.int32(3))],     # 0.1: a float64 that float32 cannot hold
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
  """The biggest OCDBT data file (in a folder named d) of step `path`: the chunks of a leaf of a
  few KiB of incompressible numbers (smaller leaves are inlined in the b-tree nodes)."""
  files = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(path, "state")) for f in fs
           if os.path.basename(d) == "d"]
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
  """A template from jax.eval_shape (no real arrays), as a resuming run would build it: Python
  scalars become weakly typed 32-bit ShapeDtypeStructs, which take the saved 64-bit values."""
  path = tmp_path / "ck"
  ckpt.save_pytree(path, tree)
  template = jax.eval_shape(lambda: tree)
  device = jax.sharding.SingleDeviceSharding(jax.devices()[-1])
  template["host"] = jax.ShapeDtypeStruct((2, 3), jnp.float32, sharding=device)
  restored, _ = ckpt.load_pytree(path, template=template)
  assert jax.tree.structure(restored) == jax.tree.structure(tree)
  np.testing.assert_array_equal(np.asarray(restored["key"]), np.asarray(tree["key"]))
  assert restored["agent"].opt_state[0].mu["params"]["bias"].dtype == jnp.float32
  np.testing.assert_array_equal(restored["agent"].opt_state[0].nu["params"]["bias"],
                                tree["agent"].opt_state[0].nu["params"]["bias"])
  assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(restored))
  assert restored["host"].sharding == device                       # the template's placement
  np.testing.assert_array_equal(restored["host"], tree["host"])
  assert restored["epoch"].dtype == jnp.int32 and int(restored["epoch"]) == 5
  assert restored["misc"][0].dtype == jnp.float32 and restored["misc"][0] == np.float32(0.1)
  assert jax.random.key_impl(restored["typed_key"]) == jax.random.key_impl(tree["typed_key"])
  np.testing.assert_array_equal(jax.random.key_data(restored["typed_key"]),
                                jax.random.key_data(tree["typed_key"]))


def test_load_without_template_gives_numpy_dicts(tree, tmp_path):
  path = tmp_path / "ck"
  ckpt.save_pytree(path, tree)
  raw, _ = ckpt.load_pytree(path)
  kernel = raw["agent"]["params"]["params"]["kernel"]
  assert isinstance(kernel, np.ndarray)
  np.testing.assert_array_equal(kernel, tree["agent"].params["params"]["kernel"])
  assert raw["agent"]["opt_state"][0]["count"].dtype == np.int32
  assert raw["misc"][1][0] is None and raw["empty"] == {}
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


def test_bad_metadata_or_leaf_writes_nothing(tmp_path):
  with pytest.raises(ckpt.CheckpointError, match="JSON"):
    ckpt.save_pytree(tmp_path / "ck", {"x": np.zeros(1)}, {"f": object()})
  assert os.listdir(tmp_path) == []
  runs = ckpt.RunCheckpointer(tmp_path / "run")
  with pytest.raises(ckpt.CheckpointError, match="Cannot checkpoint leaf a/s of type str"):
    runs.save(1, {"a": {"s": "text"}, "x": np.zeros(1)})
  assert runs.steps() == [] and os.listdir(tmp_path / "run") == []


def _fail_json_save(monkeypatch):
  """Makes the meta item's write fail after Orbax has begun the step (state already written)."""
  from orbax.checkpoint._src.handlers import json_checkpoint_handler as handler

  async def boom(self, *args, **kwargs):
    raise OSError("disk full")
  monkeypatch.setattr(handler.JsonCheckpointHandler, "async_save", boom)


def test_crash_mid_write_leaves_no_committed_step(tmp_path, monkeypatch):
  runs = ckpt.RunCheckpointer(tmp_path, keep=3)
  runs.save(1, {"x": np.zeros(2, np.float32)})
  _fail_json_save(monkeypatch)
  with pytest.raises(ckpt.CheckpointError, match="disk full.*Nothing was committed"):
    runs.save(2, {"x": np.ones(2, np.float32)})
  monkeypatch.undo()
  assert runs.steps() == [1]                         # Orbax's temporary step is not a step
  state, meta = runs.restore()
  assert state["x"].tolist() == [0.0, 0.0] and meta["step"] == 1
  # A fresh checkpointer (a restarted run) writes step 2 over the leftover temporary folder.
  again = ckpt.RunCheckpointer(tmp_path, keep=3)
  again.save(2, {"x": np.ones(2, np.float32)})
  assert again.steps() == [1, 2] and again.restore()[0]["x"].tolist() == [1.0, 1.0]


def test_overwrite_keeps_the_old_checkpoint_until_the_new_one_commits(tmp_path, monkeypatch):
  path = str(tmp_path / "ck")
  ckpt.save_pytree(path, {"x": np.zeros(2, np.float32)}, {"v": 1})
  _fail_json_save(monkeypatch)
  with pytest.raises(ckpt.CheckpointError, match="disk full"):
    ckpt.save_pytree(path, {"x": np.ones(2, np.float32)}, {"v": 2}, overwrite=True)
  monkeypatch.undo()
  tree, meta = ckpt.load_pytree(path)
  assert meta == {"v": 1} and tree["x"].tolist() == [0.0, 0.0]


def _flip_byte(filename, offset):
  with open(filename, "r+b") as f:
    f.seek(offset)
    byte = f.read(1)
    f.seek(offset)
    f.write(bytes([byte[0] ^ 0x5A]))


def test_orbax_alone_restores_a_flipped_byte_silently_and_the_crc_catches_it(tmp_path):
  """Why checkpoint.py keeps per-leaf CRC32s: with Orbax alone, a byte flipped inside a stored
  chunk comes back as wrong numbers without any error."""
  import orbax.checkpoint as ocp
  values = np.random.default_rng(0).normal(size=4096).astype(np.float32)   # incompressible
  path = str(tmp_path / "ck")
  ckpt.save_pytree(path, {"w": values})
  victim = _biggest_state_file(os.path.join(path, "0"))
  _flip_byte(victim, os.path.getsize(victim) // 2)
  with ocp.CheckpointManager(path, item_names=("state", "meta")) as mngr:
    raw = mngr.restore(0, args=ocp.args.Composite(state=ocp.args.StandardRestore()))["state"]
  assert raw["w"].shape == values.shape
  assert not np.array_equal(raw["w"], values), "Orbax noticed: the CRCs may be dropped"
  with pytest.raises(ckpt.CorruptCheckpointError, match="w fails its CRC32 check") as info:
    ckpt.load_pytree(path)
  assert os.path.join(path, "0") in str(info.value)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "delete", "meta"])
def test_corrupt_checkpoint_clear_error(tmp_path, damage):
  path = str(tmp_path / "ck")
  ckpt.save_pytree(path, {"w": np.linspace(0, 1, 4096, dtype=np.float32)}, kind="dynamics")
  step_dir = os.path.join(path, "0")
  victim = _biggest_state_file(step_dir)
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
    meta = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(step_dir, "meta"))
            for f in fs if not f.startswith("commit")]
    for m in meta:
      with open(m, "r+b") as f:
        f.truncate(max(os.path.getsize(m) - 20, 1))
  with pytest.raises(ckpt.CorruptCheckpointError) as info:
    ckpt.load_pytree(path, kind="dynamics")
  message = str(info.value)
  assert "dynamics checkpoint" in message and step_dir in message
  assert f"Delete {path} and the dynamics ensembles are trained again" in message


def test_template_mismatch(tree, tmp_path):
  path = str(tmp_path / "ck")
  ckpt.save_pytree(path, tree)
  fewer_seeds = jax.tree.map(lambda x: x, tree)
  fewer_seeds["agent"] = jax.vmap(_init)(jax.random.split(jax.random.PRNGKey(0), NUM_SEEDS - 1))
  with pytest.raises(ckpt.TemplateMismatchError) as info:
    ckpt.load_pytree(path, template=fewer_seeds)
  message = str(info.value)
  assert path in message and "--workdir" in message
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
  lines = []
  runs = ckpt.RunCheckpointer(tmp_path / "run", keep=3, log=lines.append)
  assert runs.latest_step() is None
  with pytest.raises(ckpt.CheckpointError, match="No run checkpoint"):
    runs.restore()
  noise = np.random.default_rng(0).normal(size=2048).astype(np.float32)  # the biggest file
  template = {"w": np.zeros(3, np.float32), "key": jax.random.PRNGKey(0), "noise": noise}
  for step in (10, 20, 30, 40, 50):
    runs.save(step, {"w": np.full(3, step, np.float32), "key": jax.random.PRNGKey(step),
                     "noise": noise}, {"epoch": step})
  assert runs.steps() == [30, 40, 50] and runs.latest_step() == 50
  state, meta = runs.restore(template)
  assert meta == {"epoch": 50, "step": 50} and state["w"].tolist() == [50.0] * 3
  np.testing.assert_array_equal(state["key"], jax.random.PRNGKey(50))
  assert runs.restore(template, step=30)[1]["step"] == 30
  assert lines == []

  with open(_biggest_state_file(runs.path(50)), "r+b") as f:
    f.truncate(1)
  state, meta = runs.restore(template)
  # One line for the one step skipped: which, why, the step tried next, what to delete.
  assert len(lines) == 1 and "\n" not in lines[0], lines
  assert lines[0].startswith("warning: skipping the corrupt run checkpoint at step 50, trying "
                             "step 40.")
  assert "truncated" in lines[0] and f"delete {runs.path(50)} only" in lines[0]
  assert meta["step"] == 40 and state["w"].tolist() == [40.0] * 3
  with pytest.raises(ckpt.CorruptCheckpointError):
    runs.restore(template, step=50)                  # an explicit step never falls back

  # A run resumed from 40 saves 45 next: the abandoned (here: corrupt) step 50 goes, the newest
  # others stay.
  runs.save(45, {"w": np.zeros(3, np.float32), "key": jax.random.PRNGKey(45), "noise": noise})
  assert runs.steps() == [30, 40, 45]

  for step in runs.steps():
    os.remove(_biggest_state_file(runs.path(step)))
  lines.clear()
  with pytest.raises(ckpt.CheckpointError, match="Every run checkpoint .* is corrupt"):
    runs.restore(template)
  assert [line.split(". ")[0] for line in lines] == [
      "warning: skipping the corrupt run checkpoint at step 45, trying step 40",
      "warning: skipping the corrupt run checkpoint at step 40, trying step 30",
      "warning: skipping the corrupt run checkpoint at step 30, no older step left"]


def test_an_aborted_read_leaves_no_traceback(tmp_path, capfd):
  """A truncated chunk aborts Orbax's read while tensorstore's other reads still run: each then
  reaches a closed event loop, which Python printed as a traceback (63 for a quick run's step).
  Those echoes are dropped; any other unraisable exception still reaches the hook before."""
  runs = ckpt.RunCheckpointer(tmp_path, keep=2, log=None)
  noise = np.random.default_rng(0).normal(size=(8, 2048)).astype(np.float32)
  for step in (1, 2):
    runs.save(step, {f"n{i}": noise for i in range(8)})
  with open(_biggest_state_file(runs.path(2)), "r+b") as f:
    f.truncate(100)
  assert runs.restore({f"n{i}": noise for i in range(8)})[1]["step"] == 1

  def unraisable(exc):        # as sys.unraisablehook receives one, traceback included
    return types.SimpleNamespace(exc_type=type(exc), exc_value=exc, err_msg=None, object=None,
                                 exc_traceback=exc.__traceback__)
  loop = asyncio.new_event_loop()
  loop.close()
  try:
    loop.call_soon_threadsafe(print)
  except RuntimeError as e:
    echo = e
  passed_on = []
  previous, checkpoint_files._QUIET.previous = checkpoint_files._QUIET.previous, passed_on.append
  try:
    assert sys.unraisablehook == checkpoint_files._QUIET.unraisable
    sys.unraisablehook(unraisable(echo))
    other = RuntimeError("Event loop is closed")      # the same words from elsewhere: passed on
    sys.unraisablehook(unraisable(other))
  finally:
    checkpoint_files._QUIET.previous = previous
  assert [u.exc_value for u in passed_on] == [other]
  assert "Traceback" not in capfd.readouterr().err


def _edit_meta(step_dir, edit):
  """Rewrites the meta item (JSON) of a step: the manifest and format tag live there."""
  path = os.path.join(step_dir, "meta", "metadata")
  with open(path) as f:
    body = json.load(f)
  edit(body)
  with open(path, "w") as f:
    json.dump(body, f)


def _spoil_crc(name):
  def edit(body):
    for leaf in body["leaves"]:
      if "/".join(leaf[0]) == name:
        leaf[4] ^= 1          # [path, shape, dtype, weak, crc, key impl]
  return edit


def test_partial_restore_reads_and_checks_only_the_sub_tree(tree, tmp_path):
  runs = ckpt.RunCheckpointer(tmp_path, keep=2)
  runs.save(1, tree, {"epoch": 1})
  sub = {"agent": {"params": jax.eval_shape(lambda: tree["agent"].params)},
         "typed_key": tree["typed_key"], "host": np.zeros((2, 3), np.float32)}
  restored, meta = runs.restore(sub, partial=True)
  assert meta == {"epoch": 1, "step": 1}
  assert jax.tree.structure(restored) == jax.tree.structure(sub)
  _assert_bit_exact(restored["agent"]["params"], tree["agent"].params)
  _assert_bit_exact(restored["typed_key"], tree["typed_key"])
  assert isinstance(restored["host"], np.ndarray) and restored["host"].tolist() == tree[
      "host"].tolist()
  # A flat dict or a TrainState-shaped sub-tree: the paths from the root are what counts.
  actor_only = {"agent": {"params": {"params": {"kernel": np.zeros((NUM_SEEDS, 3, 4),
                                                                   np.float32)}}}}
  np.testing.assert_array_equal(runs.restore(actor_only, partial=True)[0]["agent"]["params"][
      "params"]["kernel"], tree["agent"].params["params"]["kernel"])

  # Only the leaves read are checked: a bad CRC elsewhere does not stop a partial restore...
  _edit_meta(runs.path(1), _spoil_crc("epoch"))
  runs.restore(sub, step=1, partial=True)
  with pytest.raises(ckpt.CorruptCheckpointError, match="leaf epoch fails its CRC32 check"):
    runs.restore(tree, step=1)
  # ... but one of a leaf read does.
  _edit_meta(runs.path(1), _spoil_crc("agent/params/params/kernel"))
  with pytest.raises(ckpt.CorruptCheckpointError,
                     match="leaf agent/params/params/kernel fails its CRC32 check"):
    runs.restore(sub, step=1, partial=True)

  with pytest.raises(ckpt.TemplateMismatchError, match="agent/actor is not in the checkpoint"):
    runs.restore({"agent": {"actor": np.zeros(2, np.float32)}}, partial=True)
  with pytest.raises(ckpt.TemplateMismatchError, match=r"host: shape \(2, 3\) in checkpoint"):
    runs.restore({"host": np.zeros(6, np.float32)}, partial=True)
  with pytest.raises(ValueError, match="needs a template"):
    runs.restore(partial=True)


def test_template_structure_orbax_compares(tree, tmp_path):
  """Empty nodes have no leaves in the manifest; Orbax's own structure check reports an extra one
  as a TemplateMismatchError. (None and {} it takes as the same empty node, restored as the
  template has it.)"""
  path = str(tmp_path / "ck")
  ckpt.save_pytree(path, tree)
  with pytest.raises(ckpt.TemplateMismatchError,
                     match="(?s)does not match the template.*extra:.*--workdir"):
    ckpt.load_pytree(path, template=dict(tree, extra={}))
  assert ckpt.load_pytree(path, template=dict(tree, empty=None))[0]["empty"] is None


def test_other_format_is_refused_with_what_to_do(tmp_path):
  runs = ckpt.RunCheckpointer(tmp_path / "run", keep=3)
  for step in (1, 2):
    runs.save(step, {"x": np.full(2, step, np.float32)})
  _edit_meta(runs.path(2), lambda body: body.update(format="mombo_jax.checkpoint/2"))
  for call in (runs.restore, runs.metadata):
    with pytest.raises(ckpt.CheckpointError) as info:
      call()                                           # no fallback to step 1: not corruption
    assert not isinstance(info.value, ckpt.CorruptCheckpointError)
    assert "format 'mombo_jax.checkpoint/2'" in str(info.value)
    assert f"reads {' and '.join(ckpt.READ_FORMATS)} only. Delete {tmp_path / 'run'}" in str(
        info.value)
  assert runs.restore(step=1)[0]["x"].tolist() == [1.0, 1.0]


def test_per_shard_crcs_are_checked_and_a_bad_shard_is_named(tmp_path):
  """A leaf that was split over devices (a launch's cell-sharded state) is listed with a CRC32 per
  shard, format /4 (tests/test_sharding.py writes such checkpoints over 4 devices): every process
  reads the whole leaf back and checks each shard's block of it; one that fails is named."""
  import zlib
  w = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
  runs = ckpt.RunCheckpointer(tmp_path, keep=2)
  runs.save(1, {"w": w, "b": np.ones(2, np.float32)})
  blocks = [[[0, 2], [0, 3]], [[2, 4], [0, 3]]]          # two devices, two cells each

  def as_sharded(crc_of):
    def edit(body):
      assert body["format"] == ckpt.FORMAT                  # one device: one CRC32 a leaf
      body["format"] = ckpt.FORMAT_SHARDED
      leaf = next(leaf for leaf in body["leaves"] if leaf[0] == ["w"])
      leaf[4] = [[b, crc_of(b)] for b in blocks]
    return edit
  crc = lambda b: zlib.crc32(w[b[0][0]:b[0][1]].tobytes())  # noqa: E731
  _edit_meta(runs.path(1), as_sharded(crc))
  state, _ = runs.restore({"w": np.zeros((4, 3), np.float32), "b": np.zeros(2, np.float32)})
  assert state["w"].tobytes() == w.tobytes()
  assert runs.nbytes({"w": 0}) == (48, 56) and runs.nbytes() == (56, 56)  # shape x itemsize

  _edit_meta(runs.path(1), lambda body: body.update(format=ckpt.FORMAT))
  _edit_meta(runs.path(1), as_sharded(lambda b: crc(b) ^ (b[0][0] == 2)))  # the second shard
  with pytest.raises(ckpt.CorruptCheckpointError,
                     match=r"leaf w fails its CRC32 check in its shard \[2:4, 0:3\]"):
    runs.restore(step=1)
  runs.restore({"b": np.zeros(2, np.float32)}, step=1, partial=True)   # w is not read
