"""Part a of the device record: the facts a number needs beside it. The GPU and its driver
(nvidia-smi), JAX's devices and version, every installed package's version (pip freeze), the host's
CPU, cores and memory, Python, the kit's manifest (dataset, wheels, the commit prepared)."""
import json
import os
import platform
import subprocess
import sys
import time

from benchmarks.device import kit as kit_lib


def _run(cmd) -> str:
  try:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    return (out.stdout + out.stderr).strip() or f"(no output, exit {out.returncode})"
  except (OSError, subprocess.TimeoutExpired) as e:
    return f"(not available: {e})"


def main():
  args = kit_lib.part_args(__doc__)
  print(f"# Device record, part a: the facts "
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})")
  print(f"host: {platform.node()}; {platform.platform()}; Python {sys.version.split()[0]} "
        f"({sys.executable})")
  from benchmarks import common  # /proc/cpuinfo's model name and the core count
  print(f"CPU: {common.cpu_name()}; load average {os.getloadavg()[0]:.1f}")
  try:
    with open("/proc/meminfo") as f:
      print(f"memory: {f.readline().split(':', 1)[1].strip()}")
  except OSError:
    pass
  print("\n## GPU (nvidia-smi)")
  print(_run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_cap,"
              "clocks.max.sm,power.limit", "--format=csv"]))
  import jax
  print("\n## JAX")
  print(f"jax {jax.__version__}; backend {jax.default_backend()}; devices: "
        + ", ".join(f"{d.device_kind} ({d.platform})" for d in jax.devices()))
  from mombo_jax.core import cell_layout
  from mombo_jax.settings import environment
  print(f"cell layout: {cell_layout.layout(environment.cells())}")
  print("\n## The kit (benchmarks.device.prepare's manifest)")
  print(json.dumps(kit_lib.read_manifest(args.kit), indent=1))
  print(f"commit of this checkout: {kit_lib.git_commit()}")
  print("\n## Every installed package (pip freeze; the carried wheels are first on the path)")
  print(_run([sys.executable, "-m", "pip", "freeze", "--all"]))
  site = os.environ.get("PYTHONPATH", "").split(os.pathsep)[0]
  if site and os.path.isdir(site) and site != kit_lib.ROOT:
    print(f"\n## Installed from the carried wheels into {site}")
    print(_run([sys.executable, "-m", "pip", "list", "--path", site, "--format=freeze"]))
  kit_lib.write_rates(args.work, "a", {"device": ", ".join(d.device_kind for d in jax.devices()),
                                       "jax": jax.__version__, "cores": os.cpu_count()})


if __name__ == "__main__":
  main()
