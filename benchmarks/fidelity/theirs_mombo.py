"""adinlab/MOMBO's MOMBOPolicy (policies/mombo.py) built as its train.py builds it, with our
weights.

elite_spread: their learn() as released. lcb: the release has no code for the paper's eq. (1), so
their learn() runs with get_q_target_for_fake replaced by `lcb_fake`, the equation written here in
torch over their networks (named in the output).
"""
from __future__ import annotations

import numpy as np
import torch

from benchmarks.fidelity import ours, stubs, theirs_base


def lcb_fake(policy, fake, beta: float):
  """Paper eq. (1) with the reward's variance, the target ours calls `lcb` (mombo_jax/core/
  targets.py mombo_lcb), for the model rows `fake` of the batch:
    y = r + g (1 - d) m* - beta sqrt(var_r + g^2 (1 - d) v*),
  (m*, v*) the moment-matched mean and variance of the target critic with the smaller mean at
  (s', a' ~ pi(s')) with input variance var_s'. Returns (y [n, 1], std [n, 1]) as
  get_q_target_for_fake does."""
  with torch.no_grad():
    s, var_s = fake["next_observations"], fake["next_observation_variances"]
    a, logp = policy.actforward(s)
    qs = [critic(s, a, var_s) for critic in policy.critics_old]
    means, variances = torch.stack([q[0] for q in qs]), torch.stack([q[1] for q in qs])
    j = torch.min(means, 0)[1]
    m, v = torch.gather(means, 0, j[None])[0], torch.gather(variances, 0, j[None])[0]
    if not policy._deteterministic_backup:
      m = m - policy._alpha * logp
    go_on = 1.0 - fake["terminals"]
    std = torch.sqrt(fake["reward_variances"] + policy._gamma**2 * go_on * v)
    return fake["rewards"] + policy._gamma * go_on * m - beta * std, std


class Theirs(theirs_base.Side):
  def __init__(self, mods, setup: ours.Setup, agent, dtype):
    self.setup, self.dtype, config = setup, dtype, setup.config
    self.notes = []
    nets, dist = mods.models.nets, mods.models.dist
    ac = mods.models.actor_critic
    hidden = list(config.agent.actor_hidden)
    backbone = nets.MLP(input_dim=ours.OBS, hidden_dims=hidden)
    head = dist.TanhDiagGaussian(latent_dim=backbone.output_dim, output_dim=ours.ACT,
                                 unbounded=True, conditioned_sigma=True)   # train.py's
    actor = ac.ActorProb(backbone, head).to(dtype)
    critics = torch.nn.ModuleList([
        ac.MMCritic(ac.MMCriticBackbone(input_dim=ours.OBS + ours.ACT,
                                        hidden_dims=list(config.agent.critic_hidden)))
        for _ in range(config.agent.num_critics)]).to(dtype)
    self.critic_params = _critic_params(critics)
    self.actor, self.log_alpha, alpha = theirs_base.our_agent_into(
        backbone, head, self.critic_params, agent, config, dtype)
    model = theirs_base.dynamics_model(mods.models.dynamics_model.EnsembleDynamicsModel, setup,
                                       dtype)
    dynamics = mods.dynamics.EnsembleDynamics(
        model, torch.optim.Adam(model.parameters(), lr=config.dynamics_training.dyn_lr),
        theirs_base.scale(mods.utils.scaler.StandardScaler(), setup),
        mods.utils.termination_fns.get_termination_fn("walker2d-medium-v2"))
    self.policy = mods.policies.MOMBOPolicy(
        dynamics, actor, critics, torch.optim.Adam(actor.parameters(), lr=config.agent.actor_lr),
        torch.optim.Adam(critics.parameters(), lr=config.agent.critic_lr), tau=config.agent.tau,
        gamma=config.agent.gamma, alpha=alpha, penalty_coef=config.beta,
        deterministic_backup=config.agent.deterministic_backup)
    self.target_params = _critic_params(self.policy.critics_old)
    self.critics = {f"critic{e}": c for e, c in enumerate(critics)}
    self.critic_optims = [self.policy.critics_optim]
    # policies/mombo.py:202: one mean over both critics' [E, B, 1] errors.
    self.elements = config.agent.num_critics * config.agent.batch_size
    self._record()
    self._penalties(setup.kind == "mombo-lcb")

  def _penalties(self, lcb: bool):
    """Record get_q_target_for_fake's penalty (U of the model rows); for lcb, replace it."""
    policy, released = self.policy, self.policy.get_q_target_for_fake

    def fake_target(obss, actions):
      y, penalty = (lcb_fake(policy, self.fake, self.setup.config.beta) if lcb
                    else released(obss, actions))
      self.seen["penalty"] = penalty.detach().numpy()[:, 0].copy()
      return y, penalty

    policy.get_q_target_for_fake = fake_target
    if lcb:
      self.notes.append("lcb: their learn() with get_q_target_for_fake replaced by the paper's "
                        "eq. (1) written in the harness (theirs_mombo.lcb_fake); the release has "
                        "no lcb")

  def learn(self, batch, queue, actor_lr):
    self.fake = theirs_base.learn_batch(self.setup, batch, self.dtype)["fake"]
    return super().learn(batch, queue, actor_lr)


def _critic_params(critics):
  out = {}
  for e, critic in enumerate(critics):
    layers = [layer.mean_layer for layer in critic.backbone.model] + [critic.last.mean_layer]
    out.update(stubs.linear(f"critic{e}", layers))
  return out


def queue(setup: ours.Setup, noise) -> list:
  """Our draws in the order their learn() draws: a' of the real rows' target
  (get_q_target_for_real), a' of the model rows at every elite's mean (get_q_target_for_fake:
  [E * n_fake, A], elite-major as torch_step's view), then the actor loss's a."""
  n = setup.n_real
  noise = {k: np.asarray(v) for k, v in noise.items()}
  if setup.kind == "mombo-lcb":
    return [noise["target"][:n], noise["target"][n:], noise["actor"]]
  elite = noise["elite"][:, n:]
  return [noise["real"][:n], elite.reshape(-1, elite.shape[-1]), noise["actor"]]

