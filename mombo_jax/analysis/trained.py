"""A trained run read back for analysis (experiments.mm_vs_mc, experiments.uncertainty): its
config.json and newest checkpoint, through workdir.Workdir (restored against the typed CellState
template), and its dataset, checked to be the data it trained on (load_data / check_data, as
training checks a resumed run). The networks are rebuilt from the config (sac.make_actor /
sac.make_critic) and the dynamics ensemble is the one stored in the run's state.

Shapes: B = states, S = obs dim, A = action dim, E = critics.
"""
from __future__ import annotations

import dataclasses
import sys
from typing import List, Optional

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax.training.train_state import TrainState

from mombo_jax.core import dynamics, sac
from mombo_jax.core.critics import ensemble_moments, sample_tanh_gaussian
from mombo_jax.data import provenance, transitions as transitions_lib
from mombo_jax.errors import DatasetNotFoundError, InvalidArgument, UserError
from mombo_jax.records.workdir import Workdir
from mombo_jax.run import run_state
from mombo_jax.settings import config as config_lib
from mombo_jax.storage import checkpoint


@flax.struct.dataclass
class SeedNets:
  """One seed's trained networks. actor, critic, target_critic: Flax variables ({"params": ...});
  dyn: DynamicsState of that seed; log_alpha: f32 [] (the entropy temperature's log, used by a
  soft-backup run's targets). A pytree (config static): jitted functions take it as an argument,
  so XLA never folds the trained weights in as constants (slow compiles)."""
  config: config_lib.Config = flax.struct.field(pytree_node=False)
  actor: dict
  critic: dict
  target_critic: dict
  dyn: dynamics.DynamicsState
  log_alpha: jax.Array

  @property
  def action_dim(self) -> int:
    return sac.actor_action_dim(self.actor)

  def policy(self, obs, key):
    """(a ~ pi(.|obs) [..., A], log pi [...])."""
    mean, log_std = sac.make_actor(self.config, self.action_dim).apply(self.actor, obs)
    return sample_tanh_gaussian(mean, log_std, key)

  def policy_mode(self, obs):
    """tanh(mean) [..., A], the evaluation action."""
    mean, _ = sac.make_actor(self.config, self.action_dim).apply(self.actor, obs)
    return jnp.tanh(mean)

  def q(self, obs, action, obs_var=None, target=True):
    """Q [E, ...] of the (target) critics, or their MM (mean, var) [E, ...] with obs_var, by the
    config's moment mode (config.agent.moments: critics.ensemble_moments, as the targets)."""
    params = self.target_critic if target else self.critic
    apply = sac.make_critic(self.config).apply
    if obs_var is None:
      return apply(params, obs, action)
    return ensemble_moments(apply, params, obs, action, obs_var, self.config.moments_mode)

  def with_moments(self, moments: Optional[str]) -> "SeedNets":
    """These networks with MOMBO's targets at another moment mode (algorithms.parse_moments:
    diagonal, lowrank[<k>], full; None: the run's own): what the analyses' --moments reads."""
    if moments is None:
      return self
    return self.replace(config=self.config.replace(moments=moments))

  def agent(self) -> sac.AgentState:
    """The networks as the sac.AgentState that targets.py reads (apply functions, parameters,
    log_alpha); no optimiser state (tx None): for evaluation only."""
    def state(apply_fn, params):
      return TrainState(step=jnp.zeros((), jnp.int32), apply_fn=apply_fn, params=params, tx=None,
                        opt_state=None)

    return sac.AgentState(
        actor=state(sac.make_actor(self.config, self.action_dim).apply, self.actor),
        critic=state(sac.make_critic(self.config).apply, self.critic),
        target_critic_params=self.target_critic,
        log_alpha=state(None, {"log_alpha": jnp.asarray(self.log_alpha, jnp.float32)}))


@dataclasses.dataclass
class TrainedRun:
  """A run read back: config, dataset, seeds, the checkpoint's epoch and per-seed networks; what
  reading it cost: bytes_read of the checkpoint's bytes_total (in memory: shape x itemsize, from
  its manifest; the partial restore skips the ring buffers and optimiser states) and the process's
  peak resident memory after loading, peak_rss (bytes; 0: unknown)."""
  workdir: str
  config: config_lib.Config
  dataset: str
  seeds: List[int]
  epoch: int
  nets: List[SeedNets]
  bytes_read: int = 0
  bytes_total: int = 0
  peak_rss: int = 0
  data: Optional[dict] = None     # config.json's "data": the identity of the data it trained on

  def memory_line(self) -> str:
    """"read 1.2 MiB of the checkpoint's 541.3 MiB (...); peak memory 812 MiB": what the
    analyses print per run."""
    mib = lambda n: f"{n / 2**20:.1f} MiB"  # noqa: E731
    peak = f"; peak memory {self.peak_rss / 2**20:.0f} MiB" if self.peak_rss else ""
    return (f"read {mib(self.bytes_read)} of the checkpoint's {mib(self.bytes_total)} (networks "
            f"and dynamics; ring buffers and optimiser states skipped){peak}")


