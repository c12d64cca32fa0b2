r"""Build D4RL-recipe datasets as local Minari datasets (SPEC.md section 7).

  python -m experiments.collect --env=hopper-random                 # 1M uniform-random steps
  python -m experiments.collect \
      --env=hopper-medium-replay,hopper-medium,hopper-expert,hopper-medium-expert
  python -m experiments.collect --env=walker2d-random-expert-5pct

Datasets are written under MINARI_DATASETS_PATH as `mombo/<env>/<quality>-v0`
(`mombo_jax.data.minari_id`), with the D4RL reference returns as ref_min_score / ref_max_score.
An existing dataset is never overwritten (it is skipped, with a message) unless --overwrite.

Recipes (D4RL, Fu et al. 2020):
- random: --steps steps of a uniform random policy.
- One online SAC run per environment (our mombo_jax.sac, standard online hyperparameters in
  ONLINE_SAC) gives the other qualities. Its deterministic evaluation return is checked every
  --eval_every steps; the first time it reaches --medium_fraction x the D4RL expert return, the
  policy is snapshotted ("medium") and the replay buffer up to that step is `medium-replay`.
  Training continues to --sac_steps; the final policy is the "expert".
- medium / expert: --steps steps of the medium / final policy. D4RL sampled its behaviour policies'
  actions, so by default actions are drawn from the stochastic SAC policy
  (--rollout_policy=deterministic uses tanh(mean)).
- medium-expert: the episodes of medium followed by those of expert.
- <env>-random-<medium|expert>-<p>pct (Hong et al. 2023, as used in the paper's appendix): as many
  transitions as the random dataset, p% of them from whole episodes of the medium / expert dataset,
  the rest from whole random episodes (episodes drawn in random order; whole episodes make the
  shares approximate).
Ingredients that are missing (the random dataset for a mixture, medium for medium-expert, ...) are
built and written too; existing ones are reused as they are.

The SAC run lives in --workdir/<env>/sac: Orbax checkpoints (agent, replay buffer, medium snapshot)
every --checkpoint_every steps and at the medium point, so an interrupted run resumes where it
stopped (the interrupted episode is cut: marked truncated). Running again with a larger
--sac_steps continues a finished run.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import sys
import time
import warnings
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from absl import app, flags, logging

FLAGS = flags.FLAGS


def define_flags():
  """Flags are defined only when this module runs as the program (see the __main__ block), so
  tests can import it next to experiments.run (absl flags are global: both define --env)."""
  flags.DEFINE_list("env", None, "Dataset short name(s), comma-separated, e.g. hopper-random or "
                    "hopper-medium,hopper-expert.")
  flags.DEFINE_integer("steps", 1_000_000, "Transitions of each random / medium / expert dataset "
                       "(and the size of a mixed dataset).")
  flags.DEFINE_integer("sac_steps", 1_000_000, "Environment steps (= gradient steps) of the SAC "
                       "run.")
  flags.DEFINE_integer("start_steps", 10_000, "Uniform-random warm-up steps of the SAC run.")
  flags.DEFINE_integer("eval_every", 10_000, "SAC steps between deterministic evaluations.")
  flags.DEFINE_integer("eval_episodes", 10, "Episodes per SAC evaluation.")
  flags.DEFINE_float("medium_fraction", 1.0 / 3.0, "The medium policy is the first whose "
                     "evaluation return reaches this fraction of the D4RL expert return.")
  flags.DEFINE_integer("checkpoint_every", 50_000, "SAC steps between Orbax checkpoints.")
  flags.DEFINE_integer("train_every", 1000, "SAC env steps between chunks of as many gradient "
                       "steps (D4RL's rlkit SAC alternates 1000 and 1000; 1 = after every step).")
  flags.DEFINE_integer("log_every", 5_000, "Steps between progress lines.")
  flags.DEFINE_list("hidden", ["256", "256"], "SAC hidden layer widths (actor and critics).")
  flags.DEFINE_integer("batch_size", 256, "SAC batch size.")
  flags.DEFINE_enum("rollout_policy", "stochastic", ["stochastic", "deterministic"],
                    "How the medium / expert policies act when their datasets are recorded.")
  flags.DEFINE_integer("num_envs", 8, "Environments stepped side by side when recording a policy "
                       "(one batched policy call per round).")
  flags.DEFINE_integer("max_episode_steps", None, "Episode time limit (default: the env's 1000).")
  flags.DEFINE_integer("seed", 0, "Seed of everything random here.")
  flags.DEFINE_string("workdir", "runs/collect", "Where the SAC runs keep their checkpoints.")
  flags.DEFINE_bool("overwrite", False, "Rebuild the named datasets even if they exist.")


# Standard online SAC (Haarnoja et al. 2018; the D4RL behaviour policies were trained like this):
# Adam 3e-4 everywhere, automatic temperature, soft backup, no target clamp, constant lr.
# algo="mopo" only selects the plain (not moment-matched) critic in the actor loss.
ONLINE_SAC = dict(algo="mopo", actor_lr=3e-4, critic_lr=3e-4, alpha_lr=3e-4, auto_alpha=True,
                  log_alpha_init=0.0, actor_cosine_schedule=False, deterministic_backup=False,
                  clip_target_min=None, alpha_max=None)
SAC_QUALITIES = ("medium-replay", "medium", "expert", "medium-expert")
_SEED_OFFSETS = {"random": 0, "sac": 1, "medium": 2, "expert": 3, "mix": 4, "eval": 5}
AUTHOR = "mombo_jax experiments/collect.py"


class UserError(Exception):
  """A problem the user can fix; printed without a traceback."""


@dataclasses.dataclass(frozen=True)
class Options:
  """Everything a build needs (the CLI flags, as a value tests can construct directly)."""
  steps: int = 1_000_000
  sac_steps: int = 1_000_000
  start_steps: int = 10_000
  eval_every: int = 10_000
  eval_episodes: int = 10
  medium_fraction: float = 1.0 / 3.0
  checkpoint_every: int = 50_000
  train_every: int = 1000
  log_every: int = 5_000
  hidden: tuple = (256, 256)
  batch_size: int = 256
  rollout_policy: str = "stochastic"
  num_envs: int = 8
  max_episode_steps: Optional[int] = None
  seed: int = 0
  workdir: str = "runs/collect"
  overwrite: bool = False


def _print(msg: str):
  print(msg, flush=True)


def _fmt_time(seconds: float) -> str:
  seconds = int(max(seconds, 0))
  return f"{seconds // 3600:d}h{seconds % 3600 // 60:02d}m{seconds % 60:02d}s"


# --------------------------------------------------------------------------------- environments

def _make_env(env: str, max_episode_steps: Optional[int] = None):
  from mombo_jax import data
  kwargs = {} if max_episode_steps is None else {"max_episode_steps": max_episode_steps}
  return data.make_env(env, **kwargs)


def _to_env_action(action: np.ndarray, space) -> np.ndarray:
  """[-1, 1] policy actions -> the env's Box bounds (the identity for the MuJoCo tasks)."""
  low, high = space.low, space.high
  return (low + (np.asarray(action, np.float64) + 1.0) * 0.5 * (high - low)).astype(space.dtype)


