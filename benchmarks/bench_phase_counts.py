"""FLOPs and op counts of one training epoch per phase (rollout, dynamics, critic update, actor
update), computed on the CPU without running the epoch (issue 43: what the GPU's time could go to).

  python3 -m benchmarks.bench_phase_counts [--algos=mombo,mobile,mopo] [--work=paper|peers|mixed]

One cell's epoch = one rollout (rollout_batch x rollout_length model steps, written to the ring) +
steps_per_epoch gradient steps, as train.make_epoch runs it, counted in two pieces: the rollout
(start states drawn, rollout.run) and one gradient step (buffer.sample_mixed + sac.update), the
epoch = rollout + steps x step. Phases are the epoch's named scopes (train.PHASES): `dynamics`
is the ensemble's predictions wherever they run (in the rollout, and in MOBILE's / MOMBO
elite_spread's targets inside `critic_update`), so it overlaps the others; `other` is the step's
batch sampling and temperature.

Columns, per phase and per epoch:
  jaxpr GFLOP    the jaxpr's FLOPs (benchmarks/common.jaxpr_flops' rules: 2MNK per dot, one per
                 elementwise output, scan bodies times their lengths)
  jaxpr ops      equations executed (scan bodies times their lengths; sub-programs' bodies, not
                 the call itself)
  XLA GFLOP      XLA's cost analysis of the compiled piece (the rollout in one piece with its scan
                 unrolled, so XLA counts every step), split over phases by the share of the
                 optimised program's dot FLOPs whose op_name carries the phase (`dots`: XLA's own
                 dots, counted from the optimised HLO's shapes)
  HLO ops        instructions of the optimised program (fusions count one; per call of the piece)
The optimised program is XLA:CPU's (this machine's): a GPU's fuses differently, so its op counts
are a CPU proxy of the GPU's kernels; the FLOPs are the backend's work either way.

--work=paper: the paper's epoch (make_config's defaults for hopper-medium-replay: 2 critics 2x256,
actor 2x256, 7 x 4x200 dynamics, 5 elites, rollout 50,000 x 5, 1000 steps, batch 256);
--work=peers: benchmarks/peers' (10 critics, actor and critics 3x256: peers/work.py Work).
--work=mixed: the paper's mixed datasets' epoch (config._MIXED: actor 5x1024, critics 3x256,
rollout 50,000 x 5, the rest as paper), the FLOPs benchmarks/device/sizing.py's mixed table needs.
Runs with an older tree too (cd <old checkout>; PYTHONPATH=$PWD python3 <this file>): its totals
then compare with this tree's (an older tree has no named scopes but the rollout's, which this
script sets: its step's phases read 0, all in `other`).
"""
import argparse
import collections
import contextlib
import dataclasses
import functools
import os
import re
import types

import jax
import jax.numpy as jnp
import numpy as np

import mombo_jax
from benchmarks import common  # the tree's on PYTHONPATH (an older one's, for a comparison)
from mombo_jax.core import buffer, dynamics, rollout, sac, targets, termination, train
from mombo_jax.settings import config as config_lib

# The epoch's named scopes (an older tree has no train.PHASES, nor the scopes but the rollout's).
PHASES = getattr(train, "PHASES", ("rollout", "dynamics", "critic_update", "actor_update"))
OBS, ACT = 11, 3


def make_config(algo, work):
  if work == "paper":
    return config_lib.make_config("hopper-medium-replay", algo)
  if work == "mixed":   # the paper's mixed-dataset settings (config._MIXED), one for all of them
    return config_lib.make_config("hopper-random-medium-50pct", algo)
  return config_lib.make_config(
      "hopper-medium", algo, num_critics=10, actor_hidden=(256,) * 3, critic_hidden=(256,) * 3,
      batch_size=256, steps_per_epoch=1000, rollout_batch_size=50_000, rollout_length=5,
      buffer_retain_epochs=5, real_ratio=0.05, dyn_members=7, dyn_elites=5,
      dyn_hidden=(200,) * 4, beta=0.5)


