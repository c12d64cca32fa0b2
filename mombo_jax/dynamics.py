"""The Gaussian dynamics ensemble (SPEC.md section 5): training, prediction, one model step and the
termination functions.

One Flax module holds all members (nn.vmap, a leading member axis M on every member parameter);
seeds are a second, outer axis added by jax.vmap. The model maps standardised (obs, action) to the
mean and log-variance of (next_obs - obs, reward); means returned by `predict` / `step` are already
next-state means (obs + delta).

Training follows the MBPO/OfflineRL-Kit recipe: holdout split, per-member bootstrap, per-member
snapshots on > 1 % holdout improvement, patience-based early stopping, elites = best holdout MSE.
Everything of one epoch (shuffling, all minibatch steps via lax.scan, holdout evaluation, snapshot
and stopping bookkeeping) is a single jit-compiled call; the Python loop between epochs only logs
and checks whether every seed has stopped. Stopped seeds are frozen with a select (no lax.cond on
per-seed state: under vmap it would run both branches anyway).
"""
from __future__ import annotations

import functools
import math
import time
from typing import Callable, Optional, Sequence

import chex
import flax.linen as nn
import flax.struct as struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

# Holdout loss of a member before its first epoch: any finite loss is a > 1 % improvement on it.
_INITIAL_BEST = 1e10
# Inputs whose training-split std is below this are not scaled (constant features).
_MIN_STD = 1e-12


# ----------------------------------------------------------------------------------------------
# Model

def _trunc_normal_fan_in(key, shape, dtype=jnp.float32):
  """Truncated normal (at +-2 std) with std 1 / (2 sqrt(fan_in)), as in MBPO.

  shape [fan_in, fan_out].
  """
  std = 1.0 / (2.0 * math.sqrt(shape[0]))
  return nn.initializers.truncated_normal(stddev=std)(key, shape, dtype)


class _Member(nn.Module):
  """One member: SiLU MLP [..., D] -> (mean [..., O], raw log-variance [..., O])."""
  hidden_dims: Sequence[int]
  out_dim: int

  @nn.compact
  def __call__(self, x):
    for i, width in enumerate(self.hidden_dims):
      x = nn.silu(nn.Dense(width, kernel_init=_trunc_normal_fan_in, name=f"layer_{i}")(x))
    x = nn.Dense(2 * self.out_dim, kernel_init=_trunc_normal_fan_in, name="out")(x)
    return x[..., :self.out_dim], x[..., self.out_dim:]


class EnsembleDynamics(nn.Module):
  """All members at once. __call__(x [M, B, D] standardised) -> (mean [M, B, O], logvar [M, B, O]).

  O = obs_dim + 1: (delta_obs, reward). The log-variance is soft-clamped between learned bounds
  max_logvar / min_logvar [O] shared by all members.
  """
  hidden_dims: Sequence[int]
  out_dim: int
  num_members: int
  max_logvar_init: float = 0.5
  min_logvar_init: float = -10.0

  @nn.compact
  def __call__(self, x):
    members = nn.vmap(_Member, variable_axes={"params": 0}, split_rngs={"params": True},
                      in_axes=0, out_axes=0, axis_size=self.num_members)
    mean, logvar = members(tuple(self.hidden_dims), self.out_dim, name="members")(x)
    max_lv = self.param("max_logvar", nn.initializers.constant(self.max_logvar_init),
                        (self.out_dim,), jnp.float32)
    min_lv = self.param("min_logvar", nn.initializers.constant(self.min_logvar_init),
                        (self.out_dim,), jnp.float32)
    logvar = max_lv - jax.nn.softplus(max_lv - logvar)
    logvar = min_lv + jax.nn.softplus(logvar - min_lv)
    return mean, logvar


def make_module(config, obs_dim: int, num_members: Optional[int] = None) -> EnsembleDynamics:
  """The ensemble of config.dyn_members members (or num_members: a subset's parameters)."""
  return EnsembleDynamics(hidden_dims=tuple(config.dyn_hidden), out_dim=obs_dim + 1,
                          num_members=num_members or config.dyn_members,
                          max_logvar_init=config.dyn_max_logvar_init,
                          min_logvar_init=config.dyn_min_logvar_init)


