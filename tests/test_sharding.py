"""The cell (seed) axis sharded over several devices trains as on one device (make_cells_chunk:
several epochs in one call, then more from a restored checkpoint); a seed count that does not
split over the devices is refused.

Several CPU devices exist only when XLA_FLAGS=--xla_force_host_platform_device_count=N is set
before jax is imported, so both sides run in fresh subprocesses (this file is their script).
"""
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import HANG_S

SEEDS, EPOCHS, S_DIM, A_DIM, N = 4, 2, 11, 3, 128
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tiny_config(num_seeds):
  from mombo_jax.settings import config as config_lib
  return config_lib.make_config(
      "hopper-random", "mombo", preset="tiny", num_seeds=num_seeds, steps_per_epoch=2,
      rollout_batch_size=8, rollout_length=2, batch_size=8, actor_hidden=(8,), critic_hidden=(8,),
      dyn_hidden=(8,), dyn_weight_decay=(2.5e-5, 1e-4))


def _train(out_path):
  """Trains SEEDS seeds for EPOCHS epochs on all local devices in one call, then one more from the
  restored checkpoint; saves the state and metrics leaves of both."""
  import jax
  import jax.numpy as jnp

  from mombo_jax.core import buffer, cells_program, dynamics, placement, train as train_lib

  cfg = _tiny_config(SEEDS)
  rng = np.random.default_rng(0)
  f = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)  # noqa: E731
  obs = f(N, S_DIM).at[:, 0].set(1.25).at[:, 1].set(0.0)   # healthy hopper heights / angles
  zeros = jnp.zeros((N, S_DIM), jnp.float32)
  real = buffer.Batch(obs=obs, action=jnp.tanh(f(N, A_DIM)), reward=f(N), next_obs=obs,
                      done=jnp.zeros(N, jnp.float32), obs_var=zeros, next_obs_mean=obs,
                      next_obs_var=zeros, reward_mean=jnp.zeros(N), reward_var=jnp.zeros(N))
  keys = jax.random.split(jax.random.PRNGKey(0), SEEDS)
  # Initialisation compiled without optimisation: op by op, or optimised, it takes longer than
  # the two epochs.
  init = jax.jit(lambda k: train_lib.init_cells(
      k, cfg, real, jax.vmap(lambda kk: dynamics.init_state(kk, S_DIM, A_DIM, cfg))(k)))
  state = init.lower(keys).compile({"xla_backend_optimization_level": 0})(keys)
  real, cells = train_lib.single_dataset(real, cfg)
  state, real = placement.shard_cells(state), placement.replicate(real)
  cells = placement.shard_cells(cells)
  keys = placement.shard_cells(jax.random.split(jax.random.PRNGKey(9), SEEDS))
  # One compiled program (a chunk of up to EPOCHS epochs, each device looping over its own
  # cells): EPOCHS epochs in one call, then, from the restored checkpoint, one more.
  chunk_fn = cells_program.make_cells_chunk(cfg, SEEDS, EPOCHS)
  state, first = chunk_fn(state, real, keys, cells, 0, EPOCHS)
  # A run checkpoint restores onto the template's sharding, ready for the compiled program.
  from mombo_jax.storage import checkpoint
  ckpt = checkpoint.RunCheckpointer(out_path + ".ckpt")
  ckpt.save(EPOCHS, state)
  _check_shards(ckpt, EPOCHS, state)
  restored, _ = ckpt.restore(state)
  for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(state)):
    assert a.sharding == b.sharding, (a.sharding, b.sharding)
    np.testing.assert_array_equal(a, b)
  chunk = chunk_fn(restored, real, keys, cells, EPOCHS, 1)
  devices = len(jax.local_devices())
  spread = {len(leaf.sharding.device_set) for leaf in jax.tree.leaves((state, first, chunk))}
  assert spread == {devices}, spread           # every leaf lives on all devices
  assert len(state.epoch.addressable_shards) == devices
  assert chunk[1]["diverged"].shape == (EPOCHS, SEEDS)
  assert not any(np.any(np.asarray(v)[1:]) for v in chunk[1].values())       # rows past n
  leaves = jax.tree.leaves(jax.device_get((state, first, chunk)))
  np.savez(out_path, devices=devices, *[np.asarray(x) for x in leaves])


def _check_shards(ckpt, step, state):
  """The checkpoint of the cell-sharded state was written per shard (no gather): its manifest
  lists a CRC32 for each device's block of cells (one device: one CRC32 a leaf), and a block whose
  bytes disagree is named on restore. A group's cells (placement.take_cells) stay where they are."""
  import json

  import jax

  from mombo_jax.core import placement
  from mombo_jax.storage import checkpoint
  devices = len(jax.devices())
  step_dir = ckpt.path(step)
  with open(os.path.join(step_dir, "meta", "metadata")) as f:
    body = json.load(f)
  per = SEEDS // devices
  for leaf in body["leaves"]:
    if devices == 1:
      assert body["format"] == checkpoint.FORMAT and isinstance(leaf[4], int), leaf
      continue
    assert body["format"] == checkpoint.FORMAT_SHARDED
    assert [block[0] for block, _ in leaf[4]] == [[i * per, (i + 1) * per]
                                                  for i in range(devices)], leaf
  if devices == 1:
    return
  # The restore names a shard whose CRC32 is off (its bytes "altered"); then the manifest is put
  # back.
  text = json.dumps(body)
  leaf = next(leaf for leaf in body["leaves"] if leaf[0][-1] == "epoch")
  leaf[4][-1][1] ^= 1
  with open(os.path.join(step_dir, "meta", "metadata"), "w") as f:
    json.dump(body, f)
  try:
    ckpt.restore(state, step=step)
    raise AssertionError("the altered shard passed")
  except checkpoint.CorruptCheckpointError as e:
    assert f"leaf epoch fails its CRC32 check in its shard [{SEEDS - per}:{SEEDS}]" in str(e), e
  with open(os.path.join(step_dir, "meta", "metadata"), "w") as f:
    f.write(text)

  # take_cells: a block of cells stays on the devices that hold it (each keeps its own part);
  # parts of unequal size take one jitted slice. Values as resize_rings of the host copy.
  host = jax.device_get(state)
  for cells, rows, on in ((slice(1, 3), 4, 2), (slice(0, SEEDS), 2, devices)):
    part = placement.take_cells(state, cells, rows)
    want = placement.resize_rings(jax.tree.map(lambda x: x[cells], host), rows)
    for a, b in zip(jax.tree.leaves(part), jax.tree.leaves(want)):
      assert len(a.sharding.device_set) == on and np.array_equal(np.asarray(a), b)
  x = placement.shard_cells(np.arange(2 * SEEDS * 3).reshape(2 * SEEDS, 3))   # 2 cells a device
  for a, b, on in ((2, 6, 2), (3, 5, 2), (1, 4, devices)):
    y = placement._take_cells(x, a, b, None)
    assert len(y.sharding.device_set) == on and np.array_equal(np.asarray(y), np.asarray(x)[a:b])