def rollout(make_env: Callable, policy: Callable, num_steps: int, seed: int,
            num_envs: int = 1) -> List[dict]:
  """Record exactly `num_steps` transitions of `policy` in `num_envs` envs stepped side by side.

  policy(obs [K, S] float32) -> actions [K, A] in [-1, 1].
  Returns episodes: dicts with observations [T+1, S] (float64, as the env gives them),
  actions [T, A] (env dtype), rewards [T], terminations [T], truncations [T]. Episodes still
  running when the budget is spent are cut and marked truncated.
  """
  if num_steps < 1:
    raise ValueError(f"num_steps must be >= 1, got {num_steps}.")
  num_envs = max(1, min(num_envs, num_steps))
  envs = [make_env() for _ in range(num_envs)]
  seeds = np.random.SeedSequence(seed).generate_state(num_envs * 2)
  rngs = [np.random.default_rng(int(s)) for s in seeds[num_envs:]]
  open_eps, episodes = [], []

  def start(i, reset_seed=None):
    obs, _ = envs[i].reset(seed=reset_seed if reset_seed is not None
                           else int(rngs[i].integers(2**31)))
    return dict(observations=[obs], actions=[], rewards=[], terminations=[], truncations=[])

  open_eps = [start(i, int(seeds[i]) % 2**31) for i in range(num_envs)]
  done = 0
  while done < num_steps:
    active = min(num_envs, num_steps - done)
    obs = np.stack([ep["observations"][-1] for ep in open_eps]).astype(np.float32)
    actions = np.asarray(policy(obs))
    for i in range(active):
      ep = open_eps[i]
      act = _to_env_action(actions[i], envs[i].action_space)
      next_obs, reward, terminated, truncated, _ = envs[i].step(act)
      ep["observations"].append(next_obs)
      ep["actions"].append(act)
      ep["rewards"].append(float(reward))
      ep["terminations"].append(bool(terminated))
      ep["truncations"].append(bool(truncated))
      if terminated or truncated:
        episodes.append(_finish_episode(ep))
        open_eps[i] = start(i)
    done += active
  for ep in open_eps:
    if ep["actions"]:
      ep["truncations"][-1] = True  # cut by the budget: the next state would still bootstrap
      episodes.append(_finish_episode(ep))
  for env in envs:
    env.close()
  return episodes


def _finish_episode(ep: dict) -> dict:
  return dict(observations=np.stack(ep["observations"]), actions=np.stack(ep["actions"]),
              rewards=np.asarray(ep["rewards"], np.float64),
              terminations=np.asarray(ep["terminations"], bool),
              truncations=np.asarray(ep["truncations"], bool))


def random_policy(action_dim: int, seed: int) -> Callable:
  """Uniform actions in [-1, 1]^A for a batch of observations."""
  rng = np.random.default_rng(seed)
  return lambda obs: rng.uniform(-1.0, 1.0, (obs.shape[0], action_dim)).astype(np.float32)


_POLICY_CACHE: Dict = {}


