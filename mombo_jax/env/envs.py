"""The real environments: building one (make_env: of an env, a dataset or an env spec;
eval_env_spec: the env a dataset's policies are evaluated in, as plain data), stepping it with a
policy's action (step: the only place a [-1, 1] action is mapped to the env's bounds), and
recording its episodes (run_episodes; recording.rollout steps many side by side). Evaluation
(evaluate.Evaluator: to_env_action here, the envs stepped by env_pool.EnvPool), the online SAC
loop and its evaluations, the dataset collector and the uncertainty experiment's real transitions
step through `step`.

Which physics (docs/protocol.md, "Environments"): every env is gymnasium's v5, in its own model,
except for the policies of an imported D4RL dataset: D4RL's v2 walker data was made in the v2
walker model, whose right foot has friction 0.9 (v5's has 1.9), so d4rl.import_file records
d4rl_env_spec (Walker2d-v5 with gymnasium's walker2d.xml) in the dataset's metadata
(EVAL_ENV_KEY) and evaluation, Table 2's real transitions and rendering build that env.

Episodes are dicts of observations [T+1, S], actions [T, A], rewards [T] (float64),
terminations [T], truncations [T] (bool), as the datasets hold them.
"""
from __future__ import annotations

import json
import warnings
from typing import Any, Callable, List, NamedTuple, Optional, Union

import numpy as np

from mombo_jax import signals
from mombo_jax.data import minari_io, names
from mombo_jax.errors import UserError

GYM_IDS = {"halfcheetah": "HalfCheetah-v5", "hopper": "Hopper-v5", "walker2d": "Walker2d-v5"}
OBS_DIM = {"hopper": 11, "walker2d": 17, "halfcheetah": 17}
ACTION_DIM = {"hopper": 3, "walker2d": 6, "halfcheetah": 6}

# The MuJoCo model file each v5 env loads by default, and the model D4RL's v2 data was made in (a
# bare name is a file of gymnasium's envs/mujoco/assets). Only the walker differs: gymnasium's
# walker2d.xml is the v2-v4 model, walker2d_v5.xml changes the right foot's friction (both files'
# header comments; gymnasium envs/mujoco/walker2d_v5.py, the `xml_file` default).
V5_MODELS = {"halfcheetah": "half_cheetah.xml", "hopper": "hopper.xml",
             "walker2d": "walker2d_v5.xml"}
D4RL_MODELS = {"halfcheetah": "half_cheetah.xml", "hopper": "hopper.xml",
               "walker2d": "walker2d.xml"}
# The walker's right-foot geom and its sliding friction in each model (model.geom_friction[:, 0]);
# make_env checks the built model against the value a spec records.
RIGHT_FOOT_GEOM = "foot_geom"
RIGHT_FOOT_FRICTION = {"walker2d.xml": 0.9, "walker2d_v5.xml": 1.9}
# Minari metadata key of an imported dataset's evaluation env: a JSON string of eval_env_spec's
# dict (written by d4rl.import_file through dataset_writer.write_dataset).
EVAL_ENV_KEY = "mombo_eval_env"
_warned = set()          # datasets whose missing EVAL_ENV_KEY was warned about (once each)
# MuJoCo's compiler warns that gymnasium's half_cheetah.xml uses the deprecated `settotalmass`
# attribute each time a HalfCheetah model is built: printed raw to stderr with a blank line, and
# appended to a MUJOCO_LOG.TXT in the working directory, before anything the program says (e.g.
# import_d4rl's one-line refusal). Nothing a user can act on: quiet_mujoco drops it.
_MUJOCO_NOISE = ("compiler attribute 'settotalmass' is deprecated",)


def _spec(env: str, model: str, origin: str) -> dict:
  gym_id = GYM_IDS[env]
  out = {"id": gym_id, "kwargs": {} if model == V5_MODELS[env] else {"xml_file": model},
         "model": model}
  if model in RIGHT_FOOT_FRICTION:
    out["right_foot_friction"] = RIGHT_FOOT_FRICTION[model]
    origin += f": right-foot friction {RIGHT_FOOT_FRICTION[model]:g}"
  out["physics"] = f"{gym_id} in {origin}"
  return out


def standard_env_spec(env: str) -> dict:
  """The v5 env of `env` (halfcheetah | hopper | walker2d) in its own model, as plain data
  (eval_env_spec's dict): what the datasets this project builds are evaluated in."""
  return _spec(env, V5_MODELS[env], f"its v5 model ({V5_MODELS[env]})")


