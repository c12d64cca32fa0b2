"""D4RL's own hdf5 files (the v2 MuJoCo datasets the paper trains on) as episodes for Minari.

D4RL's layout: one row per step, `observations` [N, S], `actions` [N, A], `rewards` [N],
`terminals` [N], `timeouts` [N], optionally `next_observations` [N, S], plus `infos/*` (per row:
`infos/qpos` [N, nq] and `infos/qvel` [N, nv] are the simulator state each row's observation was
taken in) and `metadata/*` groups. Episodes end at a terminal or a timeout.

Minari stores an episode as observations [T + 1, S] (the states visited, including the last next
state) and T actions / rewards / terminations / truncations; `data.flatten_episodes` turns that back
into (s, a, r, s', terminal) rows. `to_episodes` maps one onto the other, in one of two modes:
- `timeouts="drop"` (the default): the rows of the paper's own loader, `qlearning_dataset` in
  adinlab/MOMBO utils/load_dataset.py (the same code as OfflineRL-Kit's and MOBILE's), with
  terminate_on_end=False. It reads rows 0..N-2 (the file's last row never), skips every row with
  `timeouts[i]`, and takes s' from `next_observations[i]` where the file has them (terminal rows
  kept), else from `observations[i + 1]`, and then skips terminal rows too (their next row starts
  another episode). D4RL's own `qlearning_dataset` (d4rl/__init__.py) picks the same rows from a
  file with `next_observations` (D4RL's v2 generation scripts write them) but always takes s' from
  the next row, wrong after a terminal and where the chain breaks; without `next_observations` it
  keeps the terminal rows (s' = the next episode's first observation, harmless to Q-learning, not
  to a dynamics model).
- `timeouts="keep"`: every row with the file's own s' (the timed-out last step of each episode and
  the file's last row included, truncated: they bootstrap); without `next_observations` the same
  rows as D4RL's qlearning_dataset (a timed-out row and the last row have no next state there).
In both, where a row's s' is not the next kept row's s within an episode (it happens in D4RL's
files), the episode is cut there (truncated), so that every transition keeps its exact s'.

`d4rl_physics.replay_check` tells whether a file holds the named env's physics.

`import_file` (experiments.import_d4rl is its CLI) reads a file, checks it and writes it as a real
Minari dataset with D4RL's reference returns, the evaluation env (envs.d4rl_env_spec: the model
the file's data was made in, recorded under envs.EVAL_ENV_KEY; evaluation, Table 2 and rendering
build it through envs.eval_env_spec), the file's `metadata/*` values and its provenance (which
records every option that shaped the data: the id, the timeout mode, the non-finite rows dropped;
the physics check; the quality check, d4rl_stats; and the command that rebuilds it).
"""
from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
from typing import Dict, List, Optional

import numpy as np

from mombo_jax.collection import dataset_writer
from mombo_jax.collection.d4rl_physics import OBS_TOLERANCE, replay_check, same_shaped_envs
from mombo_jax.data import d4rl_stats, minari_io, names
from mombo_jax.data.scores import D4RL_REF_SCORES
from mombo_jax.env import envs
from mombo_jax.env.envs import ACTION_DIM, OBS_DIM
from mombo_jax.errors import UserError

REQUIRED = ("observations", "actions", "rewards", "terminals", "timeouts")


class D4RLFormatError(ValueError):
  """The file is not in D4RL's layout, or does not fit the environment; the message says why."""


