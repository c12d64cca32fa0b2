"""Online SAC for building datasets (D4RL's recipe): one gradient step per environment step, run in
chunks, resumable from Orbax checkpoints. experiments/collect.py (through
mombo_jax.collection.recipes) trains one such run per environment; its medium policy, replay buffer
and final policy become the medium, medium-replay and expert datasets.

The SAC itself is mombo_jax.core.sac with the standard online hyperparameters (OnlineSettings).
Acting runs in numpy on the host (actor_policy.numpy_actor: one small MLP call per env step is
cheaper than a jitted call's dispatch); gradient steps run on the device in chunks of `train_every`,
each a loop over batches sampled on the device from a device copy of the replay buffer, in device
calls of about signals.POLL_SECONDS so that a stop request is seen within seconds. A stop
checkpoints the run where it is, and a resume continues it bit for bit (train_sac). The checkpoints
are mombo_jax.collection.sac_checkpoints'; restore_sac reads one without training (for exporting its
actors, mombo_jax.collection.saved_actors.save_actor).
"""
from __future__ import annotations

import dataclasses
import functools
import time
from typing import Callable, Dict, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mombo_jax import signals
from mombo_jax.collection.sac_checkpoints import (
  REPLAY_FIELDS,
  SacCheckpoints,
  SacResult,
  empty_replay,
  run_settings,
)
from mombo_jax.core import algorithms, sac
from mombo_jax.core.actor_policy import numpy_actor
from mombo_jax.core.buffer import Batch
from mombo_jax.env import envs, host_state
from mombo_jax.errors import Interrupted, UserError
from mombo_jax.settings import groups


def _print(msg: str):
  print(msg, flush=True)


def _fmt_time(seconds: float) -> str:
  seconds = int(max(seconds, 0))
  return f"{seconds // 3600:d}h{seconds % 3600 // 60:02d}m{seconds % 60:02d}s"


# Standard online SAC (Haarnoja et al. 2018; the D4RL behaviour policies were trained like this):
# Adam 3e-4 everywhere, automatic temperature (uncapped), soft backup, no target clamp, constant lr.
ONLINE_AGENT = groups.AgentConfig(actor_lr=3e-4, critic_lr=3e-4, alpha_lr=3e-4, alpha_max=None,
                                  actor_cosine_schedule=False, deterministic_backup=False,
                                  clip_target_min=None)


@dataclasses.dataclass(frozen=True)
class OnlineSettings:
  """What an online SAC run's networks, updates and actors read (mombo_jax.core.sac reads them as
  it reads a Config: its `agent` group, ONLINE_AGENT's values); plain SAC's algorithm record (no
  penalty, plain critic in the actor loss). env_name: the environment it trains on (halfcheetah |
  hopper | walker2d, or any)."""
  env_name: str
  agent: groups.AgentConfig = ONLINE_AGENT
  algorithm: algorithms.Algorithm = algorithms.SAC


SEED_OFFSETS = {"random": 0, "sac": 1, "medium": 2, "expert": 3, "mix": 4, "eval": 5}


def online_config(env: str, hidden: Sequence[int], batch_size: int) -> OnlineSettings:
  """The settings of the online SAC run on env (halfcheetah | hopper | walker2d)."""
  agent = dataclasses.replace(ONLINE_AGENT, actor_hidden=tuple(hidden),
                              critic_hidden=tuple(hidden), batch_size=batch_size)
  return OnlineSettings(env_name=env, agent=agent)


