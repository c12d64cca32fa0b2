"""Where does make_cells_chunk(config, 1, 1) lose time against the plain make_epoch? (issue #29)

Run (repo root): python3 -m benchmarks.peers.epoch_overhead [rounds] [variants] [hlo_dir]
The variants' calls alternate in one process (medians of the rounds, the first dropped by reading
the log); each variant's final state and metrics after one epoch are compared with A's bit for bit;
each compiled program's HLO text is written to hlo_dir (default: a temporary folder) so that the
step body's transposes can be counted. Record: epoch_overhead.txt (a loaded 2-core Intel Xeon).
Variants (all on MOPO, 10 critics, 3x256, batch 256, rollout 5000 x 5, 200 steps):
  A  make_cells_chunk(config, 1, 1)                  (what runs use)
  B  jit(make_epoch(config)), no vmap, no Cell, [N] data    (donated state)
  V  jit(vmap(epoch)) with Cell + stacked [1, N] data, no fori_loop
  C  jit(epoch) with an unbatched Cell + stacked data, no vmap
  W  jit(vmap(epoch)) without Cell ([N] data), size-1 cell axis
  L  fori_loop(traced n) + per-cell metric rows around the plain epoch of B, no vmap, no Cell
"""
import os
import resource
import sys
import time
import types

import jax
import jax.numpy as jnp
import numpy as np

from mombo_jax.core import buffer, cells_program, dynamics, train
from mombo_jax.settings import config as config_lib

OBS, ACT = 11, 3
ROWS, STEPS, RB = 200_000, 200, 5000
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
WHICH = sys.argv[2] if len(sys.argv) > 2 else "ABVCWL"
OUT = sys.argv[3] if len(sys.argv) > 3 else __import__("tempfile").mkdtemp(prefix="hlo_")


def cpu():
  ru = resource.getrusage(resource.RUSAGE_SELF)
  return ru.ru_utime + ru.ru_stime


def log(*a):
  print(time.strftime("%H:%M:%S"), *a, flush=True)


def synthetic(rows, seed=0):
  rng = np.random.default_rng(seed)
  obs = (0.1 * rng.standard_normal((rows, OBS))).astype(np.float32)
  obs[:, 0] += 1.25
  nxt = (obs + 0.01 * rng.standard_normal((rows, OBS))).astype(np.float32)
  return dict(observations=obs, actions=rng.uniform(-1, 1, (rows, ACT)).astype(np.float32),
              rewards=rng.standard_normal(rows).astype(np.float32), next_observations=nxt,
              terminals=np.zeros(rows, bool))


hidden = (256,) * 3
config = config_lib.make_config(
    "hopper-medium", "mopo", num_critics=10, actor_hidden=hidden, critic_hidden=hidden,
    batch_size=256, steps_per_epoch=STEPS, rollout_batch_size=RB, rollout_length=5,
    buffer_retain_epochs=5, real_ratio=0.05, dyn_members=7, dyn_elites=5, dyn_hidden=(200,) * 4,
    beta=0.5, num_seeds=1, seed=0)
real = buffer.from_transitions(types.SimpleNamespace(**synthetic(ROWS)))
seed_keys = jax.vmap(jax.random.PRNGKey)(jnp.arange(0, 1))
init_keys, keys1 = (jax.vmap(jax.random.fold_in, (0, None))(seed_keys, i) for i in (1, 2))
dyn = jax.jit(jax.vmap(lambda k: dynamics.init_state(k, OBS, ACT, config)))(init_keys)
state1_np = jax.device_get(jax.jit(train.init_cells, static_argnums=1)(init_keys, config, real,
                                                                        dyn))
stacked, cells1 = train.single_dataset(real, config, 1)
sq = lambda t: jax.tree.map(lambda x: x[0], t)  # noqa: E731
cell0 = sq(cells1)
key0 = keys1[0]
fold = jax.vmap(jax.random.fold_in, in_axes=(0, None))

epoch = train.make_epoch(config)


def fresh(batched):
  s = jax.tree.map(jnp.array, state1_np)
  return s if batched else sq(s)


def per_cell_rows(metrics):
  return cells_program._per_cell(metrics)


# ---- variants: (fn(state, e) -> (state, metrics reduced per cell, unbatched), batched) -------
def make_A():
  chunk = cells_program.make_cells_chunk(config, 1, 1)
  def run(state, e):
    state, m = chunk(state, stacked, keys1, cells1, e, 1)
    return state, jax.tree.map(lambda x: x[0, 0], m)
  return run, True, (chunk, lambda st: (st, stacked, keys1, cells1, 0, 1))


def make_B():
  f = jax.jit(epoch, donate_argnums=0)
  def run(state, e):
    state, m = f(state, real, jax.random.fold_in(key0, e))
    return state, m
  return run, False, (f, lambda st: (st, real, key0))


def make_V():
  f = jax.jit(jax.vmap(epoch, in_axes=(0, None, 0, 0)), donate_argnums=0)
  def run(state, e):
    state, m = f(state, stacked, fold(keys1, e), cells1)
    return state, sq(m)
  return run, True, (f, lambda st: (st, stacked, keys1, cells1))


def make_C():
  f = jax.jit(epoch, donate_argnums=0)
  def run(state, e):
    return f(state, stacked, jax.random.fold_in(key0, e), cell0)
  return run, False, (f, lambda st: (st, stacked, key0, cell0))


