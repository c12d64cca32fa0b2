"""Where a run's metrics go besides metrics.csv: `experiments.run --log=csv,tensorboard,wandb`
(csv, the workdir's metrics.csv, is always on). Each backend gets the metrics.csv rows of every
evaluation, one series per metric per cell (a cell = one seed of one workdir), on the step axis
`step` (gradient steps).

  tensorboard  <workdir>/tb/seed<s>/: one TensorBoard run per seed. Tags: eval/return_mean,
               eval/normalized_score, health/{diverged, overestimated, q_bound}, train/<metric>
               (critic_loss, q_mean, ...); metrics that already carry a namespace keep it
               (rollout/...). Dataset and beta: in the run's path (`tensorboard --logdir=runs`
               lists <dataset>/<algo>[-target][-beta<b>]/s<seed>x<S>/tb/seed<s>), in the HParams
               dashboard (every scalar config field, plus seed) and in the text tab `run`.
               Written with tensorboardX: TensorBoard's event format and protobufs without a
               TensorFlow or PyTorch dependency (TensorBoard itself is needed only to view).
  wandb        one W&B run per seed (the `wandb` package): the same keys plus `epoch`; config =
               config.json's record with `seed` the cell's and `workdir`; grouped by launch (the
               workdirs' common folder, kept in <workdir>/wandb/runs.json with each seed's run
               id, so a resume keeps both). Files under <workdir>/wandb/. Offline unless
               WANDB_MODE or WANDB_API_KEY is set (the machines that train often have no
               network): upload later with `wandb sync <workdir>/wandb`.

A resumed run appends and never duplicates a step. The runner restarts at its checkpoint's epoch E
(metrics.csv is cut back to rows <= E) and writes only rows past E; what a killed launch logged
past E is superseded:
  - TensorBoard: the writer opens with purge_step = E * steps_per_epoch + 1, a SessionLog START
    event on which TensorBoard drops the run's earlier events at or past that step (and
    TensorBoard's data server drops a series' points from any step written again).
  - W&B: an offline run cannot resume (wandb 0.31 writes a new offline-run-<time>-<id> folder per
    launch, and `wandb sync` of a later folder of the same id replaces or resumes the run). So
    each launch's folder holds the cell's whole history: metrics.csv's rows <= E replayed, then
    the new rows; the cell's earlier offline folders are deleted (everything they held up to E is
    in the replay). Online (or a server already holding the run), the run resumes by its id and
    rows below the server's next step (run.starting_step) are skipped: W&B steps only increase.

Only the main process of a multi-process launch writes (it evaluates, launch.Launch.evaluate).
"""
from __future__ import annotations

import glob
import importlib.util
import json
import os
import shutil
import struct
import time
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from mombo_jax.core import algorithms
from mombo_jax.errors import InvalidValue, UserError
from mombo_jax.records.workdir import TENSORBOARD as TB_DIR, WANDB as WANDB_DIR
from mombo_jax.storage import atomic

KINDS = ("csv", "tensorboard", "wandb")
# The package each optional logger imports; setup.cfg's extras of the same names pin them.
_MODULES = {"tensorboard": "tensorboardX", "wandb": "wandb"}
WANDB_RUNS = "runs.json"       # {"group": str, "ids": {seed: run id}} of the workdir's W&B runs
WANDB_PROJECT = "mombo_jax"    # unless WANDB_PROJECT is set

_AXES = ("epoch", "step", "seed")
_EVAL = ("return_mean", "normalized_score")
_HEALTH = ("diverged", "overestimated", "q_bound")


def parse(spec) -> Tuple[str, ...]:
  """The loggers named by `spec` ("csv,tensorboard" or a list of names), "csv" first and always
  on. InvalidValue when empty, for an unknown name (listing the valid ones); UserError when a
  logger's package is not installed (naming the extra that installs it)."""
  words = spec.split(",") if isinstance(spec, str) else list(spec or ())
  words = [w.strip() for w in words if w.strip()]
  if not words:
    raise InvalidValue(f"`log_to` is empty: name one or more of {', '.join(KINDS)} (csv is always "
                       "on).", params=("log_to",))
  unknown = [w for w in words if w not in KINDS]
  if unknown:
    raise InvalidValue(f"`log_to`: unknown logger(s) {', '.join(unknown)}; valid: "
                       f"{', '.join(KINDS)}.", params=("log_to",))
  for w in words:
    if w in _MODULES and importlib.util.find_spec(_MODULES[w]) is None:
      raise UserError(_missing(w), params=("log_to",))
  return tuple(dict.fromkeys(["csv"] + words))