def sac_policy(actor_params, config, seed: int, deterministic: bool) -> Callable:
  """Batched jitted SAC policy on host arrays (compiled once per config and batch size)."""
  import jax
  from mombo_jax import sac
  if (config, deterministic) not in _POLICY_CACHE:
    _POLICY_CACHE[config, deterministic] = jax.jit(
        (lambda p, o, k: sac.policy_mode(p, o, config)) if deterministic
        else (lambda p, o, k: sac.policy_sample(p, o, k, config)))
  fn = _POLICY_CACHE[config, deterministic]
  key = [jax.random.key(seed)]

  def policy(obs):
    key[0], k = jax.random.split(key[0])
    return np.asarray(fn(actor_params, obs, k))
  return policy


# ------------------------------------------------------------------------------ minari writing

def dataset_exists(name: str) -> bool:
  from mombo_jax import data
  return data.exists_locally(name)


RECIPE_STEPS = {"random": 1_000_000, "medium": 1_000_000, "expert": 1_000_000,
                "medium-expert": 2_000_000, "medium-replay": None, "mixed": 1_000_000}


def provenance_for(name: str, recipe: str, steps: int) -> dict:
  """What `data.provenance` reads back: the recipe, the transitions written, the full recipe's size
  (None where it has none) and the command that rebuilds the dataset at full size."""
  return {"recipe": recipe, "steps": int(steps), "recipe_steps": RECIPE_STEPS.get(recipe),
          "command": f"python -m experiments.collect --env={name} --overwrite"}


def write_dataset(name: str, episodes: Sequence[dict], description: str, algorithm: str,
                  max_episode_steps: Optional[int] = None, overwrite: bool = False, *,
                  provenance: Optional[dict] = None, ref_scores: Optional[tuple] = None,
                  env_name: Optional[str] = None, extra_metadata: Optional[dict] = None):
  """Write episodes as a Minari dataset: `name` is a short name (-> data.minari_id) or a full
  Minari id (used as it is; its env from `env_name`, else from the id). Metadata: the env and its
  gymnasium v5 eval env, reference returns (`ref_scores` (min, max), default D4RL's for the env),
  `provenance` (see provenance_for) under data.PROVENANCE_KEY, and `extra_metadata` (JSON-encoded
  values). episodes: dicts of observations [T+1, S], actions [T, A], rewards, terminations,
  truncations [T]."""
  import minari
  from minari.data_collector import EpisodeBuffer
  from mombo_jax import data
  dataset_id = name if "/" in name else data.minari_id(name)
  env_id = env_name or data.env_name(name)
  path = os.path.join(data.datasets_root(), dataset_id)
  if os.path.exists(path):
    if not overwrite:
      raise UserError(f"Dataset {dataset_id} already exists at {path}; pass --overwrite to "
                      "rebuild it.")
    shutil.rmtree(path)
  env = _make_env(env_id, max_episode_steps)
  eval_env = _make_env(env_id)
  low, high = ref_scores or data.D4RL_REF_SCORES[data.env_name(env_id)]
  buffers = [EpisodeBuffer(id=i, observations=ep["observations"], actions=ep["actions"],
                           rewards=ep["rewards"], terminations=ep["terminations"],
                           truncations=ep["truncations"]) for i, ep in enumerate(episodes)]
  try:
    with warnings.catch_warnings():
      warnings.filterwarnings("ignore", message=".*is set to None.*")
      minari.create_dataset_from_buffers(
          dataset_id, buffers, env=env, eval_env=eval_env.spec, algorithm_name=algorithm,
          author=AUTHOR, code_permalink="experiments/collect.py", ref_min_score=low,
          ref_max_score=high, description=description)
    extra = {k: json.dumps(v) for k, v in (extra_metadata or {}).items()}
    if provenance is not None:
      extra[data.PROVENANCE_KEY] = json.dumps(provenance)
    if extra:
      minari.load_dataset(dataset_id).storage.update_metadata(extra)
  except BaseException:
    shutil.rmtree(path, ignore_errors=True)  # no half-written dataset blocks the next attempt
    raise
  finally:
    env.close()
    eval_env.close()
  from mombo_jax import cards
  cards.write_card(dataset_id, episodes=episodes)   # dataset_card.md + returns_hist.png
  return dataset_id


def read_episodes(name: str) -> List[dict]:
  """The episodes of a local dataset, as written by `rollout`."""
  from mombo_jax import data
  ds = data.load_dataset(name)
  return [dict(observations=np.asarray(ep["observations"]), actions=np.asarray(ep["actions"]),
               rewards=np.asarray(ep["rewards"]), terminations=np.asarray(ep["terminations"]),
               truncations=np.asarray(ep["truncations"]))
          for ep in ds.storage.get_episodes(ds.episode_indices)]


def _summary(episodes: Sequence[dict]) -> str:
  steps = sum(len(ep["rewards"]) for ep in episodes)
  returns = [float(np.sum(ep["rewards"])) for ep in episodes]
  return (f"{steps} transitions, {len(episodes)} episodes, episode return mean "
          f"{np.mean(returns):.1f} (min {np.min(returns):.1f}, max {np.max(returns):.1f})")


# ------------------------------------------------------------------------------------- random