def read_hdf5(path: str) -> Dict[str, np.ndarray]:
  """The arrays of a D4RL hdf5 file: the REQUIRED keys, `next_observations` when present,
  `infos/<k>` per-row arrays and `metadata/<k>` values (as stored). D4RLFormatError for a file
  that is not a readable hdf5 (garbage, truncated, damaged inside) or not in D4RL's layout."""
  # HDF5 only when a file is read: experiments.import_d4rl starts without it
  import h5py
  out = {}
  try:
    f = h5py.File(path, "r")
  except OSError as e:
    raise D4RLFormatError(f"{path} is not a readable hdf5 file ({_one_line(e)}).") from None
  key = "its keys"
  try:
    with f:
      missing = [k for k in REQUIRED if k not in f]
      if missing:
        raise D4RLFormatError(f"{path} is not in D4RL's layout: missing {', '.join(missing)} "
                              f"(it has {', '.join(sorted(f.keys())) or 'no keys'}).")
      for key in REQUIRED + ("next_observations",):
        if key in f:
          out[key] = np.asarray(f[key][()])
      for group in ("infos", "metadata"):
        if group in f and hasattr(f[group], "keys"):
          for name in f[group].keys():
            key = f"{group}/{name}"
            item = f[group][name]
            if hasattr(item, "shape"):
              out[key] = item[()]
  except D4RLFormatError:
    raise
  except (OSError, RuntimeError, KeyError, ValueError, TypeError) as e:
    # A file damaged past its header opens but fails on reading (h5py raises all of these).
    raise D4RLFormatError(f"{path} is not a readable hdf5 file: reading {key} failed "
                          f"({type(e).__name__}: {_one_line(e)}); download it again.") from None
  return out


def _one_line(e: BaseException) -> str:
  return " ".join(str(e).strip("'\"").split())


def check(arrays: Dict[str, np.ndarray], env: str) -> int:
  """Refuses shapes that do not fit each other or `env` (halfcheetah | hopper | walker2d); returns
  the number of rows N."""
  obs, act = arrays["observations"], arrays["actions"]
  if obs.ndim != 2 or act.ndim != 2:
    raise D4RLFormatError(f"observations and actions must be 2-D, got shapes {obs.shape} and "
                          f"{act.shape}.")
  n = obs.shape[0]
  for key in ("actions", "rewards", "terminals", "timeouts", "next_observations"):
    if key in arrays and arrays[key].shape[0] != n:
      raise D4RLFormatError(f"{key} has {arrays[key].shape[0]} rows, observations {n}.")
  for key in ("rewards", "terminals", "timeouts"):
    if arrays[key].ndim != 1:
      raise D4RLFormatError(f"{key} must be 1-D, got shape {arrays[key].shape}.")
  if "next_observations" in arrays and arrays["next_observations"].shape != obs.shape:
    raise D4RLFormatError(f"next_observations has shape {arrays['next_observations'].shape}, "
                          f"observations {obs.shape}.")
  if obs.shape[1] != OBS_DIM[env] or act.shape[1] != ACTION_DIM[env]:
    raise D4RLFormatError(f"The file holds obs dim {obs.shape[1]} and action dim {act.shape[1]}, "
                          f"but {env} has {OBS_DIM[env]} and {ACTION_DIM[env]}: is the short name "
                          "right?")
  return n


def nonfinite_rows(arrays: Dict[str, np.ndarray]) -> np.ndarray:
  """bool [N]: rows with a NaN/inf in observations, actions, rewards or next_observations."""
  bad = ~np.isfinite(arrays["rewards"])
  for key in ("observations", "actions", "next_observations"):
    if key in arrays:
      bad |= ~np.all(np.isfinite(arrays[key]), axis=1)
  return bad


TIMEOUT_MODES = ("drop", "keep")