def _make_jitted(config):
  """(insert, sac_updates) jitted for one online-SAC config (acting runs on the host:
  actor_policy.numpy_actor).

  insert(replay, rows, start) -> replay: writes rows (obs, action, reward, next_obs, terminated,
    each [K, ...]) at start..start+K-1 of the device replay (donated: updated in place).
  sac_updates(agent, replay, size, keys [n], start=0, stop=n) -> agent: SAC updates start .. stop-1
    (update i with keys[i]; start / stop traced) in one loop, each on a batch sampled uniformly on
    the device from the first `size` rows.
  Sampling on the device and running a whole chunk of updates per call remove the per-step host
  round-trips (numpy gathers, batch uploads, one dispatch per update) that bound the collector.
  """
  target_fn = functools.partial(sac.soft_target, config=config)

  @functools.partial(jax.jit, donate_argnums=(0,))
  def insert(replay, rows, start):
    return {k: jax.lax.dynamic_update_slice_in_dim(replay[k], jnp.asarray(v, replay[k].dtype),
                                                   start, 0)
            for k, v in zip(REPLAY_FIELDS, rows)}

  @functools.partial(jax.jit, donate_argnums=(0,))
  def sac_updates(agent, replay, size, keys, start=None, stop=None):
    def one(i, agent):
      k_idx, k_update = jax.random.split(keys[i])
      idx = jax.random.randint(k_idx, (config.agent.batch_size,), 0, size)
      o, a, r, o2, d = (replay[k][idx] for k in REPLAY_FIELDS)
      batch = Batch(obs=o, action=a, reward=r, next_obs=o2, done=d, obs_var=jnp.zeros_like(o),
                    next_obs_mean=o2, next_obs_var=jnp.zeros_like(o2), reward_mean=r,
                    reward_var=jnp.zeros_like(r))
      return sac.update(agent, batch, k_update, target_fn, config)[0]

    # Traced bounds: the host runs a chunk in calls of ~signals.POLL_SECONDS (one compilation per
    # chunk length, as before), polling for a stop between them.
    return jax.lax.fori_loop(0 if start is None else start,
                             keys.shape[0] if stop is None else stop, one, agent)

  return insert, sac_updates


_JIT_CACHE: Dict = {}


def _jitted(config):
  if config not in _JIT_CACHE:
    _JIT_CACHE[config] = _make_jitted(config)
  return _JIT_CACHE[config]


def evaluate(make_env: Callable, mode_fn: Callable, episodes: int, seed: int,
             should_stop: Optional[Callable[[], bool]] = None) -> np.ndarray:
  """Returns [episodes] of the deterministic policy mode_fn(obs [S] f32) -> action [A], episode i
  reset with seed + i (envs.run_episodes); each summed step by step in order. should_stop: polled
  every env step (errors.Interrupted)."""
  return np.asarray([sum(float(r) for r in ep["rewards"])
                     for ep in envs.run_episodes(make_env, mode_fn, episodes, seed,
                                                 should_stop=should_stop)])


