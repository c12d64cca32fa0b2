"""How the device record spends its budget: the rates it is sized from, each with its source, and
each part's time cap and size from what is left. Standard library only (the record plans before
the carried wheels are installed).

The rates (one NVIDIA H100 80GB HBM3, 2026-11-23, jax 0.11.2; the only GPU lease so far):
- benchmarks/bench_scale_gpu.txt: whole paper epochs (50,000 x 5 rollout + 1000 gradient steps
  per cell) of MOMBO `lcb` in one program: 0.17 s at 1 cell, 0.26 s at 4, 0.54 s at 16, 0.94 s at
  32, 1.86 s at 64; compiling one such program took 12.8-17.6 s; 1000 gradient steps of one cell:
  SAC (= MOPO's step) 0.12 s, MOMBO `lcb` 0.16 s, `elite_spread` 0.21 s, MOBILE 0.28 s.
- benchmarks/learning/README.md (the superseded GPU record): MOMBO, MOBILE and MOPO x 3 seeds x
  300 epochs, three launches side by side on the one GPU, in 9 min 8 s (548 s: 1.83 s per epoch of
  the three together, evaluation then in series with training); 3 dynamics ensembles trained to
  convergence (270 epochs) in 66 s.
Not measured on a GPU, so estimated here and said so: an algorithm's epoch at C cells is MOMBO
`lcb`'s times the ratio of its gradient step to `lcb`'s (the epoch is 1000 steps and a rollout
that costs alike); 48 cells interpolated between 32 and 64; part d's three launches side by side
cost the sum of their 4-cell epochs times SIDE_BY_SIDE (the GPU time-slices the processes; the
evaluation now overlaps training, so the 1.83 s above, with evaluation in series, bounds it).
Every record writes the rates it measured (record.json, "rates"); part d is sized from part c's
4-cell epochs where c measured them, and the next sizing should start from the newest record's.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Optional

# --- rates, with their sources (module docstring) -------------------------------------------------
H100_LCB_EPOCH_S = {1: 0.17, 2: 0.19, 4: 0.26, 8: 0.37, 16: 0.54, 32: 0.94, 64: 1.86}
H100_COMPILE_S = 17.6            # the longest of the record's epoch compilations
H100_STEP_MS = {"mopo": 0.12, "mombo_lcb": 0.16, "mombo": 0.21, "mobile": 0.28}
H100_LEARNING_EPOCH_S = 548.0 / 300     # three 3-seed launches side by side, evaluation in series
H100_DYNAMICS_EPOCH_S = 66.0 / 270      # 3 ensembles together, hopper-medium-replay
SIDE_BY_SIDE = 1.3               # three processes on one GPU: time-sliced, plus their host work
# The later parts' floors are kept free with this margin: part c's measured rates may make part
# d's floor larger than the estimate it was kept for.
RESERVE_MARGIN = 1.15

ALGOS = ("mombo", "mobile", "mopo")     # MOMBO is `elite_spread`, the paper's
CELLS = (16, 1, 48, 4)           # part c's cell counts, in the order they are measured
SEEDS = 4                        # part d: seeds per algorithm (one program each)
MIN_EPOCHS, MAX_EPOCHS = 100, 3000      # part d: at least, and the paper's schedule
EVAL_EVERY = 10                  # part d: every algorithm evaluated alike (MOBILE's and MOPO's)
DYN_MAX_EPOCHS = 30              # part d's shared dynamics (learning.py says why)
SETUP_S = 25.0                   # installing the wheels, unpacking nothing, starting Python


def lcb_epoch_s(cells: int) -> float:
  """MOMBO lcb's H100 epoch at `cells` cells: recorded, else linear between recorded counts."""
  if cells in H100_LCB_EPOCH_S:
    return H100_LCB_EPOCH_S[cells]
  lo = max(c for c in H100_LCB_EPOCH_S if c < cells)
  hi = min((c for c in H100_LCB_EPOCH_S if c > cells), default=None)
  if hi is None:
    return H100_LCB_EPOCH_S[lo] * cells / lo
  a, b = H100_LCB_EPOCH_S[lo], H100_LCB_EPOCH_S[hi]
  return a + (b - a) * (cells - lo) / (hi - lo)


def epoch_s(algo: str, cells: int, measured: Optional[Dict] = None) -> float:
  """An algorithm's paper epoch at `cells` cells: measured (part c's rates: {"epoch_s":
  {algo: {cells: s}}}), else estimated from the H100 record (module docstring)."""
  seen = ((measured or {}).get("epoch_s") or {}).get(algo) or {}
  seen = {int(c): float(s) for c, s in seen.items()}
  if cells in seen:
    return seen[cells]
  if seen:   # scale the nearest measured count by the record's shape over cells
    near = min(seen, key=lambda c: abs(c - cells))
    return seen[near] * lcb_epoch_s(cells) / lcb_epoch_s(near)
  return lcb_epoch_s(cells) * H100_STEP_MS[algo] / H100_STEP_MS["mombo_lcb"]


@dataclasses.dataclass
class Sizes:
  """What one record runs at: the full sizes, or the smoke's tiny ones (CPU, under 2 minutes)."""
  smoke: bool
  cells: tuple
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
    return Sizes(True, cells=(2,), algos_c=("mopo",), algos_d=("mopo",), seeds=2, rollout=32,
                 steps=5, real_rows=1000, scan_steps=20, eval_steps=5, min_epochs=2, eval_every=1)
  return Sizes(False, cells=CELLS, algos_c=ALGOS, algos_d=ALGOS, seeds=SEEDS, rollout=50_000,
               steps=1000, real_rows=200_000, scan_steps=1000, eval_steps=100,
               min_epochs=MIN_EPOCHS, eval_every=EVAL_EVERY)


