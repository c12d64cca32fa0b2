"""The dynamics and rollout comparisons of the fidelity harness (issue #48): the reference's
dynamics training and one rollout stepped beside ours from the same weights, data rows, split,
bootstrap orders and random draws (`compare`).

Ours: benchmarks/fidelity/dyn_ours.py (no torch; tests/test_fidelity_dynamics.py holds it to the
product). Theirs: dyn_theirs.py, imported from --reference unchanged, its stubs listed.

What is compared, on a synthetic hopper-shaped dataset (dyn_ours.synthetic, N_DATA rows; the
reference settings of hopper-medium-replay for the algorithm: 7 members of 4 x 200, 5 elites,
batch 256), after EPOCHS epochs from our initial weights:
- dynamics training: the input scaler; each minibatch's loss terms before its Adam step (total,
  the Gaussian NLL, weight decay, the logvar-bound term); the parameters after the first Adam
  step and after each epoch; max / min logvar; each epoch's holdout MSE per member, the members
  snapshotted (the > 1 % rule) and the elites; then every member's predicted mean and variance
  on the holdout rows;
- one rollout (K steps of R_BRANCHES branches from dataset states, both sides holding our
  ensemble trained ROLLOUT_EPOCHS epochs, a fixed linear policy, our elite and noise per row):
  the rows written, their obs, action, next_obs, reward, terminal, variances (MOMBO), MOPO's
  penalty, and the replay buffers' contents after the rollout (a rollout penalises only MOPO's
  rewards; MOBILE's Q-spread and MOMBO's penalty are made in the critic targets, which the
  agent comparison covers);
- termination: ours (termination.model_done with the runaway bound) against the reference's
  function on states placed on and around every boundary, for the three envs.

The draws: their split is ours; their bootstrap (np.random.randint) is our epoch 1 order, and
their reshuffle after each epoch (argsort of np.random.uniform) turns it into our next epoch's.
Ours draws a bootstrap and then a fresh order every epoch, the first included; theirs orders the
first epoch as drawn: a permutation of uniform draws is uniform, so the two are the same
distribution, and fed these draws the same minibatches.

A row: {section, quantity, k (Adam steps so far, or rollout steps), max_abs, max_rel, verdict,
note}. max_rel is max |ours - theirs| / max |theirs| over the quantity (relative to its scale; an
element-wise ratio explodes where values cross zero). Verdict "rounding" when max_rel <= ROUNDING
of the dtype, "named" when a known definition differs (the note cites the reference's file:line
and says what ours does and why), else "FAIL". Counts (rows, terminals, snapshots, elites) are
"rounding" only at 0.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.fidelity import dyn_ours, dyn_theirs
from mombo_jax.core import buffer, dynamics, rollout, termination

# EPOCHS compared (5 minibatches each); ours trains ROLLOUT_EPOCHS in all for the rollouts' ensemble
# (after 4 epochs its variance still ends ~85 % of the branches in the first step; after 12,
# 256/220/181/149/125 rows per step). Rounding grows with the Adam steps: over 60 steps (12
# epochs) float64 drifted from 1e-14 to 6e-12 (parameters) and 3e-10 (losses), float32 from
# 4e-6 to 8e-3, and the float32 elites then differed; over 20 it stays at rounding level.
N_DATA, EPOCHS, ROLLOUT_EPOCHS, R_BRANCHES = 1500, 4, 12, 256
# float32's bound is loose on purpose: the float64 run of the same row tells rounding from
# definition (there every agreeing row falls to ~1e-14).
ROUNDING = {"float32": 1e-3, "float64": 1e-10}


def compare(algo: str, reference_dir: str, dtype: str = "float32", seed: int = 0):
  """(rows, stubs) for algo mombo | mombo-lcb | mobile | mopo against reference_dir (adinlab/MOMBO
  for MOMBO, whose targets share the dynamics and rollout; OfflineRL-Kit for the others), in
  dtype float32 | float64 (float64 switches jax_enable_x64 on for the call and back after).
  reference_dir is not checked here (the harness checks its commit first)."""
  if algo not in dyn_theirs.REFERENCES:
    raise ValueError(f"algo {algo!r}: one of {', '.join(dyn_theirs.REFERENCES)}")
  if dtype not in ROUNDING:
    raise ValueError(f"dtype {dtype!r}: float32 or float64")
  x64 = jax.config.jax_enable_x64
  jax.config.update("jax_enable_x64", dtype == "float64")
  try:
    mods, stubs = dyn_theirs.load(algo, reference_dir)
    if dtype == "float64":
      stubs = stubs + dyn_theirs.float64_stubs()
    return _compare(algo.split("-")[0], mods, dtype, seed), stubs
  finally:
    jax.config.update("jax_enable_x64", x64)


def _compare(algo, mods, dtype, seed):
  cfg = dyn_ours.config(algo, EPOCHS)
  data = dyn_ours.synthetic(N_DATA, seed)
  inputs, targets = dyn_ours.arrays(data, dtype)
  ours = dyn_ours.train_epochs(cfg, jax.random.PRNGKey(seed), inputs, targets, EPOCHS, dtype,
                               further=ROLLOUT_EPOCHS - EPOCHS)
  positions = [dyn_ours.positions(ours.train_idx, order) for order in ours.orders]
  dyn = dyn_theirs.build(mods, cfg, ours.init_params, dtype)
  theirs = dyn_theirs.train_epochs(mods, dyn, cfg, data, ours, positions, dyn_ours.reorder,
                                   dyn_ours.kept_step, dtype)
  rows = _training_rows(algo, ours, theirs, dtype)
  rows += _prediction_rows(algo, mods, dyn, cfg, ours, data, dtype)
  rows += _rollout_rows(algo, mods, cfg, ours.further, data, dtype, seed)
  return rows + _termination_rows(algo, mods)


# ------------------------------------------------------------------------------------- rows

def _diff(ours, theirs):
  """(max |ours - theirs|, that / max |theirs|) over arrays or matching trees of arrays."""
  a = [np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(ours)]
  b = [np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(theirs)]
  assert [x.shape for x in a] == [x.shape for x in b], "shapes differ"
  a, b = np.concatenate(a), np.concatenate(b)
  if a.size == 0:
    return 0.0, 0.0
  diff, scale = float(np.max(np.abs(a - b))), float(np.max(np.abs(b)))
  return diff, diff / scale if scale > 0 else diff


def _row(section, quantity, k, ours, theirs, dtype, note, named=None):
  """A compared quantity; named: the note explaining a difference above rounding (None: FAIL)."""
  max_abs, max_rel = _diff(ours, theirs)
  verdict = "rounding" if max_rel <= ROUNDING[dtype] else ("named" if named else "FAIL")
  return dict(section=section, quantity=quantity, k=k, max_abs=max_abs, max_rel=max_rel,
              verdict=verdict, note=named if verdict == "named" else note)


def _count(section, quantity, k, n_diff, total, note, named=None):
  """A counted quantity (rows, terminals, snapshots, elites): n_diff of total disagree."""
  verdict = "rounding" if n_diff == 0 else ("named" if named else "FAIL")
  return dict(section=section, quantity=quantity, k=k, max_abs=float(n_diff),
              max_rel=n_diff / max(total, 1), verdict=verdict,
              note=named if verdict == "named" else note)


def _ref(algo, path, line):
  """A reference file:line, in the reference the algorithm is compared with."""
  kit = {"dynamics/ensemble_dynamics.py": "offlinerlkit/dynamics/ensemble_dynamics.py",
         "utils/termination_fns.py": "offlinerlkit/utils/termination_fns.py",
         "models/dynamics_model.py": "offlinerlkit/modules/dynamics_module.py",
         "utils/buffer.py": "offlinerlkit/buffer/buffer.py"}
  if algo == "mombo":
    return f"adinlab/MOMBO {path}:{line[0]}"
  return f"OfflineRL-Kit {kit[path]}:{line[1]}"


# ----------------------------------------------------------------------------- dynamics training

def _training_rows(algo, ours, theirs, dtype):
  sec, ref = "dynamics training", lambda line: _ref(algo, "dynamics/ensemble_dynamics.py", line)
  epochs = min(len(ours.losses), len(theirs["losses"]))
  steps = sum(len(e) for e in ours.losses[:epochs])
  rows = [_count(sec, "epochs trained", steps, abs(len(ours.losses) - len(theirs["losses"])),
                 len(theirs["losses"]), f"ours {len(ours.losses)}, theirs "
                 f"{len(theirs['losses'])} of at most {EPOCHS} (their train(max_epochs), "
                 "patience 5 epochs without a > 1 % improvement)"),
          _row(sec, "input scaler mean", 0, ours.input_mean, theirs["mu"], dtype,
               f"their StandardScaler.fit on our training split ({ref((115, 124))})"),
          _row(sec, "input scaler std", 0, ours.input_std, theirs["std"], dtype,
               "np.std (ddof 0) vs jnp.std; constant inputs scaled by 1 on both sides")]
  notes = {"total": f"every minibatch's loss before its step (their learn, from "
                    f"{ref((183, 192))}; ours core/dynamics.loss_fn, the last minibatch "
                    "zero-padded with weight 0)",
           "nll": "mean over rows and dims of (mean - y)^2 exp(-logvar) + logvar, summed over "
                  "members (total - decay - logvar bound on both sides)",
           "decay": "sum over layers of wd * 0.5 * ||W||^2, kernels only (their get_decay_loss)",
           "logvar_bound": "0.01 * (sum max_logvar - sum min_logvar)"}
  for term, note in notes.items():
    rows.append(_row(sec, f"minibatch loss: {term}", steps,
                     [[b[term] for b in e] for e in ours.losses[:epochs]],
                     [[b[term] for b in e] for e in theirs["losses"][:epochs]], dtype, note))
  return rows + _epoch_rows(algo, ours, theirs, epochs, dtype)


def _epoch_rows(algo, ours, theirs, epochs, dtype):
  """Parameters after Adam steps, and at every epoch's end its logvar bounds, holdout losses,
  snapshots; the elites."""
  sec, ref = "dynamics training", lambda line: _ref(algo, "dynamics/ensemble_dynamics.py", line)
  nb = len(ours.losses[0])
  steps = nb * epochs
  ends = [nb * (e + 1) for e in range(epochs)]
  adam = ("torch.optim.Adam (eps 1e-8, no decoupled decay) vs optax.adam; kernels [M, in, out] "
          "as their EnsembleLinear weight")
  rows = [_row(sec, "weights, biases after Adam step 1", 1, ours.params[1]["members"],
               theirs["params"][1]["members"], dtype, adam),
          _row(sec, "weights, biases after every epoch", steps,
               [ours.params[k]["members"] for k in ends],
               [theirs["params"][k]["members"] for k in ends], dtype, adam)]
  bounds = lambda p: (p["max_logvar"], p["min_logvar"])  # noqa: E731
  rows.append(_row(sec, "max_logvar, min_logvar after every epoch", steps,
                   [bounds(ours.params[k]) for k in ends],
                   [bounds(theirs["params"][k]) for k in ends], dtype,
                   "the learned soft-clamp bounds"))
  rows.append(_row(sec, "holdout MSE per member, every epoch", steps, ours.holdout_mse[:epochs],
                   theirs["holdout_mse"][:epochs], dtype,
                   f"their validate ({ref((197, 206))}) on our holdout split"))
  kept = np.asarray(ours.kept[:epochs])
  pattern = " ".join("".join(str(int(v)) for v in e) for e in kept)
  rows.append(_count(sec, "members snapshotted (> 1 % better), every epoch", steps,
                     int(np.sum(kept != np.asarray(theirs["kept"][:epochs]))), kept.size,
                     f"ours per epoch {pattern}; their update_save ({ref((144, 153))})"))
  rows.append(_count(sec, "elites (best holdout MSE first)", steps,
                     int(np.sum(np.asarray(ours.final.elites) != theirs["elites"])),
                     len(theirs["elites"]),
                     f"ours {np.asarray(ours.final.elites).tolist()}, theirs "
                     f"{theirs['elites'].tolist()} ({ref((205, 214))})"))
  return rows


def _prediction_rows(algo, mods, dyn, cfg, ours, data, dtype):
  """Every member's Gaussian on the holdout rows: their trained model (snapshots loaded) vs ours
  (validation.pick_elites' state), each trained on its own side."""
  idx = ours.holdout_idx
  obs = np.asarray(data.observations[idx], dtype)
  act = np.asarray(data.actions[idx], dtype)
  mine = dynamics.predict(ours.final, jnp.asarray(obs), jnp.asarray(act), cfg)
  theirs = dyn_theirs.predict(mods, dyn, obs, act, dtype)
  steps = len(ours.losses[0]) * len(ours.losses)
  names = ("next-state mean", "next-state variance", "reward mean", "reward variance")
  return [_row("predictions", f"{name} per member (holdout rows)", steps, np.asarray(a), b, dtype,
               "after training on each side: their forward + obs (as their step) vs "
               "dynamics.predict") for name, a, b in zip(names, mine, theirs)]


# ----------------------------------------------------------------------------------- rollout

def _their_rollout_dynamics(mods, cfg, dyn_state, algo, dtype):
  """Their EnsembleDynamics holding our trained ensemble: weights, scaler, elites; MOPO's
  penalty_coef = beta (OfflineRL-Kit run_mopo.py; run_mobile.py and MOMBO's train.py pass none)."""
  coef = cfg.beta if cfg.algorithm.penalise_reward else 0.0
  dyn = dyn_theirs.build(mods, cfg, jax.device_get(dyn_state.params), dtype, penalty_coef=coef)
  dyn.scaler.mu = np.asarray(dyn_state.input_mean)[None]
  dyn.scaler.std = np.asarray(dyn_state.input_std)[None]
  dyn.model.set_elites(np.asarray(dyn_state.elites).tolist())
  return dyn


def _rollout_rows(algo, mods, cfg, dyn_state, data, dtype, seed):
  key = jax.random.PRNGKey(1000 + seed)
  pick = np.random.default_rng(seed).choice(len(data.observations), R_BRANCHES, replace=False)
  start = np.asarray(data.observations[pick], dtype)
  w, b = dyn_ours.linear_policy(seed)
  policy = dyn_ours.policy_fn(w, b)
  k = cfg.rollout.rollout_length
  mine, written = dyn_ours.rollout_replay(key, policy, dyn_state, jnp.asarray(start), cfg, cfg.beta)
  buf, _ = rollout.run(key, policy, dyn_state, jnp.asarray(start),
                       buffer.init_ring(R_BRANCHES * k, dyn_ours.S, dyn_ours.A), cfg,
                       termination.termination_fn(cfg.env_name),
                       rollout.CellRollout(beta=cfg.beta))
  elite, noise = dyn_ours.rollout_draws(key, R_BRANCHES, cfg, dyn_state.elites, dtype)
  dyn = _their_rollout_dynamics(mods, cfg, dyn_state, algo, dtype)
  trans, their_rows, infos, stored = dyn_theirs.rollout(
      mods, dyn, cfg, start, lambda o: np.tanh(o @ w.astype(o.dtype) + b.astype(o.dtype)),
      elite, noise, dtype)
  ours_keys = list(zip(*np.nonzero(written)))
  their_keys = [(t, r) for t, rows in enumerate(their_rows) for r in rows]
  at = {key_: j for j, key_ in enumerate(their_keys)}
  pairs = np.asarray([(i, at[key_]) for i, key_ in enumerate(ours_keys) if key_ in at], int)
  i, j = (pairs[:, 0], pairs[:, 1]) if len(pairs) else (np.zeros(0, int),) * 2
  flat = {name: v[written] for name, v in mine.items()}
  rows = [_count("rollout", "rows written (step, branch)", k,
                 len(ours_keys) + len(their_keys) - 2 * len(pairs), len(their_keys),
                 f"ours {len(ours_keys)} rows, theirs {len(their_keys)}; branches end at a "
                 f"terminal on both sides (their {_policy_ref(algo)}: nonterm_mask drops ended "
                 "branches; ours masks them)")]
  rows += _rollout_values(algo, flat, trans, infos, i, j, k, dtype)
  rows += _buffer_rows(algo, buf, stored, i, j, k)
  return rows


def _policy_ref(algo):
  return {"mombo": "adinlab/MOMBO policies/mombo.py:93-131",
          "mopo": "OfflineRL-Kit offlinerlkit/policy/model_based/mopo.py:45-79",
          "mobile": "OfflineRL-Kit offlinerlkit/policy/model_based/mobile.py:95-130"}[algo]


def _hopper_gap(next_obs):
  """bool [B]: where gymnasium v5's hopper (ours, with the runaway bound) ends a branch that the
  references' v2-era function keeps: obs[1:] <= -100 (their check is one-sided) or obs[0] >= 100
  (they bound obs[1:] only)."""
  return np.any(next_obs[:, 1:] <= -100, axis=1) | (next_obs[:, 0] >= 100)


def _terminal_note(algo):
  return (f"{_ref(algo, 'utils/termination_fns.py', (19, 24))} checks "
          "`np.abs(next_obs[:,1:] < 100)` (one-sided, obs[1:] only); ours (core/termination.py) "
          "is gymnasium v5 Hopper's |obs[1:]| < 100 plus the runaway bound |x| < 100 on every "
          "coordinate (rollout_obs_limit)")


def _rollout_values(algo, flat, trans, infos, i, j, k, dtype):
  names = [("obs", "obss"), ("action", "actions"), ("next_obs", "next_obss"),
           ("reward", "rewards")]
  if algo == "mombo":
    names += [("obs_var", "obs_variances"), ("next_obs_var", "next_obs_variances")]
  ref = _policy_ref(algo)
  rows = []
  for mine, theirs in names:
    b = trans[theirs][j].reshape(flat[mine][i].shape)
    note = (f"their {ref} with our elite and noise per row, the same policy "
            "(tanh(obs W + b)) on both sides")
    if mine == "reward" and algo == "mopo":
      note = ("sample - beta * penalty (their dynamics/ensemble_dynamics.py:71, penalty_coef = "
              "beta; ours rollout.run)")
    rows.append(_row("rollout", mine, k, flat[mine][i], b, dtype, note))
  done, term = flat["done"][i].astype(bool), trans["terminals"][j].reshape(-1).astype(bool)
  differ = done != term
  gap = _hopper_gap(flat["next_obs"][i])
  explained = differ.any() and np.all(gap[differ] & done[differ])
  rows.append(_count("rollout", "terminal", k, int(differ.sum()), len(done),
                     "their task's termination fn vs ours (gymnasium v5 + runaway bound); they "
                     "agree on every row here", _terminal_note(algo) if explained else None))
  if algo == "mopo":
    pen = np.concatenate([info["penalty"] for info in infos]).reshape(-1)
    rows.append(_row("rollout", "MOPO penalty (max over members of ||std||)", k,
                     flat["penalty"][i], pen[j], dtype,
                     "OfflineRL-Kit offlinerlkit/dynamics/ensemble_dynamics.py:58, aleatoric: "
                     "all M members, std over next-state and reward dims; ours dynamics.step"))
  return rows


def _buffer_rows(algo, buf, stored, i, j, k):
  """Our ring (rollout.run, the product) against their ReplayBuffer after add_batch: both hold
  float32 (ours core/buffer.init_ring, theirs utils/buffer.py's arrays), compared as float32."""
  names = [("obs", "observations"), ("action", "actions"), ("next_obs", "next_observations"),
           ("reward", "rewards"), ("done", "terminals")]
  if algo == "mombo":
    names += [("obs_var", "observation_variances"),
              ("next_obs_var", "next_observation_variances")]
  rows = []
  for mine, theirs in names:
    a = np.asarray(getattr(buf.data, mine))[:int(buf.count)][i]
    rows.append(_row("replay buffer", mine, k, a, stored[theirs][j].reshape(a.shape), "float32",
                     "what their add_batch stored vs our ring after rollout.run (float32 both); "
                     "ours also stores next_obs_mean, reward_mean, reward_var (MOMBO's targets)"))
  return rows


# ------------------------------------------------------------------------------- termination

def _edge_states(env):
  """States on and around every boundary of env's termination: one coordinate changed from a
  healthy state each; [B, S]."""
  dim = 11 if env == "hopper" else 17
  healthy = np.zeros(dim)
  healthy[0] = 0.0 if env == "halfcheetah" else 1.25
  values = [-np.inf, -150, -100, -99.9, -1.01, -1, -0.99, -0.21, -0.2, -0.19, 0.19, 0.2, 0.21,
            0.69, 0.7, 0.71, 0.79, 0.8, 0.81, 0.99, 1, 1.01, 1.99, 2, 2.01, 99.9, 100, 150,
            np.inf, np.nan]
  states = []
  for d in (0, 1, 2, dim - 1):
    for v in values:
      s = healthy.copy()
      s[d] = v
      states.append(s)
  return np.asarray(states)


def _termination_rows(algo, mods):
  rows = []
  for env in ("hopper", "walker2d", "halfcheetah"):
    nxt = _edge_states(env)
    obs, act = np.zeros_like(nxt), np.zeros((len(nxt), 3))
    ours = np.asarray(termination.model_done(termination.termination_fn(env), obs, act, nxt,
                                             100.0))
    theirs = mods.term.get_termination_fn(task=env)(obs, act, nxt).reshape(-1).astype(bool)
    differ = ours != theirs
    gap = _hopper_gap(nxt) if env == "hopper" else np.zeros(len(nxt), bool)
    explained = differ.any() and np.all(gap[differ] & ours[differ])
    rows.append(_count("termination", f"{env}: states on the boundaries", None, int(differ.sum()),
                       len(nxt), f"{len(nxt)} states (z, angle, obs[2], obs[-1] across every "
                       "threshold, +-inf, NaN): gymnasium v5 + runaway bound vs their v2-era fn",
                       _terminal_note(algo) + f": {int(differ.sum())} states" if explained
                       else None))
  return rows
