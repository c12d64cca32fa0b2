"""Does a D4RL file hold the named env's physics? It sets the simulator to
`infos/qpos`, `infos/qvel` of a sample of rows, steps the file's action and compares the next
observation and reward with the file's (D4RL's files come from gym's v2 envs on mujoco-py; the
gymnasium v5 envs have the same observation layout and, on non-terminal rows, the same reward; the
walker is replayed in its v2 model, whose right foot has friction 0.9 where v5's has 1.9).

Used by d4rl.import_file (refusing a file of another env whose dims fit, e.g. HalfCheetah data
imported as walker2d).
"""
from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional

import numpy as np

from mombo_jax.env.envs import ACTION_DIM, GYM_IDS, OBS_DIM, d4rl_env_spec, make_env

REPLAY_ROWS = 32         # rows replayed per check (spread evenly over the file)
MIN_REPLAY_ROWS = 8      # fewer replayable rows than this: not checked
# A row's error is max_j |replayed_j - file_j| / (1 + |file_j|) over its next observation. Its
# median over the sample decides. Measured with gymnasium 1.4 / MuJoCo 4.0 on random and periodic
# actions: replaying in the env that made the data (float32 storage) gives ~1e-7 (max 1e-5);
# replaying data made with another contact model (elliptic cones, implicitfast integrator, v5's
# walker feet), the stand-ins for mujoco-py's MuJoCo 2.0, gives medians <= 0.07 (max 1.0);
# replaying halfcheetah data in walker2d or back gives medians 4 to 9.
OBS_TOLERANCE = 0.5
# The same for |reward - file| / (1 + |file|) over the sample's non-terminal rows (v5's hopper
# and walker pay healthy_reward on a terminal step only when healthy, v2 paid it always): ~1e-8
# in the right env, <= 0.015 with another contact model, 0.4 to 0.8 in the wrong env.
REWARD_TOLERANCE = 0.1
VELOCITY_CLIP = {"hopper": 10.0, "walker2d": 10.0, "halfcheetah": None}  # as the envs' obs clip


class PhysicsCheck(NamedTuple):
  """What replay_check found. status: "match" | "mismatch" | "unchecked"; note: one line saying
  what was compared and the errors (or why nothing could be); the median errors (None: not
  computed)."""
  status: str
  note: str
  obs_error: Optional[float] = None
  reward_error: Optional[float] = None


def replay_env(env: str):
  """The unwrapped gymnasium v5 MuJoCo env of `env` with the model D4RL's v2 data was made in
  (envs.d4rl_env_spec; walker2d: gymnasium's walker2d.xml, the v2-v4 model, not v5's
  walker2d_v5.xml), the env an import then records for evaluation."""
  return make_env(d4rl_env_spec(env), disable_env_checker=True).unwrapped


