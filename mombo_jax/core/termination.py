"""Termination functions of the model rollouts: which predicted next states end a branch, as
gymnasium's MuJoCo v5 environments decide `terminated`, with their health constants.

gymnasium v5 layout (exclude_current_positions_from_observation=True): obs[0] = torso height
z = qpos[1], obs[1] = torso angle = qpos[2]. gymnasium 1.4.0's checks are strict (open intervals)
although its docs say "closed interval"; we follow the code. tests/test_dynamics.py checks every
function against gymnasium's own `terminated`.

`model_done` adds the references' runaway bound (any |x| >= Config.rollout.rollout_obs_limit = 100
is terminal) to a function's verdict on a learned model's next state; rollouts and MOMBO's per-elite
targets both use it (one rule, one place).
"""
from __future__ import annotations

from typing import Callable, Optional

import chex
import jax.numpy as jnp

HOPPER_HEALTHY_STATE = 100.0          # |obs[1:]| < 100 (gymnasium: state_vector()[2:])
HOPPER_HEALTHY_Z = 0.7                # z > 0.7 (upper bound +inf)
HOPPER_HEALTHY_ANGLE = 0.2            # -0.2 < angle < 0.2
WALKER_HEALTHY_Z = (0.8, 2.0)         # 0.8 < z < 2.0
WALKER_HEALTHY_ANGLE = (-1.0, 1.0)    # -1 < angle < 1


def _finite(next_obs):
  # A model can emit NaN / inf; gymnasium never sees those from a real simulator, and any
  # comparison with NaN there is False (= unhealthy), so treating them as terminal is consistent.
  return jnp.all(jnp.isfinite(next_obs), axis=-1)


def _hopper_done(obs, action, next_obs):
  z, angle = next_obs[..., 0], next_obs[..., 1]
  healthy = (_finite(next_obs)
             & jnp.all(jnp.abs(next_obs[..., 1:]) < HOPPER_HEALTHY_STATE, axis=-1)
             & (z > HOPPER_HEALTHY_Z)
             & (jnp.abs(angle) < HOPPER_HEALTHY_ANGLE))
  return ~healthy


def _walker_done(obs, action, next_obs):
  z, angle = next_obs[..., 0], next_obs[..., 1]
  healthy = (_finite(next_obs)
             & (z > WALKER_HEALTHY_Z[0]) & (z < WALKER_HEALTHY_Z[1])
             & (angle > WALKER_HEALTHY_ANGLE[0]) & (angle < WALKER_HEALTHY_ANGLE[1]))
  return ~healthy


def _halfcheetah_done(obs, action, next_obs):
  # HalfCheetah-v5 never terminates; only a non-finite model prediction ends a branch.
  return ~_finite(next_obs)


_TERMINATION = {"hopper": _hopper_done, "walker2d": _walker_done,
                "halfcheetah": _halfcheetah_done}


def termination_fn(env_name: str) -> Callable:
  """fn(obs [B, S], action [B, A], next_obs [B, S]) -> bool [B] (True = terminal), jittable.

  env_name: halfcheetah | hopper | walker2d; a dataset name ('hopper-medium'), gymnasium id
  ('Hopper-v5') or Minari id ('mujoco/hopper/medium-v0') works too.
  """
  parts = env_name.lower().split("/")
  # 'hopper', 'hopper-medium', 'Hopper-v5', or a Minari id 'mujoco/hopper/medium-v0'.
  env = (parts[1] if len(parts) == 3 else parts[-1]).split("-")[0]
  env = {"half_cheetah": "halfcheetah"}.get(env, env)
  if env not in _TERMINATION:
    raise ValueError(f"No termination function for {env_name!r}; known: "
                     f"{', '.join(sorted(_TERMINATION))}.")
  return _TERMINATION[env]


def model_done(term_fn: Callable, obs, action, next_obs, obs_limit: Optional[float]):
  """bool [B]: whether a learned model's next state ends the episode.

  term_fn(obs [B, S], action [B, A], next_obs [B, S]) -> bool [B] (termination_fn), or a runaway
  state: any |next_obs| >= obs_limit (Config.rollout.rollout_obs_limit; None: no bound). The bound
  is the references' (adinlab/MOMBO utils/termination_fns.py, as OfflineRL-Kit
  offlinerlkit/utils/termination_fns.py: halfcheetah and walker2d require every coordinate in
  (-100, 100); hopper writes `np.abs(next_obs[:, 1:] < 100)`, a one-sided check on obs[1:] as
  parenthesised; here it is two-sided on every coordinate for all three envs). adinlab/MOMBO
  applies it in its rollouts (dynamics/ensemble_dynamics.py `step`) and in its per-elite targets
  (`torch_step`, on each elite's next-state mean; policies/mombo.py get_q_target_for_fake). Real
  envs never get there; a runaway learned model does.
  """
  chex.assert_equal_shape([obs, next_obs])
  done = term_fn(obs, action, next_obs)
  if obs_limit is not None:
    done = done | jnp.any(jnp.abs(next_obs) >= obs_limit, axis=-1)
  return done
