"""Measurements shared by the benchmarks: this machine's matmul throughput and XLA's FLOP count."""
import os
import time

import jax
import jax.numpy as jnp


def matmul_gflops(rows: int, width: int, seconds: float = 5.0, chain: int = 64) -> float:
  """This machine's float32 matmul throughput (GFLOP/s) at a network layer's shapes: the best of
  repeated jitted chains of [rows, width] x [width, width] products over `seconds`. At these
  (small) shapes the figure includes XLA's per-op overhead, so it bounds what a train step of such
  layers can reach better than the CPU's peak does."""
  x = jnp.ones((rows, width), jnp.float32)
  w = jnp.full((width, width), 1.0 / width, jnp.float32)

  @jax.jit
  def products(x, w):
    return jax.lax.fori_loop(0, chain, lambda _, y: y @ w, x)

  products(x, w).block_until_ready()
  flops = 2.0 * rows * width * width * chain
  best, t_end = 0.0, time.perf_counter() + seconds
  while time.perf_counter() < t_end:
    t = time.perf_counter()
    products(x, w).block_until_ready()
    best = max(best, flops / (time.perf_counter() - t))
  return best / 1e9


def xla_flops(compiled) -> float:
  """FLOPs of one call of a compiled function (jax `.lower(...).compile()`), by XLA's cost
  analysis. A while loop's body counts once, whatever its trip count: count a scan's step on its
  own and multiply."""
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return float(cost["flops"])


def cpu_name() -> str:
  """The CPU's model name (/proc/cpuinfo) and core count, for the hardware line of a record."""
  try:
    with open("/proc/cpuinfo") as f:
      name = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
  except (OSError, StopIteration):
    name = "unknown CPU"
  return f"{name}, {os.cpu_count()} cores"


def print_header(name: str):
  """The first lines of a record: the benchmark, the hardware, JAX's devices and the load."""
  print(f"# {name}")
  print(f"hardware: {cpu_name()}; devices: {jax.device_count()} x "
        f"{jax.devices()[0].device_kind} ({jax.default_backend()}); jax {jax.__version__}")
  print(f"load average at start: {os.getloadavg()[0]:.1f}")
