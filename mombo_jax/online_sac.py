"""Online SAC for building datasets (D4RL's recipe): one gradient step per environment step, run in
chunks, resumable from Orbax checkpoints. experiments/collect.py (through mombo_jax.recipes) trains
one such run per environment; its medium policy, replay buffer and final policy become the
medium, medium-replay and expert datasets.

The SAC itself is mombo_jax.sac with the standard online hyperparameters (ONLINE_SAC). Acting runs
in numpy on the host (host_actor: one small MLP call per env step is cheaper than a jitted call's
dispatch); gradient steps run on the device in chunks of `train_every`, each a lax.scan over
batches sampled on the device from a device copy of the replay buffer. restore_sac reads a run's
checkpoint without training (for exporting its actors, mombo_jax.saved_actors.save_actor).
"""
from __future__ import annotations

import dataclasses
import os
import time
from typing import Callable, Dict, Optional, Sequence

import numpy as np

from mombo_jax import envs
from mombo_jax.errors import UserError


def _print(msg: str):
  print(msg, flush=True)


def _fmt_time(seconds: float) -> str:
  seconds = int(max(seconds, 0))
  return f"{seconds // 3600:d}h{seconds % 3600 // 60:02d}m{seconds % 60:02d}s"


# Standard online SAC (Haarnoja et al. 2018; the D4RL behaviour policies were trained like this):
# Adam 3e-4 everywhere, automatic temperature, soft backup, no target clamp, constant lr.
# algo="mopo" only selects the plain (not moment-matched) critic in the actor loss.
ONLINE_SAC = dict(algo="mopo", actor_lr=3e-4, critic_lr=3e-4, alpha_lr=3e-4, auto_alpha=True,
                  log_alpha_init=0.0, actor_cosine_schedule=False, deterministic_backup=False,
                  clip_target_min=None, alpha_max=None)


SEED_OFFSETS = {"random": 0, "sac": 1, "medium": 2, "expert": 3, "mix": 4, "eval": 5}


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
  from mombo_jax import sac
  hidden, (mean_w, mean_b), (std_w, std_b) = jax.tree.map(
      np.asarray, sac.actor_layers(jax.device_get(actor_params)))

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
  """Returns [episodes] of the deterministic policy mode_fn(obs [S] f32) -> action [A], episode i
  reset with seed + i (envs.run_episodes); each summed step by step in order."""
  return np.asarray([sum(float(r) for r in ep["rewards"])
                     for ep in envs.run_episodes(make_env, mode_fn, episodes, seed)])


@dataclasses.dataclass
class SacResult:
  """What the datasets need from a SAC run. replay_* arrays hold the first `medium_size` rows."""
  config: object
  final_actor: object                 # actor variables at the end of training
  steps_done: int                     # env steps trained (< total steps: stopped at medium)
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


def _run_settings(env, seed: int, start_steps: int) -> dict:
  """What a checkpoint must have been made with to be resumed (besides the network settings)."""
  return dict(seed=seed, start_steps=start_steps, obs_dim=env.observation_space.shape[0],
              action_dim=env.action_space.shape[0],
              max_episode_steps=env.spec.max_episode_steps if env.spec else None)


def restore_sac(make_env: Callable, config, total_steps: int, *, start_steps: int, seed: int,
                workdir: str) -> Optional[SacResult]:
  """The SAC run checkpointed in workdir, as train_sac (same arguments) would resume it, without
  training or evaluating anything: for exporting its actors (`collect --actors_only`). None when
  workdir holds no checkpoint. final_actor is the actor of the checkpoint's step (steps_done).
  Not beside a process still writing checkpoints there: opening the Orbax manager removes
  unfinished temporary checkpoint folders."""
  if not os.path.isdir(workdir):
    return None   # nothing to read, and nothing created
  env = make_env()
  obs_dim, action_dim = env.observation_space.shape[0], env.action_space.shape[0]
  settings = _run_settings(env, seed, start_steps)
  env.close()
  state, meta = _SacCheckpoints(workdir, config, total_steps, settings).restore(obs_dim, action_dim)
  if state is None:
    return None
  evals = [tuple(e) for e in meta["evals"] or []]
  size = meta["medium_size"]
  return SacResult(config=config, final_actor=state["agent"].actor.params,
                   steps_done=meta["step"],
                   medium_actor=state["medium_actor"] if meta["medium_step"] >= 0 else None,
                   medium_step=meta["medium_step"], medium_size=size,
                   replay={k: v[:size] for k, v in state["replay"].items()}, evals=evals,
                   best_eval=max(evals, key=lambda e: e[1]) if evals else (meta["step"],
                                                                           float("nan")))


