"""The CPU learning comparison of issue #49 item 3: MOMBO `elite_spread` and `lcb` at
--moments=diagonal vs lowrank, read from the runs' metrics.csv at the last epoch all four
evaluated on every seed (benchmarks/device/learning.py's common_epoch: AULCs over one horizon).

  python3 -m benchmarks.learning.lowrank_compare \
      [--dir=benchmarks/learning/hopper-random-lowrank-cpu]

--dir holds metrics_<name>.csv for name in NAMES (copied from the runs' folders).
"""
import argparse
import os

import numpy as np

from benchmarks.device.learning import common_epoch, every_seed
from mombo_jax.records import outputs

NAMES = ("mombo-elite_spread", "mombo-elite_spread-lowrank", "mombo-lcb", "mombo-lcb-lowrank")


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--dir", default=os.path.join(os.path.dirname(__file__),
                                               "hopper-random-lowrank-cpu"))
  p.add_argument("--seeds", type=int, default=4)
  args = p.parse_args()
  seeds = list(range(args.seeds))
  rows = {n: outputs.read_rows(os.path.join(args.dir, f"metrics_{n}.csv")) for n in NAMES}
  table(rows, seeds, "all four")
  for pair in (NAMES[:2], NAMES[2:]):
    table({n: rows[n] for n in pair}, seeds, "each pair")


def table(rows, seeds, which):
  """The runs of `rows` at the last epoch all of them evaluated on every seed."""
  common = common_epoch(rows, seeds)
  print(f"\n{which}: normalised score at epoch {common} (the last all of them evaluated on all "
        f"{len(seeds)} seeds), mean +- std over seeds (ddof 0); AULC over the evaluations up to "
        "it; penalty and target_std: the seeds' means of the last training-metrics row there")
  print("| run | last epoch evaluated | final | AULC | final per seed | penalty | target_std |")
  print("|---|---|---|---|---|---|---|")
  for name, got in rows.items():
    kept = [r for r in every_seed(got, seeds) if r["epoch"] <= common]
    last = max((r["epoch"] for r in got), default=0)
    if not kept:
      print(f"| {name} | {last} | - | - | - | - | - |")
      continue
    s = outputs.summarise(kept, seeds)
    at = [r for r in kept if r["epoch"] == common]
    mean = lambda k: np.mean([r.get(k, np.nan) for r in at])  # noqa: E731
    print(f"| {name} | {last} | {s['final_normalized_score_mean']:.1f} +- "
          f"{s['final_normalized_score_std']:.1f} | {s['aulc_mean']:.1f} +- {s['aulc_std']:.1f} | "
          f"{', '.join(f'{x:.1f}' for x in s['final_normalized_score'])} | "
          f"{mean('penalty'):.3g} | {mean('target_std'):.3g} |")


if __name__ == "__main__":
  main()