class DynamicsState(struct.PyTreeNode):
  """A trained ensemble (one seed; vmapping stacks a leading seed axis on every field).

  params: EnsembleDynamics params ({"members": leading member axis M, "max_logvar" [O],
  "min_logvar" [O]}); input_mean, input_std [S + A]: training-split statistics of (obs, action);
  elites int32 [num_elites]: member indices, best holdout MSE first.
  """
  params: dict
  input_mean: jax.Array
  input_std: jax.Array
  elites: jax.Array


class StepResult(struct.PyTreeNode):
  """One model step of B rows (attribute or dict-style access: r.next_obs == r["next_obs"]).

  next_obs [B, S], reward [B]: samples from the chosen elite's Gaussian;
  next_obs_mean, next_obs_var [B, S], reward_mean, reward_var [B]: that elite's Gaussian;
  elite int32 [B]: the member index used per row;
  mopo_penalty [B]: max over all members of the L2 norm of the std over (next-state, reward) dims
  (None when step ran with penalty=False).
  """
  next_obs: jax.Array
  reward: jax.Array
  next_obs_mean: jax.Array
  next_obs_var: jax.Array
  reward_mean: jax.Array
  reward_var: jax.Array
  elite: jax.Array
  mopo_penalty: Optional[jax.Array]

  def __getitem__(self, name):
    return getattr(self, name)

  def keys(self):
    return [f.name for f in self.__dataclass_fields__.values()]


def _apply(config, params, x_std):
  """Raw module call on standardised inputs x_std [M, B, D] (M: the members in params)."""
  obs_dim = params["max_logvar"].shape[-1] - 1
  return make_module(config, obs_dim, x_std.shape[0]).apply({"params": params}, x_std)


def predict(dyn: DynamicsState, obs, action, config, members=None):
  """All members' Gaussians at (obs [B, S], action [B, A]), or those of `members` only.

  members: int32 [K] member indices (e.g. dyn.elites), None for all M; only those members'
  networks run.
  Returns next_obs_mean [K, B, S] (obs + predicted delta), next_obs_var [K, B, S],
  reward_mean [K, B], reward_var [K, B] (K = M for members=None).
  """
  chex.assert_rank([obs, action], 2)
  chex.assert_equal_shape_prefix([obs, action], 1)
  obs_dim = obs.shape[-1]
  if dyn.params["max_logvar"].shape[-1] != obs_dim + 1:
    raise ValueError(f"The dynamics model predicts {dyn.params['max_logvar'].shape[-1] - 1} state "
                     f"dims but obs has {obs_dim}: train or load a model for this environment.")
  params, num = dyn.params, config.dyn_members
  if members is not None:
    params = dict(params, members=jax.tree.map(lambda p: p[members], params["members"]))
    num = members.shape[0]
  x = (jnp.concatenate([obs, action], axis=-1) - dyn.input_mean) / dyn.input_std
  x = jnp.broadcast_to(x, (num,) + x.shape)
  mean, logvar = _apply(config, params, x)
  var = jnp.exp(logvar)
  return obs + mean[..., :obs_dim], var[..., :obs_dim], mean[..., obs_dim], var[..., obs_dim]


