"""README command 1 from a fresh clone, timed per phase: install, dataset, dynamics, compile,
training, evaluation, with the machine named. Writes benchmarks/quickstart.txt (issue #28 item 1).

  python3 benchmarks/quickstart.py                      # fresh venv; ~5 min on a quiet 2-core CPU
  python3 benchmarks/quickstart.py --python=system --out=/tmp/q.txt --keep
  python3 benchmarks/quickstart.py --caches=machine     # pip's (and other) caches of this machine

What it does, in a new temporary folder (removed at the end unless --keep):
1. `git clone` of this repository at its HEAD (commit in the record; uncommitted edits are not in
   it), and a Python environment for it: `--python=fresh` (default) a new venv without the
   system's packages, so the command installs every requirement from the packages pip finds
   already downloaded (the machine's pip configuration: wheel folders / local indexes / cache);
   `--python=system` a venv over the system's site-packages (requirements already installed, pip
   only checks them and installs the clone). The venv's creation is timed apart, outside the
   command.
2. README.md's command 1 (the line after `# 1.` in its first bash block), run exactly as written by
   bash in the clone, with the venv first on PATH, a fresh MINARI_DATASETS_PATH and a fresh
   JAX_COMPILATION_CACHE_DIR in the temporary folder (nothing built or compiled before is reused;
   the run's workdir is the clone's runs/), PYTHONPATH unset. With `--caches=fresh` (default)
   pip, matplotlib and everything else that caches under ~/.cache get new empty caches there
   too (PIP_CACHE_DIR, XDG_CACHE_HOME, MPLCONFIGDIR): pip downloads every package from its index
   and matplotlib builds its font cache, as on a new machine; `--caches=machine` keeps this
   machine's, which can make the install several times faster than a new user's (pip's
   configuration, e.g. a local index, is kept either way).
   The command's parts (split at `&&`: the install, then the run) run one after the other as
   separate processes, each timed apart (the record's "install" and "run" rows), their stamped
   lines joined on one clock.
3. Every output line is stamped with the wall seconds since the start and the CPU seconds
   (user + sys) the command's process tree has used so far (/proc: live processes' own and
   reaped children's times), so each phase gets both; the total CPU also comes from
   getrusage(RUSAGE_CHILDREN). On a loaded machine wall time stretches while CPU time hardly does.

Phases, from the run's own log lines: install (start -> pip's "Successfully installed"); start-up
(-> the dataset's "is missing: building" line); dataset (-> the "<name>: N transitions" line);
dynamics ("Training ... dynamics" -> "Dynamics trained in"); compile (-> "Compiled the epoch");
training (epochs x steps x seeds / the last progress line's steps/s, which is of training alone
(the device calls; run/host_run.Pace) as a moving average over the last 3 evaluation intervals:
so this assumes the run's late rate throughout; quickstart.txt recorded before issue #50 read a
wall-clock rate, evaluations included);
evaluations (the rest up to the final line: the evaluation points and checkpoints, which run
beside training on the same cores, and writing the outputs). CPU per phase is the CPU used
between the lines that bound it (training and evaluation share the span after compile and are
given together).
"""
import argparse
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TICK = os.sysconf("SC_CLK_TCK")


def readme_command(readme: str) -> str:
  """The line after `# 1.` in README.md's first ```bash block."""
  with open(readme) as f:
    lines = f.read().splitlines()
  start = lines.index("```bash")
  for i, line in enumerate(lines[start:], start):
    if line.startswith("# 1."):
      return lines[i + 1].strip()
  raise SystemExit(f"{readme}: no `# 1.` line in its first bash block")


def machine() -> list:
  """Model name, cores, memory and load average, as the record's header lines."""
  out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
  info = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
  get = lambda k: info.get(k, "?").strip()
  with open("/proc/meminfo") as f:
    mem_kb = int(f.readline().split()[1])
  load = os.getloadavg()
  return [f"cpu: {get('Model name')}; {os.cpu_count()} logical cores ({get('Thread(s) per core')} "
          f"thread(s) per core, {get('Socket(s)')} socket(s)); {mem_kb / 2**20:.0f} GiB memory",
          f"load average at start (1, 5, 15 min): {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}"]


