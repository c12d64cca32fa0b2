"""Part e of the device record, if time is left: the paper's Table 2 (accuracy and tightness of each
algorithm's uncertainty quantifier, experiments.uncertainty --states=policy) on part d's runs,
beside the paper's numbers (uncertainty.md, which the part prints into e_uncertainty.md).

At the paper's settings (100 model draws per tuple, 1000 policy samples, 10 episodes per seed)
when the part has REDUCED_BELOW_S seconds or more, else at a reduced one (2 episodes per seed, 20
draws, 200 policy samples), said in the file.
"""
import json
import os
import subprocess
import sys

from benchmarks.device import kit as kit_lib

REDUCED_BELOW_S = 150.0
REDUCED = ["--episodes=2", "--draws=20", "--num_policy=200"]
SMOKE = ["--episodes=1", "--draws=2", "--num_policy=4", "--every=50"]


def main():
  args = kit_lib.part_args(__doc__)
  with open(os.path.join(args.work, "rates_d.json")) as f:
    d = json.load(f)
  runs = os.path.join(d["d_root"], d["d_dataset"])
  out = os.path.join(args.work, "table2")
  flags = SMOKE if args.smoke else (REDUCED if args.soft_s < REDUCED_BELOW_S else [])
  cmd = [sys.executable, "-m", "experiments.uncertainty", f"--runs={runs}", "--states=policy",
         f"--out={out}", *flags]
  print(f"# Device record, part e: Table 2 on part d's runs\n$ {' '.join(cmd[2:])}\n"
        + ("(REDUCED settings: " + " ".join(flags) + ")\n" if flags
           else "(the paper's settings)\n"),
        flush=True)
  rc = subprocess.run(cmd, cwd=kit_lib.ROOT, timeout=max(args.soft_s, 1.0)).returncode
  table = os.path.join(out, "uncertainty.md")
  if os.path.exists(table):
    with open(table) as f:
      print("\n" + f.read(), flush=True)
  kit_lib.write_rates(args.work, "e", {"table2_exit": rc})
  sys.exit(rc)


if __name__ == "__main__":
  main()