def train_sac(make_env: Callable, config, total_steps: int, *, start_steps: int, eval_every: int,
              eval_episodes: int, seed: int, medium_return: Optional[float] = None,
              workdir: Optional[str] = None, checkpoint_every: int = 50_000,
              log_every: int = 5_000, log_fn=_print, train_every: int = 1000,
              stop_at_medium: bool = False, medium_consecutive: int = 2) -> SacResult:
  """Online SAC (one gradient step per env step, run in chunks of train_every), resumable from
  checkpoints in workdir.

  make_env() -> gymnasium env with a Box action space. Evaluations (deterministic policy,
  eval_episodes episodes) run every eval_every steps; once medium_consecutive evaluations in a
  row reach medium_return (if given), the last of them snapshots the actor and the replay size
  (the medium point): one lucky evaluation (hopper's returns swing by +-700 between evaluations)
  is not a medium policy.
  stop_at_medium: end the run at the medium point (checkpointed there; a later call without it
  resumes towards total_steps). Building medium / medium-replay needs no more.
  """
  import jax
  from mombo_jax import sac

  env = make_env()
  obs_dim, action_dim = env.observation_space.shape[0], env.action_space.shape[0]
  insert, train = _jitted(config)
  if train_every < 1:
    raise UserError(f"--train_every must be >= 1, got {train_every}.")
  if medium_consecutive < 1:
    raise UserError(f"--medium_consecutive must be >= 1, got {medium_consecutive}.")
  settings = _run_settings(env, seed, start_steps)
  ckpt = _SacCheckpoints(workdir, config, total_steps, settings) if workdir else None

  state, meta = None, None
  if ckpt is not None:
    state, meta = ckpt.restore(obs_dim, action_dim)
  if state is None:
    agent = sac.init_agent(jax.random.key(seed), obs_dim, action_dim, config, total_steps)
    state = dict(agent=agent, key=jax.random.key_data(jax.random.key(seed + 1)),
                 replay=_empty_replay(total_steps, obs_dim, action_dim),
                 medium_actor=jax.tree_util.tree_map(np.asarray, agent.actor.params))
    meta = dict(step=0, medium_step=-1, medium_size=0, evals=[], episodes=0, trained=0,
                medium_streak=0)
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
                       seed * 1000 + SEED_OFFSETS["eval"] + step)
    meta["evals"].append([step, float(returns.mean())])
    reached = ""
    if medium_return is not None and meta["medium_step"] < 0:
      passed = returns.mean() >= medium_return
      meta["medium_streak"] = meta.get("medium_streak", 0) + 1 if passed else 0
      if meta["medium_streak"] >= medium_consecutive:
        meta["medium_step"], meta["medium_size"] = step, step
        state["medium_actor"] = jax.tree_util.tree_map(np.asarray, agent.actor.params)
        reached = (f"  -> medium point ({medium_consecutive} evaluation(s) in a row >= "
                   f"{medium_return:.1f}); snapshot taken")
      elif passed:
        reached_once = f"  (>= {medium_return:.1f}: {meta['medium_streak']} of {medium_consecutive})"
        log_fn(f"  eval @ {step}: return {returns.mean():.1f} +- {returns.std():.1f}{reached_once}")
        return False
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
  while step < total_steps and not (stop_at_medium and meta["medium_step"] >= 0):
    if step < start_steps or action is None:
      action = rng.uniform(-1.0, 1.0, action_dim).astype(np.float32)
    next_obs, reward, terminated, truncated, _ = envs.step(env, action)
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
  if step < total_steps:
    log_fn(f"SAC run stopped at its medium point (step {step} of {total_steps}): nothing asked "
           "for more; building the expert resumes it from its checkpoint.")
  return SacResult(config=config, final_actor=agent.actor.params, steps_done=step,
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
                                      "trained", "medium_streak")}
    meta["medium_streak"] = meta["medium_streak"] or 0
    return state, meta