def build_random(name: str, steps: int = 1_000_000, seed: int = 0, log_fn=_print,
                 max_episode_steps: Optional[int] = None, overwrite: bool = False,
                 num_envs: int = 1) -> str:
  """Write `<env>-random`: `steps` transitions of a uniform random policy; returns its id."""
  from mombo_jax import data
  env, quality = data.parse_name(name)
  if quality != "random":
    raise ValueError(f"build_random builds <env>-random datasets, got {name!r}.")
  probe = _make_env(name, max_episode_steps)
  action_dim = probe.action_space.shape[0]
  probe.close()
  t0 = time.time()
  episodes = rollout(lambda: _make_env(name, max_episode_steps),
                     random_policy(action_dim, seed), steps, seed + _SEED_OFFSETS["random"],
                     num_envs)
  elapsed = time.time() - t0
  log_fn(f"{name}: {_summary(episodes)}; {steps / max(elapsed, 1e-9):.0f} steps/s")
  written = sum(len(ep["rewards"]) for ep in episodes)
  dataset_id = write_dataset(name, episodes, f"{steps} steps of a uniform random policy on "
                             f"{data.GYM_IDS[env]} (D4RL recipe).", "uniform-random",
                             max_episode_steps, overwrite,
                             provenance=provenance_for(name, "random", written))
  log_fn(f"wrote {dataset_id} ({time.time() - t0:.1f} s in all)")
  return dataset_id


# ----------------------------------------------------------------------------------- SAC run

def online_config(env: str, hidden: Sequence[int], batch_size: int):
  """The Config of the online SAC run (ONLINE_SAC on top of the defaults)."""
  from mombo_jax.config import Config
  return Config(env=f"{env}-expert", actor_hidden=tuple(hidden), critic_hidden=tuple(hidden),
                batch_size=batch_size, **ONLINE_SAC)


_REPLAY_FIELDS = ("obs", "action", "reward", "next_obs", "terminated")


def _make_jitted(config):
  """(insert, train) jitted for one online-SAC config (acting runs on the host: host_actor).

  insert(replay, rows, start) -> replay: writes rows (obs, action, reward, next_obs, terminated,
    each [K, ...]) at start..start+K-1 of the device replay (donated: updated in place).
  train(agent, replay, size, keys [n]) -> agent: n SAC updates in one lax.scan, each on a batch
    sampled uniformly on the device from the first `size` rows.
  Sampling on the device and running a whole chunk of updates per call remove the per-step host
  round-trips (numpy gathers, batch uploads, one dispatch per update) that bound the collector.
  """
  import functools
  import jax
  import jax.numpy as jnp
  from mombo_jax import sac
  from mombo_jax.buffer import Batch
  target_fn = functools.partial(sac.soft_target, config=config)

  @functools.partial(jax.jit, donate_argnums=(0,))
  def insert(replay, rows, start):
    return {k: jax.lax.dynamic_update_slice_in_dim(replay[k], jnp.asarray(v, replay[k].dtype),
                                                   start, 0)
            for k, v in zip(_REPLAY_FIELDS, rows)}

  @functools.partial(jax.jit, donate_argnums=(0,))
  def train(agent, replay, size, keys):
    def one(agent, key):
      k_idx, k_update = jax.random.split(key)
      idx = jax.random.randint(k_idx, (config.batch_size,), 0, size)
      o, a, r, o2, d = (replay[k][idx] for k in _REPLAY_FIELDS)
      batch = Batch(obs=o, action=a, reward=r, next_obs=o2, done=d, obs_var=jnp.zeros_like(o),
                    next_obs_mean=o2, next_obs_var=jnp.zeros_like(o2), reward_mean=r,
                    reward_var=jnp.zeros_like(r))
      return sac.update(agent, batch, k_update, target_fn, config)[0], None

    return jax.lax.scan(one, agent, keys)[0]

  return insert, train


def host_actor(actor_params, config) -> Callable:
  """The actor as a numpy function on one observation: f(obs [S], rng or None) -> action [A]
  (a sample when rng is a numpy Generator, tanh(mean) when None). A [256, 256] MLP on one state
  costs tens of microseconds in numpy, several times less than a jitted call's dispatch, and the
  online loop acts once per environment step."""
  import jax
  layers = jax.device_get(actor_params)["params"]
  n = len(config.actor_hidden)
  hidden = [(np.asarray(layers[f"Dense_{i}"]["kernel"]), np.asarray(layers[f"Dense_{i}"]["bias"]))
            for i in range(n)]
  mean_w, mean_b = (np.asarray(layers[f"Dense_{n}"][k]) for k in ("kernel", "bias"))
  std_w, std_b = (np.asarray(layers[f"Dense_{n + 1}"][k]) for k in ("kernel", "bias"))

  def f(obs, rng=None):
    x = np.asarray(obs, np.float32)
    for w, b in hidden:
      x = np.maximum(x @ w + b, 0.0)
    mean = x @ mean_w + mean_b
    if rng is None:
      return np.tanh(mean)
    log_std = np.clip(x @ std_w + std_b, config.log_std_min, config.log_std_max)
    return np.tanh(mean + np.exp(log_std) * rng.standard_normal(mean.shape, np.float32))
  return f


_JIT_CACHE: Dict = {}


def _jitted(config):
  if config not in _JIT_CACHE:
    _JIT_CACHE[config] = _make_jitted(config)
  return _JIT_CACHE[config]


