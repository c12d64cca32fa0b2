"""A `jax.profiler` trace summarised into a small markdown table, on the machine that took it (a
trace is megabytes; the record returns at most 8 small files). Standard library only.

`jax.profiler.trace(folder)` writes folder/plugins/profile/<run>/<host>.trace.json.gz (Chrome's
trace format; `perfetto_trace.json.gz` beside it with create_perfetto_trace): "X" events with
"ts" / "dur" in microseconds, and, for each executed XLA op, args {"hlo_op": the HLO instruction's
name, "hlo_module": its program}. On a GPU those events sit in the "/device:GPU:<n>" processes
(one per kernel: a fusion, a cuBLAS gemm, a copy), on the CPU in the host's XLA threads. The
HLO text of the compiled program (`compiled.as_text()`) gives each instruction's metadata op_name,
JAX's name stack: the phases are the `jax.named_scope`s the training code opens (PHASES), and
the dynamics ensemble is its Flax module's name (DYNAMICS), inside whichever phase steps it.
"""
from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re
from typing import Dict, List, Optional

# The named scopes of core/train.py (rollout) and core/sac.py (target, critic_update,
# actor_update), in the order they nest from the outside; an op in none is "other".
PHASES = ("rollout", "target", "critic_update", "actor_update")
DYNAMICS = "EnsembleDynamics"
# Control flow the CPU's trace times as an op around its body's ops (on a GPU the host drives it):
# not a kernel, and counting it would count its body twice.
CONTAINERS = re.compile(r"^(while|conditional|call)(\.\d+)?$")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=.*?metadata=\{[^}]*?op_name=\"([^\"]*)\"")


def trace_file(folder: str) -> str:
  """The trace JAX wrote under `folder` (the newest run's *.trace.json.gz, else its
  perfetto_trace.json.gz)."""
  runs = sorted(glob.glob(os.path.join(folder, "plugins", "profile", "*")))
  for run in reversed(runs):
    for pattern in ("*.trace.json.gz", "perfetto_trace.json.gz"):
      found = sorted(glob.glob(os.path.join(run, pattern)))
      if found:
        return found[0]
  raise FileNotFoundError(f"no trace under {folder}/plugins/profile/ (jax.profiler.trace "
                          "writes one there)")


def op_events(path: str, module: Optional[str] = None) -> List[dict]:
  """The executed XLA ops of a trace: [{name, hlo_op, module, dur_us, device}], device ops only
  when the trace has a device process (a GPU's), else the host's; `module`: only ops of programs
  whose name contains it."""
  with gzip.open(path, "rt") as f:
    trace = json.load(f)
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  names = {e["pid"]: e.get("args", {}).get("name", "") for e in events
           if e.get("ph") == "M" and e.get("name") == "process_name"}
  devices = {pid for pid, n in names.items() if n.startswith("/device:")}
  # Should a device's kernels carry no hlo_op (a profiler version that leaves it out), each
  # kernel's own name stands in for it (XLA names a fusion's kernel after the fusion).
  by_name = bool(devices) and not any(
      e.get("ph") == "X" and e.get("pid") in devices and "hlo_op" in (e.get("args") or {})
      for e in events)
  out = []
  for e in events:
    args = dict(e.get("args") or {})
    if by_name and e.get("pid") in devices:
      args.setdefault("hlo_op", e.get("name", ""))
    if e.get("ph") != "X" or "hlo_op" not in args:
      continue
    if devices and e.get("pid") not in devices:
      continue
    if CONTAINERS.match(str(args["hlo_op"])):
      continue
    if module and module not in str(args.get("hlo_module", "")):
      continue
    out.append(dict(name=e.get("name", ""), hlo_op=args["hlo_op"],
                    module=args.get("hlo_module", ""), dur_us=float(e.get("dur", 0.0)),
                    device=names.get(e.get("pid"), "")))
  return out