def step(dyn: DynamicsState, obs, action, key, config, penalty: bool = True) -> StepResult:
  """One model transition per row with a uniformly random elite per row. See StepResult.

  penalty: compute mopo_penalty, which needs every member's network; False runs the elites' only
  (E of M networks) and leaves mopo_penalty None. Either way the same key picks the same elite
  and noise per row.
  """
  batch, obs_dim = obs.shape
  k_elite, k_noise = jax.random.split(key)
  slot = jax.random.randint(k_elite, (batch,), 0, dyn.elites.shape[0])    # index into elites
  elite = dyn.elites[slot]
  rows = jnp.arange(batch)
  if penalty:
    s_mean, s_var, r_mean, r_var = predict(dyn, obs, action, config)
    pick = lambda a: a[elite, rows]  # noqa: E731
  else:
    s_mean, s_var, r_mean, r_var = predict(dyn, obs, action, config, members=dyn.elites)
    pick = lambda a: a[slot, rows]  # noqa: E731
  mean_s, var_s, mean_r, var_r = pick(s_mean), pick(s_var), pick(r_mean), pick(r_var)
  noise = jax.random.normal(k_noise, (batch, obs_dim + 1), obs.dtype)
  next_obs = mean_s + jnp.sqrt(var_s) * noise[:, :obs_dim]
  reward = mean_r + jnp.sqrt(var_r) * noise[:, obs_dim]
  mopo = None
  if penalty:
    all_var = jnp.concatenate([s_var, r_var[..., None]], axis=-1)          # [M, B, S + 1]
    mopo = jnp.max(jnp.linalg.norm(jnp.sqrt(all_var), axis=-1), axis=0)
  return StepResult(next_obs=next_obs, reward=reward, next_obs_mean=mean_s, next_obs_var=var_s,
                    reward_mean=mean_r, reward_var=var_r, elite=elite.astype(jnp.int32),
                    mopo_penalty=mopo)


# ----------------------------------------------------------------------------------------------
# Loss and one epoch of training

def _decay(config, params):
  """sum_l wd_l * 0.5 * ||W_l||^2 over all members (kernels only, no biases)."""
  members = params["members"]
  names = [f"layer_{i}" for i in range(len(config.dyn_hidden))] + ["out"]
  return sum(wd * 0.5 * jnp.sum(jnp.square(members[n]["kernel"]))
             for wd, n in zip(config.dyn_weight_decay, names))


def loss_fn(config, params, x_std, y, weight):
  """Training loss of one minibatch: x_std [M, B, D] standardised inputs, y [M, B, O] targets,
  weight [M, B] (1 for real rows, 0 for padding). Returns a scalar."""
  mean, logvar = _apply(config, params, x_std)
  w = weight[..., None]
  denom = jnp.maximum(jnp.sum(weight, axis=1), 1.0) * y.shape[-1]            # [M]
  mse_inv = jnp.sum(w * jnp.square(mean - y) * jnp.exp(-logvar), axis=(1, 2)) / denom
  var_loss = jnp.sum(w * logvar, axis=(1, 2)) / denom
  loss = jnp.sum(mse_inv + var_loss) + _decay(config, params)
  return loss + config.dyn_logvar_coef * (jnp.sum(params["max_logvar"])
                                          - jnp.sum(params["min_logvar"]))


class _SeedTrain(struct.PyTreeNode):
  """Training state of one seed's ensemble (vmapped: a leading seed axis)."""
  params: dict
  opt_state: optax.OptState
  snapshot: dict            # members' params at their best holdout loss (leading member axis)
  best: jax.Array           # [M] best holdout MSE so far
  since: jax.Array          # int32: epochs since any member improved
  epoch: jax.Array          # int32: epochs trained
  active: jax.Array         # bool: still training
  key: jax.Array
  boot: jax.Array           # int32 [M, T]: each member's bootstrap sample (indices into the data)
  holdout: jax.Array        # int32 [H]
  input_mean: jax.Array     # [D]
  input_std: jax.Array      # [D]


def split_sizes(n: int, config) -> tuple:
  """(train size, holdout size) for n transitions."""
  holdout = min(int(n * config.dyn_holdout_ratio), config.dyn_max_holdout)
  return n - holdout, holdout


def _seed_keys(key):
  """(permutation, bootstrap, init, training) keys of one seed."""
  return jax.random.split(key, 4)


def split_indices(key, n: int, config) -> tuple:
  """(train_idx [n - H], holdout_idx [H]): the split train / train_seeds use for this seed key."""
  n_train, n_hold = split_sizes(n, config)
  perm = jax.random.permutation(_seed_keys(key)[0], n).astype(jnp.int32)
  return perm[n_hold:], perm[:n_hold]