def evaluate(make_env: Callable, mode_fn: Callable, episodes: int, seed: int) -> np.ndarray:
  """Returns [episodes] of the deterministic policy mode_fn(obs [S] f32) -> action [A]."""
  env = make_env()
  returns = []
  for i in range(episodes):
    obs, _ = env.reset(seed=seed + i)
    total, done = 0.0, False
    while not done:
      action = _to_env_action(np.asarray(mode_fn(obs.astype(np.float32))), env.action_space)
      obs, reward, terminated, truncated, _ = env.step(action)
      total += float(reward)
      done = terminated or truncated
    returns.append(total)
  env.close()
  return np.asarray(returns)


@dataclasses.dataclass
class SacResult:
  """What the datasets need from a SAC run. replay_* arrays hold the first `medium_size` rows."""
  config: object
  final_actor: object                 # actor variables at the end of training
  medium_actor: Optional[object]      # actor variables at the medium point (None: never reached)
  medium_step: int                    # env step of the medium point (-1: never reached)
  medium_size: int                    # replay rows up to the medium point
  replay: dict                        # host arrays, rows [0, medium_size)
  evals: list                         # [(step, mean return), ...]
  best_eval: tuple                    # (step, mean return)


def _empty_replay(capacity: int, obs_dim: int, action_dim: int) -> dict:
  f32 = np.float32
  return dict(obs=np.zeros((capacity, obs_dim), f32), action=np.zeros((capacity, action_dim), f32),
              reward=np.zeros((capacity,), f32), next_obs=np.zeros((capacity, obs_dim), f32),
              terminated=np.zeros((capacity,), f32), end=np.zeros((capacity,), f32))


def train_sac(make_env: Callable, config, total_steps: int, *, start_steps: int, eval_every: int,
              eval_episodes: int, seed: int, medium_return: Optional[float] = None,
              workdir: Optional[str] = None, checkpoint_every: int = 50_000,
              log_every: int = 5_000, log_fn=_print, train_every: int = 1000) -> SacResult:
  """Online SAC (one gradient step per env step, run in chunks of train_every), resumable from
  checkpoints in workdir.

  make_env() -> gymnasium env with a Box action space. Evaluations (deterministic policy,
  eval_episodes episodes) run every eval_every steps; the first one whose mean reaches
  medium_return (if given) snapshots the actor and the replay size (the medium point).
  """
  import jax
  from mombo_jax import sac

  env = make_env()
  obs_dim, action_dim = env.observation_space.shape[0], env.action_space.shape[0]
  insert, train = _jitted(config)
  if train_every < 1:
    raise UserError(f"--train_every must be >= 1, got {train_every}.")
  settings = dict(seed=seed, start_steps=start_steps, obs_dim=obs_dim, action_dim=action_dim,
                  max_episode_steps=env.spec.max_episode_steps if env.spec else None)
  ckpt = _SacCheckpoints(workdir, config, total_steps, settings) if workdir else None

  state, meta = None, None
  if ckpt is not None:
    state, meta = ckpt.restore(obs_dim, action_dim)
  if state is None:
    agent = sac.init_agent(jax.random.key(seed), obs_dim, action_dim, config, total_steps)
    state = dict(agent=agent, key=jax.random.key_data(jax.random.key(seed + 1)),
                 replay=_empty_replay(total_steps, obs_dim, action_dim),
                 medium_actor=jax.tree_util.tree_map(np.asarray, agent.actor.params))
    meta = dict(step=0, medium_step=-1, medium_size=0, evals=[], episodes=0, trained=0)
  else:
    reached = (f"medium point at step {meta['medium_step']}" if meta["medium_step"] >= 0
               else "medium point not reached yet")
    log_fn(f"resumed the SAC run at step {meta['step']} from {ckpt.directory} ({reached})")
    if meta["step"] > 0:
      state["replay"]["end"][meta["step"] - 1] = 1.0  # the interrupted episode is cut here
  replay = state["replay"]
  agent = state["agent"]
  key = jax.random.wrap_key_data(np.asarray(state["key"], np.uint32))
  device_replay, uploaded = None, 0   # the sampling copy on the device and the rows it holds
  policy = host_actor(agent.actor.params, config)    # refreshed after every training chunk
  act_rng = np.random.default_rng([seed, meta["step"], 1])
  rng = np.random.default_rng([seed, meta["step"]])
  step = meta["step"]

  def save():
    if ckpt is not None:
      state.update(agent=agent, key=jax.random.key_data(key))
      ckpt.save(step, state, meta)

  def eval_now():
    returns = evaluate(make_env, policy, eval_episodes,
                       seed * 1000 + _SEED_OFFSETS["eval"] + step)
    meta["evals"].append([step, float(returns.mean())])
    reached = ""
    if medium_return is not None and meta["medium_step"] < 0 and returns.mean() >= medium_return:
      meta["medium_step"], meta["medium_size"] = step, step
      state["medium_actor"] = jax.tree_util.tree_map(np.asarray, agent.actor.params)
      reached = f"  -> medium point (>= {medium_return:.1f}); snapshot taken"
    log_fn(f"  eval @ {step}: return {returns.mean():.1f} +- {returns.std():.1f}{reached}")
    return bool(reached)

  # Gradient steps start once the warm-up is over and a full batch exists.
  learning_starts = max(start_steps, config.batch_size)
  if meta.get("trained") is None:   # a checkpoint from before chunked training: one per step
    meta["trained"] = max(0, meta["step"] - learning_starts + 1)
  obs, _ = env.reset(seed=int(rng.integers(2**31)))
  episode_return, last_return = 0.0, float("nan")
  action = None
  window = (step, time.time())  # (step, time) of the last progress line
  while step < total_steps:
    if step < start_steps or action is None:
      action = rng.uniform(-1.0, 1.0, action_dim).astype(np.float32)
    next_obs, reward, terminated, truncated, _ = env.step(
        _to_env_action(action, env.action_space))
    replay["obs"][step], replay["action"][step] = obs, action
    replay["reward"][step], replay["next_obs"][step] = reward, next_obs
    replay["terminated"][step] = float(terminated)
    replay["end"][step] = float(terminated or truncated)
    episode_return += float(reward)
    obs = next_obs
    if terminated or truncated:
      last_return, episode_return = episode_return, 0.0
      meta["episodes"] += 1
      obs, _ = env.reset(seed=int(rng.integers(2**31)))
    step += 1
    # One gradient step per environment step from learning_starts on, run in chunks of
    # train_every (as D4RL's rlkit SAC alternates 1000 env steps with 1000 gradient steps).
    due = step - learning_starts + 1 - meta["trained"]
    if due > 0 and (step % train_every == 0 or step == total_steps):
      if device_replay is None:  # first chunk (or a resume): upload everything collected so far
        device_replay, uploaded = {k: jax.device_put(replay[k]) for k in _REPLAY_FIELDS}, step
      elif uploaded < step:
        rows = tuple(replay[k][uploaded:step] for k in _REPLAY_FIELDS)
        device_replay, uploaded = insert(device_replay, rows, np.int32(uploaded)), step
      key, k_train = jax.random.split(key)
      agent = train(agent, device_replay, np.int32(step), jax.random.split(k_train, due))
      meta["trained"] += due
      policy = host_actor(agent.actor.params, config)
    if step >= start_steps:
      action = policy(obs, act_rng).astype(np.float32)
    meta["step"] = step
    if step % log_every == 0 or step == total_steps:
      # Rate over the last interval: the warm-up (no gradient steps) is much faster.
      now = time.time()
      rate = (step - window[0]) / max(now - window[1], 1e-9)
      window = (step, now)
      log_fn(f"SAC step {step}/{total_steps}  {rate:.0f} steps/s  last episode return "
             f"{last_return:.1f}  episodes {meta['episodes']}  ETA "
             f"{_fmt_time((total_steps - step) / max(rate, 1e-9))}")
    reached = (step % eval_every == 0 or step == total_steps) and eval_now()
    if ckpt is not None and (reached or step % checkpoint_every == 0 or step == total_steps):
      save()
  env.close()
  best = max(meta["evals"], key=lambda e: e[1]) if meta["evals"] else (step, float("nan"))
  size = meta["medium_size"]
  return SacResult(config=config, final_actor=agent.actor.params,
                   medium_actor=state["medium_actor"] if meta["medium_step"] >= 0 else None,
                   medium_step=meta["medium_step"], medium_size=size,
                   replay={k: v[:size] for k, v in replay.items()},
                   evals=[tuple(e) for e in meta["evals"]], best_eval=tuple(best))