def tree_cpu(root: int) -> float:
  """CPU seconds (user + sys) of process `root` and its live descendants, each with its reaped
  children's times (cutime + cstime), from /proc."""
  parent, times = {}, {}
  for pid in os.listdir("/proc"):
    if not pid.isdigit():
      continue
    try:
      with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
      continue
    parent[int(pid)] = int(fields[1])
    times[int(pid)] = sum(int(x) for x in fields[11:15])       # utime stime cutime cstime
  total, todo = 0, [root]
  children = {}
  for pid, ppid in parent.items():
    children.setdefault(ppid, []).append(pid)
  while todo:
    pid = todo.pop()
    total += times.get(pid, 0)
    todo += children.get(pid, [])
  return total / TICK


def command_parts(command: str) -> list:
  """[(what, part)] of README command 1, split at `&&`: "install" for a pip install, else "run"."""
  parts = [p.strip() for p in command.split("&&")]
  return [("install" if "pip install" in p else "run", p) for p in parts]


def run_stamped(command, cwd, env, log, start=(0.0, 0.0)):
  """Runs `command` with bash; returns ([(wall s, cpu s, line)], exit code, rusage cpu s), the
  stamps counted from `start` (wall s, cpu s: the parts run before it)."""
  before = resource.getrusage(resource.RUSAGE_CHILDREN)
  t0 = time.monotonic()
  proc = subprocess.Popen(["bash", "-c", command], cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, bufsize=1)
  lines = []
  for line in proc.stdout:
    stamp = (start[0] + time.monotonic() - t0, start[1] + tree_cpu(proc.pid),
             line.rstrip("\n"))
    lines.append(stamp)
    log.write(f"[{stamp[0]:7.1f} s wall {stamp[1]:7.1f} s cpu] {stamp[2]}\n")
    log.flush()
  code = proc.wait()
  wall = time.monotonic() - t0
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
  lines.append((start[0] + wall, start[1] + cpu, "(exit)"))
  return lines, code, cpu


def run_parts(command, cwd, env, log):
  """The command's parts (command_parts) one after the other, as `&&` runs them (a failed part
  ends it). -> (stamped lines of all, one clock, the last "(exit)" the command's; exit code;
  [(what, wall s, cpu s)] per part run)."""
  lines, code, spans, at = [], 0, [], (0.0, 0.0)
  for what, part in command_parts(command):
    log.write(f"# {what}: {part}\n")
    got, code, cpu = run_stamped(part, cwd, env, log, start=at)
    spans.append((what, got[-1][0] - at[0], cpu))
    at = (got[-1][0], at[1] + cpu)
    lines += got[:-1] + [(at[0], at[1], f"({what} done)")]
    if code:
      break
  lines[-1] = (at[0], at[1], "(exit)")
  return lines, code, spans


def first(lines, pattern, after=0):
  """Index of the first line at or after `after` matching `pattern` (regex), else None."""
  for i in range(after, len(lines)):
    if re.search(pattern, lines[i][2]):
      return i
  return None