def _init_seed(config, key, inputs, targets) -> _SeedTrain:
  n = inputs.shape[0]
  n_train, _ = split_sizes(n, config)
  _, k_boot, k_init, k_train = _seed_keys(key)
  train_idx, holdout = split_indices(key, n, config)
  boot = train_idx[jax.random.randint(k_boot, (config.dyn_members, n_train), 0, n_train)]
  x_train = inputs[train_idx]
  mu = jnp.mean(x_train, axis=0)
  std = jnp.std(x_train, axis=0)
  std = jnp.where(std < _MIN_STD, 1.0, std)
  module = make_module(config, targets.shape[-1] - 1)
  params = module.init(k_init, jnp.zeros((config.dyn_members, 1, inputs.shape[-1])))["params"]
  opt_state = optax.adam(config.dyn_lr).init(params)
  return _SeedTrain(params=params, opt_state=opt_state, snapshot=params["members"],
                    best=jnp.full((config.dyn_members,), _INITIAL_BEST, jnp.float32),
                    since=jnp.zeros((), jnp.int32), epoch=jnp.zeros((), jnp.int32),
                    active=jnp.ones((), bool), key=k_train, boot=boot, holdout=holdout,
                    input_mean=mu, input_std=std)


def holdout_mse(config, params, st: _SeedTrain, inputs, targets):
  """[M] MSE of each member's mean prediction on the seed's holdout split."""
  x = (inputs[st.holdout] - st.input_mean) / st.input_std
  x = jnp.broadcast_to(x, (config.dyn_members,) + x.shape)
  mean, _ = _apply(config, params, x)
  return jnp.mean(jnp.square(mean - targets[st.holdout]), axis=(1, 2))


def _epoch(config, st: _SeedTrain, inputs, targets, max_epochs):
  """One epoch of one seed: all minibatches (lax.scan), holdout evaluation, snapshot, stopping.

  max_epochs: int32 [] (an argument, not a compile-time constant, so one compilation serves
  every dyn_max_epochs).

  A stopped seed (st.active False) comes back unchanged, by select rather than cond.
  Returns (new state, holdout MSE [M] of this epoch's parameters; a stopped seed: its best).
  """
  members, n_train = st.boot.shape
  bs = config.dyn_batch_size
  n_batches = -(-n_train // bs)
  pad = n_batches * bs - n_train
  key, k_perm = jax.random.split(st.key)
  # Each member visits its own bootstrap sample in a fresh order every epoch.
  order = jax.vmap(jax.random.permutation)(jax.random.split(k_perm, members), st.boot)
  order = jnp.pad(order, ((0, 0), (0, pad)))
  weight = jnp.pad(jnp.ones((members, n_train), jnp.float32), ((0, 0), (0, pad)))
  order = order.reshape(members, n_batches, bs).swapaxes(0, 1)      # [n_batches, M, bs]
  weight = weight.reshape(members, n_batches, bs).swapaxes(0, 1)
  tx = optax.adam(config.dyn_lr)
  grad_fn = jax.value_and_grad(functools.partial(loss_fn, config))

  def minibatch(carry, xs):
    params, opt_state = carry
    idx, w = xs
    x = (inputs[idx] - st.input_mean) / st.input_std
    loss, grads = grad_fn(params, x, targets[idx], w)
    updates, opt_state = tx.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), loss

  (params, opt_state), _ = jax.lax.scan(minibatch, (st.params, st.opt_state), (order, weight))
  mse = holdout_mse(config, params, st, inputs, targets)
  improved = ((st.best - mse) / st.best > config.dyn_improvement) & st.active
  sel_m = lambda new, old: jnp.where(  # noqa: E731
      improved.reshape((members,) + (1,) * (new.ndim - 1)), new, old)
  snapshot = jax.tree.map(sel_m, params["members"], st.snapshot)
  best = jnp.where(improved, mse, st.best)
  since = jnp.where(jnp.any(improved), 0, st.since + 1)
  epoch = st.epoch + 1
  stop = (since >= config.dyn_patience) | (epoch >= max_epochs)
  new = st.replace(params=params, opt_state=opt_state, snapshot=snapshot, best=best, since=since,
                   epoch=epoch, active=~stop, key=key)
  out = jax.tree.map(lambda a, b: jnp.where(st.active, a, b), new, st)
  # A stopped seed reports its kept (snapshot) losses, not those of the discarded update.
  return out, jnp.where(st.active, mse, st.best)