def make_W():
  f = jax.jit(jax.vmap(lambda s, r, k: epoch(s, r, k), in_axes=(0, None, 0)), donate_argnums=0)
  def run(state, e):
    state, m = f(state, real, fold(keys1, e))
    return state, sq(m)
  return run, True, (f, lambda st: (st, real, keys1))


def make_L():
  one = jax.jit(lambda s, r, k, e: (lambda o: (o[0], per_cell_rows(o[1])))(
      epoch(s, r, jax.random.fold_in(k, e))))

  def chunk(state, r, k, start, n):
    shapes = jax.eval_shape(one, state, r, k, start)[1]
    rows = jax.tree.map(lambda s: jnp.zeros((1,) + s.shape, s.dtype), shapes)

    def body(i, carry):
      state, rows = carry
      state, m = one(state, r, k, start + i)
      rows = jax.tree.map(lambda a, b: jax.lax.dynamic_update_index_in_dim(a, b, i, 0), rows, m)
      return state, rows
    return jax.lax.fori_loop(0, jnp.clip(n, 0, 1), body, (state, rows))
  f = jax.jit(chunk, donate_argnums=0)
  def run(state, e):
    state, m = f(state, real, key0, jnp.int32(e), jnp.int32(1))
    return state, jax.tree.map(lambda x: x[0], m)
  return run, False, (f, lambda st: (st, real, key0, jnp.int32(0), jnp.int32(1)))


MAKERS = dict(A=make_A, B=make_B, V=make_V, C=make_C, W=make_W, L=make_L)
variants = {}
for name in WHICH:
  run, batched, (f, args) = MAKERS[name]()
  t = time.perf_counter()
  st = fresh(batched)
  try:
    text = f.lower(*args(st)).compile().as_text()
    with open(f"{OUT}/hlo_{name}.txt", "w") as fh:
      fh.write(text)
  except Exception as ex:  # noqa: BLE001
    log(name, "hlo dump failed", ex)
  # First call (compile + run), epoch 0 from the same initial state: bit-identity check.
  out = jax.block_until_ready(run(st, 0))
  log(name, f"compiled+first epoch {time.perf_counter() - t:.1f}s")
  variants[name] = dict(run=run, batched=batched, state=out[0], first=out, times=[], e=1)

# ---- bit identity of epoch 0 against A (or the first variant) ---------------------------------
ref_name = WHICH[0]
ref_state, ref_m = variants[ref_name]["first"]
ref_state = ref_state if not variants[ref_name]["batched"] else sq(ref_state)
ref_m = {k: np.asarray(v) for k, v in ref_m.items()}
for name, v in variants.items():
  s, m = v["first"]
  s = sq(s) if v["batched"] else s
  if m and np.ndim(next(iter(m.values()))) and name in "BCVW":
    m = per_cell_rows(m) if name in "BC" else per_cell_rows(m)
  m = {k: np.asarray(x) for k, x in m.items()}
  ls, lr = jax.tree.leaves(s), jax.tree.leaves(ref_state)
  same_state = all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(ls, lr))
  diff = [i for i, (a, b) in enumerate(zip(ls, lr)) if not np.array_equal(np.asarray(a),
                                                                          np.asarray(b))]
  mk = sorted(set(m) & set(ref_m))
  same_m = all(np.array_equal(m[k], ref_m[k]) for k in mk)
  bad_m = [k for k in mk if not np.array_equal(m[k], ref_m[k])]
  log(f"bit-identity {name} vs {ref_name}: state {same_state} ({len(diff)} of {len(ls)} leaves "
      f"differ) metrics {same_m} ({len(mk)} compared; differ: {bad_m[:6]})")
  v["first"] = None

# ---- timing, alternating ----------------------------------------------------------------------
for r in range(ROUNDS):
  order = list(variants) if r % 2 == 0 else list(variants)[::-1]
  for name in order:
    v = variants[name]
    t, c = time.perf_counter(), cpu()
    v["state"], _ = jax.block_until_ready(v["run"](v["state"], v["e"]))
    v["times"].append(time.perf_counter() - t)
    v.setdefault("cpu", []).append(cpu() - c)
    v["e"] += 1
  log(f"round {r}: " + " ".join(f"{n}={variants[n]['times'][-1]:.2f}" for n in variants)
      + " | cpu " + " ".join(f"{n}={variants[n]['cpu'][-1]:.2f}" for n in variants)
      + f" load {os.getloadavg()[0]:.1f}")

med = {n: float(np.median(v["times"])) for n, v in variants.items()}
for n in variants:
  ratios = [t / a for t, a in zip(variants[n]["times"], variants[ref_name]["times"])]
  log(f"{n}: median {med[n]:.3f}s  ratio to {ref_name} {med[n] / med[ref_name]:.3f}  "
      f"(median of paired ratios {np.median(ratios):.3f})  times "
      + " ".join(f"{t:.2f}" for t in variants[n]["times"]))

cmed = {n: float(np.median(v["cpu"])) for n, v in variants.items()}
for n in variants:
  ratios = [t / a for t, a in zip(variants[n]["cpu"], variants[ref_name]["cpu"])]
  log(f"{n}: CPU-s median {cmed[n]:.3f}  ratio to {ref_name} {cmed[n] / cmed[ref_name]:.3f}  "
      f"(paired {np.median(ratios):.3f})  " + " ".join(f"{t:.2f}" for t in variants[n]["cpu"]))