def phases(lines, steps_per_epoch=None) -> list:
  """[(phase, wall s, cpu s or None, note)] from the stamped log of README command 1; the phases
  tile the command's time (their walls add up to the total)."""
  def at(pattern):
    i = first(lines, pattern)
    return None if i is None else lines[i]

  end = lines[-1]
  # The install's end: its own process's exit where it ran apart (run_parts), else pip's last line.
  marks = [("install", at(r"^\(install done\)$") or at(r"^Successfully installed")),
           ("start-up (imports, flags)", at(r"is missing: building it")),
           ("dataset (build, write, load)", at(r"^\S+: \d+ transitions, obs dim")),
           ("dynamics", at(r"^Dynamics trained in")),
           ("set-up + compile", at(r"^Compiled the epoch in")),
           ("training + evaluation", at(r"final normalised score")),
           ("outputs, exit", end)]
  out, prev = [], (0.0, 0.0, "")
  for name, mark in marks:
    if mark is None:
      out.append((name, None, None, "its closing line is not in the log"))
      continue
    out.append((name, mark[0] - prev[0], mark[1] - prev[1], ""))
    prev = mark
  progress = [l for l in lines if re.match(r"^epoch \d+/\d+ .* \d+ steps/s", l[2])]
  span = next((row for row in out if row[0] == "training + evaluation"), None)
  if progress and steps_per_epoch and span and span[1] is not None:
    m = re.match(r"^epoch (\d+)/(\d+) .* (\d+) steps/s", progress[-1][2])
    epochs, rate = int(m.group(2)), float(m.group(3))
    seeds = len(re.search(r"score per seed \[([^\]]*)\]", progress[-1][2]).group(1).split(","))
    train = epochs * steps_per_epoch * seeds / rate
    i = out.index(span)
    out[i:i + 1] = [
        span,
        ("  of it: training", train, None, f"{epochs} epochs x {steps_per_epoch} steps x {seeds} "
         f"seeds / the last progress line's {rate:.0f} steps/s (of training alone)"),
        # The evaluations run beside training on the same cores: what is left of the span is
        # what they add to it, 0 where the late rate's estimate covers the whole span.
        ("  of it: evaluations, checkpoints", max(0.0, span[1] - train), None,
         "the rest of the span (they run beside training; what they add, not what they take)")]
  out.append(("total (the command)", end[0], end[1], "cpu: getrusage of the children"))
  return out


BUDGET = ("epochs", "steps_per_epoch", "batch_size", "actor_hidden", "critic_hidden",
          "rollout_batch_size", "eval_every", "eval_episodes", "dyn_hidden", "dyn_members",
          "dyn_max_epochs")


def fmt_value(v) -> str:
  """A config value in the record's budget line: layer sizes as 128x128."""
  return "x".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)


def read_run(clone, lines) -> dict:
  """The run folder the final line names (relative to the clone): its config.json, summary.json
  and whether learning_curve.png was written; {} when there is none."""
  import json
  m = next((re.search(r"; wrote (\S+)$", l[2]) for l in lines if "final normalised score" in l[2]),
           None)
  if not m:
    return {}
  path = os.path.join(clone, m.group(1))
  out = dict(workdir=m.group(1), png=os.path.isfile(os.path.join(path, "learning_curve.png")))
  for name in ("config", "summary"):
    with open(os.path.join(path, f"{name}.json")) as f:
      out[name] = json.load(f)
  return out


ZERO_TORQUE = """
import gymnasium as gym, numpy as np
from mombo_jax.data import scores
env, returns = gym.make("Hopper-v5"), []
for seed in range({episodes}):
  env.reset(seed=seed)
  total, done = 0.0, False
  while not done:
    _, r, terminated, truncated, _ = env.step(np.zeros(env.action_space.shape))
    total, done = total + r, terminated or truncated
  returns.append(total)
print(f"{{np.mean(scores.normalized_score('hopper-random', returns)):.1f}}")
"""


def zero_torque_score(python, cwd, env, episodes=10) -> str:
  """For scale beside the run's score: the mean normalised score of the policy that applies no
  torque (Hopper-v5 stands, then falls over), with the run's own normaliser; "n/a" on failure."""
  out = subprocess.run([python, "-c", ZERO_TORQUE.format(episodes=episodes)], cwd=cwd, env=env,
                       capture_output=True, text=True)
  return (out.stdout.strip().splitlines()[-1] if out.returncode == 0 and out.stdout.strip()
          else "n/a")