def _finish(config, st: _SeedTrain) -> DynamicsState:
  """Snapshot members + the final shared log-variance bounds; elites by best holdout MSE."""
  params = dict(st.params, members=st.snapshot)
  elites = jnp.argsort(st.best)[:config.dyn_elites].astype(jnp.int32)
  return DynamicsState(params=params, input_mean=st.input_mean, input_std=st.input_std,
                       elites=elites)


@functools.lru_cache(maxsize=None)
def _compiled(config, batched: bool):
  """(init, epoch, finish) jitted for one seed or vmapped over a leading seed axis."""
  init = functools.partial(_init_seed, config)
  epoch = functools.partial(_epoch, config)
  finish = functools.partial(_finish, config)
  if batched:
    init = jax.vmap(init, in_axes=(0, None, None))
    epoch = jax.vmap(epoch, in_axes=(0, None, None, None))
    finish = jax.vmap(finish)
  return jax.jit(init), jax.jit(epoch, donate_argnums=0), jax.jit(finish)


def _dyn_config(config):
  """Only the dyn_* fields matter for training: key the compile cache on those alone
  (dyn_max_epochs is a runtime argument)."""
  from mombo_jax.config import Config
  fields = {f: getattr(config, f) for f in Config.__dataclass_fields__ if f.startswith("dyn_")}
  fields["dyn_max_epochs"] = None
  fields.pop("dyn_checkpoint_every_s")
  return Config(**fields)


def make_arrays(transitions):
  """Transitions -> (inputs [N, S + A], targets [N, S + 1]) float32 device arrays.

  targets = (next_obs - obs, reward).
  """
  obs = np.asarray(transitions.observations, np.float32)
  act = np.asarray(transitions.actions, np.float32)
  nxt = np.asarray(transitions.next_observations, np.float32)
  rew = np.asarray(transitions.rewards, np.float32).reshape(-1, 1)
  if obs.ndim != 2 or act.ndim != 2 or nxt.shape != obs.shape or len(rew) != len(obs) \
      or len(act) != len(obs):
    raise ValueError("Transitions must hold observations [N, S], actions [N, A], "
                     "next_observations [N, S] and rewards [N]; got shapes "
                     f"{obs.shape}, {act.shape}, {nxt.shape}, {rew.shape[:1]}.")
  inputs = np.concatenate([obs, act], axis=1)
  targets = np.concatenate([nxt - obs, rew], axis=1)
  if not (np.all(np.isfinite(inputs)) and np.all(np.isfinite(targets))):
    raise ValueError("Transitions contain NaN or inf values; clean the dataset first.")
  return jnp.asarray(inputs), jnp.asarray(targets)


class Interrupted(Exception):
  """Dynamics training stopped on request (should_stop) after checkpointing; `epoch` reached.
  Calling train / train_seeds again with the same checkpoint_dir resumes from there."""

  def __init__(self, epoch: int, checkpoint_dir: str):
    super().__init__(f"dynamics training stopped after epoch {epoch}; its state is in "
                     f"{checkpoint_dir} and the same call resumes from it")
    self.epoch = epoch
    self.checkpoint_dir = checkpoint_dir


def _resume(ckpt, st, identity):
  """The checkpointed training state (template st) if there is one; refuses another identity."""
  from mombo_jax import checkpoint
  if ckpt is None or ckpt.latest_step() is None:
    return st, False
  restored, meta = ckpt.restore(st)
  differs = identity_mismatch(meta, identity or {})
  if differs:
    raise checkpoint.CheckpointError(
        f"The unfinished dynamics training in {ckpt.directory} belongs to another setup "
        f"({_fmt_mismatch(differs)}); delete that folder to train from scratch, or pass another "
        "--dynamics_dir.")
  return restored, True