@contextlib.contextmanager
def one_piece():
  """The rollout traced in one piece (XLA's cost analysis counts a loop's body once): this tree's
  rewrites.Rewrites(predict_rows=None), an older tree's PREDICT_ROWS made huge."""
  try:
    # Imported here: an older tree (PYTHONPATH=<old checkout>) has no such module.
    from mombo_jax.core import rewrites
  except ImportError:
    rewrites = None
  if rewrites is not None:
    with rewrites.tracing(dataclasses.replace(rewrites.choose(), predict_rows=None)):
      yield
    return
  saved = dynamics.PREDICT_ROWS, train._POLICY_ROWS
  dynamics.PREDICT_ROWS = train._POLICY_ROWS = 1 << 40
  try:
    yield
  finally:
    dynamics.PREDICT_ROWS, train._POLICY_ROWS = saved


@contextlib.contextmanager
def unrolled_scans():
  """jax.lax.scan unrolled (the rollout's 5 steps), for XLA's cost analysis only."""
  orig = jax.lax.scan

  def scan(f, init, xs=None, length=None, reverse=False, unroll=1, **kw):
    return orig(f, init, xs, length, reverse=reverse, unroll=True, **kw)
  jax.lax.scan = scan
  try:
    yield
  finally:
    jax.lax.scan = orig


def pieces(config):
  """((rollout fn, args), (step fn, args)) of one cell at config's sizes (random networks)."""
  rng = np.random.default_rng(0)
  n = 20_000
  f = lambda *s: jnp.asarray(rng.normal(size=s).astype(np.float32))  # noqa: E731
  z = lambda *s: jnp.zeros(s, jnp.float32)  # noqa: E731
  obs, nxt, rew = 0.3 * f(n, OBS), 0.3 * f(n, OBS), f(n)
  real = buffer.Batch(obs=obs, action=jnp.tanh(f(n, ACT)), reward=rew, next_obs=nxt, done=z(n),
                      obs_var=z(n, OBS), next_obs_mean=nxt, next_obs_var=z(n, OBS),
                      reward_mean=rew, reward_var=z(n))
  key = jax.random.PRNGKey(0)
  dyn = jax.jit(lambda k: dynamics.init_state(k, OBS, ACT, config))(key)
  state = jax.jit(train.init, static_argnums=1)(key, config, real, dyn)
  agent, ring = state.agent, state.buffer
  term_fn = termination.termination_fn(config.env_name)

  def roll(key, agent, ring):
    k_start, k_roll = jax.random.split(key)
    start = jax.random.randint(k_start, (config.rollout.rollout_batch_size,), 0, n)
    policy_fn = functools.partial(train._policy, agent, config)
    with jax.named_scope("rollout"):
      return rollout.run(k_roll, policy_fn, dyn, buffer.take(real, start).obs, ring, config,
                         term_fn)

  target_fn = targets.bind(config, dyn, term_fn)
  n_real = buffer.real_rows(config.agent.batch_size, config.rollout.real_ratio)

  def step(agent, ring, key):
    k_batch, k_update = jax.random.split(key)
    batch = buffer.sample_mixed(real, ring, k_batch, config.agent.batch_size, n_real)
    return sac.update(agent, batch, k_update, target_fn, config)

  return (roll, (jax.random.PRNGKey(1), agent, ring)), (step, (agent, ring, jax.random.PRNGKey(2)))


def _phases_of(stack: str):
  return [p for p in PHASES if re.search(rf"(^|/){p}(/|$)", stack)] or ["other"]