def peak_rss() -> int:
  """This process's peak resident memory so far, in bytes (0 where the platform does not say)."""
  try:
    import resource  # Unix only: see the except
  except ImportError:                          # not on Windows
    return 0
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return int(peak if sys.platform == "darwin" else peak * 1024)   # macOS: bytes; Linux: KiB


def load_run(workdir: str, step: Optional[int] = None) -> TrainedRun:
  """A run's config and newest (or `step`'s) checkpoint. Raises ValueError with what is missing."""
  wd = Workdir(workdir)
  try:
    record = wd.read_record()
    config, dataset = wd.read_config()
    t = run_state.state_template(wd, config)
    # The networks and the dynamics only: the ring buffers (~135 MB a seed at paper size) and
    # the optimiser states are never read.
    sub = {"agent": {"actor": {"params": t.agent.actor.params},
                     "critic": {"params": t.agent.critic.params},
                     "target_critic_params": t.agent.target_critic_params,
                     "log_alpha": {"params": t.agent.log_alpha.params}},
           "dynamics": t.dynamics}
    part, meta = run_state.restore(wd, sub, step=step, partial=True)
    ckpt = run_state.checkpointer(wd, keep=None)
    try:
      bytes_read, bytes_total = ckpt.nbytes(sub, step=meta.get("step", step))
    except checkpoint.CheckpointError as e:
      raise UserError(str(e)) from None
    finally:
      ckpt.close()
  except UserError as e:
    raise InvalidArgument(str(e), params=e.params) from None
  agent = part["agent"]
  num = int(np.shape(agent["log_alpha"]["params"]["log_alpha"])[0])
  nets = []
  for i in range(num):
    pick = lambda t, i=i: jax.tree.map(lambda x: x[i], t)  # noqa: E731
    nets.append(SeedNets(config=config, actor=pick(agent["actor"]["params"]),
                         critic=pick(agent["critic"]["params"]),
                         target_critic=pick(agent["target_critic_params"]),
                         log_alpha=pick(agent["log_alpha"]["params"]["log_alpha"]),
                         dyn=pick(part["dynamics"])))
  return TrainedRun(workdir=workdir, config=config, dataset=dataset,
                    seeds=list(range(config.seed, config.seed + num)),
                    epoch=int(meta.get("epoch", meta.get("step", -1))), nets=nets,
                    bytes_read=bytes_read, bytes_total=bytes_total, peak_rss=peak_rss(),
                    data=record.get("data"))


def check_data(trained: TrainedRun, transitions) -> None:
  """Refuses to analyse a run with data other than it trained on, as training refuses to resume
  it (workdir.Workdir.check_data): ValueError in one line naming what changed (the dataset's
  fingerprint, size or id: provenance.identity_changes) when `transitions`
  (transitions_lib.Transitions of trained.dataset as it is now) are not the data config.json
  records. Nothing to check for transitions None (the dataset is not local) or a run written before
  runs recorded their data."""
  if trained.data is None or transitions is None:
    return
  changes = provenance.identity_changes(
      trained.data, provenance.dataset_identity(trained.dataset, transitions))
  if changes:
    raise InvalidArgument(
        f"{trained.workdir} was trained on other data than {trained.dataset} holds now "
        f"({changes}): the dataset was rebuilt or replaced since, and analysing the run on it "
        "would mix the run with data it never saw. Put back the data it was trained on, or "
        "analyse a run trained on the new data.")


def load_data(trained: TrainedRun, required: bool = True):
  """transitions_lib.Transitions of the run's dataset, checked to be the data it trained on
  (check_data). required=False: None when the dataset is not local (an analysis that reads only its
  name); otherwise a missing dataset raises errors.DatasetNotFoundError (a FileNotFoundError)."""
  try:
    transitions = transitions_lib.load_transitions(trained.dataset)
  except DatasetNotFoundError:
    if required:
      raise
    return None
  check_data(trained, transitions)
  return transitions
