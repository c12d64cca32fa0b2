"""The host state beside a checkpoint's arrays that an exact resume of a host loop needs (the
collector's online SAC run): numpy Generators and a MuJoCo env mid-episode, as JSON. (Stop requests
themselves: mombo_jax/signals.py.)
"""
from __future__ import annotations

from typing import Optional

import numpy as np


def rng_state(rng: np.random.Generator) -> dict:
  """A numpy Generator's bit-generator state as JSON (its 128-bit integers as hex strings)."""
  def enc(x):
    if isinstance(x, dict):
      return {k: enc(v) for k, v in x.items()}
    return hex(x) if isinstance(x, int) and not isinstance(x, bool) else x
  return enc(rng.bit_generator.state)


def rng_from_state(state: dict) -> np.random.Generator:
  """The Generator rng_state(g) saved: it draws what g would have drawn next."""
  def dec(x):
    if isinstance(x, dict):
      return {k: dec(v) for k, v in x.items()}
    return int(x, 16) if isinstance(x, str) and x.startswith(("0x", "-0x")) else x
  state = dec(state)
  rng = np.random.Generator(getattr(np.random, state["bit_generator"])())
  rng.bit_generator.state = state
  return rng


def env_state(env) -> dict:
  """A gymnasium MuJoCo env mid-episode as JSON: MuJoCo's integration state (time, qpos, qvel,
  act, controls, applied forces, the solver's warm start: what mj_step reads, so that stepping
  on from it is bit for bit stepping on the original) and the time limit's elapsed steps."""
  import mujoco  # loaded only when an env is saved or restored: its native library is heavy
  model, data = env.unwrapped.model, env.unwrapped.data
  spec = mujoco.mjtState.mjSTATE_INTEGRATION
  out = np.empty(mujoco.mj_stateSize(model, spec), np.float64)
  mujoco.mj_getState(model, data, out, spec)
  return dict(mujoco=[float(x) for x in out], elapsed_steps=_elapsed(env))


def restore_env(env, state: dict):
  """Puts env (built as the saved one was, then reset: gymnasium wants a reset before a step)
  into env_state's `state`."""
  import mujoco  # loaded only when an env is saved or restored: its native library is heavy
  model, data = env.unwrapped.model, env.unwrapped.data
  spec = mujoco.mjtState.mjSTATE_INTEGRATION
  values = np.asarray(state["mujoco"], np.float64)
  if values.shape != (mujoco.mj_stateSize(model, spec),):
    raise ValueError(f"The saved env state has {values.size} values; this env's MuJoCo state has "
                     f"{mujoco.mj_stateSize(model, spec)} (another model or MuJoCo version).")
  mujoco.mj_setState(model, data, values, spec)
  if state.get("elapsed_steps") is not None:
    env.set_wrapper_attr("_elapsed_steps", int(state["elapsed_steps"]))


def _elapsed(env) -> Optional[int]:
  try:
    return int(env.get_wrapper_attr("_elapsed_steps"))
  except AttributeError:               # no time limit
    return None