def replay_check(arrays: Dict[str, np.ndarray], env: str, keep: Optional[np.ndarray] = None,
                  rows: int = REPLAY_ROWS) -> PhysicsCheck:
  """Replays up to `rows` rows of a D4RL file (`arrays` as read_hdf5 gives them) in `env`'s
  simulator: set_state(infos/qpos[i], infos/qvel[i]), step actions[i], compare the next
  observation (and, on non-terminal rows, the reward) with the file's. The rows are spread evenly
  over those that can be replayed: kept (`keep`, bool [N]), with a next observation, whose stored
  state gives their observation (the state is looked for in the same row, else the previous one),
  and, for the envs that clip velocities in their observation, with none at the clip (D4RL's
  scripts/generation/mujoco/fix_qpos_qvel.py rebuilt some files' qvel from the clipped
  observation)."""
  if "infos/qpos" not in arrays or "infos/qvel" not in arrays:
    return PhysicsCheck("unchecked", "the file has no infos/qpos and infos/qvel to replay")
  obs, act = arrays["observations"], arrays["actions"]
  qpos, qvel = np.asarray(arrays["infos/qpos"]), np.asarray(arrays["infos/qvel"])   # as stored
  n = obs.shape[0]
  if qpos.ndim != 2 or qvel.ndim != 2 or len(qpos) != n or len(qvel) != n:
    return PhysicsCheck("unchecked", f"infos/qpos {qpos.shape} and infos/qvel {qvel.shape} are "
                                     f"not one row per step ({n} rows)")
  sim = replay_env(env)
  try:
    nq, nv = sim.model.nq, sim.model.nv
    if qpos.shape[1] != nq or qvel.shape[1] != nv:
      return PhysicsCheck("mismatch", f"infos/qpos, infos/qvel have {qpos.shape[1]} and "
                                      f"{qvel.shape[1]} columns where {env} has {nq} and {nv}")
    # The observation each stored state gives: qpos[1:] and (clipped) qvel, as the envs' _get_obs.
    clip = VELOCITY_CLIP[env]
    implied = np.concatenate([qpos[:, 1:], qvel if clip is None else np.clip(qvel, -clip, clip)],
                             axis=1)
    with np.errstate(invalid="ignore"):
      same = np.all(np.abs(implied - obs) <= 1e-4 * (1 + np.abs(obs)), axis=1)   # [N]
      after = np.zeros(n, bool)
      after[1:] = np.all(np.abs(implied[:-1] - obs[1:]) <= 1e-4 * (1 + np.abs(obs[1:])), axis=1)
    # Pre-step states (D4RL's collect_data.py records qpos before env.step), else post-step ones.
    state = np.arange(n) if same.sum() >= after.sum() else np.arange(n) - 1
    consistent = same if same.sum() >= after.sum() else after
    nxt = arrays.get("next_observations")
    has_next = np.ones(n, bool)
    if nxt is None:
      nxt = np.concatenate([obs[1:], obs[-1:]], axis=0)
      has_next = ~(arrays["terminals"].astype(bool) | arrays["timeouts"].astype(bool))
      has_next[-1] = False
    ok = consistent & has_next & np.all(np.isfinite(nxt), axis=1) & np.all(np.isfinite(act), 1)
    if keep is not None:
      ok &= np.asarray(keep, bool)
    if clip is not None:
      ok &= np.all(np.abs(obs[:, nq - 1:]) < clip - 1e-4, axis=1)
    candidates = np.flatnonzero(ok)
    if len(candidates) < MIN_REPLAY_ROWS:
      return PhysicsCheck("unchecked", f"only {len(candidates)} row(s) have a stored state that "
                                       f"gives their observation in {env} and a next observation "
                                       f"(at least {MIN_REPLAY_ROWS} are needed)")
    picked = candidates[np.unique(np.linspace(0, len(candidates) - 1, rows).round().astype(int))]
    obs_err, rew_err = [], []
    terminal = arrays["terminals"].astype(bool)
    sim.reset(seed=0)
    for i in picked:
      sim.set_state(qpos[state[i]].astype(np.float64), qvel[state[i]].astype(np.float64))
      next_obs, reward, *_ = sim.step(np.asarray(act[i], np.float64))
      want = np.asarray(nxt[i], np.float64)
      obs_err.append(float(np.max(np.abs(next_obs - want) / (1 + np.abs(want)))))
      if not terminal[i]:
        want_r = float(arrays["rewards"][i])
        rew_err.append(abs(float(reward) - want_r) / (1 + abs(want_r)))
  finally:
    sim.close()
  obs_error = float(np.median(obs_err))
  reward_error = float(np.median(rew_err)) if rew_err else None
  where = (f"{len(picked)} rows replayed in {GYM_IDS[env]}"
           + (" (v2 walker model)" if env == "walker2d" else "") + " from infos/qpos, infos/qvel")
  errors = (f"next observations off by a median {obs_error:.2g} (match: < {OBS_TOLERANCE:g})"
            + (f", rewards of {len(rew_err)} non-terminal rows by {reward_error:.2g} (match: < "
               f"{REWARD_TOLERANCE:g})" if rew_err else ""))
  if obs_error > OBS_TOLERANCE or (reward_error is not None and reward_error > REWARD_TOLERANCE):
    return PhysicsCheck("mismatch", f"{where}: {errors}", obs_error, reward_error)
  return PhysicsCheck("match", f"{where}: {errors}", obs_error, reward_error)


def same_shaped_envs(env: str) -> List[str]:
  """The other envs whose observation and action dims equal `env`'s (the ones a file could be
  mistaken for)."""
  return [e for e in GYM_IDS if e != env and OBS_DIM[e] == OBS_DIM[env]
          and ACTION_DIM[e] == ACTION_DIM[env]]