class _SacCheckpoints:
  """The SAC run's checkpoints (mombo_jax.checkpoint.RunCheckpointer, kind "collector"): state
  pytree (agent, replay, key data, medium actor) plus metadata (step, medium point, evaluations,
  the run's settings for a sanity check)."""

  def __init__(self, directory: str, config, total_steps: int, run_settings: dict):
    from mombo_jax import checkpoint
    self.directory = os.path.abspath(directory)
    self.config = config
    self.run_settings = run_settings
    self.total_steps = total_steps
    self._ckpt = checkpoint.RunCheckpointer(self.directory, keep=2, kind="collector")

  def _settings(self):
    c = self.config
    return dict(actor_hidden=list(c.actor_hidden), critic_hidden=list(c.critic_hidden),
                batch_size=c.batch_size, **self.run_settings)

  def save(self, step: int, state: dict, meta: dict):
    meta = dict(meta, settings=self._settings(), capacity=int(state["replay"]["obs"].shape[0]))
    self._ckpt.save(step, state, meta)

  def restore(self, obs_dim: int, action_dim: int):
    """(state, meta) of the latest valid checkpoint, or (None, None) when there is none."""
    import jax
    from mombo_jax import checkpoint, sac
    try:
      meta = self._ckpt.metadata()
    except checkpoint.CheckpointError as e:
      raise UserError(str(e)) from None
    if meta is None:
      return None, None
    if meta.get("settings") != self._settings():
      raise UserError(f"The SAC checkpoint in {self.directory} was made with {meta.get('settings')}"
                      f", not {self._settings()}; use another --workdir or the same settings.")
    capacity = int(meta["capacity"])
    agent = sac.init_agent(jax.random.key(0), obs_dim, action_dim, self.config, self.total_steps)
    template = dict(agent=agent, key=np.asarray(jax.random.key_data(jax.random.key(0))),
                    replay=_empty_replay(capacity, obs_dim, action_dim),
                    medium_actor=jax.tree_util.tree_map(np.asarray, agent.actor.params))
    try:
      state, meta = self._ckpt.restore(template)
    except checkpoint.CheckpointError as e:
      raise UserError(str(e)) from None
    state["replay"] = {k: np.array(v) for k, v in state["replay"].items()}
    if capacity < self.total_steps:  # a longer run continues a finished one
      grown = _empty_replay(self.total_steps, obs_dim, action_dim)
      for k, v in state["replay"].items():
        grown[k][:capacity] = v
      state["replay"] = grown
    state["medium_actor"] = jax.tree_util.tree_map(np.asarray, state["medium_actor"])
    meta = {k: meta.get(k) for k in ("step", "medium_step", "medium_size", "evals", "episodes",
                                      "trained")}
    return state, meta