def to_episodes(arrays: Dict[str, np.ndarray], keep: Optional[np.ndarray] = None,
                timeouts: str = "drop") -> List[dict]:
  """Minari episodes (dicts of observations [T+1, S], actions [T, A], rewards, terminations,
  truncations [T]) holding the file's transitions as `timeouts` says (module docstring): "drop" =
  the paper's loader's rows, "keep" = every row that has a next state.

  keep: bool [N] rows to keep (e.g. the finite ones); a dropped row cuts its episode there.
  """
  if timeouts not in TIMEOUT_MODES:
    raise ValueError(f"timeouts must be one of {', '.join(TIMEOUT_MODES)}, got {timeouts!r}.")
  obs, act, rew = arrays["observations"], arrays["actions"], arrays["rewards"]
  term = arrays["terminals"].astype(bool)
  timeout = arrays["timeouts"].astype(bool)
  n = obs.shape[0]
  keep = np.ones(n, bool) if keep is None else np.array(keep, bool)   # a copy: edited below
  nxt = arrays.get("next_observations")
  if nxt is None:
    # s' = the next row; timed-out rows and the last row have none.
    nxt = np.concatenate([obs[1:], obs[-1:]], axis=0)
    keep &= ~timeout
    if timeouts == "drop":
      keep &= ~term            # the paper's `if done_bool ...: if not has_next_obs: continue`
  elif timeouts == "drop":
    keep &= ~timeout           # `if final_timestep: continue`
  if n and (timeouts == "drop" or "next_observations" not in arrays):
    keep[-1] = False           # `for i in range(N - 1)`
  episodes, rows = [], []

  def close(terminated):
    if rows:
      idx = np.asarray(rows)
      ep_term = np.zeros(len(idx), bool)
      ep_trunc = np.zeros(len(idx), bool)
      (ep_term if terminated else ep_trunc)[-1] = True
      episodes.append(dict(observations=np.concatenate([obs[idx], nxt[idx[-1:]]], axis=0),
                           actions=act[idx], rewards=rew[idx], terminations=ep_term,
                           truncations=ep_trunc))
    rows.clear()

  for i in range(n):
    if not keep[i]:
      close(False)
      continue
    if rows and not np.array_equal(obs[i], nxt[rows[-1]]):
      close(False)              # the previous row's s' is not this s: the chain is cut here
    rows.append(i)
    if term[i]:
      close(True)
    elif timeout[i]:
      close(False)
  close(False)
  return episodes


# D4RL's published statistics per file (rows, mean and std of the episode return) live in
# d4rl_stats, with their source and the quality check of an import.
PUBLISHED = d4rl_stats.PUBLISHED
# The download URL of each v2 file, from d4rl/infos.py (the files are public; no machine of this
# project can fetch them).
D4RL_URL = "http://rail.eecs.berkeley.edu/datasets/offline_rl/gym_mujoco_v2/{env}_{quality}-v2.hdf5"


def url(name: str) -> str:
  """The public download URL of D4RL's v2 file for a short name like 'hopper-medium-replay'."""
  env, _, quality = name.partition("-")
  return D4RL_URL.format(env=env, quality=quality.replace("-", "_"))


# ------------------------------------------------------------------------ import as Minari

def default_id(name: str) -> str:
  """The Minari id an import of short name `name` writes by default: d4rl/<env>/<quality>-v2."""
  env, _, quality = name.partition("-")
  return f"d4rl/{env}/{quality}-v2"


@dataclasses.dataclass(frozen=True)
class ImportOptions:
  """How import_file treats a file (experiments.import_d4rl's flags): overwrite an existing
  dataset; drop_nonfinite: drop rows holding NaN/inf (refused otherwise); timeouts: "drop" (the
  paper's loader's rows) or "keep" (to_episodes); check_physics: replay the stored states in
  the named env (replay_check) and refuse a mismatch; check_quality: compare the episodes' mean
  return with what D4RL publishes (d4rl_stats.quality_check), a one-line warning when far."""
  overwrite: bool = False
  drop_nonfinite: bool = False
  timeouts: str = "drop"
  check_physics: bool = True
  check_quality: bool = True

  def flags(self) -> List[str]:
    """The experiments.import_d4rl flags of the options that change what is written."""
    return ([f"--timeouts={self.timeouts}"] + (["--drop_nonfinite"] if self.drop_nonfinite else [])
            + ([] if self.check_physics else ["--nocheck_physics"])
            + ([] if self.check_quality else ["--nocheck_quality"]))


