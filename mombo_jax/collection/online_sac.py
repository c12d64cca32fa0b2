"""Online SAC for building datasets (D4RL's recipe), its pieces: the settings (OnlineSettings, the
standard online hyperparameters of mombo_jax.core.sac), the compiled updates and the evaluation.
The run itself (one gradient step per environment step, in chunks, resumable): sac_run.train_sac.
experiments/collect.py (through mombo_jax.collection.recipes) trains one such run per environment;
its medium policy, replay buffer and final policy become the medium, medium-replay and expert
datasets.

Acting runs in numpy on the host (actor_policy.numpy_actor: one small MLP call per env step is
cheaper than a jitted call's dispatch); gradient steps run on the device in chunks of `train_every`,
each a loop over batches sampled on the device from a device copy of the replay buffer (_jitted),
in device calls of about signals.POLL_SECONDS so that a stop request is seen within seconds. The
checkpoints are mombo_jax.collection.sac_checkpoints'; restore_sac reads one without training (for
exporting its actors, mombo_jax.collection.saved_actors.save_actor).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Dict, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mombo_jax.collection.sac_checkpoints import REPLAY_FIELDS
from mombo_jax.core import algorithms, sac
from mombo_jax.core.buffer import Batch
from mombo_jax.env import envs
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