def _missing(kind: str) -> str:
  return (f"log_to={kind} needs the {_MODULES[kind]} package, which is not installed: "
          f"pip install -e .[{kind}] (in the repository).")


def scalars(row: dict) -> Dict[str, float]:
  """{tag: value} of one metrics.csv row, its epoch / step / seed left out: eval/..., health/...,
  train/<metric>; a metric named with a '/' (rollout/...) keeps its name."""
  out = {}
  for k, v in row.items():
    if k in _AXES:
      continue
    space = "eval" if k in _EVAL else "health" if k in _HEALTH else "train"
    out[k if "/" in k else f"{space}/{k}"] = float(v)
  return out


def wandb_group(workdirs: Sequence[str]) -> str:
  """A launch's W&B group: its workdirs' common folder, relative to the current folder when
  inside it (`runs/hopper-random` for a --betas grid under runs)."""
  common = os.path.commonpath([os.path.abspath(w) for w in workdirs])
  rel = os.path.relpath(common)
  return common if rel == os.pardir or rel.startswith(os.pardir + os.sep) else rel


class RunLoggers:
  """One workdir's loggers besides metrics.csv (kinds: `parse`'s names; "csv" alone: nothing to
  do). open() before the first write; write() each evaluation's rows; close() at the end."""

  def __init__(self, kinds: Iterable[str] = ("csv",), group: Optional[str] = None):
    self.kinds = parse(tuple(kinds))
    self.group = group
    self._backends: list = []

  @property
  def extra(self) -> Tuple[str, ...]:
    """The loggers besides csv (none: open / write / close do nothing)."""
    return tuple(k for k in self.kinds if k != "csv")

  def open(self, workdir: str, record: dict, seeds: Sequence[int], history: Sequence[dict] = (),
           resume_epoch: int = 0) -> List[str]:
    """Opens the loggers of the run in `workdir` (record: its config.json; seeds: int [S]) that
    resumes at `resume_epoch` (0: fresh) with `history`, its metrics.csv rows up to there.
    Returns one line per logger saying where it writes."""
    self.close()
    seeds = [int(s) for s in seeds]
    history = [r for r in history if r["epoch"] <= resume_epoch]
    resume_step = resume_epoch * int(record["steps_per_epoch"])
    group = self.group or wandb_group([workdir])
    try:
      if "tensorboard" in self.kinds:
        self._backends.append(_TensorBoard(workdir, record, seeds, history, resume_step))
      if "wandb" in self.kinds:
        self._backends.append(_WandB(workdir, record, seeds, history, group))
    except ImportError as e:
      self.close()
      kind = next((k for k, m in _MODULES.items() if m in str(e)), None)
      raise UserError(_missing(kind) if kind else f"`log_to`: {e}", params=("log_to",)) from None
    except BaseException:
      self.close()
      raise
    return [b.where for b in self._backends]

  def write(self, rows: Sequence[dict]):
    """metrics.csv rows (epoch, step, seed, return_mean, normalized_score, diverged, training
    metrics, q_bound, overestimated) of one or more evaluations, in step order."""
    for b in self._backends:
      b.write(rows)

  def close(self):
    backends, self._backends = self._backends, []
    for b in backends:
      b.close()


# ------------------------------------------------------------------------------- TensorBoard