def _fit(keys, transitions, config, log_fn, batched: bool, history, checkpoint_dir=None,
         should_stop=None, identity=None) -> DynamicsState:
  inputs, targets = make_arrays(transitions)
  n_train, n_hold = split_sizes(inputs.shape[0], config)
  if n_hold < 1 or n_train < 1:
    raise ValueError(f"{inputs.shape[0]} transitions are too few to split off a holdout set "
                     f"(holdout ratio {config.dyn_holdout_ratio}); pass more data.")
  init, epoch, finish = _compiled(_dyn_config(config), batched)
  st = init(keys, inputs, targets)
  ckpt = None
  if checkpoint_dir is not None:
    from mombo_jax import checkpoint
    ckpt = checkpoint.RunCheckpointer(checkpoint_dir, keep=2, kind="dynamics training")
  st, resumed = _resume(ckpt, st, identity)
  if resumed:
    log_fn(f"dynamics: resumed unfinished training from {checkpoint_dir} at epoch "
           f"{int(np.max(jax.device_get(st.epoch)))}")
  last_save = time.time()
  max_epochs = jnp.asarray(np.iinfo(np.int32).max if config.dyn_max_epochs is None
                           else config.dyn_max_epochs, jnp.int32)
  num_seeds = keys.shape[0] if batched else 1
  t0 = time.time()
  while True:
    st, mse = epoch(st, inputs, targets, max_epochs)
    mse, best, active, since, ep = jax.device_get((mse, st.best, st.active, st.since, st.epoch))
    mse, best = (np.reshape(a, (num_seeds, -1)) for a in (mse, best))
    active, since, ep = (np.reshape(a, (num_seeds,)) for a in (active, since, ep))
    if history is not None:
      history.append(dict(epoch=ep, holdout_mse=mse, best=best, active=active))
    left = int(np.max(np.where(active, config.dyn_patience - since, 0)))
    if config.dyn_max_epochs is not None:
      left = min(left, config.dyn_max_epochs - int(ep.max()))
    per_seed = " | ".join(
        f"seed {s}{'' if active[s] else ' (stopped)'}: " + " ".join(f"{v:.4g}" for v in mse[s])
        for s in range(num_seeds))
    log_fn(f"dynamics epoch {int(ep.max())}: holdout mse {per_seed}; "
           f"{time.time() - t0:.1f} s elapsed; {int(active.sum())}/{num_seeds} seed(s) training, "
           f"at most {left} epoch(s) left unless a member improves")
    if not active.any():
      break
    stop = should_stop is not None and should_stop()
    if ckpt is not None and (stop or time.time() - last_save >= config.dyn_checkpoint_every_s):
      ckpt.save(int(ep.max()), st, {"identity": identity or {}})
      last_save = time.time()
    if stop:
      raise Interrupted(int(ep.max()), checkpoint_dir)
  return finish(st)


def train(key, transitions, config, log_fn: Callable = print,
          history: Optional[list] = None, **resume) -> DynamicsState:
  """Trains one seed's ensemble on data.Transitions (numpy). key: PRNG key [2].

  log_fn gets one progress line per epoch. history: if a list, one dict per epoch is appended
  (epoch [1], holdout_mse [1, M], best [1, M], active [1]; numpy). `resume`: checkpoint_dir,
  should_stop, identity as in train_seeds.
  """
  chex.assert_shape(key, (2,))
  return _fit(key, transitions, config, log_fn, False, history, **resume)


def train_seeds(keys, transitions, config, log_fn: Callable = print,
                history: Optional[list] = None, *, checkpoint_dir: Optional[str] = None,
                should_stop: Optional[Callable[[], bool]] = None,
                identity: Optional[dict] = None) -> DynamicsState:
  """Trains len(keys) seeds' ensembles in one vmapped call per epoch. keys [N, 2].

  Returns a DynamicsState with a leading seed axis N. Each seed stops on its own; stopped seeds
  stay frozen while the others finish, so seed i's result equals train(keys[i], ...).
  history: as in `train`, with N rows per array (only the epochs of this call after a resume).

  checkpoint_dir: the training state is saved there (every config.dyn_checkpoint_every_s seconds,
  and when stopping), and a call with the same checkpoint_dir resumes from it, ending with the same
  result as an uninterrupted call; a checkpoint of another `identity` is refused.
  should_stop: polled after each epoch; when it returns True the state is checkpointed and
  `Interrupted` raised (needs checkpoint_dir).
  """
  chex.assert_rank(keys, 2)
  if should_stop is not None and checkpoint_dir is None:
    raise ValueError("should_stop needs a checkpoint_dir to save the interrupted training in.")
  return _fit(keys, transitions, config, log_fn, True, history, checkpoint_dir, should_stop,
              identity)


