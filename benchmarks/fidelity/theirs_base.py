"""What both references' sides share: their EnsembleDynamicsModel (the same file in adinlab/MOMBO
models/dynamics_model.py and OfflineRL-Kit offlinerlkit/modules/dynamics_module.py) built with our
ensemble's weights, normaliser and elites; the batch as their learn() takes it; one learn() with
our draws, recorded."""
from __future__ import annotations

from typing import Dict

import numpy as np
import torch

from benchmarks.fidelity import ours, stubs


def our_agent_into(backbone, head, critic_params, agent, config, dtype):
  """Their actor (backbone + head) and critics (critic_params: name -> linear) set to our agent's
  weights, and their alpha as their learn() takes it: (actor linears, log_alpha or None, alpha:
  the fixed value, or (target entropy -|A|, log_alpha, its Adam) when alpha is learnt)."""
  actor = stubs.linear("actor", stubs.linears(backbone.model) + [head.mu, head.sigma])
  stubs.copy_into(actor, ours.actor_arrays(agent.actor.params))
  stubs.copy_into(critic_params, ours.critic_arrays(agent.critic.params))
  if not config.agent.auto_alpha:
    return actor, None, config.agent.alpha
  log_alpha = torch.zeros(1, dtype=dtype, requires_grad=True)
  return actor, log_alpha, (-float(ours.ACT), log_alpha,
                            torch.optim.Adam([log_alpha], lr=config.agent.alpha_lr))


def dynamics_model(model_cls, setup: ours.Setup, dtype):
  """Their EnsembleDynamicsModel with our dynamics parameters (EnsembleLinear's weight [M, in,
  out] is our kernel's layout; its bias [M, 1, out]) and our elites."""
  config, params = setup.config, setup.dyn.params
  model = model_cls(obs_dim=ours.OBS, action_dim=ours.ACT,
                    hidden_dims=list(config.dynamics.dyn_hidden),
                    num_ensemble=config.dynamics.dyn_members,
                    num_elites=config.dynamics.dyn_elites,
                    weight_decays=list(config.dynamics_training.dyn_weight_decay)).to(dtype)
  members = params["members"]
  layers = list(model.backbones) + [model.output_layer]
  names = [f"layer_{i}" for i in range(len(config.dynamics.dyn_hidden))] + ["out"]
  with torch.no_grad():
    for layer, name in zip(layers, names):
      layer.weight.copy_(torch.as_tensor(np.asarray(members[name]["kernel"]), dtype=dtype))
      layer.bias.copy_(torch.as_tensor(np.asarray(members[name]["bias"])[:, None], dtype=dtype))
    model.max_logvar.copy_(torch.as_tensor(np.asarray(params["max_logvar"]), dtype=dtype))
    model.min_logvar.copy_(torch.as_tensor(np.asarray(params["min_logvar"]), dtype=dtype))
  model.set_elites([int(e) for e in np.asarray(setup.dyn.elites)])
  return model


def scale(scaler, setup: ours.Setup):
  """Their StandardScaler set to our normaliser (fit() would compute it from data)."""
  scaler.mu = np.asarray(setup.dyn.input_mean)[None]
  scaler.std = np.asarray(setup.dyn.input_std)[None]
  return scaler


def learn_batch(setup: ours.Setup, batch, dtype) -> Dict[str, Dict[str, torch.Tensor]]:
  """{'real': rows[:n_real], 'fake': rows[n_real:]} as their trainers hand learn() a mixed batch
  (real first, as our buffer.sample_mixed): rewards and terminals [n, 1]; MOMBO's variance
  columns too (other learn()s ignore keys they do not read)."""
  t = lambda x: torch.as_tensor(np.asarray(x), dtype=dtype)  # noqa: E731
  col = lambda x: t(x)[:, None]  # noqa: E731
  rows = {"observations": t(batch.obs), "actions": t(batch.action),
          "next_observations": t(batch.next_obs), "rewards": col(batch.reward),
          "terminals": col(batch.done), "observation_variances": t(batch.obs_var),
          "next_observation_variances": t(batch.next_obs_var),
          "reward_variances": col(batch.reward_var)}
  n = setup.n_real
  return {"real": {k: v[:n] for k, v in rows.items()}, "fake": {k: v[n:] for k, v in rows.items()}}


class Side:
  """One reference policy with our weights. Subclasses set: policy, actor (named params), critics
  (name -> module), critic_params, target_params (named), critic_optims, elements (entries of
  each critic's loss mean), log_alpha (tensor or None), notes; and call _record()."""

  def _record(self):
    self.seen: dict = {}
    stubs.record_grads(self.policy.actor_optim, self.actor, self.seen)
    for optim in self.critic_optims:
      stubs.record_grads(optim, self.critic_params, self.seen)
    if self.log_alpha is not None:
      stubs.record_grads(self.policy.alpha_optim, {"log_alpha": self.log_alpha}, self.seen)
    stubs.record_targets(self.critics, self.elements, self.seen)

  def learn(self, batch, queue, actor_lr: float) -> dict:
    """One learn() of theirs on `batch` with our draws `queue`; their actor's lr set to ours
    for this step (their trainer anneals per epoch; see agent_side.NAMED)."""
    for group in self.policy.actor_optim.param_groups:
      group["lr"] = actor_lr
    self.seen.clear()
    alpha = float(self.policy._alpha)
    with stubs.our_draws(queue, self.dtype):
      result = self.policy.learn(learn_batch(self.setup, batch, self.dtype))
    grads = {k: v for k, v in self.seen.items() if not k.startswith(("q_", "y_"))}
    return {"result": result, "y": self.seen[f"y_{next(iter(self.critics))}"], "grads": grads,
            "alpha": alpha, "penalty": self.seen.get("penalty")}

  def state(self) -> dict:
    out = {"actor": stubs.arrays(self.actor), "critic": stubs.arrays(self.critic_params),
           "target": stubs.arrays(self.target_params)}
    if self.log_alpha is not None:
      out["log_alpha"] = float(self.log_alpha.detach().reshape(()))
    return out