def op_names(hlo_text: str) -> Dict[str, str]:
  """{HLO instruction name: its metadata op_name} of a compiled program's text."""
  out = {}
  for line in hlo_text.splitlines():
    m = _INSTR.match(line)
    if m:
      out.setdefault(m.group(1), m.group(2))
  return out


def _bare(part: str) -> str:
  """A name-stack entry without JAX's transformation wrappers: vmap(rollout) -> rollout,
  transpose(jvp(critic_update)) -> critic_update."""
  return re.sub(r"^(?:[\w.]+\()+", "", part).rstrip(")")


def phase_of(op_name: str) -> str:
  """The outermost of PHASES in a name stack, under any transformation (vmap(rollout)); "other"
  when none."""
  for part in op_name.split("/"):
    if _bare(part) in PHASES:
      return _bare(part)
  return "other"


def summarise(folder: str, hlo_text: str, steps: int, epochs: int = 1, top: int = 10,
              module: Optional[str] = None) -> dict:
  """The trace under `folder` of `epochs` epochs of the program `hlo_text`, each of `steps`
  gradient steps: {"phases": {phase: (ms per epoch, kernels per epoch)}, "dynamics": (ms,
  kernels) per epoch, "per_step": device kernels per gradient step (target + critic_update +
  actor_update), "top": [(kernel, hlo_op, phase, ms per epoch, calls per epoch)], "total_ms",
  "kernels"} (per epoch)."""
  events = op_events(trace_file(folder), module)
  names = op_names(hlo_text)
  phases = collections.OrderedDict((p, [0.0, 0]) for p in PHASES + ("other",))
  dyn = [0.0, 0]
  kernels = collections.defaultdict(lambda: [0.0, 0, ""])
  for e in events:
    op = e["hlo_op"]
    op_name = names.get(op) or names.get(re.sub(r"_(\d+)$", r".\1", op), "")
    phase = phase_of(op_name)
    phases[phase][0] += e["dur_us"]
    phases[phase][1] += 1
    if DYNAMICS in op_name:
      dyn[0] += e["dur_us"]
      dyn[1] += 1
    k = kernels[(e["name"], e["hlo_op"])]
    k[0] += e["dur_us"]
    k[1] += 1
    k[2] = phase
  per = lambda us: us / 1000.0 / epochs  # noqa: E731
  step_kernels = sum(phases[p][1] for p in ("target", "critic_update", "actor_update"))
  ranked = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:top]
  return {"phases": {p: (per(us), n / epochs) for p, (us, n) in phases.items()},
          "dynamics": (per(dyn[0]), dyn[1] / epochs),
          "per_step": step_kernels / epochs / max(steps, 1),
          "top": [(name, op, ph, per(us), n / epochs) for (name, op), (us, n, ph) in ranked],
          "total_ms": per(sum(e["dur_us"] for e in events)), "kernels": len(events) / epochs}


def markdown(summary: dict, title: str) -> str:
  """The summary as markdown: the phases, the dynamics, kernels per step, the top kernels."""
  total = summary["total_ms"] or 1.0
  lines = [f"### {title}", "",
           f"device time {summary['total_ms']:.1f} ms per epoch in {summary['kernels']:.0f} "
           f"kernels; {summary['per_step']:.1f} kernels per gradient step", "",
           "| phase | ms / epoch | share | kernels / epoch |", "|---|---:|---:|---:|"]
  for phase, (ms, n) in summary["phases"].items():
    lines.append(f"| {phase} | {ms:.1f} | {ms / total:.3f} | {n:.0f} |")
  ms, n = summary["dynamics"]
  lines.append(f"| (of which the dynamics ensemble, any phase) | {ms:.1f} | {ms / total:.3f} | "
               f"{n:.0f} |")
  lines += ["", "| top kernels | hlo op | phase | ms / epoch | calls / epoch |",
            "|---|---|---|---:|---:|"]
  for name, op, phase, ms, calls in summary["top"]:
    lines.append(f"| {name[:60]} | {op} | {phase} | {ms:.2f} | {calls:.0f} |")
  return "\n".join(lines) + "\n"