def _refuse():
  """make_cells_epoch and the launch's validate (experiments.run's checks) refuse 3 seeds on 4
  devices."""
  from mombo_jax.core import cells_program
  from mombo_jax.errors import UserError
  from mombo_jax.run import preflight
  try:
    cells_program.make_cells_epoch(_tiny_config(3), 3)
  except ValueError as e:
    print("train:", e)
  try:
    preflight.validate(_tiny_config(3), "hopper-random", os.environ["REFUSE_WORKDIR"])
  except UserError as e:
    print("run:", e)


def _spawn(devices, *args, env_extra=None, module=None):
  """This file (or `module` with -m) in a fresh process with `devices` CPU devices."""
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
           if not f.startswith("--xla_force_host_platform_device_count")]
  if devices > 1:
    flags.append(f"--xla_force_host_platform_device_count={devices}")
  env = dict(os.environ, XLA_FLAGS=" ".join(flags), JAX_PLATFORMS="cpu",
             PYTHONPATH=os.pathsep.join([_ROOT, os.environ.get("PYTHONPATH", "")]),
             **(env_extra or {}))
  cmd = ["-m", module] if module else [os.path.abspath(__file__)]
  return subprocess.Popen([sys.executable, *cmd, *args], cwd=_ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc, ok=True):
  out, err = proc.communicate(timeout=HANG_S)
  assert (proc.returncode == 0) == ok, out + err
  return out + err


@pytest.mark.bit_identity
def test_seeds_sharded_over_4_devices_train_as_on_1(tmp_path):
  # Both processes at once: each is mostly single-threaded compilation.
  procs = {d: _spawn(d, "train", str(tmp_path / f"d{d}.npz")) for d in (4, 1)}
  for proc in procs.values():
    _finish(proc)
  sharded, single = (np.load(tmp_path / f"d{d}.npz") for d in (4, 1))
  assert int(sharded["devices"]) == 4 and int(single["devices"]) == 1
  names = [k for k in single.files if k != "devices"]
  assert len(names) > 50 and sorted(names) == sorted(k for k in sharded.files if k != "devices")
  exact = 0
  for k in names:
    assert sharded[k].shape == single[k].shape and sharded[k].dtype == single[k].dtype, k
    if single[k].dtype.kind == "f":
      # XLA:CPU compiles a 4-partition program with other fusions than a 1-device one, so a few
      # reductions round differently (last bits, measured); no seed sees another's numbers.
      np.testing.assert_allclose(sharded[k], single[k], rtol=2e-5, atol=1e-6, err_msg=k)
      exact += np.array_equal(sharded[k], single[k])
    else:                  # counters, ring pointers, elites, divergence flags
      np.testing.assert_array_equal(sharded[k], single[k], err_msg=k)
  assert exact > len(names) // 2          # most leaves are bit for bit the same
  # The seeds trained different things (a broken split could make them all seed 0).
  assert any(not np.array_equal(single[k][0], single[k][1]) for k in names
             if single[k].ndim and single[k].dtype.kind == "f")


def test_seed_count_not_divisible_by_devices_is_refused(tmp_path):
  script = _spawn(4, "refuse", env_extra={"REFUSE_WORKDIR": str(tmp_path / "w")})
  cli = _spawn(4, "--seeds=3", "--env=hopper-random", f"--workdir={tmp_path / 'cli'}",
               module="experiments.run", env_extra={"MINARI_DATASETS_PATH": str(tmp_path / "m")})
  out = _finish(script)
  lines = dict(line.split(": ", 1) for line in out.strip().splitlines() if ": " in line)
  for where in ("train", "run"):
    assert "3 seed(s)" in lines[where] and "4 cpu device(s)" in lines[where], out
  assert "num_seeds" in lines["run"] and "multiple of 4" in lines["run"], out
  # The command line: one `error:` line, before any work.
  err = _finish(cli, ok=False).strip().splitlines()
  assert len(err) == 1 and err[0].startswith("error: --seeds=3: 3 seed(s)"), err
  assert "multiple of 4" in err[0] and "CUDA_VISIBLE_DEVICES" in err[0]
  assert not (tmp_path / "w" / "config.json").exists()
  assert not (tmp_path / "cli" / "config.json").exists()


if __name__ == "__main__":
  if sys.argv[1] == "train":
    _train(sys.argv[2])
  else:
    _refuse()