# --------------------------------------------------------------------------------- builders

def _replay_episodes(replay: dict) -> List[dict]:
  """Replay rows (in collection order) -> episodes; a final unfinished episode is cut."""
  n = replay["reward"].shape[0]
  ends = np.flatnonzero(replay["end"] > 0).tolist()
  if not ends or ends[-1] != n - 1:
    ends.append(n - 1)
  episodes, start = [], 0
  for end in ends:
    sl = slice(start, end + 1)
    obs = np.concatenate([replay["obs"][sl], replay["next_obs"][end:end + 1]]).astype(np.float64)
    terminations = replay["terminated"][sl] > 0
    truncations = ~terminations
    truncations[:-1] = False
    episodes.append(dict(observations=obs, actions=replay["action"][sl].astype(np.float32),
                         rewards=replay["reward"][sl].astype(np.float64),
                         terminations=terminations, truncations=truncations))
    start = end + 1
  return episodes


class Builder:
  """Builds named datasets, sharing one SAC run per environment."""

  def __init__(self, opts: Options, log_fn=_print):
    self.opts = opts
    self.log = log_fn
    self._sac: Dict[str, SacResult] = {}

  # -- helpers
  def _exists(self, name: str) -> bool:
    return dataset_exists(name)

  def _write(self, name, episodes, description, algorithm, overwrite=False):
    from mombo_jax import data
    quality = data.parse_name(name)[1]
    recipe = "mixed" if quality.endswith("pct") else quality
    written = sum(len(ep["rewards"]) for ep in episodes)
    dataset_id = write_dataset(name, episodes, description, algorithm, self.opts.max_episode_steps,
                               overwrite, provenance=provenance_for(name, recipe, written))
    self.log(f"wrote {dataset_id}: {_summary(episodes)}")
    return dataset_id

  def sac_run(self, env: str) -> SacResult:
    if env in self._sac:
      return self._sac[env]
    from mombo_jax import data
    o = self.opts
    config = online_config(env, o.hidden, o.batch_size)
    expert_return = data.D4RL_REF_SCORES[env][1]
    medium_return = o.medium_fraction * expert_return
    workdir = os.path.join(o.workdir, env, "sac")
    self.log(f"SAC run on {data.GYM_IDS[env]}: {o.sac_steps} steps, hidden {list(o.hidden)}, "
             f"medium point at eval return >= {medium_return:.1f} "
             f"({o.medium_fraction:.3g} x D4RL expert {expert_return}); checkpoints in {workdir}")
    result = train_sac(lambda: _make_env(env, o.max_episode_steps), config, o.sac_steps,
                       start_steps=o.start_steps, eval_every=o.eval_every,
                       eval_episodes=o.eval_episodes, seed=o.seed + _SEED_OFFSETS["sac"],
                       medium_return=medium_return, workdir=workdir,
                       checkpoint_every=o.checkpoint_every, log_every=o.log_every, log_fn=self.log,
                       train_every=o.train_every)
    self._sac[env] = result
    return result

  def _medium_result(self, env: str) -> SacResult:
    result = self.sac_run(env)
    if result.medium_step < 0:
      step, ret = result.best_eval
      raise UserError(
          f"The SAC run on {env} never reached the medium point ({self.opts.medium_fraction:.3g} x "
          f"expert return) in {self.opts.sac_steps} steps (best evaluation {ret:.1f} at step "
          f"{step}). Run again with a larger --sac_steps (the run resumes, and its later "
          "evaluations are checked), or with a lower --medium_fraction and a fresh --workdir.")
    return result

  def _policy_episodes(self, env: str, actor_params, config, seed_key: str) -> List[dict]:
    o = self.opts
    policy = sac_policy(actor_params, config, o.seed + _SEED_OFFSETS[seed_key],
                        o.rollout_policy == "deterministic")
    t0 = time.time()
    episodes = rollout(lambda: _make_env(env, o.max_episode_steps), policy, o.steps,
                       o.seed + _SEED_OFFSETS[seed_key], o.num_envs)
    self.log(f"recorded {o.steps} {seed_key} steps at {o.steps / max(time.time() - t0, 1e-9):.0f}"
             " steps/s")
    return episodes

  def _episodes_of(self, name: str) -> List[dict]:
    """Episodes of an ingredient dataset: read when it exists, else built (and written) now."""
    if not self._exists(name):
      self.log(f"ingredient {name} is missing: building it")
      self.build(name, overwrite=False)
    return read_episodes(name)

  # -- the recipes
  def build(self, name: str, overwrite: Optional[bool] = None) -> Optional[str]:
    from mombo_jax import data
    overwrite = self.opts.overwrite if overwrite is None else overwrite
    env, quality = data.parse_name(name)
    if self._exists(name) and not overwrite:
      self.log(f"{data.minari_id(name)} already exists: skipped (pass --overwrite to rebuild it)")
      return None
    o = self.opts
    gym_id = data.GYM_IDS[env]
    if quality == "random":
      return build_random(name, o.steps, o.seed, self.log, o.max_episode_steps, overwrite=overwrite,
                          num_envs=1)
    if quality in SAC_QUALITIES:
      if quality == "medium-expert":
        episodes = self._episodes_of(f"{env}-medium") + self._episodes_of(f"{env}-expert")
        return self._write(name, episodes, f"{env}-medium followed by {env}-expert (D4RL recipe).",
                           "SAC", overwrite)
      if quality == "expert":
        result = self.sac_run(env)
        episodes = self._policy_episodes(env, result.final_actor, result.config, "expert")
        return self._write(name, episodes, f"{o.steps} steps of the {o.rollout_policy} SAC policy "
                           f"after {o.sac_steps} training steps on {gym_id} (D4RL recipe).", "SAC",
                           overwrite)
      result = self._medium_result(env)
      if quality == "medium":
        episodes = self._policy_episodes(env, result.medium_actor, result.config, "medium")
        return self._write(name, episodes, f"{o.steps} steps of the {o.rollout_policy} SAC policy "
                           f"at its medium point (step {result.medium_step}, evaluation return >= "
                           f"{o.medium_fraction:.3g} x D4RL expert) on {gym_id} (D4RL recipe).",
                           "SAC", overwrite)
      episodes = _replay_episodes(result.replay)
      return self._write(name, episodes, f"The replay buffer of a SAC run on {gym_id} up to its "
                         f"medium point (step {result.medium_step}) (D4RL recipe).", "SAC",
                         overwrite)
    # Mixed: <random|...>-<partner>-<p>pct
    _, partner, pct = quality.split("-")
    percent = int(pct[:-3])
    random_eps = self._episodes_of(f"{env}-random")
    partner_eps = self._episodes_of(f"{env}-{partner}")
    wanted = percent / 100.0 * sum(len(ep["rewards"]) for ep in random_eps)
    available = sum(len(ep["rewards"]) for ep in partner_eps)
    if available < wanted:
      self.log(f"warning: {env}-{partner} has {available} transitions, fewer than the "
               f"{wanted:.0f} that {percent}% of {env}-random asks for; all of them are used")
    episodes = mix_episodes(random_eps, partner_eps, percent / 100.0,
                            o.seed + _SEED_OFFSETS["mix"])
    return self._write(name, episodes, f"{env}-random with {percent}% of its transitions replaced "
                       f"by whole episodes of {env}-{partner} (Hong et al. 2023).", "mixture",
                       overwrite)


