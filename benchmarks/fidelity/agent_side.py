"""The agent comparison: our update (ours.step) and the reference's learn() from the same weights,
batches and draws, step by step; after each K of `checkpoints` every intermediate of step K and
the state after it compared (rows.py).

Their trainer's part is played here: it hands learn() the batch (real rows first), and sets the
actor's learning rate to ours for each step (their trainers step torch's CosineAnnealingLR once
per epoch, utils/policy_trainer.py:86 in adinlab/MOMBO, offlinerlkit/policy_trainer/
mb_policy_trainer.py:94; ours anneals per gradient step, optax's cosine over the 3000 epochs'
steps: within epoch 0 the two rates differ by at most 2.7e-7 of the rate, NAMED, not measured).
"""
from __future__ import annotations

import sys
from typing import Dict, List, Sequence

import jax
import numpy as np

from benchmarks.fidelity import ours, rows, stubs, theirs_kit, theirs_mombo

LR_NOTE = ("actor lr: their trainers anneal it once per epoch (adinlab/MOMBO "
           "utils/policy_trainer.py:86; OfflineRL-Kit mb_policy_trainer.py:94), ours per gradient "
           "step (sac.py actor_lr_schedule); the harness gives their actor our step's lr (<= "
           "2.7e-7 apart in epoch 0)")
# MOMBO and MOBILE: one loss mean and one Adam over both critics.
POOLED = {"mombo": "adinlab/MOMBO policies/mombo.py:202 and train.py:74",
          "mombo-lcb": "adinlab/MOMBO policies/mombo.py:202 and train.py:74",
          "mobile": "OfflineRL-Kit offlinerlkit/policy/model_based/mobile.py:176 and "
                    "run_example/run_mobile.py's critics_optim"}


def pooled_note(kind: str) -> str:
  return (f"{POOLED[kind]}: one mean over both critics' squared errors and one Adam over both "
          "critics; ours sums the per-critic means (sac.py update; as OfflineRL-Kit's SAC/MOPO "
          "with an Adam per critic), so its critic loss and gradients are 2x theirs (compared here "
          "halved) and Adam's eps (1e-8) weighs 2x more in theirs: each critic step differs by "
          "~2e-8/sqrt(v) of itself, and all that depends on the critics with it; the eps-matched "
          "float64 run (their eps / 2) shows what else differs")


def causes(kind: str, match_eps: bool) -> str:
  """The named difference behind kind's rows ('' for none)."""
  return "" if match_eps or kind not in POOLED else pooled_note(kind)


def _side(kind):
  return theirs_mombo if kind.startswith("mombo") else theirs_kit


def compare(kind: str, mods, dtype: str, checkpoints: Sequence[int], seed: int = 0,
            match_eps: bool = False) -> List[Dict]:
  """Rows for kind (ours.ALGOS) in dtype after each K in checkpoints. match_eps: their critics'
  Adam eps divided by the number of critics where one Adam steps them all (POOLED), which makes
  its update ours exactly in real arithmetic."""
  setup, agent = ours.init(kind, dtype, seed)
  side = _side(kind)
  theirs = side.Theirs(mods, setup, agent, stubs.DTYPES[dtype])
  critics = setup.config.agent.num_critics
  pooled = kind in POOLED
  if match_eps and pooled:
    for group in theirs.policy.critics_optim.param_groups:
      group["eps"] = group["eps"] / critics
  section = f"agent {kind} {dtype}" + (" eps-matched" if match_eps and pooled else "")
  named = causes(kind, match_eps) or None
  steps = max(checkpoints)
  batches = jax.tree.map(np.asarray, ours.batches(setup, steps, seed))
  keys = jax.random.split(jax.random.PRNGKey(seed + 1), steps)
  lrs = ours.actor_lrs(setup, steps)
  out = []
  for t in range(steps):
    batch = ours.step_batch(batches, t)
    noise = ours.draws(setup, keys[t])
    agent, mine = ours.step(setup, agent, batch, noise)
    got = theirs.learn(batch, side.queue(setup, noise), float(lrs[t]))
    if t + 1 in checkpoints:
      _same_dtype(agent, dtype)
      print(f"{section}: step {t + 1} of {steps}", file=sys.stderr, flush=True)
      out += _rows(section, t + 1, setup, agent, mine, got, theirs.state(), dtype,
                   critics if pooled else 1, named)
  return out


def _same_dtype(agent, dtype):
  """Every float leaf of our agent in dtype: the harness process runs x64, and a float32 run that
  promoted somewhere would no longer be the product's float32 step."""
  leaves = [x for x in jax.tree.leaves(agent) if hasattr(x, "dtype")
            and np.issubdtype(x.dtype, np.floating)]
  wrong = {str(x.dtype) for x in leaves if x.dtype != np.dtype(dtype)}
  if wrong:
    raise AssertionError(f"our {dtype} agent holds {sorted(wrong)} leaves after a step")


def _rows(section, k, setup, agent, mine, got, state, dtype, pool, named):
  """The rows of step k: its intermediates, then the state after it. pool: theirs = ours / pool
  for the critic loss and gradients. named: the note of a difference above rounding."""
  result, grads = got["result"], got["grads"]
  r = lambda q, a, b: rows.row(section, q, k, a, b, dtype, named)  # noqa: E731
  n = setup.n_real
  out = [r("critic target y", mine["y"], got["y"])]
  if mine["penalty"] is not None:
    penalty = np.asarray(mine["penalty"])
    out.append(r("penalty U (unscaled)", penalty if setup.kind == "mobile" else penalty[n:],
                 got["penalty"]))
  critic_loss = result.get("loss/critic")
  if critic_loss is None:   # OfflineRL-Kit SAC: one loss per critic
    critic_loss = result["loss/critic1"] + result["loss/critic2"]
  out.append(r("critic loss", np.asarray(mine["critic_loss"]) / pool, critic_loss))
  critic_grads = {k_: v / pool for k_, v in ours.critic_arrays(mine["critic_grads"]).items()}
  out.append(r("critic gradients", critic_grads, {k_: grads[k_] for k_ in critic_grads}))
  out.append(r("alpha used", mine["alpha"], got["alpha"]))
  out.append(r("actor loss", mine["actor_loss"], result["loss/actor"]))
  actor_grads = ours.actor_arrays(mine["actor_grads"])
  out.append(r("actor gradients", actor_grads, {k_: grads[k_] for k_ in actor_grads}))
  if mine["alpha_grads"] is not None:
    out.append(r("alpha loss", mine["alpha_loss"], result["loss/alpha"]))
    out.append(r("log_alpha gradient", mine["alpha_grads"]["log_alpha"], grads["log_alpha"]))
  out.append(r("critic params after", ours.critic_arrays(agent.critic.params), state["critic"]))
  out.append(r("target critic params after", ours.critic_arrays(agent.target_critic_params),
               state["target"]))
  out.append(r("actor params after", ours.actor_arrays(agent.actor.params), state["actor"]))
  if "log_alpha" in state:
    out.append(r("log_alpha after", agent.log_alpha.params["log_alpha"], state["log_alpha"]))
  return out
