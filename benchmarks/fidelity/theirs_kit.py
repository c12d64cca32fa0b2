"""OfflineRL-Kit's MOBILEPolicy (offlinerlkit/policy/model_based/mobile.py) and MOPOPolicy
(mopo.py, whose learn() is model_free/sac.py's SACPolicy.learn on the mixed batch), built as
run_example/run_mobile.py and run_mopo.py build them, with our weights."""
from __future__ import annotations

import numpy as np
import torch

from benchmarks.fidelity import ours, stubs, theirs_base


class Theirs(theirs_base.Side):
  def __init__(self, mods, setup: ours.Setup, agent, dtype):
    self.setup, self.dtype, config = setup, dtype, setup.config
    self.notes = []
    kit = mods.kit
    modules, nets = kit.modules, kit.nets
    backbone = nets.MLP(input_dim=ours.OBS, hidden_dims=list(config.agent.actor_hidden))
    head = modules.TanhDiagGaussian(latent_dim=backbone.output_dim, output_dim=ours.ACT,
                                    unbounded=True, conditioned_sigma=True, max_mu=1.0)
    actor = modules.ActorProb(backbone, head).to(dtype)
    critics = [modules.Critic(nets.MLP(input_dim=ours.OBS + ours.ACT,
                                       hidden_dims=list(config.agent.critic_hidden))).to(dtype)
               for _ in range(config.agent.num_critics)]
    self.critic_params = _critic_params(critics)
    self.actor, self.log_alpha, alpha = theirs_base.our_agent_into(
        backbone, head, self.critic_params, agent, config, dtype)
    model = theirs_base.dynamics_model(modules.EnsembleDynamicsModel, setup, dtype)
    dynamics = kit.dynamics.EnsembleDynamics(
        model, torch.optim.Adam(model.parameters(), lr=config.dynamics_training.dyn_lr),
        theirs_base.scale(kit.utils.scaler.StandardScaler(), setup),
        kit.utils.termination_fns.get_termination_fn("walker2d-medium-v2"))
    actor_optim = torch.optim.Adam(actor.parameters(), lr=config.agent.actor_lr)
    common = dict(tau=config.agent.tau, gamma=config.agent.gamma, alpha=alpha)
    if setup.kind == "mobile":
      ensemble = torch.nn.ModuleList(critics)
      self.policy = kit.policy.MOBILEPolicy(
          dynamics, actor, ensemble, actor_optim,
          torch.optim.Adam(ensemble.parameters(), lr=config.agent.critic_lr),
          penalty_coef=config.beta, num_samples=config.agent.mobile_num_samples,
          deterministic_backup=config.agent.deterministic_backup, **common)
      self.target_params = _critic_params(self.policy.critics_old)
      self.critic_optims = [self.policy.critics_optim]
      # mobile.py:176: one mean over both critics' [E, B, 1] errors.
      self.elements = config.agent.num_critics * config.agent.batch_size
      self._penalty()
    else:
      optims = [torch.optim.Adam(c.parameters(), lr=config.agent.critic_lr) for c in critics]
      self.policy = kit.policy.MOPOPolicy(dynamics, actor, critics[0], critics[1], actor_optim,
                                          optims[0], optims[1], **common)
      self.target_params = _critic_params([self.policy.critic1_old, self.policy.critic2_old])
      self.critic_optims = optims
      self.elements = config.agent.batch_size          # sac.py:101,106: one mean per critic
    self.critics = {f"critic{e}": c for e, c in enumerate(critics)}
    self._record()

  def _penalty(self):
    """Record compute_lcb's penalty (all rows, before learn() zeroes the real ones in place)."""
    released = self.policy.compute_lcb

    def compute_lcb(obss, actions):
      penalty = released(obss, actions)
      self.seen["penalty"] = penalty.detach().numpy()[:, 0].copy()
      return penalty

    self.policy.compute_lcb = compute_lcb


def _critic_params(critics):
  out = {}
  for e, critic in enumerate(critics):
    out.update(stubs.linear(f"critic{e}", stubs.linears(critic.backbone.model) + [critic.last]))
  return out


def queue(setup: ours.Setup, noise) -> list:
  """Our draws in the order their learn() draws. MOBILE: compute_lcb's N next-state draws
  (ensemble_dynamics.py sample_next_obss: randn_like of the elites' std [E, B, S + 1], one per
  sample; its reward column is dropped there, so ours fills it with 0), their a' [N * E * B, A],
  the target's a' [B, A], the actor loss's a. MOPO: the target's a', the actor loss's a."""
  noise = {k: np.asarray(v) for k, v in noise.items()}
  if setup.kind == "mopo":
    return [noise["target"], noise["actor"]]
  samples = noise["samples"]
  pad = np.zeros(samples.shape[1:-1] + (1,), samples.dtype)
  draws = [np.concatenate([s, pad], axis=-1) for s in samples]
  return draws + [noise["pi"].reshape(-1, noise["pi"].shape[-1]), noise["next"], noise["actor"]]