def import_file(path: str, name: str, dataset_id: Optional[str] = None,
                options: ImportOptions = ImportOptions(), log_fn=print) -> str:
  """Reads D4RL's file at `path` for the short name `name` and writes it as the Minari dataset
  `dataset_id` (default_id(name) when None); returns the id. UserError for a bad name, id or
  `timeouts`, a missing or unreadable file, an existing dataset (without overwrite), a file not in
  D4RL's layout, rows holding NaN/inf (without drop_nonfinite), or (with check_physics) a file
  whose stored states do not replay as `name`'s env (the line names the env they do replay as, if
  any): ImportOptions. log_fn: progress lines. A failed write leaves no dataset behind.

  The provenance records every option that shaped the data (the id, the timeout mode, the
  non-finite rows dropped, the checks) and the command that rebuilds the same dataset."""
  env, dataset_id, arrays, bad = _read_checked(path, name, dataset_id, options, log_fn)
  physics_note = (_physics(arrays, path, name, env, ~bad, log_fn) if options.check_physics
                  else "not checked (--nocheck_physics)")
  episodes = to_episodes(arrays, keep=~bad, timeouts=options.timeouts)
  if not episodes:
    raise UserError(f"{path} holds no complete transition.")
  steps = sum(len(ep["rewards"]) for ep in episodes)
  log_fn(f"{path}: {len(arrays['rewards'])} rows -> {steps} transitions in {len(episodes)} "
         f"episodes ({'the file' if 'next_observations' in arrays else 'the next row'}'s next "
         f"observations, --timeouts={options.timeouts}).")
  quality_note = (_quality(episodes, path, name, log_fn) if options.check_quality
                  else "not checked (--nocheck_quality)")
  # Every option that changed what is written, so that the command rebuilds this very dataset.
  flags = [f"--file={os.path.abspath(path)}", f"--env={name}"]
  flags += [f"--dataset_id={dataset_id}"] if dataset_id != default_id(name) else []
  flags += options.flags() + ["--overwrite"]
  provenance = {"recipe": "d4rl-import", "steps": int(steps), "recipe_steps": None,
                "command": "python -m experiments.import_d4rl " + shlex.join(flags),
                "source_file": os.path.abspath(path), "timeouts": options.timeouts,
                "drop_nonfinite": bool(options.drop_nonfinite),
                "nonfinite_rows_dropped": int(bad.sum()),
                "physics_check": physics_note, "quality_check": quality_note}
  file_meta = {k.split("/", 1)[1]: _jsonable(v) for k, v in arrays.items()
               if k.startswith("metadata/")}
  metadata = dataset_writer.DatasetMetadata(
      f"D4RL's {name}-v2 file ({os.path.basename(path)}), imported with "
      f"experiments/import_d4rl.py (--timeouts={options.timeouts}).", "D4RL",
      provenance=provenance, ref_scores=D4RL_REF_SCORES[env], env_name=env,
      extra={"d4rl_metadata": file_meta} if file_meta else None,
      eval_env=envs.d4rl_env_spec(env))
  try:
    return dataset_writer.write_dataset(dataset_id, episodes, metadata, options.overwrite)
  except UserError:
    raise                      # refused before writing anything (e.g. created meanwhile)
  except BaseException:
    # write_dataset removes a dataset it failed to write, not one whose card failed afterwards.
    shutil.rmtree(os.path.join(minari_io.datasets_root(), names.resolve(dataset_id)),
                  ignore_errors=True)
    raise


