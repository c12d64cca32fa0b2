"""One online SAC run of the collector (train_sac): its steps and cadence (SacSchedule), when it
takes its medium policy (MediumPoint), and its loop (_SacRun: the env, RNGs, agent and replay, a
step's work one method each). A stop checkpoints the run where it is, and a resume continues it
bit for bit. Its pieces (settings, compiled updates, evaluation): online_sac.py; its checkpoints
and result: sac_checkpoints.py.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable, Optional

import jax
import numpy as np

from mombo_jax import signals
from mombo_jax.collection import online_sac
from mombo_jax.collection.online_sac import SEED_OFFSETS, _fmt_time, _jitted, _print
from mombo_jax.collection.sac_checkpoints import (
  REPLAY_FIELDS,
  SacCheckpoints,
  SacResult,
  empty_replay,
  run_settings,
)
from mombo_jax.core import sac
from mombo_jax.core.actor_policy import numpy_actor
from mombo_jax.env import envs, host_state
from mombo_jax.errors import Interrupted, InvalidValue


@dataclasses.dataclass(frozen=True)
class SacSchedule:
  """How long an online SAC run trains and when it does what on the way: total_steps env steps
  (one gradient step each, from max(start_steps, batch size) on, run in chunks of train_every),
  the first start_steps of them uniformly random (the warm-up); a deterministic evaluation of
  eval_episodes episodes every eval_every steps, a checkpoint every checkpoint_every steps, a
  progress line every log_every steps; seed: of everything random in it."""
  total_steps: int
  start_steps: int
  eval_every: int
  eval_episodes: int
  seed: int
  train_every: int = 1000
  checkpoint_every: int = 50_000
  log_every: int = 5_000

  def __post_init__(self):
    if self.train_every < 1:
      raise InvalidValue(f"`train_every` must be >= 1, got {self.train_every}.",
                         params=("train_every",))


@dataclasses.dataclass(frozen=True)
class MediumPoint:
  """When a SAC run takes its medium policy: once `consecutive` evaluations in a row reach
  target_return (None: never), the last of them snapshots the actor and the replay size (one lucky
  evaluation is not a medium policy: hopper's returns swing by +-700 between evaluations).
  stop_at: end the run there (checkpointed; a later call without it resumes towards total_steps);
  building medium / medium-replay needs no more."""
  target_return: Optional[float] = None
  consecutive: int = 2
  stop_at: bool = False

  def __post_init__(self):
    if self.consecutive < 1:
      raise InvalidValue(f"`medium_consecutive` must be >= 1, got {self.consecutive}.",
                         params=("medium_consecutive",))


def train_sac(make_env: Callable, config, schedule: SacSchedule,
              medium: MediumPoint = MediumPoint(), *, workdir: Optional[str] = None,
              log_fn=_print, should_stop: Optional[Callable[[], bool]] = None) -> SacResult:
  """Online SAC (one gradient step per env step, run in chunks: SacSchedule), resumable from
  checkpoints in workdir; its medium point as `medium` says.

  make_env() -> gymnasium env with a Box action space.
  should_stop: polled between env steps, between device calls of a chunk's gradient steps (about
  signals.POLL_SECONDS each) and between an evaluation's env steps; when it fires the run is
  checkpointed where it is (mid-chunk and mid-evaluation included) and errors.Interrupted raised.

  A checkpoint of a MuJoCo env also holds the loop's host state (meta["loop"]: the env mid-episode,
  the numpy RNGs, the pending action and episode return, and where in the step's work it was), so
  that a resume from any checkpoint (a stop's, or the last periodic one after a kill) continues
  bit for bit as the run would have gone on; older checkpoints, and other envs, cut the
  interrupted episode (marked ended) and reseed the RNGs instead.
  """
  return _SacRun(make_env, config, schedule, medium, workdir, log_fn, should_stop).run()


class _SacRun:
  """One call of train_sac: the loop's state (env, RNGs, agent, replay, step) and the work of a
  step, one method each (env_step, train_chunk, act_and_log, eval_and_save), as the run resumes
  it (restore, the `loop` of its checkpoint's metadata)."""

  def __init__(self, make_env, config, schedule: SacSchedule, medium: MediumPoint,
               workdir: Optional[str], log_fn, should_stop):
    self.make_env, self.config, self.plan, self.medium = make_env, config, schedule, medium
    self.log_fn, self.should_stop = log_fn, should_stop
    self.env = env = make_env()
    self.obs_dim, self.action_dim = env.observation_space.shape[0], env.action_space.shape[0]
    self.insert, self.sac_updates = _jitted(config)
    settings = run_settings(env, schedule.seed, schedule.start_steps)
    self.ckpt = (SacCheckpoints(workdir, config, schedule.total_steps, settings) if workdir
                 else None)
    loop = self._restore()
    self.replay, self.agent = self.state["replay"], self.state["agent"]
    self.key = jax.random.wrap_key_data(np.asarray(self.state["key"], np.uint32))
    self.device_replay, self.uploaded = None, 0  # the sampling copy on the device, rows it holds
    self.policy = self._policy()                 # refreshed after every training chunk
    self.step = self.meta["step"]
    self._host_state(loop)
    self.pace = signals.Chunks(0)                # lengths of the device calls of a chunk's updates
    # Gradient steps start once the warm-up is over and a full batch exists.
    self.learning_starts = max(schedule.start_steps, config.agent.batch_size)
    if self.meta.get("trained") is None:   # a checkpoint from before chunked training: one a step
      self.meta["trained"] = max(0, self.meta["step"] - self.learning_starts + 1)
    self.window = (self.step, time.time())  # (step, time) of the last progress line

  def _restore(self) -> Optional[dict]:
    """self.state, self.meta and self.saved_at from the checkpoint (or fresh); -> its loop."""
    seed = self.plan.seed
    state, meta = (None, None) if self.ckpt is None else self.ckpt.restore(self.obs_dim,
                                                                          self.action_dim)
    if state is None:
      agent = sac.init_agent(jax.random.key(seed), self.obs_dim, self.action_dim, self.config,
                             self.plan.total_steps)
      self.state = dict(agent=agent, key=jax.random.key_data(jax.random.key(seed + 1)),
                        replay=empty_replay(self.plan.total_steps, self.obs_dim, self.action_dim),
                        medium_actor=jax.tree_util.tree_map(np.asarray, agent.actor.params))
      self.meta = dict(step=0, medium_step=-1, medium_size=0, evals=[], episodes=0, trained=0,
                       medium_streak=0)
      self.saved_at = None
      return None
    self.state, self.meta = state, meta
    loop = meta.get("loop")
    reached = (f"medium point at step {meta['medium_step']}" if meta["medium_step"] >= 0
               else "medium point not reached yet")
    self.log_fn(f"resumed the SAC run at step {meta['step']} from {self.ckpt.directory} "
                f"({reached})")
    if meta["step"] > 0 and loop is None:
      state["replay"]["end"][meta["step"] - 1] = 1.0  # the interrupted episode is cut here
    self.saved_at = (meta["step"], (loop or {}).get("phase"))   # what the checkpoint holds
    return loop

  def _host_state(self, loop: Optional[dict]):
    """The env, RNGs, pending action and episode return: fresh at this step, or as saved."""
    if loop is None:
      seed, at = self.plan.seed, self.meta["step"]
      self.act_rng = np.random.default_rng([seed, at, 1])
      self.rng = np.random.default_rng([seed, at])
      self.obs, _ = self.env.reset(seed=int(self.rng.integers(2**31)))
      self.episode_return, self.last_return, self.action = 0.0, float("nan"), None
      self.phase, self.chunk = None, None
      return
    self.rng = host_state.rng_from_state(loop["rng"])
    self.act_rng = host_state.rng_from_state(loop["act_rng"])
    self.env.reset(seed=0)          # gymnasium steps a reset env only; the saved state replaces it
    host_state.restore_env(self.env, loop["env"])
    self.obs = np.asarray(loop["obs"], loop["obs_dtype"])
    self.episode_return = loop["episode_return"]
    self.last_return = float("nan") if loop["last_return"] is None else loop["last_return"]
    self.action = None if loop["action"] is None else np.asarray(loop["action"], np.float32)
    self.phase, self.chunk = loop["phase"], loop["chunk"]

  def _policy(self):
    agent = self.config.agent
    return numpy_actor(self.agent.actor.params, agent.log_std_min, agent.log_std_max)

  def save(self, phase=None):
    if self.ckpt is None or (phase is None and self.saved_at == (self.step, None)):  # as it is
      return
    self.state.update(agent=self.agent, key=jax.random.key_data(self.key))
    self.meta["step"] = self.step
    env_saved = host_state.env_state(self.env) if hasattr(self.env.unwrapped, "model") else None
    obs = np.asarray(self.obs)
    self.meta["loop"] = None if env_saved is None else dict(
        phase=phase, chunk=self.chunk, rng=host_state.rng_state(self.rng),
        act_rng=host_state.rng_state(self.act_rng), env=env_saved, obs=obs.tolist(),
        obs_dtype=obs.dtype.str, episode_return=float(self.episode_return),
        last_return=None if np.isnan(self.last_return) else float(self.last_return),
        action=None if self.action is None else np.asarray(self.action, np.float32).tolist())
    self.ckpt.save(self.step, self.state, self.meta)
    self.saved_at = (self.step, phase)

  def stop_here(self, phase, doing):
    self.save(phase)
    where = f"SAC step {self.step}{doing}" + (f" (checkpoint in {self.ckpt.directory})"
                                              if self.ckpt else "")
    raise Interrupted(getattr(self.should_stop, "signum", None), where)

  def eval_now(self) -> bool:
    """The evaluation at this step; True when it is the medium point."""
    meta, medium, step = self.meta, self.medium, self.step
    returns = online_sac.evaluate(self.make_env, self.policy, self.plan.eval_episodes,
                       self.plan.seed * 1000 + SEED_OFFSETS["eval"] + step,
                       should_stop=self.should_stop)
    meta["evals"].append([step, float(returns.mean())])
    reached = ""
    if medium.target_return is not None and meta["medium_step"] < 0:
      passed = returns.mean() >= medium.target_return
      meta["medium_streak"] = meta.get("medium_streak", 0) + 1 if passed else 0
      if meta["medium_streak"] >= medium.consecutive:
        meta["medium_step"], meta["medium_size"] = step, step
        self.state["medium_actor"] = jax.tree_util.tree_map(np.asarray, self.agent.actor.params)
        reached = (f"  -> medium point ({medium.consecutive} evaluation(s) in a row >= "
                   f"{medium.target_return:.1f}); snapshot taken")
      elif passed:
        reached_once = (f"  (>= {medium.target_return:.1f}: {meta['medium_streak']} "
                        f"of {medium.consecutive})")
        self.log_fn(f"  eval @ {step}: return {returns.mean():.1f} +- {returns.std():.1f}"
                    f"{reached_once}")
        return False
    self.log_fn(f"  eval @ {step}: return {returns.mean():.1f} +- {returns.std():.1f}{reached}")
    return bool(reached)

  def _upload(self):
    """The device replay holds every row collected so far."""
    step, fields = self.step, REPLAY_FIELDS
    if self.device_replay is None:  # first chunk (or a resume): upload everything collected
      self.device_replay = {k: jax.device_put(self.replay[k]) for k in fields}
    elif self.uploaded < step:
      rows = tuple(self.replay[k][self.uploaded:step] for k in fields)
      self.device_replay = self.insert(self.device_replay, rows, np.int32(self.uploaded))
    self.uploaded = step

  def train_chunk(self):
    """One gradient step per environment step from learning_starts on, run in chunks of
    train_every (as D4RL's rlkit SAC alternates 1000 env steps with 1000 gradient steps); a
    chunk's updates in device calls of ~signals.POLL_SECONDS, a stop between them saving the
    chunk's progress (`chunk`: its key, length and updates done)."""
    step = self.step
    if self.chunk is None:
      due = step - self.learning_starts + 1 - self.meta["trained"]
      if due <= 0 or not (step % self.plan.train_every == 0 or step == self.plan.total_steps):
        return
      self.key, k_train = jax.random.split(self.key)
      self.chunk = dict(key=np.asarray(jax.random.key_data(k_train)).tolist(), due=int(due),
                        done=0)
    self._upload()
    chunk = self.chunk
    keys = jax.random.split(jax.random.wrap_key_data(np.asarray(chunk["key"], np.uint32)),
                            chunk["due"])
    while chunk["done"] < chunk["due"]:
      if self.should_stop is not None and self.should_stop():
        self.stop_here("train", f", {chunk['done']} of the {chunk['due']} gradient steps due "
                                "there")
      n = self.pace.next(chunk["due"] - chunk["done"])
      self.agent = self.pace.run(lambda a, b: self.sac_updates(
          self.agent, self.device_replay, np.int32(step), keys, np.int32(a), np.int32(b)),
          chunk["done"], n)
      chunk["done"] += n
    self.meta["trained"] += chunk["due"]
    self.chunk = None
    self.policy = self._policy()

  def act_and_log(self):
    step, total = self.step, self.plan.total_steps
    if step >= self.plan.start_steps:
      self.action = self.policy(self.obs, self.act_rng).astype(np.float32)
    self.meta["step"] = step
    if step % self.plan.log_every == 0 or step == total:
      # Rate over the last interval: the warm-up (no gradient steps) is much faster.
      now = time.time()
      rate = (step - self.window[0]) / max(now - self.window[1], 1e-9)
      self.window = (step, now)
      self.log_fn(f"SAC step {step}/{total}  {rate:.0f} steps/s  last episode return "
                  f"{self.last_return:.1f}  episodes {self.meta['episodes']}  ETA "
                  f"{_fmt_time((total - step) / max(rate, 1e-9))}")

  def eval_and_save(self):
    step, plan, reached = self.step, self.plan, False
    if step % plan.eval_every == 0 or step == plan.total_steps:
      try:
        reached = self.eval_now()
      except Interrupted:
        self.stop_here("eval", ", its evaluation")
    if self.ckpt is not None and (reached or step % plan.checkpoint_every == 0
                                  or step == plan.total_steps):
      self.save()

  def env_step(self):
    """One environment step into the replay (a random action during the warm-up)."""
    step, replay = self.step, self.replay
    if step < self.plan.start_steps or self.action is None:
      self.action = self.rng.uniform(-1.0, 1.0, self.action_dim).astype(np.float32)
    next_obs, reward, terminated, truncated, _ = envs.step(self.env, self.action)
    replay["obs"][step], replay["action"][step] = self.obs, self.action
    replay["reward"][step], replay["next_obs"][step] = reward, next_obs
    replay["terminated"][step] = float(terminated)
    replay["end"][step] = float(terminated or truncated)
    self.episode_return += float(reward)
    self.obs = next_obs
    if terminated or truncated:
      self.last_return, self.episode_return = self.episode_return, 0.0
      self.meta["episodes"] += 1
      self.obs, _ = self.env.reset(seed=int(self.rng.integers(2**31)))
    self.step += 1

  def run(self) -> SacResult:
    """The loop, from where the run stands; its result."""
    # A checkpoint taken inside a step's work (a stop) finishes that step's work first.
    if self.phase == "train":
      self.train_chunk()
      self.act_and_log()
    if self.phase in ("train", "eval"):
      self.eval_and_save()
    while self.step < self.plan.total_steps and not (self.medium.stop_at
                                                     and self.meta["medium_step"] >= 0):
      if self.should_stop is not None and self.should_stop():
        self.stop_here(None, "")
      self.env_step()
      self.train_chunk()
      self.act_and_log()
      self.eval_and_save()
    self.env.close()
    return self._result()

  def _result(self) -> SacResult:
    meta, step = self.meta, self.step
    best = max(meta["evals"], key=lambda e: e[1]) if meta["evals"] else (step, float("nan"))
    size = meta["medium_size"]
    if step < self.plan.total_steps:
      self.log_fn(f"SAC run stopped at its medium point (step {step} of {self.plan.total_steps})"
                  ": nothing asked for more; building the expert resumes it from its checkpoint.")
    return SacResult(config=self.config, final_actor=self.agent.actor.params, steps_done=step,
                     medium_actor=(self.state["medium_actor"] if meta["medium_step"] >= 0
                                   else None),
                     medium_step=meta["medium_step"], medium_size=size,
                     replay={k: v[:size] for k, v in self.replay.items()},
                     evals=[tuple(e) for e in meta["evals"]], best_eval=tuple(best))
