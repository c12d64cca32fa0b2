"""How the device record spends its budget: the plans (which parts one 8-minute call runs), the
rates each part is sized from, each with its source, and each part's cap and size, all fixed
before the first part starts. Standard library only (the record plans before the carried wheels
are installed). `python3 -m benchmarks.device.sizing` prints the plans and the projection.

The rates (one NVIDIA H100 80GB HBM3, jax 0.11.2, main b6b1d0f: benchmarks/device/records/
2026-11-27-h100/, the newest record; file names below are that folder's):
- record_abc.json "rates" (c_speed.md's tables): whole paper epochs (50,000 x 5 rollout + 1000
  gradient steps per cell), cells vmapped in one program: MOMBO `elite_spread` 0.2594 s at 1 cell
  and 1.0988 s at 16, MOBILE 1.8308 s and MOPO 0.6986 s at 16; compiling one program 11.3-20.8 s;
  one evaluation at 16 cells 6.81 s; parts a 6.2 s and b 76.9 s of wall time ("parts").
- record_d.json "rates": part d's three 4-seed launches side by side, 2.20 s per epoch of them all
  (352 s for the 160 epochs all three reached, compilation and evaluation included); the shared
  dynamics (4 ensembles, 30 epochs) 23.6 s.
- README.md: Table 2 (part e, experiments.uncertainty at the paper's settings) on d's runs, 145 s.
Not measured there, so estimated and said so: MOBILE's and MOPO's 1-cell epochs are their 16-cell
epochs times MOMBO's 1/16 ratio (0.236); an epoch between 1 and 16 cells is linear between them;
past 16 cells it grows in proportion to the cells (no more sharing than at 16: 1 -> 16 cells cost
4.2x). The 2026-11-23 rows of MOMBO `lcb` (benchmarks/bench_scale_gpu.txt: 0.17 s at 1 cell, 0.54
s at 16) are the speed plan's regression anchor (ANCHOR_LCB_S), not a sizing rate.
Every record writes the rates it measured (record.json, "rates"): the next sizing starts from the
newest record's, each constant citing its file.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Optional

RECORD = "benchmarks/device/records/2026-11-27-h100"
# --- rates, with their sources (module docstring; files of RECORD) -------------------------------
EPOCH_S = {"mombo": {1: 0.2594, 16: 1.0988},     # record_abc.json rates.epoch_s
           "mobile": {16: 1.8308}, "mopo": {16: 0.6986}}
COMPILE_S = 20.8                 # record_abc.json rates.compile_s: the longest (MOMBO, 16 cells)
EVAL_S = 6.81                    # record_abc.json rates.eval_s: one evaluation at 16 cells
A_S, B_S = 6.2, 76.9             # record_abc.json parts.a / parts.b wall_s
D_EPOCH_S3 = 2.20                # record_d.json rates.d_epoch_s_side_by_side (the three)
# Not measured on a GPU yet, so estimated and said so: the lowrank launch adds MOMBO's 4-cell
# epoch (epoch_s("mombo", 4) = 0.427 s) times its epoch's FLOPs over the diagonal's on hopper,
# 2.57 (benchmarks/bench_lowrank.txt): 1.10 s per epoch of the four side by side.
D_LOWRANK_S = 1.10
D_EPOCH_S = D_EPOCH_S3 + D_LOWRANK_S
D_DYNAMICS_S = 23.6              # record_d.json rates.d_dynamics_s (4 ensembles, 30 epochs)
E_S = 145.0                      # README.md: table2 on d's runs at the paper's settings
ANCHOR_LCB_S = {1: 0.17, 16: 0.54}      # benchmarks/bench_scale_gpu.txt (2026-11-23), MOMBO lcb

ALGOS = ("mombo", "mobile", "mopo")     # MOMBO is `elite_spread`, the paper's
# Part d's launches: the three, and MOMBO `elite_spread` at --moments=lowrank (issue #49: the
# correlated moments at the paper's sizes; learning.py).
ALGOS_D = ALGOS + ("mombo-lowrank",)
CELLS = (16, 1, 48, 4)           # part c's cell counts, in the order they are measured
PROFILE_CELLS = (1, 16, 48)      # part c traces MOMBO's epoch at these (c_profile.md)
SEEDS = 4                        # part d: seeds per algorithm (one program each)
# part d: the aim (100 before part m took 75 s of the learning plan), and the paper's schedule
MIN_EPOCHS, MAX_EPOCHS = 60, 3000
EVAL_EVERY = 10                  # part d: every algorithm evaluated alike (MOBILE's and MOPO's)
DYN_MAX_EPOCHS = 30              # part d's shared dynamics (learning.py says why)
SETUP_S = 25.0                   # installing the wheels, starting Python
# The paper's D4RL table (the speed goals): 12 datasets x 4 seeds x 3000 epochs per algorithm.
TABLE_CELLS, TABLE_EPOCHS = 48, 3000
GOALS = {"ratio_16_1": 2.0, "mombo_16_s": 0.55, "table_hours": 4.0}
# The paper's mixed table (appendix results_mixed): 3 envs x 2 partners x 4 shares = 24 datasets x
# 4 seeds = 96 cells per algorithm, 2000 epochs, at the mixed settings (mombo_jax/settings/
# config.py _MIXED: actor 5x1024, critics 3x256; D4RL's are 2x256 both; rollout length 5, as
# hopper-medium-replay's, whose epochs EPOCH_S measured). No device has timed a mixed epoch yet, so
# it is projected from EPOCH_S between two bounds, both said as estimates:
# - low: the paper's own ratio, 11 s against 8 s per 1000 gradient steps (mixed against D4RL, RTX
#   4090, PyTorch; its appendix "Experiment compute resources"): an epoch whose cost is not its
#   matmuls;
# - high: mixed_macs_ratio(), the matmul multiply-adds per sample of a gradient step at the two
#   sizes (~14.5x): an epoch made of its matmuls, run at the D4RL epoch's utilisation (the wider
#   layers use an H100 better, so the truth is below it).
MIXED_CELLS, MIXED_EPOCHS = 96, 2000
PAPER_MIXED_RATIO = 11.0 / 8.0
PAPER_MIXED_GPU_HOURS = 600      # the paper: all MOMBO repetitions on the mixed data, its devices
D4RL_NETS = ((256, 256), (256, 256))               # (actor_hidden, critic_hidden)
MIXED_NETS = ((1024,) * 5, (256, 256, 256))


def epoch_s(algo: str, cells: int, measured: Optional[Dict] = None) -> float:
  """An algorithm's paper epoch at `cells` cells: measured (rates {"epoch_s": {algo: {cells: s}}},
  a record's), else from EPOCH_S (module docstring)."""
  seen = ((measured or {}).get("epoch_s") or {}).get(algo) or {}
  known = {int(c): float(s) for c, s in EPOCH_S[algo].items()}
  known.update({int(c): float(s) for c, s in seen.items()})
  if cells in known:
    return known[cells]
  if 16 in known and 1 not in known:
    known[1] = known[16] * EPOCH_S["mombo"][1] / EPOCH_S["mombo"][16]
  lo = max((c for c in known if c < cells), default=min(known))
  hi = min((c for c in known if c > cells), default=None)
  if hi is None or cells < lo:
    return known[lo] * cells / lo
  return known[lo] + (known[hi] - known[lo]) * (cells - lo) / (hi - lo)


