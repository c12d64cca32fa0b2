"""Several seeds in one program on CPU: cells vmapped vs looped (core/cell_layout) vs one-cell
programs.

Run (repo root):  python3 -m benchmarks.bench_cell_layout [--parts=epoch,dynamics] [--algos=mopo]
                  [--cells=4] [--steps=200] [--rollout_batch=10000] [--dyn_rows=100000]
                  [--rounds=4] [--out=FILE]

One process compiles three ways of training C seeds for an epoch
(cells_program.make_cells_chunk, one epoch per call, what runs use) and calls them in alternation,
round after round (the order reversed every other round), so that load drifts fall on all of them
alike:
  separate  C one-cell programs: the one-cell program called once per seed (as C runs would)
  loop      one C-cell program, cells looped (MOMBO_JAX_CELLS=loop, the CPU default)
  vmap      one C-cell program, cells vmapped (MOMBO_JAX_CELLS=vmap, the default elsewhere)
Recorded: compile seconds, seconds per round (C seeds x one epoch), the median of the per-round
ratios to `separate`, and how many leaves of the state after the first epoch equal `separate`'s bit
for bit. Work per seed: 10 critics, actor and critics 3x256, batch 256, real ratio 0.05, rollouts of
--rollout_batch x 5 (retained 5 epochs), a random 7-member 4x200 ensemble, synthetic hopper-shaped
data (200,000 rows), float32.

--parts=dynamics: the same three ways for the dynamics ensemble's training
(dynamics/dynamics_training: one whole epoch = its plan, minibatch and end calls), C seeds of the
paper's 7-member 4x200 ensemble on --dyn_rows synthetic transitions; `separate` is the one-seed
(unbatched) program, as a 1-seed run trains. Leaves equal to `separate`'s are counted as above (the
one-seed program is not a vmap of one, so few are).
"""
import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from benchmarks.bench_epoch_changes import ROWS, build, synthetic
from mombo_jax.core import buffer, cells_program
from mombo_jax.dynamics import dynamics_training, training_data
from mombo_jax.settings import config as config_lib

WAYS = ("separate", "loop", "vmap")


def _cell(tree, c):
  return jax.tree.map(lambda x: x[c:c + 1], tree)


def compile_way(way, config, state, stacked, cells, keys):
  layout = "loop" if way == "separate" else way
  try:
    cells_program._cells_chunk.cache_clear()   # programs are cached per config: build each anew
    if way == "separate":
      chunk = cells_program.make_cells_chunk(config, 1, 1, layout=layout)
      args = (jax.tree.map(jnp.asarray, _cell(state, 0)), stacked, keys[:1], _cell(cells, 0), 0, 1)
    else:
      chunk = cells_program.make_cells_chunk(config, keys.shape[0], 1, layout=layout)
      args = (jax.tree.map(jnp.asarray, state), stacked, keys, cells, 0, 1)
    t = time.perf_counter()
    compiled = chunk.lower(*args).compile()
    return compiled, time.perf_counter() - t
  finally:
    cells_program._cells_chunk.cache_clear()


def run_way(way, fn, state, stacked, cells, keys, epoch):
  """One epoch of all cells -> the new state ([C] in one tree, or a list of one-cell trees)."""
  if way == "separate":
    outs = [fn(s, stacked, keys[c:c + 1], _cell(cells, c), epoch, 1) for c, s in enumerate(state)]
    return jax.block_until_ready([o[0] for o in outs])
  return jax.block_until_ready(fn(state, stacked, keys, cells, epoch, 1))[0]


def run_algo(algo, args, real, out):
  config, state, stacked, cells, keys = build(algo, args, real, args.cells)
  v = {}
  for way in WAYS:
    fn, seconds = compile_way(way, config, state, stacked, cells, keys)
    start = ([jax.tree.map(jnp.asarray, _cell(state, c)) for c in range(args.cells)]
             if way == "separate" else jax.tree.map(jnp.asarray, state))
    first = run_way(way, fn, start, stacked, cells, keys, 0)
    host = jax.device_get(first)
    if way == "separate":
      host = jax.tree.map(lambda *xs: np.concatenate(xs), *host)
    v[way] = dict(fn=fn, state=first, first=host, compile=seconds, times=[], epoch=1)
  ref = v["separate"]["first"]
  for x in v.values():
    x["same"] = common.equal_leaves(x.pop("first"), ref)

  def one_round(way, x):
    x["state"] = run_way(way, x["fn"], x["state"], stacked, cells, keys, x["epoch"])

  common.alternate(v, args.rounds, one_round, algo, out)
  return _rows(algo, v, ref)