class _TensorBoard:

  def __init__(self, workdir, record, seeds, history, resume_step):
    # optional extra `tensorboard`: imported only when that logger is used
    from tensorboardX import SummaryWriter
    from tensorboardX.summary import hparams
    self.writers = {}
    for s in seeds:
      path = os.path.join(workdir, TB_DIR, f"seed{s}")
      fresh = not glob.glob(os.path.join(path, "*tfevents*"))
      # A name unique within the second too (tensorboardX names files by second and host; a
      # second writer in the same second would truncate the first's file). Readers take a
      # run's files in name order, which stays the order they were written.
      w = SummaryWriter(path, purge_step=None if fresh else resume_step + 1,
                        filename_suffix=f".{time.time_ns()}")
      if fresh:        # the run's description, once (at step 0, which no purge reaches)
        w.add_text("run", _describe(record, s, workdir), 0)
        for summary in hparams(_hparams(record, s), {"eval/normalized_score": 0.0,
                                                     "eval/return_mean": 0.0}):
          w.file_writer.add_summary(summary, 0)
      self.writers[s] = w
      if fresh:        # a run that logs to TensorBoard from a resume on gets its history too
        self.write([r for r in history if r["seed"] == s])
      w.flush()
    self.where = (f"TensorBoard: {os.path.join(workdir, TB_DIR)} (view: tensorboard "
                  "--logdir=<it or a parent folder>).")

  def write(self, rows):
    for row in rows:
      w = self.writers[int(row["seed"])]
      for tag, v in scalars(row).items():
        w.add_scalar(tag, v, int(row["step"]))
    # Flushed at every evaluation (they are minutes apart): a killed launch loses no event that
    # its checkpoint covers.
    for w in self.writers.values():
      w.flush()

  def close(self):
    for w in self.writers.values():
      w.close()


def _hparams(record: dict, seed: int) -> dict:
  """The HParams dashboard's columns: config.json's scalar fields, dataset and seed."""
  out = {k: v for k, v in record.items() if isinstance(v, (str, bool, int, float))}
  out["seed"] = seed
  return out


def _describe(record: dict, seed: int, workdir: str) -> str:
  algo = algorithms.label(str(record.get("algo")), record.get("target"), "title")
  return (f"dataset **{record.get('dataset')}**, {algo}, beta **{_num(record.get('beta'))}"
          f"**, seed **{seed}**, workdir `{os.path.abspath(workdir)}`\n\n"
          + "    " + json.dumps(record, indent=1, sort_keys=True).replace("\n", "\n    "))


def _num(x) -> str:
  return f"{x:g}" if isinstance(x, (int, float)) else str(x)


def read_tensorboard(path: str) -> Dict[str, List[Tuple[int, float]]]:
  """The scalars of the TensorBoard run in folder `path` as TensorBoard shows them: {tag: [(step,
  value)]} in step order, the events a later launch's purge step superseded dropped (a
  SessionLog START at step p drops the events read so far at steps >= p). No TensorFlow needed."""
  from tensorboardX.proto import event_pb2  # optional extra `tensorboard`
  series: Dict[str, Dict[int, float]] = {}
  for name in sorted(glob.glob(os.path.join(path, "*tfevents*"))):
    with open(name, "rb") as f:
      data = f.read()
    pos = 0
    while pos + 12 <= len(data):     # records: u64 length, u32 crc, payload, u32 crc
      (length,) = struct.unpack("<Q", data[pos:pos + 8])
      if pos + 12 + length + 4 > len(data):
        break                        # a record cut short by a kill
      event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + length])
      pos += 12 + length + 4
      if event.HasField("session_log") and event.session_log.status == event.session_log.START:
        for points in series.values():
          for step in [s for s in points if s >= event.step]:
            del points[step]
      for v in event.summary.value:
        if v.WhichOneof("value") == "simple_value":
          points = series.setdefault(v.tag, {})
          # Only a purge removes a point; a step written twice without one is a duplicate that
          # TensorBoard would show: kept apart so that a check can see it.
          if event.step in points:
            series.setdefault(v.tag + "#duplicate", {})[event.step] = v.simple_value
          points[event.step] = v.simple_value
  return {tag: sorted(points.items()) for tag, points in series.items()}


# ------------------------------------------------------------------------------------ W&B

