"""Prepare a lent device's record on the CPU (issue #36): everything the record needs, in one
git-ignored folder (.device_record/, benchmarks/device/kit.py), then the exact `run` call.

  python3 -m benchmarks.device.prepare           # build what is missing, check, print the call
  python3 -m benchmarks.device.prepare --check   # only check what is there (exit 1 if not ready)
                                                 # and name the plan the newest record lacks
  python3 -m benchmarks.device.prepare --smoke --kit=/tmp/kit --no_wheels   # a tiny kit (tests)

1. The wheels the device image lacks (kit.WHEELS: mujoco, mujoco-core, glfw, pyopengl, gymnasium,
   farama-notifications, minari), for its Python 3.12 on manylinux x86-64, one version each: the
   version installed here (this project's pins), by pip download.
2. Part d's dataset (hopper-medium-replay: learning.py's docstring says why) as a Minari dataset
   built by the project's own collector (experiments.collect: an online SAC run up to its medium
   point, the replay buffer up to there) into the kit's Minari root. THIS TAKES ~30-50 MINUTES ON
   2 CORES: 49 min on the project's 2-core Xeon, loaded (benchmarks/datasets/build_log.txt, 220k
   SAC steps), 26 min for an earlier 200k-step build (benchmarks/learning/README.md). A lent
   session starts it first, in the background, and its device call when it is done. It resumes
   where it stopped (the collector's checkpoints in .device_record/build/).
3. The manifest (dataset, its size, the wheels, the commit) and the size check: the working tree
   that a `run` call sends plus the carried paths must fit in 64 MiB.
4. The plan to run (benchmarks/device/sizing.PLANS): the first the newest committed record under
   benchmarks/device/records/ lacks (lacking_plans: a part is recorded when its files are in the
   folder and one of the folder's record*.json ran it; part d when its table is at the epoch all
   three reached, which its record.json says with `d_epochs_asked`).
Then it prints the carry list and the one `run` call, with that plan.

Run it in the checkout the session's device tool sends (the session's own, not a helper's
worktree): only that checkout travels.
"""
import argparse
import importlib.metadata
import json
import os
import subprocess
import sys
import time

from benchmarks.device import kit as kit_lib, record as record_lib, sizing

DATASET = "hopper-medium-replay"
SAC_STEPS = 400_000      # the collector stops at the medium point (~220k on hopper), well before
SMOKE_DATASET, SMOKE_STEPS = "hopper-random", 2000
BUDGET_S, TIMEOUT_S = 480, 540
# The command of the one `run` call; $OUT is the device's.
RUN_COMMAND = (f"PYTHONUNBUFFERED=1 python3 -m benchmarks.device.record --out=$OUT "
               f"--budget_s={BUDGET_S}")
RECORDS = os.path.join(kit_lib.ROOT, "benchmarks", "device", "records")


def newest_record(records: str = RECORDS):
  """The newest record's folder (<date>-<device>/: the names sort by date), or None."""
  folders = sorted(d for d in os.listdir(records) if os.path.isdir(os.path.join(records, d))) \
      if os.path.isdir(records) else []
  return os.path.join(records, folders[-1]) if folders else None


def missing_parts(folder: str) -> dict:
  """{part: why it is not recorded} over every plan's parts, for one record's folder."""
  ran, rates = set(), {}
  for name in sorted(os.listdir(folder)):
    if name.startswith("record") and name.endswith(".json"):
      with open(os.path.join(folder, name)) as f:
        rec = json.load(f)
      ran |= {p for p, r in rec.get("parts", {}).items() if not r.get("killed")}
      rates.update(rec.get("rates", {}))
  out = {}
  for part in sizing.PARTS:
    gone = [n for n in record_lib.FILES[part] if not os.path.exists(os.path.join(folder, n))]
    if gone:
      out[part] = f"{', '.join(gone)} missing"
    elif part not in ran:
      out[part] = "no record.json of the folder ran it (made by hand)"
    elif part == "d" and "d_epochs_asked" not in rates:
      out[part] = "its table ranks AULCs over unequal epochs (before equal epochs, issue #43)"
  return out