def _read_checked(path: str, name: str, dataset_id: Optional[str], options: ImportOptions,
                  log_fn):
  """The refusals of import_file before the physics, in the order its docstring lists them, each
  before anything is written. -> (env, dataset_id, the file's arrays, bool [N]: rows holding
  NaN/inf, to drop)."""
  try:
    env, _ = names.parse_name(name)
  except ValueError as e:
    raise UserError(str(e)) from None
  if options.timeouts not in TIMEOUT_MODES:
    raise UserError(f"timeouts={options.timeouts}: expected one of {', '.join(TIMEOUT_MODES)}.",
                    params=("timeouts",))
  dataset_id = dataset_id or default_id(name)
  try:
    names.resolve(dataset_id)
  except ValueError as e:
    raise UserError(f"`dataset_id`: {e}", params=("dataset_id",)) from None
  if not os.path.isfile(path):
    raise UserError(f"path={path} does not exist. D4RL's files are at {url(name)} "
                    "(download it once on a machine with network access).", params=("path",))
  if minari_io.exists_locally(dataset_id) and not options.overwrite:
    raise UserError(f"Dataset {dataset_id} already exists; pass overwrite=True to replace it.",
                    params=("overwrite",))
  try:
    arrays = read_hdf5(path)
    check(arrays, env)
  except D4RLFormatError as e:
    raise UserError(str(e)) from None
  bad = nonfinite_rows(arrays)
  if bad.any() and not options.drop_nonfinite:
    raise UserError(f"{path} has {int(bad.sum())} row(s) holding NaN/inf (first at row "
                    f"{int(np.argmax(bad))}); pass drop_nonfinite=True to drop them.",
                    params=("drop_nonfinite",))
  if bad.any():
    log_fn(f"Dropping {int(bad.sum())} row(s) holding NaN/inf (--drop_nonfinite).")
  return env, dataset_id, arrays, bad


def _physics(arrays, path, name, env, keep, log_fn) -> str:
  """replay_check for an import: the note for the provenance; UserError for a mismatch, naming
  the same-shaped env the file does replay as, if any."""
  result = replay_check(arrays, env, keep)
  if result.status == "unchecked":
    log_fn(f"Could not check that {path} holds {env}'s physics: {result.note}.")
    return f"not possible: {result.note}"
  if result.status == "match":
    log_fn(f"Physics check: {result.note}.")
    return f"passed: {result.note}"
  if result.obs_error is not None and result.obs_error <= OBS_TOLERANCE:
    raise UserError(f"{path} holds {env}'s physics but not its rewards: {result.note}; were they "
                    "rescaled or shifted? Pass check_physics=False to import it anyway.",
                    params=("check_physics",))
  others = same_shaped_envs(env)
  matches = [e for e in others if replay_check(arrays, e, keep).status == "match"]
  quality = name.partition("-")[2]
  if matches:
    found = (f"they replay as {' and '.join(matches)}'s (name={matches[0]}-{quality}?)")
  elif others:
    found = f"nor as {' or '.join(others)}'s, the other env(s) of these dims"
  else:
    found = f"no other env has {OBS_DIM[env]}/{ACTION_DIM[env]} dims"
  raise UserError(f"{path} is not {name}'s data: expected {env}'s physics, but {result.note}; "
                  f"{found}. Pass check_physics=False to import it anyway.",
                  params=("check_physics", "name"))


def _quality(episodes, path, name, log_fn) -> str:
  """d4rl_stats.quality_check of an import: the note for the provenance; a one-line warning when
  the episodes' mean return is far from what D4RL publishes for `name`."""
  ok, text = d4rl_stats.quality_check(name, [float(np.sum(ep["rewards"])) for ep in episodes])
  if ok is None:
    return f"not possible: {text}"
  if ok:
    log_fn(f"Quality check: {text}.")
    return f"passed: {text}"
  log_fn(f"warning: {path} does not look like D4RL's {name}: {text}. Is --env right? (Pass "
         "--nocheck_quality to silence this.)")
  return f"far from D4RL's: {text}"


def _jsonable(value):
  """A `metadata/*` value of the file as JSON: bytes and object arrays as strings."""
  value = np.asarray(value)
  if value.dtype.kind in "SO":
    flat = [v.decode() if isinstance(v, bytes) else str(v) for v in value.ravel().tolist()]
    return flat[0] if value.ndim == 0 else flat
  return value.tolist()