# --- each part's time: what it would like (want) and the least worth starting (floor) ------------

# Smoke: seconds on the 2-core CPU. Measured at load 5.8 (benchmarks/device/README.md): a 4 s,
# b 8 s, c 71 s, d 65 s, e 16 s; at load 7 part d took 94 s before its table: the caps leave
# room for a test machine busier still (they are limits, not what the smoke takes).
SMOKE = {"a": (30, 5), "b": (60, 25), "c": (150, 20), "d": (240, 40), "e": (90, 15)}


def d_fixed_s() -> float:
  """Part d's cost besides its epochs: start and data (15 s), the shared dynamics (4 ensembles x
  DYN_MAX_EPOCHS at the record's dynamics rate x 4/3 for the fourth seed, + 20 s to compile), the
  launches' compilation side by side (30 s), the last evaluation and the table (30 s)."""
  dynamics = DYN_MAX_EPOCHS * H100_DYNAMICS_EPOCH_S * SEEDS / 3 + 20
  return 15 + dynamics + 30 + 30


def d_epoch_s(measured: Optional[Dict] = None, algos=ALGOS) -> float:
  """Part d's seconds per epoch: its three 4-seed launches side by side (module docstring)."""
  return SIDE_BY_SIDE * sum(epoch_s(a, SEEDS, measured) for a in algos)


def c_want_s(measured: Optional[Dict] = None) -> float:
  """Part c at full size, compiled one program after another: every (algorithm, cells) program
  (compile + a warm-up and a timed epoch), the 1000-step timings (3 x (10 s compile + 2 runs)),
  the chunk lengths (20 epochs of MOPO at 16 cells + 3 s) and the evaluation (15 s)."""
  programs = sum(H100_COMPILE_S + 2 * epoch_s(a, c, measured) for a in ALGOS for c in CELLS)
  steps = sum(10 + 2 * H100_STEP_MS[a] for a in ALGOS)
  return programs + steps + 3 + 20 * epoch_s("mopo", 16, measured) + 15


def want_floor(part: str, smoke: bool, measured: Optional[Dict] = None):
  """(want, floor) seconds of a part."""
  if smoke:
    return SMOKE[part]
  d_floor = d_fixed_s() + MIN_EPOCHS * d_epoch_s(measured)
  return {"a": (30.0, 10.0),
          "b": (90.0, 30.0),
          "c": (c_want_s(measured), 3 * (H100_COMPILE_S + 2 * max(
              epoch_s(a, 16, measured) for a in ALGOS))),
          "d": (d_fixed_s() + MAX_EPOCHS * d_epoch_s(measured), d_floor),
          "e": (90.0, 30.0)}[part]


@dataclasses.dataclass
class Plan:
  part: str
  cap_s: float                 # the hard limit: the part's process is killed past it
  epochs: Optional[int] = None  # part d
  skip: Optional[str] = None   # why it is skipped (None: it runs)


PARTS = ("a", "b", "c", "d", "e")
# Parts whose floors are kept free for them while earlier parts are capped (e only runs on what is
# left: "if time is left").
RESERVED = ("a", "b", "c", "d")


def plan(part: str, left_s: float, smoke: bool, measured: Optional[Dict] = None,
         done: tuple = (), algos_d=ALGOS) -> Plan:
  """The next part's cap from `left_s` seconds: its want, less the floors (x RESERVE_MARGIN) of the
  later reserved parts that have not run (as many of them as leave this part its floor, the highest
  first); skipped (with the reason) when what is left is under its floor. `done`: parts
  that ran or were skipped (a skipped part reserves nothing). Part d's epochs follow from its cap
  (at least the minimum, a multiple of its evaluation cadence, at most the paper's 3000); part d
  leaves part e its want when d still gets its minimum without it."""
  want, floor = want_floor(part, smoke, measured)
  later = [p for p in RESERVED if p > part and p not in done]
  # A higher priority never yields to a lower: the lowest later parts stop being kept free first.
  kept = lambda parts: RESERVE_MARGIN * sum(want_floor(p, smoke, measured)[1]  # noqa: E731
                                            for p in parts)
  while later and left_s - kept(later) < floor:
    later.pop()
  reserve = kept(later)
  room = left_s - reserve
  if part == "e" and "d" in done and not _d_ran(measured):
    return Plan(part, 0.0, skip="part d did not run: no runs to measure")
  if room < floor:
    return Plan(part, 0.0, skip=f"{room:.0f} s free for it (of {left_s:.0f} s left, "
                f"{reserve:.0f} s kept for parts {','.join(later) or '-'}), under its "
                f"{floor:.0f} s floor")
  cap = min(want, room)
  if part != "d":
    return Plan(part, cap)
  s = sizes(smoke)
  if smoke:
    return Plan(part, cap, epochs=s.min_epochs)
  e_want = want_floor("e", smoke, measured)[0]
  fixed, per = d_fixed_s(), d_epoch_s(measured, algos_d)
  if room - e_want >= fixed + MIN_EPOCHS * per:
    cap = min(cap, room - e_want)
  epochs = int((cap - fixed) / per) // s.eval_every * s.eval_every
  epochs = max(MIN_EPOCHS, min(MAX_EPOCHS, epochs))
  return Plan(part, min(cap, fixed + epochs * per * 1.15), epochs=epochs)


def _d_ran(measured: Optional[Dict]) -> bool:
  return bool((measured or {}).get("d_ran"))