def run_dynamics(args, out):
  from benchmarks.bench_dynamics import _data
  config = dynamics_training._dyn_config(config_lib.make_config("hopper-medium"))
  inputs, targets = training_data.make_arrays(_data(args.dyn_rows))
  never = jnp.asarray(np.iinfo(np.int32).max, jnp.int32)
  keys = jax.random.split(jax.random.PRNGKey(0), args.cells)
  v = {}
  for way in WAYS:
    t = time.perf_counter()
    fns = dynamics_training._compiled_as(config, None if way == "separate" else way)
    state = ([fns.init(k, inputs, targets) for k in keys] if way == "separate"
             else fns.init(keys, inputs, targets))
    v[way] = dict(fns=fns, state=state, times=[], epoch=0)
    _dyn_epoch(v[way], way, inputs, targets, never)        # compiles
    v[way]["compile"] = time.perf_counter() - t
  ref = _dyn_host(v["separate"])
  for x in v.values():
    x["same"] = common.equal_leaves(_dyn_host(x), ref)
  common.alternate(v, args.rounds, lambda way, x: _dyn_epoch(x, way, inputs, targets, never),
                   "dynamics", out)
  return _rows("dynamics", v, ref)


def _rows(label, v, ref):
  """The table's rows of one part: each way's times against `separate`'s, leaves equal to ref's."""
  rows = []
  for way, x in v.items():
    ratio = common.median_ratio(x["times"], v["separate"]["times"])
    rows.append(f"| {label} | {way} | {x['compile']:.1f} | {np.median(x['times']):.2f} | "
                f"**{ratio:.3f}** | {x['same']} of {len(jax.tree.leaves(ref))} |")
  return rows


def _dyn_epoch(x, way, inputs, targets, never):
  run = lambda st: dynamics_training.run_epoch(x["fns"], st, inputs, targets, never)[0]  # noqa: E731
  x["state"] = jax.block_until_ready([run(s) for s in x["state"]] if way == "separate"
                                     else run(x["state"]))


def _dyn_host(x):
  host = jax.device_get(x["state"])
  return jax.tree.map(lambda *xs: np.stack(xs), *host) if isinstance(host, list) else host


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--parts", default="epoch,dynamics")
  p.add_argument("--algos", default="mopo")
  p.add_argument("--cells", type=int, default=4)
  p.add_argument("--steps", type=int, default=200)
  p.add_argument("--rollout_batch", type=int, default=10_000)
  p.add_argument("--dyn_rows", type=int, default=100_000)
  p.add_argument("--rounds", type=int, default=4)
  p.add_argument("--out", default=None)
  args = p.parse_args()
  if not set(args.parts.split(",")) <= {"epoch", "dynamics"}:
    raise SystemExit(f"error: --parts={args.parts}: use epoch, dynamics or epoch,dynamics")
  unknown = set(args.algos.split(",")) - {"mopo", "mombo", "mobile"}
  if unknown or args.cells < 1:
    raise SystemExit(f"error: --algos={args.algos} --cells={args.cells}: algorithms are mopo, "
                     "mombo, mobile; cells >= 1")
  out = common.Record(args.out)
  common.record_start(out, "bench_cell_layout", "C seeds in one program, cells looped or vmapped, "
                      "against C one-cell programs", args)
  out(f"work per round: {args.cells} seeds x one epoch ({args.steps} gradient steps + a "
      f"{args.rollout_batch} x 5 rollout), 10 critics, 3x256, batch 256, 7-member 4x200 ensemble")
  parts = args.parts.split(",")
  table = []
  if "epoch" in parts:
    real = buffer.from_transitions(synthetic(ROWS))
    for algo in args.algos.split(","):
      table += run_algo(algo, args, real, out)
  if "dynamics" in parts:
    out(f"dynamics: {args.cells} seeds x one training epoch of the 7-member 4x200 ensemble on "
        f"{args.dyn_rows} synthetic transitions")
    table += run_dynamics(args, out)
  out("")
  out("| algorithm (or dynamics) | way | compile s (dynamics: + init + first epoch) | "
      "median s per round | x separate (median of rounds) | "
      "state leaves equal to separate's after epoch 1 |")
  out("|---|---|---|---|---|---|")
  for row in table:
    out(row)
  out(f"load at end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
  main()