def table_hours(epochs: Dict[str, float], cells: int) -> float:
  """The paper's D4RL table in device-hours from each algorithm's epoch (s) at `cells` cells:
  TABLE_CELLS cells per algorithm in TABLE_CELLS / cells programs, TABLE_EPOCHS epochs each, one
  after another (evaluation overlapped: runner.loop)."""
  return sum(s * TABLE_CELLS / cells for s in epochs.values()) * TABLE_EPOCHS / 3600


def step_macs(actor_hidden, critic_hidden, obs: int = 17, act: int = 6) -> int:
  """Matmul multiply-adds per sample of one SAC gradient step: the actor 4 times (its action at s'
  for the target, then forward and backward of its loss, ~3x), each of the two critics 7 times
  (target forward, forward and backward of their loss, and of the actor's loss through them).
  obs / act: walker2d's and halfcheetah's dims (hopper's 11 / 3 give within 4 %)."""
  def mlp(sizes):
    return sum(a * b for a, b in zip(sizes, sizes[1:]))
  actor = mlp((obs, *actor_hidden, 2 * act))
  critic = mlp((obs + act, *critic_hidden, 1))
  return 4 * actor + 2 * 7 * critic


def mixed_macs_ratio() -> float:
  """step_macs at the mixed sizes over D4RL's (the high bound's ratio)."""
  return step_macs(*MIXED_NETS) / step_macs(*D4RL_NETS)


def mixed_table_hours(ratio: float, cells: int = 16) -> float:
  """The paper's mixed table in device-hours, each algorithm's 16-cell D4RL epoch (EPOCH_S) times
  `ratio`: MIXED_CELLS cells per algorithm in MIXED_CELLS / cells programs, MIXED_EPOCHS epochs."""
  return sum(epoch_s(a, cells) * ratio * MIXED_CELLS / cells
             for a in ALGOS) * MIXED_EPOCHS / 3600