def lacking_plans(folder) -> list:
  """[(plan, {part: why})] of the plans the record in `folder` lacks, in sizing.PLANS's order
  (every plan when there is no record)."""
  if folder is None:
    return [(plan, {p: "no record yet" for p in parts}) for plan, parts in sizing.PLANS.items()]
  missing = missing_parts(folder)
  return [(plan, {p: missing[p] for p in parts if p in missing})
          for plan, parts in sizing.PLANS.items() if any(p in missing for p in parts)]


def download_wheels(kit, say):
  """Each of kit.WHEELS at the version installed here, for the device's Python; other versions of
  it in the kit are removed (two versions stop the device's install)."""
  folder = kit_lib.kit_path(kit, "whl")
  os.makedirs(folder, exist_ok=True)
  for name in kit_lib.WHEELS:
    version = importlib.metadata.version(name)
    stem = name.replace("-", "_").lower()
    present = [f for f in os.listdir(folder) if f.lower().startswith(stem + "-")]
    if any(f.lower().startswith(f"{stem}-{version}-") for f in present):
      continue
    for f in present:
      os.remove(os.path.join(folder, f))
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", kit_lib.PYTHON_VERSION, "--implementation", "cp", "-d", folder]
    for p in kit_lib.PLATFORMS:
      cmd += ["--platform", p]
    subprocess.run(cmd + [f"{name}=={version}"], check=True)
    say(f"wheel: {name}=={version}")


def build_dataset(kit, dataset, smoke, say) -> float:
  """The collector, into the kit's Minari root (skipped when the dataset is there). Returns the
  build's seconds."""
  env = dict(os.environ, MINARI_DATASETS_PATH=kit_lib.kit_path(kit, "minari"),
             PYTHONPATH=os.pathsep.join(p for p in (kit_lib.ROOT, os.environ.get("PYTHONPATH"))
                                        if p))
  cmd = [sys.executable, "-m", "experiments.collect", f"--env={dataset}",
         f"--workdir={kit_lib.kit_path(kit, 'build', 'collect')}"]
  cmd += [f"--steps={SMOKE_STEPS}"] if smoke else [f"--sac_steps={SAC_STEPS}"]
  os.makedirs(kit_lib.kit_path(kit, "build"), exist_ok=True)
  say(f"building {dataset}" + ("" if smoke else " (~30-50 min on 2 cores)") + f": "
      f"{' '.join(cmd[1:])}; log in {kit_lib.kit_path(kit, 'build', 'collect.log')}")
  t = time.time()
  with open(kit_lib.kit_path(kit, "build", "collect.log"), "a") as log:
    subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, check=True,
                   cwd=kit_lib.ROOT)
  return time.time() - t


def dataset_facts(kit, dataset) -> dict:
  """The dataset's Minari id, transitions and bytes in the kit (None values when missing)."""
  from mombo_jax.data import names
  minari_id = names.minari_id(dataset)
  path = kit_lib.kit_path(kit, "minari", minari_id)
  if not os.path.isdir(os.path.join(path, "data")):
    return {"dataset": dataset, "minari_id": minari_id, "transitions": None, "bytes": None}
  with open(os.path.join(path, "data", "metadata.json")) as f:
    meta = json.load(f)
  return {"dataset": dataset, "minari_id": minari_id, "transitions": meta.get("total_steps"),
          "bytes": kit_lib.folder_bytes(kit_lib.kit_path(kit, "minari"))}


def carry_list(kit) -> list:
  """The carried paths, relative to the checkout's root (kit.CARRY for the default kit)."""
  return [os.path.relpath(kit_lib.kit_path(kit, os.path.relpath(p, kit_lib.KIT)), kit_lib.ROOT)
          for p in kit_lib.CARRY]