class _WandB:

  def __init__(self, workdir, record, seeds, history, group):
    import wandb  # optional extra `wandb`: only with --log=wandb
    root = os.path.join(workdir, WANDB_DIR)
    os.makedirs(root, exist_ok=True)
    ident = _identities(root, seeds, group)
    # Offline unless the user asked for a mode or gave a key: no process here waits on a network.
    offline = not (os.environ.get("WANDB_MODE") or os.environ.get("WANDB_API_KEY"))
    dataset, beta = record.get("dataset"), record.get("beta")
    self.runs, self.next_step = {}, {}
    for s in seeds:
      try:
        run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or WANDB_PROJECT, dir=workdir,
            id=ident["ids"][str(s)],
            name=f"{dataset} {record.get('algo')} beta={_num(beta)} seed={s}",
            group=ident["group"], tags=[str(dataset), str(record.get("algo"))],
            config=dict(record, seed=s, workdir=os.path.abspath(workdir)),
            resume="allow", reinit="create_new", mode="offline" if offline else None,
            # console off: the launch's stdout is every cell's, not this run's; silent: one
            # line per workdir (`where`) instead of W&B's banner per run
            settings=wandb.Settings(console="off", silent=True))
      except wandb.errors.Error as e:
        self.close()
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UserError(f"log_to=wandb: W&B could not start the run of seed {s} ({first}); "
                        "set WANDB_MODE=offline to log offline (upload later with wandb sync), "
                        "or fix the W&B login / network.", params=("log_to",)) from None
      self.runs[s] = run
      # W&B steps only increase: a run the server already holds resumes at its next step.
      self.next_step[s] = int(getattr(run, "starting_step", 0) or 0)
      if getattr(run, "offline", False):
        _remove_superseded(root, run)
    self.write(history)
    mode = "offline" if offline else os.environ.get("WANDB_MODE") or "online"
    self.where = (f"W&B ({mode}): runs {', '.join(r.id for r in self.runs.values())} of group "
                  f"{ident['group']!r} in {root}"
                  + (f" (upload: wandb sync {root})." if mode == "offline" else "."))

  def write(self, rows):
    for row in rows:
      s, step = int(row["seed"]), int(row["step"])
      if step < self.next_step[s]:
        continue
      self.runs[s].log(dict(scalars(row), epoch=int(row["epoch"])), step=step)
      self.next_step[s] = step + 1

  def close(self):
    # optional extra `wandb`: only with --log=wandb
    import wandb
    from wandb.sdk import wandb_setup
    for run in self.runs.values():
      run.finish()
    # wandb-core closes a finished run's stream after finish() returns; opening the same run id
    # again in this process before then (a resume in a test or notebook) would write into the old
    # stream's folder. With no other run active here, stopping the service closes every stream.
    if wandb_setup.singleton().most_recent_active_run is None:
      wandb.teardown()


def _identities(root: str, seeds: Sequence[int], group: str) -> dict:
  """<root>/runs.json, created or completed: the W&B group and a run id per seed, drawn once so a
  resume (even of one cell of a grid alone) reuses them, and a new workdir never does."""
  from wandb.sdk.lib import runid  # optional extra `wandb`
  path = os.path.join(root, WANDB_RUNS)
  old = {}
  if os.path.exists(path):
    with open(path) as f:
      old = json.load(f)
  ids = dict(old.get("ids", {}))
  for s in seeds:
    ids.setdefault(str(s), runid.generate_id())
  new = dict(group=old.get("group") or group, ids=ids)
  if new != old:
    atomic.write_json(path, new)
  return new


def _remove_superseded(root: str, run):
  """Deletes the offline folders of `run`'s id written by earlier launches: the new folder
  replays their history up to the resume point (metrics.csv), and what they held past it is what
  the resume re-computes."""
  mine = os.path.dirname(os.path.abspath(run.dir))
  for d in glob.glob(os.path.join(glob.escape(root), "offline-run-*")):
    if _fragment_id(d) == run.id and os.path.abspath(d) != mine:
      shutil.rmtree(d, ignore_errors=True)


def _fragment_id(folder: str) -> Optional[str]:
  """The run id of an offline run folder: offline-run-<YYYYmmdd_HHMMSS>-<id>[-<n>] (wandb adds
  -<n> when a launch in the same second took the name)."""
  parts = os.path.basename(folder).split("-")
  return parts[3] if len(parts) >= 4 and parts[:2] == ["offline", "run"] else None