@dataclasses.dataclass
class Sizes:
  """What one record runs at: the full sizes, or the smoke's tiny ones (CPU)."""
  smoke: bool
  cells: tuple
  profile_cells: tuple
  algos_c: tuple               # part c's algorithms
  algos_d: tuple               # part d's
  seeds: int
  rollout: int                 # part c's epoch: rollout start states and gradient steps
  steps: int
  real_rows: int
  scan_steps: int              # part c's gradient-step timing
  eval_steps: int              # part c's evaluation timing: time steps, scaled to 1000
  min_epochs: int              # part d
  eval_every: int


def sizes(smoke: bool) -> Sizes:
  if smoke:
    return Sizes(True, cells=(2,), profile_cells=(2,), algos_c=("mopo",), algos_d=("mopo",),
                 seeds=2, rollout=32, steps=5, real_rows=1000, scan_steps=20, eval_steps=5,
                 min_epochs=2, eval_every=1)
  return Sizes(False, cells=CELLS, profile_cells=PROFILE_CELLS, algos_c=ALGOS, algos_d=ALGOS_D,
               seeds=SEEDS, rollout=50_000, steps=1000, real_rows=200_000, scan_steps=1000,
               eval_steps=100, min_epochs=MIN_EPOCHS, eval_every=EVAL_EVERY)


# --- the plans: each fits one call; its parts' caps are fixed before the first part starts -------

PARTS = ("a", "b", "c", "v", "d", "e", "m")
PLANS = {"speed": ("a", "b", "c", "v"), "learning": ("a", "d", "e", "m")}
MIXED_CELL_EPOCHS = 5            # part m: epochs of each algorithm at the mixed settings
# Seconds of each part in a plan of budget B (setup excluded): a and b at their measured walls
# with room, v its variants (variants.py: compiled side by side, timed in turn), e Table 2 at the
# paper's settings, c and d what is left (c: its rows as far as they fit; d: its epochs).
FIXED = {"a": 15.0,                      # A_S and Python's start, pip freeze on a busy host
         "b": round(B_S * 1.25),          # 96 s
         "v": 130.0,                      # 10 variants, 2 waves of WAVE (variants.py)
         "e": E_S + 5,
         # m: start-up and data (~15 s), compiling the three side by side (~20 s each, D4RL's
         # COMPILE_S), MIXED_CELL_EPOCHS epochs at the unmeasured mixed rate (~1.5-16 s at 16
         # cells, so ~1-5 s at 4: sizing's bounds), the one evaluation.
         "m": 75.0}
# The least worth starting a part with (the plan drops the last parts that cannot have it).
FLOOR = {"a": 10.0, "b": 30.0, "c": 60.0, "v": 60.0, "d": 120.0, "e": 30.0, "m": 45.0}
SMOKE_FLOOR = {"a": 5.0, "b": 25.0, "c": 20.0, "v": 20.0, "d": 40.0, "e": 15.0, "m": 20.0}
# Smoke: seconds on the 2-core CPU (limits, not what the smoke takes: a 4 s, b 8-16 s, c 40-70 s,
# d 44-65 s, e 7-16 s at load 5-7, benchmarks/device/README.md).
SMOKE = {"a": 30.0, "b": 60.0, "c": 150.0, "v": 150.0, "d": 240.0, "e": 90.0, "m": 150.0}


@dataclasses.dataclass
class Plan:
  part: str
  cap_s: float                 # the hard limit: the part's process is killed past it
  epochs: Optional[int] = None  # part d
  skip: Optional[str] = None   # why it is skipped (None: it runs)


def d_fixed_s() -> float:
  """Part d's cost besides its epochs: start and data (15 s), the shared dynamics (D_DYNAMICS_S),
  the last evaluation and the table (30 s). D_EPOCH_S holds the launches' compilation."""
  return 15 + D_DYNAMICS_S + 30


def d_epochs(cap_s: float) -> int:
  """Part d's epochs in `cap_s` seconds at D_EPOCH_S, a multiple of EVAL_EVERY, at most the
  paper's (under MIN_EPOCHS when the cap holds fewer: the work shrinks, the part still runs)."""
  epochs = int((cap_s - d_fixed_s()) / D_EPOCH_S) // EVAL_EVERY * EVAL_EVERY
  return max(EVAL_EVERY, min(MAX_EPOCHS, epochs))


