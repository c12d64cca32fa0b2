"""A sweep's record, sweep.json, read back: each entry's history and outcome (`history_of`,
`finished_status`), the sweep's exit status and one-line summary (`exit_code`, `summary`), and the
signal an entry's exit status reports (`signal_of`). sweep.py runs the entries and writes the
record.
"""
from __future__ import annotations

import datetime
import json
import os
import signal
from typing import List, Optional, Sequence

from mombo_jax.errors import UserError
from mombo_jax.records.workdir import Workdir
from mombo_jax.run.console import EXIT_DIVERGED

# Statuses of a launched entry, least to most severe (the sweep's status is the worst).
SEVERITY = ("finished", "diverged", "failed", "interrupted")


def now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def signal_of(code: int) -> Optional[int]:
  """The stop signal (SIGINT / SIGTERM) an entry's exit status reports, or None: experiments.run
  exits 128 + signal after checkpointing; a child killed by the signal has -signal; the Launcher
  returns -signal for entries it did not start after one."""
  for signum in (signal.SIGINT, signal.SIGTERM):
    if code in (128 + signum, -signum):
      return int(signum)
  return None


def read_record(path: str) -> dict:
  """The sweep.json of earlier sweeps into this folder ({} when none)."""
  if not os.path.exists(path):
    return {}
  try:
    with open(path) as f:
      record = json.load(f)
  except (OSError, ValueError) as e:
    raise UserError(f"{path} is unreadable ({e}); delete it and run again (each entry's folder "
                    "keeps its own results; only the record of earlier sweeps goes).") from None
  return record if isinstance(record, dict) else {}


def history_of(outcome: dict) -> List[dict]:
  """An entry's history from its outcome in an earlier sweep.json (a record written before histories
  were kept gives its one status, time unknown)."""
  if isinstance(outcome.get("history"), list):
    return list(outcome["history"])
  if outcome.get("status") in SEVERITY:
    return [dict(status=outcome["status"], time=None, command=outcome.get("command"),
                 exit_code=outcome.get("exit_code"), seconds=outcome.get("seconds"))]
  return []


def finished_status(entry, history: Sequence[dict]) -> str:
  """A finished entry's (sweep.SweepEntry) outcome: diverged when its summary.json lists diverged
  seeds or its last launch ended diverged, else finished."""
  try:
    if Workdir(entry.workdir).read_summary().get("diverged"):
      return "diverged"
  except (OSError, ValueError, AttributeError):
    pass
  launches = [h for h in history if h.get("status") in SEVERITY]
  return "diverged" if launches and launches[-1]["status"] == "diverged" else "finished"


def exit_code(result: dict) -> int:
  """The sweep's exit status: 0, EXIT_DIVERGED (seeds of an entry diverged, now or in an earlier
  sweep, and nothing failed), 1 (an entry failed) or 128 + the signal that interrupted it (130
  SIGINT, 143 SIGTERM)."""
  if result["status"] == "interrupted":
    return 128 + int(result.get("signal") or signal.SIGINT)
  return {"finished": 0, "diverged": EXIT_DIVERGED, "failed": 1}[result["status"]]


def summary(result: dict, out: str) -> str:
  """One line: the sweep's status, how many entries ended in each status, how many were skipped
  (finished before), where the record is."""
  counts = {}
  for outcome in result["cells"]:
    counts[outcome["status"]] = counts.get(outcome["status"], 0) + 1
  skipped = sum(bool(e.get("skipped")) for e in result["cells"])
  return (f"sweep {result['status']}: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
          + (f" ({skipped} skipped: finished before)" if skipped else "")
          + f"; record in {os.path.join(out, 'sweep.json')}")