def check(kit, dataset, need_wheels, say, need_dataset=True) -> bool:
  """Is the kit ready? Says what is missing, the sizes, and whether they fit. need_dataset: the
  plan has part d (the speed plan reads random data: no dataset)."""
  ok = True
  wheels = [os.path.basename(w) for w in kit_lib.wheels(kit)]
  for name in kit_lib.WHEELS if need_wheels else ():
    stem = name.replace("-", "_").lower()
    have = [w for w in wheels if w.lower().startswith(stem + "-")]
    if len(have) != 1:
      say(f"missing: the wheel of {name} ({len(have)} found; one version each)")
      ok = False
  facts = dataset_facts(kit, dataset)
  if facts["transitions"] is None and need_dataset:
    say(f"missing: the dataset {dataset} ({facts['minari_id']}) in "
        f"{kit_lib.kit_path(kit, 'minari')}")
    ok = False
  manifest = kit_lib.read_manifest(kit)
  if manifest is None or (need_dataset and manifest.get("dataset") != dataset):
    say(f"missing: {kit_lib.kit_path(kit, kit_lib.MANIFEST)} for {dataset}")
    ok = False
  tree = kit_lib.tree_bytes()
  carried = {p: kit_lib.folder_bytes(os.path.join(kit_lib.ROOT, p)) for p in carry_list(kit)}
  total = tree + sum(carried.values())
  say(f"size: working tree {tree / 2**20:.1f} MiB + " + " + ".join(
      f"{p} {b / 2**20:.1f} MiB" for p, b in carried.items())
      + f" = {total / 2**20:.1f} MiB of {kit_lib.LIMIT_BYTES / 2**20:.0f} MiB")
  if total > kit_lib.LIMIT_BYTES:
    say(f"error: {total / 2**20:.1f} MiB is past the {kit_lib.LIMIT_BYTES / 2**20:.0f} MiB a run "
        "call carries: remove untracked files from the checkout (git status), or build a smaller "
        "dataset")
    ok = False
  return ok


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--check", action="store_true", help="Only check what is there.")
  parser.add_argument("--smoke", action="store_true",
                      help=f"A tiny kit: {SMOKE_DATASET}, {SMOKE_STEPS} steps (for the tests).")
  parser.add_argument("--kit", default=None, help=f"The kit's folder (default {kit_lib.KIT}).")
  parser.add_argument("--plan", choices=sorted(sizing.PLANS), default=None,
                      help="The plan to prepare for (default: the first the newest committed "
                      "record lacks); only `learning` needs the dataset.")
  parser.add_argument("--no_wheels", action="store_true", help="Neither download nor require "
                      "the wheels (a CPU smoke record, where they are installed).")
  args = parser.parse_args(argv)
  say = lambda line: print(f"[prepare] {line}", flush=True)  # noqa: E731
  dataset = SMOKE_DATASET if args.smoke else DATASET
  folder = newest_record()
  lacking = lacking_plans(folder)
  plan = args.plan or (lacking[0][0] if lacking else "speed")
  needs_dataset = "d" in sizing.PLANS[plan]
  if not args.check:
    if not args.no_wheels:
      download_wheels(args.kit, say)
    build_s = None
    if needs_dataset and dataset_facts(args.kit, dataset)["transitions"] is None:
      build_s = build_dataset(args.kit, dataset, args.smoke, say)
    old = kit_lib.read_manifest(args.kit) or {}
    manifest = dict(dataset_facts(args.kit, dataset), smoke=args.smoke,
                    wheels=[os.path.basename(w) for w in kit_lib.wheels(args.kit)],
                    commit=kit_lib.git_commit(),
                    prepared=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    build_s=round(build_s, 1) if build_s is not None else old.get("build_s"))
    with open(kit_lib.kit_path(args.kit, kit_lib.MANIFEST), "w") as f:
      json.dump(manifest, f, indent=1)
  ready = check(args.kit, dataset, not args.no_wheels, say, needs_dataset)
  say(f"newest record: {os.path.relpath(folder, kit_lib.ROOT) if folder else 'none'}")
  for name, why in lacking:
    say(f"it lacks plan {name}: " + "; ".join(f"part {p}: {w}" for p, w in why.items()))
  say(f"plan: {plan}" + (" (--plan)" if args.plan else "" if lacking else
                         " (the newest record has every plan: speed again, the numbers that "
                         "change most)") + ("" if needs_dataset else ": no dataset needed"))
  carry = carry_list(args.kit)
  command = RUN_COMMAND + f" --plan={plan}" + (
      "" if args.kit is None else
      f" --kit={os.path.relpath(kit_lib.kit_path(args.kit), kit_lib.ROOT)}")
  print("\ncarry: " + json.dumps(carry))
  print(f"run: command={json.dumps(command)} carry={json.dumps(carry)} timeout_s={TIMEOUT_S}")
  if not ready:
    say("NOT READY: see the lines above" + ("" if args.check else ""))
    return 1
  say("ready")
  return 0


if __name__ == "__main__":
  sys.exit(main())