def init_state(key, obs_dim: int, action_dim: int, config) -> DynamicsState:
  """An untrained ensemble (identity normaliser, elites 0..E-1): for tests and shape templates."""
  params = make_module(config, obs_dim).init(
      key, jnp.zeros((config.dyn_members, 1, obs_dim + action_dim)))["params"]
  return DynamicsState(params=params, input_mean=jnp.zeros((obs_dim + action_dim,)),
                       input_std=jnp.ones((obs_dim + action_dim,)),
                       elites=jnp.arange(config.dyn_elites, dtype=jnp.int32))


# ----------------------------------------------------------------------------------------------
# Termination functions (gymnasium v5 layout: exclude_current_positions_from_observation=True, so
# obs[0] = torso height z = qpos[1], obs[1] = torso angle = qpos[2]). gymnasium 1.4.0's checks are
# strict (open intervals) although its docs say "closed interval"; we follow the code.

HOPPER_HEALTHY_STATE = 100.0          # |obs[1:]| < 100 (gymnasium: state_vector()[2:])
HOPPER_HEALTHY_Z = 0.7                # z > 0.7 (upper bound +inf)
HOPPER_HEALTHY_ANGLE = 0.2            # -0.2 < angle < 0.2
WALKER_HEALTHY_Z = (0.8, 2.0)         # 0.8 < z < 2.0
WALKER_HEALTHY_ANGLE = (-1.0, 1.0)    # -1 < angle < 1


def _finite(next_obs):
  # A model can emit NaN / inf; gymnasium never sees those from a real simulator, and any
  # comparison with NaN there is False (= unhealthy), so treating them as terminal is consistent.
  return jnp.all(jnp.isfinite(next_obs), axis=-1)


def _hopper_done(obs, action, next_obs):
  z, angle = next_obs[..., 0], next_obs[..., 1]
  healthy = (_finite(next_obs)
             & jnp.all(jnp.abs(next_obs[..., 1:]) < HOPPER_HEALTHY_STATE, axis=-1)
             & (z > HOPPER_HEALTHY_Z)
             & (jnp.abs(angle) < HOPPER_HEALTHY_ANGLE))
  return ~healthy


def _walker_done(obs, action, next_obs):
  z, angle = next_obs[..., 0], next_obs[..., 1]
  healthy = (_finite(next_obs)
             & (z > WALKER_HEALTHY_Z[0]) & (z < WALKER_HEALTHY_Z[1])
             & (angle > WALKER_HEALTHY_ANGLE[0]) & (angle < WALKER_HEALTHY_ANGLE[1]))
  return ~healthy


def _halfcheetah_done(obs, action, next_obs):
  # HalfCheetah-v5 never terminates; only a non-finite model prediction ends a branch.
  return ~_finite(next_obs)


_TERMINATION = {"hopper": _hopper_done, "walker2d": _walker_done,
                "halfcheetah": _halfcheetah_done}


def termination_fn(env_name: str) -> Callable:
  """fn(obs [B, S], action [B, A], next_obs [B, S]) -> bool [B] (True = terminal), jittable.

  env_name: halfcheetah | hopper | walker2d; a dataset name ('hopper-medium'), gymnasium id
  ('Hopper-v5') or Minari id ('mujoco/hopper/medium-v0') works too.
  """
  parts = env_name.lower().split("/")
  # 'hopper', 'hopper-medium', 'Hopper-v5', or a Minari id 'mujoco/hopper/medium-v0'.
  env = (parts[1] if len(parts) == 3 else parts[-1]).split("-")[0]
  env = {"half_cheetah": "halfcheetah"}.get(env, env)
  if env not in _TERMINATION:
    raise ValueError(f"No termination function for {env_name!r}; known: "
                     f"{', '.join(sorted(_TERMINATION))}.")
  return _TERMINATION[env]