def d4rl_env_spec(env: str) -> dict:
  """The v5 env of `env` in the model D4RL's v2 data was made in (walker2d: gymnasium's
  walker2d.xml; the others' v5 model is v2's), as plain data (eval_env_spec's dict)."""
  model = D4RL_MODELS[env]
  if model == V5_MODELS[env]:
    return _spec(env, model, f"its v5 model ({model}, the model of D4RL's v2 data too)")
  return _spec(env, model, f"D4RL's v2 model ({model})")


def eval_env_spec(name: str) -> dict:
  """The env the policies trained on dataset `name` meet (evaluation, Table 2's real transitions,
  rendering), as plain JSON data: {"id": gymnasium id, "kwargs": gym.make's keyword arguments
  (e.g. {"xml_file": "walker2d.xml"}), "model": the model file, "physics": one line saying which
  model, and for the walker "right_foot_friction"}.

  - a dataset id whose metadata records EVAL_ENV_KEY (an import of D4RL's file): that env;
  - an import of D4RL's file that records none (imported before it was recorded): d4rl_env_spec,
    inferred from its provenance (or, when the dataset is not local, from a `d4rl/` id), with a
    warning (once per dataset) where that is not v5's physics, naming the re-import that
    records it;
  - anything else (an env name, the datasets this project builds, other Minari datasets): the
    v5 env in its own model (standard_env_spec).
  """
  if not names.is_dataset_id(name):
    return standard_env_spec(minari_io.env_name(name))
  meta = minari_io.local_metadata(names.resolve(name))
  if meta and meta.get(EVAL_ENV_KEY):
    return _recorded(meta[EVAL_ENV_KEY], name)
  env = minari_io.env_name(name)
  prov = _provenance(meta)
  if prov.get("recipe") == "d4rl-import" or (meta is None and name.startswith("d4rl/")):
    spec = d4rl_env_spec(env)
    if spec["kwargs"] and name not in _warned:
      _warned.add(name)
      fix = (f"re-import it to record it: {prov['command']}" if prov.get("command") else
             "re-import it with python -m experiments.import_d4rl to record it")
      warnings.warn(f"Dataset {name} records no evaluation env (imported before mombo_jax "
                    f"recorded one); as an import of D4RL's file it is evaluated in "
                    f"{spec['physics']}; {fix}.", UserWarning, stacklevel=2)
    return spec
  return standard_env_spec(env)


def _provenance(meta) -> dict:
  raw = meta.get(minari_io.PROVENANCE_KEY) if meta else None
  try:
    out = json.loads(raw) if isinstance(raw, str) else raw
  except ValueError:
    return {}
  return out if isinstance(out, dict) else {}


def _recorded(raw, name: str) -> dict:
  """EVAL_ENV_KEY's value, checked: UserError naming the dataset when it is not such a dict."""
  try:
    spec = json.loads(raw) if isinstance(raw, str) else raw
  except ValueError:
    spec = None
  if not (isinstance(spec, dict) and isinstance(spec.get("id"), str)
          and isinstance(spec.get("kwargs", {}), dict)):
    raise UserError(f"Dataset {name}: its metadata's {EVAL_ENV_KEY} is not an env spec "
                    f"({str(raw)[:80]!r}); re-import the dataset.")
  spec.setdefault("kwargs", {})
  spec.setdefault("physics", spec["id"])
  return spec


def right_foot_friction(env) -> float:
  """The sliding friction of the walker's right foot (geom RIGHT_FOOT_GEOM) in a gymnasium MuJoCo
  env's model."""
  # mujoco only here: import_d4rl and the cards import envs without it
  import mujoco
  model = env.unwrapped.model
  geom = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_GEOM, RIGHT_FOOT_GEOM)
  if geom < 0:
    raise ValueError(f"The model has no geom {RIGHT_FOOT_GEOM!r} (not a walker).")
  return float(model.geom_friction[geom, 0])


def quiet_mujoco():
  """Routes MuJoCo's warnings through Python's warnings (each message shown once, no
  MUJOCO_LOG.TXT), less the _MUJOCO_NOISE ones; leaves a handler the caller installed alone.
  make_env calls it: every env of this package is built after it."""
  # mujoco only here: import_d4rl and the cards import envs without it
  import mujoco
  if mujoco.get_mju_user_warning() is None:
    mujoco.set_mju_user_warning(_mujoco_warning)


def _mujoco_warning(message: str):
  if not any(noise in message for noise in _MUJOCO_NOISE):
    warnings.warn(f"MuJoCo: {message}", RuntimeWarning, stacklevel=2)