def mix_episodes(base: Sequence[dict], better: Sequence[dict], fraction: float,
                 seed: int) -> List[dict]:
  """About len(base) transitions: `fraction` of them from whole `better` episodes, the rest whole
  `base` episodes, each drawn in random order (better ones first in the result)."""
  rng = np.random.default_rng(seed)
  total = sum(len(ep["rewards"]) for ep in base)

  def take(episodes, budget):
    out, count = [], 0
    for i in rng.permutation(len(episodes)):
      if count >= budget:
        break
      out.append(episodes[i])
      count += len(episodes[i]["rewards"])
    return out, count

  better_eps, n_better = take(better, math.ceil(fraction * total))
  base_eps, _ = take(base, total - n_better)
  return list(better_eps) + list(base_eps)


def options_from_flags() -> Options:
  return Options(steps=FLAGS.steps, sac_steps=FLAGS.sac_steps, start_steps=FLAGS.start_steps,
                 eval_every=FLAGS.eval_every, eval_episodes=FLAGS.eval_episodes,
                 medium_fraction=FLAGS.medium_fraction, checkpoint_every=FLAGS.checkpoint_every,
                 train_every=FLAGS.train_every,
                 log_every=FLAGS.log_every, hidden=tuple(int(h) for h in FLAGS.hidden),
                 batch_size=FLAGS.batch_size, rollout_policy=FLAGS.rollout_policy,
                 num_envs=FLAGS.num_envs, max_episode_steps=FLAGS.max_episode_steps,
                 seed=FLAGS.seed, workdir=FLAGS.workdir, overwrite=FLAGS.overwrite)


def main(argv):
  del argv
  # Orbax reports every checkpoint write at INFO; progress lines are printed instead.
  logging.set_verbosity(logging.WARNING)
  from mombo_jax import config as config_lib
  if not FLAGS.env:
    raise app.UsageError("--env is required, e.g. --env=hopper-random. Valid names: "
                         f"{', '.join(config_lib.valid_names())}")
  try:
    for name in FLAGS.env:
      config_lib.parse_name(name)  # every name is checked before anything runs
    opts = options_from_flags()
    builder = Builder(opts)
    from mombo_jax import data
    _print(f"Minari root: {data.datasets_root()}")
    for name in FLAGS.env:
      builder.build(name)
  except (UserError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
  except KeyboardInterrupt:
    print("\nInterrupted. Run the same command again: finished datasets are kept and the SAC run "
          "resumes from its last checkpoint (every --checkpoint_every steps).", file=sys.stderr)
    sys.exit(130)


if __name__ == "__main__":
  define_flags()
  app.run(main)