def train_sac(make_env: Callable, config, total_steps: int, *, start_steps: int, eval_every: int,
              eval_episodes: int, seed: int, medium_return: Optional[float] = None,
              workdir: Optional[str] = None, checkpoint_every: int = 50_000,
              log_every: int = 5_000, log_fn=_print, train_every: int = 1000,
              stop_at_medium: bool = False, medium_consecutive: int = 2,
              should_stop: Optional[Callable[[], bool]] = None) -> SacResult:
  """Online SAC (one gradient step per env step, run in chunks of train_every), resumable from
  checkpoints in workdir.

  make_env() -> gymnasium env with a Box action space. Evaluations (deterministic policy,
  eval_episodes episodes) run every eval_every steps; once medium_consecutive evaluations in a
  row reach medium_return (if given), the last of them snapshots the actor and the replay size
  (the medium point): one lucky evaluation (hopper's returns swing by +-700 between evaluations)
  is not a medium policy.
  stop_at_medium: end the run at the medium point (checkpointed there; a later call without it
  resumes towards total_steps). Building medium / medium-replay needs no more.
  should_stop: polled between env steps, between device calls of a chunk's gradient steps (about
  signals.POLL_SECONDS each) and between an evaluation's env steps; when it fires the run is
  checkpointed where it is (mid-chunk and mid-evaluation included) and errors.Interrupted raised.

  A checkpoint of a MuJoCo env also holds the loop's host state (meta["loop"]: the env mid-episode,
  the numpy RNGs, the pending action and episode return, and where in the step's work it was), so
  that a resume from any checkpoint (a stop's, or the last periodic one after a kill) continues
  bit for bit as the run would have gone on; older checkpoints, and other envs, cut the
  interrupted episode (marked ended) and reseed the RNGs instead.
  """
  # One function: its six inner functions (save, stop_here, eval_now, train_chunk, act_and_log,
  # eval_and_save) share the loop's state (env, generators, agent, step) by closure; as module
  # functions they would pass it all around.
  env = make_env()
  obs_dim, action_dim = env.observation_space.shape[0], env.action_space.shape[0]
  insert, sac_updates = _jitted(config)
  if train_every < 1:
    raise UserError(f"`train_every` must be >= 1, got {train_every}.", params=("train_every",))
  if medium_consecutive < 1:
    raise UserError(f"`medium_consecutive` must be >= 1, got {medium_consecutive}.",
                    params=("medium_consecutive",))
  settings = run_settings(env, seed, start_steps)
  ckpt = SacCheckpoints(workdir, config, total_steps, settings) if workdir else None

  state, meta, loop = None, None, None
  if ckpt is not None:
    state, meta = ckpt.restore(obs_dim, action_dim)
  if state is None:
    agent = sac.init_agent(jax.random.key(seed), obs_dim, action_dim, config, total_steps)
    state = dict(agent=agent, key=jax.random.key_data(jax.random.key(seed + 1)),
                 replay=empty_replay(total_steps, obs_dim, action_dim),
                 medium_actor=jax.tree_util.tree_map(np.asarray, agent.actor.params))
    meta = dict(step=0, medium_step=-1, medium_size=0, evals=[], episodes=0, trained=0,
                medium_streak=0)
    saved_at = None
  else:
    loop = meta.get("loop")
    reached = (f"medium point at step {meta['medium_step']}" if meta["medium_step"] >= 0
               else "medium point not reached yet")
    log_fn(f"resumed the SAC run at step {meta['step']} from {ckpt.directory} ({reached})")
    if meta["step"] > 0 and loop is None:
      state["replay"]["end"][meta["step"] - 1] = 1.0  # the interrupted episode is cut here
    saved_at = (meta["step"], (loop or {}).get("phase"))   # what the checkpoint holds
  replay = state["replay"]
  agent = state["agent"]
  key = jax.random.wrap_key_data(np.asarray(state["key"], np.uint32))
  device_replay, uploaded = None, 0   # the sampling copy on the device and the rows it holds
  # Refreshed after every training chunk.
  policy = numpy_actor(agent.actor.params, config.agent.log_std_min, config.agent.log_std_max)
  step = meta["step"]
  if loop is None:
    act_rng = np.random.default_rng([seed, meta["step"], 1])
    rng = np.random.default_rng([seed, meta["step"]])
    obs, _ = env.reset(seed=int(rng.integers(2**31)))
    episode_return, last_return, action, phase, chunk = 0.0, float("nan"), None, None, None
  else:
    rng = host_state.rng_from_state(loop["rng"])
    act_rng = host_state.rng_from_state(loop["act_rng"])
    env.reset(seed=0)          # gymnasium steps a reset env only; the saved state replaces it
    host_state.restore_env(env, loop["env"])
    obs = np.asarray(loop["obs"], loop["obs_dtype"])
    episode_return = loop["episode_return"]
    last_return = float("nan") if loop["last_return"] is None else loop["last_return"]
    action = None if loop["action"] is None else np.asarray(loop["action"], np.float32)
    phase, chunk = loop["phase"], loop["chunk"]
  pace = signals.Chunks(0)                 # lengths of the device calls of a chunk's updates

  def save(phase=None):
    nonlocal saved_at
    if ckpt is None or (phase is None and saved_at == (step, None)):   # saved as it is
      return
    state.update(agent=agent, key=jax.random.key_data(key))
    meta["step"] = step
    env_saved = host_state.env_state(env) if hasattr(env.unwrapped, "model") else None
    meta["loop"] = None if env_saved is None else dict(
        phase=phase, chunk=chunk, rng=host_state.rng_state(rng),
        act_rng=host_state.rng_state(act_rng),
        env=env_saved, obs=np.asarray(obs).tolist(), obs_dtype=np.asarray(obs).dtype.str,
        episode_return=float(episode_return),
        last_return=None if np.isnan(last_return) else float(last_return),
        action=None if action is None else np.asarray(action, np.float32).tolist())
    ckpt.save(step, state, meta)
    saved_at = (step, phase)

  def stop_here(phase, doing):
    save(phase)
    where = f"SAC step {step}{doing}" + (f" (checkpoint in {ckpt.directory})" if ckpt else "")
    raise Interrupted(getattr(should_stop, "signum", None), where)

  def eval_now():
    returns = evaluate(make_env, policy, eval_episodes,
                       seed * 1000 + SEED_OFFSETS["eval"] + step, should_stop=should_stop)
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
        reached_once = (f"  (>= {medium_return:.1f}: {meta['medium_streak']} "
                        f"of {medium_consecutive})")
        log_fn(f"  eval @ {step}: return {returns.mean():.1f} +- {returns.std():.1f}{reached_once}")
        return False
    log_fn(f"  eval @ {step}: return {returns.mean():.1f} +- {returns.std():.1f}{reached}")
    return bool(reached)

  # Gradient steps start once the warm-up is over and a full batch exists.
  learning_starts = max(start_steps, config.agent.batch_size)
  if meta.get("trained") is None:   # a checkpoint from before chunked training: one per step
    meta["trained"] = max(0, meta["step"] - learning_starts + 1)

  def train_chunk():
    """One gradient step per environment step from learning_starts on, run in chunks of
    train_every (as D4RL's rlkit SAC alternates 1000 env steps with 1000 gradient steps); a
    chunk's updates in device calls of ~signals.POLL_SECONDS, a stop between them saving the
    chunk's progress (`chunk`: its key, length and updates done)."""
    nonlocal agent, key, device_replay, uploaded, chunk, policy
    if chunk is None:
      due = step - learning_starts + 1 - meta["trained"]
      if due <= 0 or not (step % train_every == 0 or step == total_steps):
        return
      key, k_train = jax.random.split(key)
      chunk = dict(key=np.asarray(jax.random.key_data(k_train)).tolist(), due=int(due), done=0)
    if device_replay is None:  # first chunk (or a resume): upload everything collected so far
      device_replay, uploaded = {k: jax.device_put(replay[k]) for k in REPLAY_FIELDS}, step
    elif uploaded < step:
      rows = tuple(replay[k][uploaded:step] for k in REPLAY_FIELDS)
      device_replay, uploaded = insert(device_replay, rows, np.int32(uploaded)), step
    keys = jax.random.split(jax.random.wrap_key_data(np.asarray(chunk["key"], np.uint32)),
                            chunk["due"])
    while chunk["done"] < chunk["due"]:
      if should_stop is not None and should_stop():
        stop_here("train", f", {chunk['done']} of the {chunk['due']} gradient steps due there")
      n = pace.next(chunk["due"] - chunk["done"])
      agent = pace.run(lambda a, b: sac_updates(agent, device_replay, np.int32(step), keys,
                                          np.int32(a), np.int32(b)), chunk["done"], n)
      chunk["done"] += n
    meta["trained"] += chunk["due"]
    chunk = None
    policy = numpy_actor(agent.actor.params, config.agent.log_std_min, config.agent.log_std_max)

  window = (step, time.time())  # (step, time) of the last progress line

  def act_and_log():
    nonlocal action, window
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

  def eval_and_save():
    reached = False
    if step % eval_every == 0 or step == total_steps:
      try:
        reached = eval_now()
      except Interrupted:
        stop_here("eval", ", its evaluation")
    if ckpt is not None and (reached or step % checkpoint_every == 0 or step == total_steps):
      save()

  # A checkpoint taken inside a step's work (a stop) finishes that step's work first.
  if phase == "train":
    train_chunk()
    act_and_log()
  if phase in ("train", "eval"):
    eval_and_save()
  while step < total_steps and not (stop_at_medium and meta["medium_step"] >= 0):
    if should_stop is not None and should_stop():
      stop_here(None, "")
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
    train_chunk()
    act_and_log()
    eval_and_save()
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