def make_env(name: Union[str, dict], **kwargs):
  """The gymnasium env of an env name or short name (v5), of a dataset id (its eval_env_spec), or
  of an eval_env_spec dict. kwargs go to gym.make (max_episode_steps=None keeps the env's own time
  limit). UserError when a spec's recorded right-foot friction is not the built model's (a
  gymnasium whose model files changed)."""
  # gymnasium only here: import_d4rl and the cards import envs without it
  import gymnasium as gym
  quiet_mujoco()
  if isinstance(name, dict):
    spec = name
  elif names.is_dataset_id(name):
    spec = eval_env_spec(name)
  else:
    return gym.make(GYM_IDS[minari_io.env_name(name)], **kwargs)
  env = gym.make(spec["id"], **{**spec.get("kwargs", {}), **kwargs})
  want = spec.get("right_foot_friction")
  if want is not None:
    got = right_foot_friction(env)
    if abs(got - float(want)) > 1e-6:
      env.close()
      raise UserError(f"{spec['physics']}: the built model's right-foot friction is {got:g}, not "
                      f"{want:g}; this gymnasium's model files differ from the ones the spec "
                      "names (requirements.txt pins gymnasium).")
  return env


def to_env_action(action, space) -> np.ndarray:
  """Policy actions [..., A] in [-1, 1] -> the Box `space`'s bounds, in its dtype: low + (a + 1) / 2
  * (high - low), computed in float64. For [-1, 1] bounds (the MuJoCo tasks) that is exactly the
  identity, so it is skipped there."""
  action = np.asarray(action, np.float64)
  low, high = np.asarray(space.low, np.float64), np.asarray(space.high, np.float64)
  if not (np.all(low == -1.0) and np.all(high == 1.0)):
    action = low + 0.5 * (action + 1.0) * (high - low)
  return action.astype(space.dtype)


class EnvStep(NamedTuple):
  """What one env step returns. For a vector env every field has a leading env axis [N]."""
  next_obs: np.ndarray     # [S]
  reward: Any              # float
  terminated: Any          # bool
  truncated: Any           # bool
  env_action: np.ndarray   # [A]: the action the env got (in its bounds and dtype)


def step(env, action) -> EnvStep:
  """Steps `env` (a gymnasium env, or a vector env with actions [N, A]) with the policy's action
  in [-1, 1] (to_env_action maps it to the env's bounds)."""
  env_action = to_env_action(action, env.action_space)
  next_obs, reward, terminated, truncated, _ = env.step(env_action)
  return EnvStep(next_obs, reward, terminated, truncated, env_action)


def new_episode(obs) -> dict:
  """An episode being recorded, from its first observation [S] (lists; finish_episode stacks)."""
  return dict(observations=[obs], actions=[], rewards=[], terminations=[], truncations=[])


def record_step(episode: dict, action, out: EnvStep):
  """Appends one step to an episode being recorded: `action` [A] as it should be stored."""
  episode["observations"].append(out.next_obs)
  episode["actions"].append(action)
  episode["rewards"].append(float(out.reward))
  episode["terminations"].append(bool(out.terminated))
  episode["truncations"].append(bool(out.truncated))


def finish_episode(episode: dict) -> dict:
  """A recorded episode as arrays: observations [T+1, S] (as the env gives them), actions [T, A],
  rewards [T] float64, terminations / truncations [T] bool."""
  return dict(observations=np.stack(episode["observations"]),
              actions=np.stack(episode["actions"]),
              rewards=np.asarray(episode["rewards"], np.float64),
              terminations=np.asarray(episode["terminations"], bool),
              truncations=np.asarray(episode["truncations"], bool))


def run_episodes(make_env: Callable, policy: Callable, episodes: int, seed: int,
                 should_stop: Optional[Callable[[], bool]] = None) -> List[dict]:
  """`episodes` whole episodes of policy(obs [S] float32) -> action [A] in [-1, 1] in one env from
  make_env(), episode i reset with seed + i, each run to termination or the time limit. Returns
  them as episodes (module docstring) holding the policy's actions (before to_env_action).
  should_stop: polled every step; when it fires, errors.Interrupted (nothing is returned)."""
  env = make_env()
  out = []
  try:
    for i in range(episodes):
      obs, _ = env.reset(seed=seed + i)
      episode = new_episode(obs)
      while True:
        signals.check(should_stop, "an evaluation")
        action = np.asarray(policy(np.asarray(obs, np.float32)))
        result = step(env, action)
        record_step(episode, action, result)
        obs = result.next_obs
        if result.terminated or result.truncated:
          break
      out.append(finish_episode(episode))
  finally:
    env.close()
  return out