def plan_parts(plan: str, budget_s: float, smoke: bool = False) -> Dict[str, Plan]:
  """Every part of `plan` with its cap (and part d its epochs), from the rates alone, before any
  part runs: what the record runs whatever an earlier part measures (a part that ends early
  leaves its spare to the next: record.main). When the budget cannot hold the plan, its last
  parts are cut to their floors, then dropped, each named with the reason (Plan.skip)."""
  parts = PLANS[plan]
  room = budget_s - (0.0 if smoke else SETUP_S)
  floor = SMOKE_FLOOR if smoke else FLOOR
  if smoke:
    caps = {p: SMOKE[p] for p in parts}
  else:
    fixed = {p: FIXED[p] for p in parts if p in FIXED}
    rest = [p for p in parts if p not in FIXED]          # c or d: the plan's main part
    share = max(room - sum(fixed.values()), 0.0) / max(len(rest), 1)
    caps = {p: fixed.get(p, share) for p in parts}
  skip = {}
  for main in (p for p in parts if not smoke and p not in FIXED):
    # The main part before the later ones: they give up their time down to their floors, then
    # whole, before it goes under its own floor.
    later = parts[parts.index(main) + 1:]
    for p in reversed(later):
      give = max(min(caps[p] - floor[p], floor[main] - caps[main]), 0.0)
      caps[p] -= give
      caps[main] += give
    for p in reversed(later):
      if caps[main] >= floor[main]:
        break
      caps[main] += caps[p]
      caps[p] = 0.0
      skip[p] = (f"not in the plan at --budget_s={budget_s:g}: its time went to part {main}, "
                 f"under its {floor[main]:.0f} s floor otherwise")
  for p in reversed(parts):
    over = sum(caps.values()) - room
    if over <= 0:
      break
    if p in skip:
      continue
    if caps[p] - over >= floor[p]:
      caps[p] -= over
    else:
      skip[p] = (f"not in the plan at --budget_s={budget_s:g}: {max(caps[p] - over, 0):.0f} s "
                 f"would be left for it, under its {floor[p]:.0f} s floor")
      caps[p] = 0.0
  for p in parts:
    if p not in skip and caps[p] < floor[p] - 1e-9:
      skip[p] = (f"not in the plan at --budget_s={budget_s:g}: {caps[p]:.0f} s left for it, "
                 f"under its {floor[p]:.0f} s floor")
  out = {}
  for p in parts:
    if p in skip:
      out[p] = Plan(p, 0.0, skip=skip[p])
    elif p == "d":
      out[p] = Plan(p, caps[p], epochs=sizes(True).min_epochs if smoke else d_epochs(caps[p]))
    else:
      out[p] = Plan(p, caps[p])
  return out


def plan_lines(budget_s: float = 480.0) -> str:
  """The plans at `budget_s` and the projection, as `python3 -m benchmarks.device.sizing` prints."""
  lines = [f"rates: {RECORD} (module docstring); budget {budget_s:g} s, setup {SETUP_S:g} s"]
  for name in PLANS:
    parts = plan_parts(name, budget_s)
    lines.append(f"plan {name}: " + ", ".join(
        f"{p} {q.cap_s:.0f} s" + (f" ({q.epochs} epochs)" if q.epochs else "")
        for p, q in parts.items()) + f"; sum {sum(q.cap_s for q in parts.values()):.0f} s")
  at16 = {a: epoch_s(a, 16) for a in ALGOS}
  lines.append("the paper's D4RL table (12 datasets x 4 seeds x 3000 epochs, three algorithms) "
               "from the 16-cell epochs (" + ", ".join(f"{a} {s:.3f} s" for a, s in at16.items())
               + f"), three 16-cell programs per algorithm: {table_hours(at16, 16):.2f} H100-hours"
               f" (goal: <= {GOALS['table_hours']:g} from measured 48-cell epochs)")
  lo, hi = PAPER_MIXED_RATIO, mixed_macs_ratio()
  lines.append(f"the paper's mixed table ({MIXED_CELLS // 4} datasets x 4 seeds x {MIXED_EPOCHS} "
               "epochs, three algorithms, actor 5x1024, critics 3x256), six 16-cell programs per "
               f"algorithm, NOT MEASURED: the 16-cell D4RL epochs x {lo:.3f} (the paper's 11 s / "
               f"8 s per 1000 steps) to x {hi:.1f} (matmul multiply-adds per step): "
               f"{mixed_table_hours(lo):.1f} to {mixed_table_hours(hi):.0f} H100-hours (the "
               f"paper: ~{PAPER_MIXED_GPU_HOURS} GPU-hours for its MOMBO runs alone)")
  return "\n".join(lines)


def main(argv=None):
  import argparse  # the command line only: the record imports this module for its constants
  parser = argparse.ArgumentParser(description="The device record's plans and the projection.")
  parser.add_argument("--budget_s", type=float, default=480.0, help="The record's --budget_s.")
  print(plan_lines(parser.parse_args(argv).budget_s))


if __name__ == "__main__":
  main()