def jaxpr_counts(fn, *args):
  """{phase: [flops, ops]} of one call, from its jaxpr (dead code dropped, as XLA drops it)."""
  # JAX internals: only this count needs dce_jaxpr (as common.jaxpr_flops, which imports it so).
  from jax._src.interpreters import partial_eval as pe
  jaxpr = jax.make_jaxpr(fn)(*args).jaxpr
  jaxpr, _ = pe.dce_jaxpr(jaxpr, [True] * len(jaxpr.outvars))
  out = collections.defaultdict(lambda: [0.0, 0])

  def walk(jaxpr, prefix, times):
    for eqn in jaxpr.eqns:
      stack = "/".join(s for s in (prefix, str(eqn.source_info.name_stack)) if s)
      subs = list(common._sub_jaxprs(eqn.params))
      if eqn.primitive.name == "cond":      # the costliest branch, as common.jaxpr_flops
        subs = [max(subs, key=common._jaxpr_flops)]
      if subs:
        n = eqn.params.get("length", 1) if eqn.primitive.name == "scan" else 1
        for sub in subs:
          walk(sub, stack, times * n)
        continue
      flops = common._jaxpr_flops(types.SimpleNamespace(eqns=[eqn]))
      for phase in _phases_of(stack):
        out[phase][0] += times * flops
        out[phase][1] += times
  walk(jaxpr, "", 1)
  return dict(out)


_INSTR = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = \w+\[([\d,]*)\]")
_DOT = re.compile(r" dot\(%([\w.\-]+), %([\w.\-]+)\).*?lhs_contracting_dims=\{([\d,]*)\}")


def hlo_counts(text):
  """({phase: dot flops}, {phase: instructions}) of an optimised HLO module's text, each with a
  "_total" (an instruction counts in every phase its op_name names). Instructions: those of the
  entry and control-flow computations (a fusion counts one; its insides, parameters, constants,
  tuples and bitcasts none); dots: every dot's 2MNK, inside fusions too."""
  dots, ops = collections.Counter(), collections.Counter()
  fused = set(re.findall(r"calls=%?([\w.\-]+)", text))
  skip = ("parameter(", "constant(", "tuple(", "get-tuple-element(", "bitcast(")
  current, shapes = None, {}
  for line in text.splitlines():
    head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) ", line)
    if head and line.rstrip().endswith("{"):
      current, shapes = head.group(1), {}
      continue
    instr = _INSTR.match(line)
    if not instr:
      continue
    out = [int(x) for x in instr.group(2).split(",") if x]
    shapes[instr.group(1)] = out
    m = re.search(r'op_name="([^"]*)"', line)
    phases = _phases_of(m.group(1) if m else "") + ["_total"]
    dot = _DOT.search(line)
    flops = 0.0
    if dot and dot.group(1) in shapes:
      lhs = shapes[dot.group(1)]
      k = np.prod([lhs[int(i)] for i in dot.group(3).split(",") if i], dtype=np.float64)
      flops = 2.0 * np.prod(out, dtype=np.float64) * k
    for phase in phases:
      dots[phase] += flops
      if current not in fused and not any(s in line for s in skip):
        ops[phase] += 1
  return dots, ops


def xla_counts(fn, *args):
  """(XLA's FLOPs, dots, ops: hlo_counts) of fn compiled as the package compiles its programs
  (xla_options), through a fresh wrapper: a cached trace (make_jaxpr's) is not reused."""
  options = getattr(train, "xla_options", None)
  options = options.options() if options is not None else None
  compiled = jax.jit(lambda *a: fn(*a), compiler_options=options).lower(*args).compile()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  dots, ops = hlo_counts(compiled.as_text())
  return float(cost.get("flops", 0.0)), dots, ops


