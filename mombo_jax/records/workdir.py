"""A run on disk, owned in one place: the layout of a run's folder, its config.json (write, read,
compare), its lock and its outputs. No other module spells a path inside a run. It imports no
JAX, flax or Orbax, not even inside a function, so the report reads runs without them
(tests/test_records.py, .importlinter). Its checkpoints (the checkpointer, the CellState template,
restore): mombo_jax.run.run_state; the dynamics ensembles' folder scheme and get-or-train:
mombo_jax.dynamics (reuse.py, dynamics_store.py); the run's key scheme: mombo_jax.core.key_scheme;
finding runs under folders: mombo_jax.records.run_search.

    <workdir>/
      .lock                the OS lock of the launch writing here (locks.FolderLock: the holder's
                           PID, host, start)
      config.json          the Config fields + "dataset", "data" (the dataset's identity:
                           transitions and fingerprint; a resume on other data is refused),
                           "epochs_changes" (--allow_epochs_change), "eval_changes"
      checkpoints/<step>/  Orbax steps of the CellState, leading cell axis [S] (run/run_state.py)
      dynamics/seed<s>x<S>-<tag>/  the S dynamics ensembles; <tag> names their training settings
                           (reuse.settings_tag; unless --dynamics_dir puts them elsewhere)
      metrics.csv          one row per seed per evaluation        (outputs.py formats the files)
      summary.json         final scores, AULC, diverged / overestimated seeds, protocol
      learning_curve.png
      tb/seed<s>/          TensorBoard events per seed (--log=tensorboard; loggers.py)
      wandb/               offline W&B runs per seed + runs.json (--log=wandb)
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
from typing import List, Optional, Sequence, Tuple

from mombo_jax.core import algorithms
from mombo_jax.data import provenance
from mombo_jax.errors import UserError
from mombo_jax.records import outputs
from mombo_jax.settings import config as config_lib, references
from mombo_jax.storage import atomic, locks

CONFIG = "config.json"
METRICS = "metrics.csv"
SUMMARY = "summary.json"
CURVE = "learning_curve.png"
CHECKPOINTS = "checkpoints"
DYNAMICS = "dynamics"
LOCK = ".lock"
TENSORBOARD = "tb"
WANDB = "wandb"
# What a finished run holds (experiments.report reads these three).
RUN_FILES = (CONFIG, METRICS, SUMMARY)
# Config fields that may change between launches of one run without --allow_epochs_change.
HARMLESS = ("eval_every", "eval_episodes")


def run_dir(root, dataset, algo, target, seed, seeds, beta=None, reference=None,
            moments=None) -> str:
  """<root>/<dataset>/<algo>[-<target>][-<moments>][-<reference>][-beta<beta>]/s<seed>x<seeds>:
  a run's default workdir (beta only in the name of a --betas grid's cells; reference only when it
  is not the algorithm's default source, so runs of both sources of one algorithm sit side by side;
  moments only when not the default diagonal: mombo-elite_spread-lowrank)."""
  name = algorithms.label(algo, target)
  name += "" if moments in (None, config_lib.MOMENTS_BEFORE_RECORDED) else f"-{moments}"
  tables = algorithms.tables(algo) if algo in algorithms.names() else algo
  name += "" if reference in (None, references.DEFAULT.get(tables)) else f"-{reference}"
  name += "" if beta is None else f"-beta{beta:g}"
  return os.path.join(root, dataset.replace("/", "_"), name, f"s{seed}x{seeds}")


def grid_dynamics_dir(root: str, dataset: str, dynamics_dir: Optional[str] = None) -> str:
  """Where the betas of a --betas grid share a dataset's ensembles: <dynamics_dir>/dynamics, by
  default <root>/<dataset>/dynamics."""
  return os.path.join(dynamics_dir or os.path.join(root, dataset.replace("/", "_")), DYNAMICS)


def config_record(config, dataset: str) -> dict:
  """config.json's content for `config` trained on `dataset` (JSON types: tuples become lists),
  with "algo_module": the module that registers its algorithm, which readers import again."""
  return json.loads(json.dumps(dict(config.settings(), dataset=dataset,
                                    algo_module=algorithms.module_of(config.algo))))


def config_from_record(record: dict):
  """(Config, dataset) of a config.json record; fields the Config no longer has are ignored, and
  a record written before runs recorded their settings' source gets the source it was built from
  (config.upgrade_record: the settings' source, the matmul precision, the moment mode), never
  today's default."""
  # An algorithm registered by the user's own module: imported again, or one line naming it (first:
  # upgrade_record reads whether it has variants).
  algorithms.ensure(str(record.get("algo")), record.get("algo_module"))
  record = config_lib.upgrade_record(record)
  fields = set(config_lib.Config.setting_names())
  # JSON turned the config's tuples into lists; the frozen Config must stay hashable.
  values = {k: tuple(v) if isinstance(v, list) else v for k, v in record.items() if k in fields}
  return config_lib.Config().replace(**values), record.get("dataset") or values.get("env")


@dataclasses.dataclass(frozen=True)
class Workdir:
  """One run's folder. dynamics_dir: where its dynamics ensembles live (default
  <path>/dynamics; a --betas grid shares one across the betas of a dataset)."""
  path: str
  dynamics_dir: Optional[str] = None

  def __post_init__(self):
    if self.dynamics_dir is None:
      object.__setattr__(self, "dynamics_dir", os.path.join(self.path, DYNAMICS))

  def file(self, name: str) -> str:
    return os.path.join(self.path, name)

  @property
  def checkpoints(self) -> str:
    return self.file(CHECKPOINTS)

  def finished(self) -> bool:
    """The run ended (summary.json written)."""
    return os.path.exists(self.file(SUMMARY))

  # ------------------------------------------------------------------------------ config.json

  def read_record(self) -> dict:
    """config.json as written, but for a field added since, which gets the value the version that
    wrote it meant (config.upgrade_record: the settings' source, the matmul precision, the moment
    mode); UserError naming the file when missing or unreadable."""
    path = self.file(CONFIG)
    try:
      with open(path) as f:
        return config_lib.upgrade_record(json.load(f))
    except (OSError, ValueError) as e:
      raise UserError(f"{path} is missing or unreadable ({e}); pass a run workdir written by "
                      "experiments.run.") from None

  def read_config(self):
    """(Config, dataset) of the run here."""
    return config_from_record(self.read_record())

  def check_config(self, config, dataset, allow_epochs_change=False) -> Tuple[dict, List[str]]:
    """(config.json record to write, notes) for training `config` on `dataset` here. Refuses a run
    of another config, and a changed --epochs unless allow_epochs_change (then recorded with how
    the actor's schedule was handled). Writes nothing."""
    new = config_record(config, dataset)
    path = self.file(CONFIG)
    if not os.path.exists(path):
      if self.checkpointer_steps():
        raise UserError(f"{self.checkpoints} holds checkpoints but {path} is missing: what they "
                        "were trained on (config, data) cannot be told. Delete "
                        f"{self.checkpoints} to start the run afresh, or pass another `workdir`.",
                        params=("workdir",))
      return new, []
    try:
      with open(path) as f:
        written = json.load(f)
    except (OSError, ValueError) as e:
      raise UserError(f"{path} is unreadable ({e}); delete that file to start the run afresh "
                      "(its checkpoints then no longer match and must go too).") from None
    # A record from before runs recorded their settings' source is compared as the source its
    # table came from (a MOBILE run: its authors' table), not as today's default; one from before
    # they recorded their matmul precision as float32 (config.MATMUL_PRECISION_BEFORE_RECORDED).
    old = config_lib.upgrade_record(written)
    changed = {k: (old.get(k), v) for k, v in new.items() if old.get(k) != v
               and k not in ("epochs", "algo_module") + HARMLESS}
    if changed:
      hint = (f"Pass --reference={old['reference']} to continue it with the settings it was "
              "started with, pass" if "reference" in changed and old.get("reference") else "Pass")
      raise UserError(
          f"{self.path} holds a run with another config "
          f"({', '.join(f'{k}: {a!r} -> {b!r}' for k, (a, b) in sorted(changed.items()))}). "
          f"{hint} another `workdir`, or delete that folder to start over.",
          params=("workdir",))
    notes, history = [], list(old.get("epochs_changes", []))
    if "reference" not in written and "reference" in old:
      notes.append(f"config.json did not record its settings' source (written before "
                   f"--reference existed): it is {old['reference']!r}, the only {old.get('algo')} "
                   "table then; recorded now.")
    if "moments" not in written:
      notes.append(f"config.json did not record its moment mode (written before --moments "
                   f"existed): it continues at {old['moments']!r}, the only mode then; recorded "
                   "now.")
    if "matmul_precision" not in written:
      notes.append(f"config.json did not record its matmul precision (written before "
                   f"--matmul_precision existed): it continues at {old['matmul_precision']!r}, the "
                   "precision it computed at on a CPU (on a GPU it had JAX's default, TF32); "
                   "recorded now.")
    if old.get("epochs") != new["epochs"]:
      # With a fixed schedule_epochs the schedule does not move: the run stays a prefix of the
      # schedule_epochs-epoch run. Without one it spans --epochs and is re-spanned.
      fixed = new.get("schedule_epochs") is not None
      how = (f"unchanged: it spans schedule_epochs={new['schedule_epochs']} epochs whatever "
             "--epochs says" if fixed else "re-spanned over the new total from the current step on")
      if not allow_epochs_change:
        raise UserError(f"{self.path} holds a run of epochs={old.get('epochs')}, not "
                        f"{new['epochs']}. Pass `allow_epochs_change` to continue it to "
                        f"{new['epochs']} epochs (the actor's cosine learning-rate schedule is "
                        f"then {how}), or another `workdir`.",
                        params=("epochs", "allow_epochs_change", "workdir"))
      history.append({"from": old.get("epochs"), "to": new["epochs"],
                      "actor_lr_schedule": ("unchanged: spans schedule_epochs" if fixed else
                                            "re-spanned: the cosine continues from the current "
                                            "step over the new total number of steps")})
      notes.append(f"--epochs changed {old.get('epochs')} -> {new['epochs']} "
                   f"(--allow_epochs_change): the actor's cosine schedule is {how}; recorded in "
                   "config.json.")
    eval_history = list(old.get("eval_changes", []))
    for k in HARMLESS:
      if old.get(k) != new[k]:
        notes.append(f"--{k} changed {old.get(k)} -> {new[k]} (recorded in config.json).")
        eval_history.append({"field": k, "from": old.get(k), "to": new[k], "time": _now()})
    if history:
      new["epochs_changes"] = history
    if eval_history:
      new["eval_changes"] = eval_history
    if "data" in old:
      new["data"] = old["data"]
    return new, notes

  def check_data(self, record: dict, identity: dict) -> Tuple[dict, List[str]]:
    """(record with "data" = identity, notes): refuses training on data other than the run's
    (provenance.dataset_identity: Minari id, transitions, fingerprint) recorded in config.json,
    whatever else was deleted (dynamics, checkpoints)."""
    old = record.get("data")
    record = dict(record, data=identity)
    if old is None:
      resumed = bool(self.checkpointer_steps())
      return record, ([f"config.json of {self.path} did not record its data yet (written before "
                       "data fingerprints): recording it now."] if resumed else [])
    changes = provenance.identity_changes(old, identity)
    if changes:
      raise UserError(
          f"{self.path} was trained on other data than {record.get('dataset')} holds now "
          f"({changes}): the dataset was rebuilt or replaced. Pass another `workdir`, or delete "
          f"{self.path} to train on the new data from the start.", params=("workdir",))
    return record, []

  def checkpointer_steps(self) -> List[str]:
    """The step folders under checkpoints/ (committed or not), without opening Orbax."""
    if not os.path.isdir(self.checkpoints):
      return []
    return [d for d in os.listdir(self.checkpoints) if d.isdigit()]

  def write_config(self, record: dict):
    atomic.make_dirs(self.path)
    atomic.write_json(self.file(CONFIG), record)

  # -------------------------------------------------------------------------------- the lock

  def lock(self):
    """locks.FolderLock on <path>/.lock (acquire() it): the one writer of this run. Creates the
    folder; release(cleanup=True) after a refusal removes it again when it holds nothing else."""
    return locks.FolderLock(self.path, LOCK, what="--workdir", fix=(
        "wait for it to finish or stop it (it checkpoints, and the same command resumes it), or "
        "pass another --workdir"))

  # ---------------------------------------------------------------------------------- outputs

  def read_rows(self, max_epoch: Optional[int] = None) -> List[dict]:
    return outputs.read_rows(self.file(METRICS), max_epoch=max_epoch)

  def write_rows(self, rows: Sequence[dict]):
    outputs.write_rows(self.file(METRICS), rows)

  def read_summary(self) -> dict:
    with open(self.file(SUMMARY)) as f:
      return json.load(f)

  def write_summary(self, summary: dict):
    atomic.write_json(self.file(SUMMARY), summary)

  def plot(self, rows, seeds, title: str, diverged=(), dataset_score=None):
    """learning_curve.png (outputs.plot_curve), a run below the paper's budget marked
    (budget_note of its config.json)."""
    note = budget_note(self.read_record()) if os.path.exists(self.file(CONFIG)) else None
    outputs.plot_curve(rows, seeds, self.file(CURVE), title, diverged, dataset_score, note=note)


def budget_note(record: dict) -> Optional[str]:
  """The learning curve's note for a run below the paper's budget (a smoke or short run: the
  quick and tiny presets, a short --epochs): its gradient steps per seed beside the paper
  preset's for its task, marked as report.md marks such runs (its tables' footnotes list what
  else falls short); None for a run at the paper's budget, or one whose budget cannot be told."""
  try:
    paper = config_lib.make_config(record["env"], record["algo"], "paper",
                                   reference=record.get("reference"))
    steps = int(record["epochs"]) * int(record["steps_per_epoch"])
  except (KeyError, TypeError, ValueError):
    return None
  full = paper.epochs * paper.steps_per_epoch
  return (None if steps >= full else f"§ below the paper's budget: {steps:,} gradient steps per "
          f"seed (paper: {full:,})")


def _now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