# ----------------------------------------------------------------------------------------------
# Saving and loading

_META_FIELDS = ("dyn_members", "dyn_elites", "dyn_hidden", "dyn_weight_decay",
                "dyn_max_logvar_init", "dyn_min_logvar_init")


def identity(config, transitions, extra: Optional[dict] = None) -> dict:
  """What must match for saved dynamics to be reused: the env and the ensemble's shape (members,
  elites, hidden sizes, obs/action dims, seeds) plus the caller's `extra` (data.dataset_identity:
  dataset id, size, fingerprint). JSON-friendly values only."""
  out = dict(env=config.env_name, dyn_members=config.dyn_members, dyn_elites=config.dyn_elites,
             dyn_hidden=list(config.dyn_hidden), obs_dim=int(transitions.observations.shape[1]),
             action_dim=int(transitions.actions.shape[1]), num_seeds=config.num_seeds,
             seed=config.seed)
  out.update(extra or {})
  return out


def identity_mismatch(meta: dict, expected: dict) -> dict:
  """{key: (saved, expected)} for every key of `expected` whose saved value (meta["identity"])
  differs or is missing; empty when the saved dynamics fit."""
  saved = (meta or {}).get("identity") or {}
  return {k: (saved.get(k, "<not recorded>"), v) for k, v in expected.items()
          if saved.get(k, "<not recorded>") != v}


def _fmt_mismatch(differs: dict) -> str:
  return "; ".join(f"{k}: saved {a!r}, now {b!r}" for k, (a, b) in sorted(differs.items()))


def save(path: str, dyn: DynamicsState, config, overwrite: bool = False,
         identity: Optional[dict] = None) -> None:
  """Writes dyn (one seed or a leading seed axis) with Orbax; metadata rebuilds the module and
  records `identity` (see `identity`) for reuse checks."""
  from mombo_jax import checkpoint
  obs_dim = int(dyn.params["max_logvar"].shape[-1]) - 1
  in_dim = int(dyn.input_mean.shape[-1])
  seeds = int(dyn.input_mean.shape[0]) if dyn.input_mean.ndim == 2 else None
  meta = {f: getattr(config, f) for f in _META_FIELDS}
  meta["dyn_hidden"] = list(meta["dyn_hidden"])
  meta["dyn_weight_decay"] = list(meta["dyn_weight_decay"])
  meta.update(obs_dim=obs_dim, action_dim=in_dim - obs_dim, num_seeds=seeds, env=config.env,
              kind="mombo_jax.dynamics", identity=identity or {})
  tree = {"params": dyn.params, "input_mean": dyn.input_mean, "input_std": dyn.input_std,
          "elites": dyn.elites}
  checkpoint.save_pytree(path, jax.device_get(tree), meta, overwrite=overwrite, kind="dynamics")


def load(path: str):
  """-> (DynamicsState, metadata dict). metadata holds obs_dim, action_dim, num_seeds (None for a
  single seed) and the dyn_* fields the module needs (apply with a Config carrying them)."""
  from mombo_jax import checkpoint
  tree, meta = checkpoint.load_pytree(path, kind="dynamics")
  if meta.get("kind") != "mombo_jax.dynamics":
    raise checkpoint.CheckpointError(f"{path} does not hold a dynamics ensemble saved by "
                                     "mombo_jax.dynamics.save.")
  tree = jax.tree.map(jnp.asarray, tree)
  dyn = DynamicsState(params=tree["params"], input_mean=tree["input_mean"],
                      input_std=tree["input_std"], elites=tree["elites"].astype(jnp.int32))
  return dyn, meta


def config_overrides(meta: dict) -> dict:
  """Config overrides that rebuild the saved module: make_config(..., **config_overrides(meta))."""
  out = {f: meta[f] for f in _META_FIELDS}
  out["dyn_hidden"] = tuple(out["dyn_hidden"])
  out["dyn_weight_decay"] = tuple(out["dyn_weight_decay"])
  return out
