"""The harness's row: one compared quantity after K steps (or of one dynamics/rollout check), and
the table every part prints. Both parts (agent_side.py, dynamics_side.py) return lists of these
dicts:

  {"section": str,          # e.g. "agent mombo float64"
   "quantity": str,         # e.g. "critic target y", "actor params"
   "k": int | None,         # gradient steps taken (None: not a step count)
   "max_abs": float,        # max |ours - theirs| over every entry
   "max_rel": float,        # max_abs / max |theirs| (the difference relative to the scale)
   "verdict": "rounding" | "named" | "FAIL",
   "note": str}             # for "named": the reference's file:line, what ours does and why

Verdicts (`verdict`): rounding when max_rel is at most ROUNDING[dtype]; else named when the caller
gives the named difference that explains it; else FAIL. float64 decides what is a definition:
a float32 row above ROUNDING takes the verdict of the same quantity's float64 row where there is
one (`settle_float32`): float32 rounding grows along the steps (Adam divides every gradient entry
by its own scale, so the rounding of tiny entries becomes lr-sized steps), which float64 shows.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Optional

import numpy as np

KEYS = ("section", "quantity", "k", "max_abs", "max_rel", "verdict", "note")
# What rounding reaches: float64 after up to 1000 steps of chained updates stays near 1e-12 of
# the scale; float32 rounding (~6e-8 a step) grows along the steps, and through the penalties'
# std of few elites, to ~1e-4. A definition that differs shows far above either.
ROUNDING = {"float64": 1e-9, "float32": 1e-3}


def differences(ours, theirs) -> tuple:
  """(max_abs, max_rel) of two arrays (or dicts of arrays with the same keys)."""
  if isinstance(ours, dict):
    if set(ours) != set(theirs):
      raise AssertionError(f"different entries: {sorted(set(ours) ^ set(theirs))}")
    ours = np.concatenate([np.ravel(ours[k]) for k in sorted(ours)])
    theirs = np.concatenate([np.ravel(theirs[k]) for k in sorted(theirs)])
  ours, theirs = np.asarray(ours, np.float64).ravel(), np.asarray(theirs, np.float64).ravel()
  if ours.shape != theirs.shape:
    raise AssertionError(f"shapes differ: ours {ours.shape}, theirs {theirs.shape}")
  max_abs = float(np.max(np.abs(ours - theirs))) if ours.size else 0.0
  scale = float(np.max(np.abs(theirs))) if theirs.size else 0.0
  return max_abs, (max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else np.inf))


def verdict(max_rel: float, dtype: str, named: Optional[str]) -> str:
  if max_rel <= ROUNDING[dtype]:
    return "rounding"
  return "named" if named else "FAIL"


def row(section: str, quantity: str, k: Optional[int], ours, theirs, dtype: str,
        named: Optional[str] = None) -> Dict:
  """One row comparing ours with theirs; `named` explains a difference above rounding (its note
  is kept only when the verdict is 'named')."""
  max_abs, max_rel = differences(ours, theirs)
  v = verdict(max_rel, dtype, named)
  return {"section": section, "quantity": quantity, "k": k, "max_abs": max_abs,
          "max_rel": max_rel, "verdict": v, "note": named if v == "named" else ""}


def settle_float32(rows: List[Dict]) -> List[Dict]:
  """Each float32 FAIL row given the verdict of its float64 twin (same section with float64, same
  quantity and k) where that exists: rounding (noting the float64 difference) or named (its
  note). Other rows unchanged."""
  twins = {(r["section"], r["quantity"], r["k"]): r for r in rows}
  out = []
  for r in rows:
    twin = twins.get((r["section"].replace("float32", "float64"), r["quantity"], r["k"]))
    if r["verdict"] == "FAIL" and "float32" in r["section"] and twin is not None \
        and twin["verdict"] != "FAIL":
      note = twin["note"] or (f"float32 rounding grown over {r['k']} steps: the float64 run "
                              "agrees to rounding")
      r = dict(r, verdict=twin["verdict"], note=note)
    out.append(r)
  return out


def table(rows: Iterable[Dict]) -> str:
  """The rows as a fixed-width table grouped by section, each named note printed once under its
  section (numbered)."""
  lines: List[str] = []
  section, notes = None, []
  for r in rows:
    if r["section"] != section:
      lines += _notes(notes)
      section, notes = r["section"], []
      lines += ["", f"## {section}", f"{'quantity':<34} {'K':>5} {'max abs':>10} {'max rel':>10}  "
                "verdict"]
    ref = ""
    if r["note"]:
      if r["note"] not in notes:
        notes.append(r["note"])
      ref = f" [{notes.index(r['note']) + 1}]"
    k = "" if r["k"] is None else str(r["k"])
    lines.append(f"{r['quantity']:<34} {k:>5} {r['max_abs']:>10.3e} {r['max_rel']:>10.3e}  "
                 f"{r['verdict']}{ref}")
  lines += _notes(notes)
  return "\n".join(lines)


def _notes(notes):
  return [f"  [{i}] {n}" for i, n in enumerate(notes, 1)]


def summary(rows: Iterable[Dict]) -> str:
  """'N rows: a rounding, b named, c FAIL'."""
  rows = list(rows)
  count = {v: sum(r["verdict"] == v for r in rows) for v in ("rounding", "named", "FAIL")}
  return (f"{len(rows)} rows: {count['rounding']} rounding, {count['named']} named, "
          f"{count['FAIL']} FAIL")
