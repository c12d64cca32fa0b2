"""Profile: where one update of the collector's online SAC spends its time on CPU (#11's speed gap).

  python -m benchmarks.profile_sac_update                  # -> benchmarks/profile_sac_update.txt

Compiles the collector's own `train` chunk (online_sac._make_jitted: hopper dims, [256, 256] nets,
batch 256), traces --updates updates with jax.profiler (a Perfetto trace, parsed here), and prints
per XLA:CPU thunk: time per update, share of the update, its output shape and the JAX operation it
comes from. Summary lines: updates/s under the profiler, the share of matrix products (XLA `dot`
thunks and YNNPACK dot fusions) and how many thunks an update runs.
"""
import argparse
import collections
import glob
import gzip
import json
import os
import re
import tempfile
import time

import jax
import numpy as np

from benchmarks import common


def hlo_ops(hlo_text: str) -> dict:
  """{instruction name: (output shape, short JAX op name)} from compiled HLO text."""
  ops = {}
  for line in hlo_text.splitlines():
    m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = (\S+) ", line)
    if m:
      src = re.search(r'op_name="([^"]*)"', line)
      ops[m.group(1)] = (m.group(2), "/".join(src.group(1).split("/")[-3:]) if src else "")
  return ops


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--updates", type=int, default=200)
  p.add_argument("--top", type=int, default=25)
  args = p.parse_args()
  from mombo_jax.collection import online_sac
  from mombo_jax.core import sac
  common.print_header("profile_sac_update")
  print(f"# {args.updates} SAC updates traced (hopper dims, [256, 256] nets, batch 256, replay "
        "of 50,000 rows)")
  cfg = online_sac.online_config("hopper", (256, 256), 256)
  _, train = online_sac._make_jitted(cfg)
  agent = sac.init_agent(jax.random.key(0), 11, 3, cfg, 1)
  n, rng = 50_000, np.random.default_rng(0)
  replay = jax.device_put({
      "obs": rng.standard_normal((n, 11), np.float32),
      "action": rng.uniform(-1, 1, (n, 3)).astype(np.float32),
      "reward": rng.standard_normal(n).astype(np.float32),
      "next_obs": rng.standard_normal((n, 11), np.float32),
      "terminated": np.zeros(n, np.float32)})
  keys = jax.random.split(jax.random.key(1), args.updates)
  compiled = train.lower(agent, replay, np.int32(n), keys).compile()
  ops = hlo_ops(compiled.as_text())
  agent = compiled(agent, replay, np.int32(n), keys)
  jax.block_until_ready(agent)
  t0 = time.perf_counter()
  agent = compiled(agent, replay, np.int32(n), keys)
  jax.block_until_ready(agent)
  plain = args.updates / (time.perf_counter() - t0)
  with tempfile.TemporaryDirectory() as tmp:
    jax.profiler.start_trace(tmp, create_perfetto_trace=True)
    t0 = time.perf_counter()
    agent = compiled(agent, replay, np.int32(n), keys)
    jax.block_until_ready(agent)
    traced_s = time.perf_counter() - t0
    jax.profiler.stop_trace()
    path = glob.glob(os.path.join(tmp, "**", "perfetto_trace.json.gz"), recursive=True)[-1]
    trace = json.load(gzip.open(path))
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  per_op = collections.defaultdict(lambda: [0, 0.0])        # name -> [calls, total us]
  for e in events:
    if e.get("ph") == "X" and e.get("name") in ops:
      per_op[e["name"]][0] += 1
      per_op[e["name"]][1] += e.get("dur", 0.0)
  update_us = traced_s * 1e6 / args.updates
  busy = sum(v[1] for v in per_op.values()) / args.updates
  is_dot = lambda name: name.startswith(("dot", "ynn_fusion"))  # noqa: E731
  dot_us = sum(v[1] for k, v in per_op.items() if is_dot(k)) / args.updates
  print(f"# {plain:.1f} updates/s without the profiler, {args.updates / traced_s:.1f} with it "
        f"({update_us:.0f} us per update)")
  print(f"# thunks per update: {sum(v[0] for v in per_op.values()) / args.updates:.0f} "
        f"({len(per_op)} distinct); their time adds up to {busy:.0f} us per update (thunks may "
        "overlap on the 2 cores)")
  print(f"# matrix products (XLA dot thunks and YNNPACK dot fusions): {dot_us:.0f} us per "
        f"update = {100 * dot_us / max(busy, 1e-9):.0f}% of the thunks' time; the other thunks "
        f"{busy - dot_us:.0f} us")
  print("\n| thunk | us / update | % of thunk time | output | from |\n|---|---|---|---|---|")
  for name, (calls, total) in sorted(per_op.items(), key=lambda kv: -kv[1][1])[:args.top]:
    shape, src = ops[name]
    print(f"| {name} | {total / args.updates:.0f} | {100 * total / args.updates / busy:.1f} | "
          f"{shape} | {src} |")


if __name__ == "__main__":
  main()
