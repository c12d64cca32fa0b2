"""The reporting protocol as the report checks it: which summary.json protocols it reads
(outputs.READABLE_PROTOCOLS: protocol/1's per-seed scores are protocol/2's, so the report computes
every number from them, over every seed), which it refuses (any other, in one line), and the
paragraph of report.md that names docs/protocol.md by version (protocol_reference)."""
from __future__ import annotations

import os
from typing import List, Sequence

import mombo_jax
from mombo_jax.errors import UserError
from mombo_jax.records import outputs
from mombo_jax.report.results import Run


def protocol_doc() -> str:
  """The path of docs/protocol.md in this checkout (it may be absent from an installed copy)."""
  # The checkout holds the package folder, wherever in it this module sits.
  root = os.path.dirname(os.path.dirname(os.path.abspath(mombo_jax.__file__)))
  return os.path.join(root, outputs.PROTOCOL_DOC)


def check_protocols(runs: Sequence[Run]) -> List[str]:
  """Refuses (UserError, one line) runs summarised under a protocol this report cannot read
  (outside outputs.READABLE_PROTOCOLS): their numbers may mean something else, and a report never
  mixes them. Returns the warnings for the runs it reads under outputs.PROTOCOL from their
  per-seed scores: protocol/1 runs (their per-seed scores are protocol/2's, diverged seeds
  included; only summary.json's means left those out, and the report does not use them) and
  runs written before summary.json had the field (protocol/1's definitions)."""
  other = [r for r in runs if r.protocol is not None
           and r.protocol not in outputs.READABLE_PROTOCOLS]
  if other:
    shown = ", ".join(f"{r.path} ({r.protocol})" for r in other[:3])
    more = f" and {len(other) - 3} more" if len(other) > 3 else ""
    raise UserError(f"{len(other)} run(s) follow another reporting protocol than this report's "
                    f"{outputs.PROTOCOL} ({outputs.PROTOCOL_DOC}): {shown}{more}. Report them "
                    "with the mombo_jax version that wrote them, or leave their folders out.")
  old = [r for r in runs if r.protocol != outputs.PROTOCOL]
  if not old:
    return []
  diverged = sum(bool(r.diverged) for r in old)
  return [f"warning: {len(old)} run(s) were summarised under {outputs.PROTOCOL_1} or before the "
          "protocol was recorded (summary.json's means leave diverged seeds out); the report "
          f"computes every number from their per-seed scores over every seed ({outputs.PROTOCOL}"
          f"; {diverged} of them with diverged seeds): "
          f"{', '.join(r.path for r in old[:3])}" + (f" and {len(old) - 3} more"
                                                      if len(old) > 3 else "")]


def protocol_reference() -> str:
  """Where the protocol is defined, stably: its version, the page's path in the repository and
  the package's version (not a path from where a report was written, which breaks once the report
  is moved or shared)."""
  return (f"{outputs.PROTOCOL}, defined in `{outputs.PROTOCOL_DOC}` of the mombo_jax repository "
          f"(package version {mombo_jax.__version__})")


def protocol_line(out: str, runs: Sequence[Run]) -> str:
  """report.md's protocol paragraph: the protocol's stable reference (protocol_reference; the same
  wherever `out` is) and a note on the runs read from an older protocol."""
  del out
  old = sum(r.protocol != outputs.PROTOCOL for r in runs)
  return (f"Protocol: {protocol_reference()} (what the final score, the AULC, the std and "
          "the interval are, that every seed counts, diverged ones at their frozen policy, the "
          "environments' versions, the reference scores; no number is picked by online "
          "evaluation)."
          + (f" {old} run(s) were summarised under {outputs.PROTOCOL_1} or predate the protocol "
             "field in summary.json; their numbers here are recomputed from their per-seed "
             f"scores over every seed, as {outputs.PROTOCOL} defines them." if old else ""))