def count(algo, work):
  config = make_config(algo, work)
  steps = config.steps_per_epoch
  (roll, roll_args), (step, step_args) = pieces(config)
  with one_piece():
    roll_j = jaxpr_counts(roll, *roll_args)
    with unrolled_scans():
      roll_x, roll_dots, roll_ops = xla_counts(roll, *roll_args)
  step_j = jaxpr_counts(step, *step_args)
  step_x, step_dots, step_ops = xla_counts(step, *step_args)
  rows = {}
  # A rollout equation is in `rollout` (and maybe `dynamics`); a step's in critic/actor/other.
  for phase in PHASES + ("other",):
    j = [roll_j.get(phase, [0, 0])[i] + steps * step_j.get(phase, [0, 0])[i] for i in (0, 1)]
    rows[phase] = dict(jflops=j[0], jops=j[1])
  roll_total_j = roll_j["rollout"][0]
  step_total_j = sum(v[0] for k, v in step_j.items() if k in ("critic_update", "actor_update",
                                                                "other"))
  # XLA's FLOPs split over the phases by their shares of XLA's dot FLOPs (the dots are the bulk).
  def split(total, dots, phase):
    return total * dots.get(phase, 0.0) / dots["_total"] if dots["_total"] else 0.0
  rows["rollout"].update(xflops=roll_x, hops=roll_ops["_total"])
  rows["dynamics"].update(
      xflops=split(roll_x, roll_dots, "dynamics") + steps * split(step_x, step_dots, "dynamics"),
      hops=roll_ops.get("dynamics", 0) + steps * step_ops.get("dynamics", 0))
  for phase in ("critic_update", "actor_update", "other"):
    rows[phase].update(xflops=steps * split(step_x, step_dots, phase),
                       hops=steps * step_ops.get(phase, 0))
  epoch = dict(jflops=roll_total_j + steps * step_total_j, xflops=roll_x + steps * step_x,
               hops=roll_ops["_total"] + steps * step_ops["_total"])
  return config, rows, epoch, dict(roll_x=roll_x, step_x=step_x, roll_j=roll_total_j,
                                   step_j=step_total_j, step_hops=step_ops["_total"],
                                   roll_hops=roll_ops["_total"])


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--algos", default="mombo,mobile,mopo")
  p.add_argument("--work", default="paper", choices=("paper", "peers", "mixed"))
  args = p.parse_args()
  common.print_header("bench_phase_counts")
  print(f"tree: {os.path.dirname(os.path.dirname(os.path.abspath(mombo_jax.__file__)))}; "
        f"work: {args.work}; backend: {jax.default_backend()}")
  for algo in args.algos.split(","):
    config, rows, epoch, parts = count(algo, args.work)
    print(f"\n## {config.algorithm.label}: rollout {config.rollout.rollout_batch_size} x "
          f"{config.rollout.rollout_length}, {config.steps_per_epoch} steps, critics "
          f"{config.agent.num_critics} x {config.agent.critic_hidden}, actor "
          f"{config.agent.actor_hidden}, dynamics {config.dynamics.dyn_members} x "
          f"{config.dynamics.dyn_hidden}")
    print("| phase | jaxpr GFLOP | jaxpr ops | XLA GFLOP | HLO ops |")
    print("|---|---|---|---|---|")
    for phase, r in rows.items():
      print(f"| {phase} | {r['jflops'] / 1e9:.1f} | {r['jops']:,} | {r['xflops'] / 1e9:.1f} | "
            f"{r['hops']:,} |")
    print(f"| **epoch** | {epoch['jflops'] / 1e9:.1f} | | {epoch['xflops'] / 1e9:.1f} | "
          f"{epoch['hops']:,} |")
    print(f"rollout: jaxpr {parts['roll_j'] / 1e9:.2f} GFLOP, XLA {parts['roll_x'] / 1e9:.2f} "
          f"GFLOP, {parts['roll_hops']} HLO ops; one step: jaxpr {parts['step_j'] / 1e9:.3f}, "
          f"XLA {parts['step_x'] / 1e9:.3f} GFLOP, {parts['step_hops']} HLO ops; XLA / jaxpr "
          f"(epoch) {epoch['xflops'] / epoch['jflops']:.3f}", flush=True)
  print(f"\nload average at end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
  main()