def run_lines(run) -> list:
  """The record's lines on the run: its budget, per-seed scores and the curve."""
  if not run:
    return ["(no run folder found)"]
  c, s = run["config"], run["summary"]
  return ["budget (config.json): " + ", ".join(f"{k}={fmt_value(c.get(k))}" for k in BUDGET),
          f"per seed: final normalised score {[round(x, 1) for x in s['final_normalized_score']]}"
          f" at epochs {s['epochs']}",
          f"{run['workdir']}/learning_curve.png "
          + ("written" if run["png"] else "MISSING")]


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--python", choices=["fresh", "system"], default="fresh",
                 help="fresh: a new venv, every requirement installed by the command; system: a "
                      "venv over the system's site-packages")
  p.add_argument("--out", default=os.path.join(REPO, "benchmarks", "quickstart.txt"))
  p.add_argument("--label", default="", help="a line added to the record's header (e.g. "
                 "'loaded machine')")
  p.add_argument("--caches", choices=["fresh", "machine"], default="fresh",
                 help="fresh: new empty pip, ~/.cache and matplotlib caches, as on a new machine "
                      "(pip downloads every package); machine: this machine's")
  p.add_argument("--keep", action="store_true", help="keep the temporary folder")
  args = p.parse_args()

  head = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                        text=True, check=True).stdout.strip()
  header = machine()
  tmp = tempfile.mkdtemp(prefix="mombo_quickstart_")
  clone = os.path.join(tmp, "mombo_jax")
  log_path = args.out.rsplit(".", 1)[0] + ".log"
  try:
    subprocess.run(["git", "clone", "--quiet", REPO, clone], check=True)
    command = readme_command(os.path.join(clone, "README.md"))
    t = time.monotonic()
    venv = os.path.join(tmp, "venv")
    subprocess.run([sys.executable, "-m", "venv", venv]
                   + (["--system-site-packages"] if args.python == "system" else []), check=True)
    venv_s = time.monotonic() - t
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(PATH=os.path.join(venv, "bin") + os.pathsep + env.get("PATH", ""),
               VIRTUAL_ENV=venv, MINARI_DATASETS_PATH=os.path.join(tmp, "minari"),
               JAX_COMPILATION_CACHE_DIR=os.path.join(tmp, "jax_cache"))
    if args.caches == "fresh":
      env.update(PIP_CACHE_DIR=os.path.join(tmp, "pip_cache"),
                 XDG_CACHE_HOME=os.path.join(tmp, "xdg_cache"),
                 MPLCONFIGDIR=os.path.join(tmp, "matplotlib"))
    print(f"running in {clone}: {command}", flush=True)
    with open(log_path, "w") as log:
      lines, code, spans = run_parts(command, clone, env, log)
    run = read_run(clone, lines)
    zero = zero_torque_score(os.path.join(venv, "bin", "python3"), clone, env)
  finally:
    if not args.keep:
      shutil.rmtree(tmp, ignore_errors=True)
    else:
      print(f"kept {tmp}")

  rows = phases(lines, run.get("config", {}).get("steps_per_epoch"))
  final = next((l[2] for l in lines if "final normalised score" in l[2]), "(no final line)")
  text = [f"# Recorded output of: python3 benchmarks/quickstart.py --python={args.python}",
          *( [args.label] if args.label else []),
          f"{time.strftime('%Y-%m-%d %H:%M %Z')}; repository at {head} (git clone of HEAD)",
          *header,
          f"load average at the end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}",
          f"python: {args.python} venv ({venv_s:.1f} s to create, not counted); caches: "
          + ("fresh (pip downloads every package; ~/.cache and matplotlib's empty)"
             if args.caches == "fresh" else "this machine's pip, ~/.cache and matplotlib caches"),
          "compile cache: fresh (JAX_COMPILATION_CACHE_DIR in the temporary folder)",
          f"command (README.md's command 1): {command}", f"exit code: {code}",
          "timed apart (separate processes): " + "; ".join(
              f"{what} {wall:.1f} s wall, {cpu_s:.1f} s cpu" for what, wall, cpu_s in spans), "",
          "| phase | wall s | cpu s (user + sys) | note |", "|---|---|---|---|"]
  for name, wall, cpu_s, note in rows:
    text.append(f"| {name} | {'n/a' if wall is None else f'{wall:.1f}'} | "
                f"{'' if cpu_s is None else f'{cpu_s:.1f}'} | {note} |")
  text += ["", f"final line: {final}", *run_lines(run),
           f"for scale: the policy that applies no torque scores {zero} (Hopper-v5, 10 episodes, "
           "same normaliser); the dataset's random policy: its mean in the final line",
           f"full stamped log: {os.path.relpath(log_path, REPO)} ([wall s, cpu s] per line)", ""]
  with open(args.out, "w") as f:
    f.write("\n".join(text))
  print("\n".join(text))
  sys.exit(code)


if __name__ == "__main__":
  main()
