"""The Gaussian dynamics ensemble (docs/spec.md section 5): the model, its predictions and one model
step, which is what rollouts and the Bellman targets use, and its pure training loss (`loss_fn`).

One Flax module holds all members (nn.vmap, a leading member axis M on every member parameter);
seeds are a second, outer axis added by jax.vmap. The model maps standardised (obs, action) to the
mean and log-variance of (next_obs - obs, reward); means returned by `predict` / `step` are already
next-state means (obs + delta).

Elsewhere: its life in mombo_jax/dynamics/, whose package docstring maps it (training in
dynamics_training.py, validation and elites in validation.py, the reuse key in reuse.py, saving /
loading in saved_dynamics.py, the store of trained ensembles in dynamics_store.py); termination
functions in termination.py.
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import chex
import flax.linen as nn
import flax.struct as struct
import jax
import jax.numpy as jnp

from mombo_jax.core import inits, pieces, rewrites

# ----------------------------------------------------------------------------------------------
# Model

def _ensemble_dense(features: int, name: str) -> nn.Dense:
  return nn.Dense(features, kernel_init=inits.ensemble_linear_kernel,
                  bias_init=inits.ensemble_linear_bias, name=name)


class _Member(nn.Module):
  """One member: SiLU MLP [..., D] -> (mean [..., O], raw log-variance [..., O]).

  Layers start as the reference's EnsembleLinear (inits.ensemble_linear_kernel / _bias).
  """
  hidden_dims: Sequence[int]
  out_dim: int

  @nn.compact
  def __call__(self, x):
    for i, width in enumerate(self.hidden_dims):
      x = nn.silu(_ensemble_dense(width, f"layer_{i}")(x))
    x = _ensemble_dense(2 * self.out_dim, "out")(x)
    return x[..., :self.out_dim], x[..., self.out_dim:]


class EnsembleDynamics(nn.Module):
  """All members at once. __call__(x [M, B, D] standardised) -> (mean [M, B, O], logvar [M, B, O]).

  O = obs_dim + 1: (delta_obs, reward). The log-variance is soft-clamped between learned bounds
  max_logvar / min_logvar [O] shared by all members, initialised to max_logvar_init /
  min_logvar_init (0.5 / -10 by default: adinlab/MOMBO models/dynamics_model.py).
  """
  hidden_dims: Sequence[int]
  out_dim: int
  num_members: int
  max_logvar_init: float = 0.5
  min_logvar_init: float = -10.0
  # The soft clamp computed on the flat log-variance (on_flat): predictions only (predict);
  # training keeps the program it was recorded with.
  flat_clamp: bool = False

  @nn.compact
  def __call__(self, x):
    members = nn.vmap(_Member, variable_axes={"params": 0}, split_rngs={"params": True},
                      in_axes=0, out_axes=0, axis_size=self.num_members)
    mean, logvar = members(tuple(self.hidden_dims), self.out_dim, name="members")(x)
    max_lv = self.param("max_logvar", nn.initializers.constant(self.max_logvar_init),
                        (self.out_dim,), jnp.float32)
    min_lv = self.param("min_logvar", nn.initializers.constant(self.min_logvar_init),
                        (self.out_dim,), jnp.float32)
    if self.flat_clamp:
      return mean, on_flat(_soft_clamp, logvar, max_lv, min_lv)
    return mean, _soft_clamp(logvar, max_lv, min_lv)


def _soft_clamp(logvar, max_lv, min_lv):
  logvar = max_lv - jax.nn.softplus(max_lv - logvar)
  return min_lv + jax.nn.softplus(logvar - min_lv)


def on_flat(fn, x, *rows):
  """fn(x, *rows) for an elementwise fn, computed on x [..., O] as one flat array; rows [O]
  broadcast along x's last axis. The same arithmetic per element, so the same values bit for bit.

  Why: XLA:CPU compiles an elementwise fusion over [M, B, O] (O = S + 1, 12 for hopper; x a
  slice of the output layer) into scalar code over the short last axis: the log-variance's soft
  clamp and exp took as long as a 200x200 layer of the rollout (~0.5 s of each MOPO rollout step
  at 7 x 50,000 rows, 2-core Xeon); on the flat view they vectorise (~3-6x faster).

  Bit-identity holds for the programs checked (the rollout and targets of every algorithm,
  benchmarks/bench_epoch_phases.txt); the dynamics training keeps the plain form (EnsembleDynamics
  .flat_clamp), whose program this changed in the last bits."""
  shape = x.shape
  flat = lambda r: jnp.broadcast_to(r, shape).reshape(-1)  # noqa: E731
  # The barrier on the flat operands: XLA would otherwise move the reshapes past the elementwise
  # ops (its ReshapeMover), back to the short last axis.
  out = fn(*jax.lax.optimization_barrier((x.reshape(-1),) + tuple(map(flat, rows))))
  return out.reshape(shape)


def make_module(config, obs_dim: int, num_members: Optional[int] = None,
                flat_clamp: bool = False) -> EnsembleDynamics:
  """The ensemble of config.dynamics.dyn_members members (or num_members: a subset's parameters)."""
  shape = config.dynamics
  return EnsembleDynamics(hidden_dims=tuple(shape.dyn_hidden), out_dim=obs_dim + 1,
                          num_members=num_members or shape.dyn_members,
                          max_logvar_init=shape.dyn_max_logvar_init,
                          min_logvar_init=shape.dyn_min_logvar_init, flat_clamp=flat_clamp)


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


class Gaussians(NamedTuple):
  """Members' predicted Gaussians at B rows (dynamics.predict's tuple, named):
  next_obs_mean, next_obs_var [K, B, S], reward_mean, reward_var [K, B]; K the members that ran."""
  next_obs_mean: jax.Array
  next_obs_var: jax.Array
  reward_mean: jax.Array
  reward_var: jax.Array


class StepResult(struct.PyTreeNode):
  """One model step of B rows (attribute or dict-style access: r.next_obs == r["next_obs"]).

  next_obs [B, S], reward [B]: samples from the chosen elite's Gaussian;
  next_obs_mean, next_obs_var [B, S], reward_mean, reward_var [B]: that elite's Gaussian;
  elite int32 [B]: the member index used per row;
  ensemble: every member's Gaussians [M, B, ...] when step ran with every_member=True (what a
  penalty of the whole ensemble reads: targets.EnsemblePenalty, MOPO's), else None.
  """
  next_obs: jax.Array
  reward: jax.Array
  next_obs_mean: jax.Array
  next_obs_var: jax.Array
  reward_mean: jax.Array
  reward_var: jax.Array
  elite: jax.Array
  ensemble: Optional[Gaussians]

  def __getitem__(self, name):
    return getattr(self, name)

  def keys(self):
    return [f.name for f in self.__dataclass_fields__.values()]


def apply(config, params, x_std, flat_clamp: bool = False):
  """Raw module call on standardised inputs x_std [M, B, D] (M: the members in params).
  flat_clamp: EnsembleDynamics.flat_clamp (the same values, faster on CPU; predict's).

  Returns (mean [M, B, O], log-variance [M, B, O]) of (delta_obs, reward), O = S + 1.
  """
  obs_dim = params["max_logvar"].shape[-1] - 1
  return make_module(config, obs_dim, x_std.shape[0], flat_clamp).apply({"params": params},
                                                                       x_std)


# ----------------------------------------------------------------------------------------------
# The training loss (its loop and split: mombo_jax/dynamics/dynamics_training.py; early stopping:
# validation.py)

def _decay(config, params):
  """sum_l wd_l * 0.5 * ||W_l||^2 over all members (kernels only, no biases)."""
  members = params["members"]
  names = [f"layer_{i}" for i in range(len(config.dynamics.dyn_hidden))] + ["out"]
  return sum(wd * 0.5 * jnp.sum(jnp.square(members[n]["kernel"]))
             for wd, n in zip(config.dynamics_training.dyn_weight_decay, names))


def loss_fn(config, params, x_std, y, weight):
  """Training loss of one minibatch: x_std [M, B, D] standardised inputs, y [M, B, O] targets,
  weight [M, B] (1 for real rows, 0 for padding). Returns a scalar."""
  mean, logvar = apply(config, params, x_std)
  w = weight[..., None]
  denom = jnp.maximum(jnp.sum(weight, axis=1), 1.0) * y.shape[-1]            # [M]
  mse_inv = jnp.sum(w * jnp.square(mean - y) * jnp.exp(-logvar), axis=(1, 2)) / denom
  var_loss = jnp.sum(w * logvar, axis=(1, 2)) / denom
  loss = jnp.sum(mse_inv + var_loss) + _decay(config, params)
  return loss + config.dynamics_training.dyn_logvar_coef * (jnp.sum(params["max_logvar"])
                                          - jnp.sum(params["min_logvar"]))


def predict(dyn: DynamicsState, obs, action, config, members=None):
  """All members' Gaussians at (obs [B, S], action [B, A]), or those of `members` only.

  members: int32 [K] member indices (e.g. dyn.elites), None for all M; only those members'
  networks run.
  Returns next_obs_mean [K, B, S] (obs + predicted delta), next_obs_var [K, B, S],
  reward_mean [K, B], reward_var [K, B] (K = M for members=None).

  More rows than rewrites.in_effect().predict_rows (on CPU 1000, elsewhere None: one piece;
  rewrites.py) run as a loop over pieces of that many rows (the last padded, its padding dropped):
  each row's arithmetic is the same as in one piece, but XLA may round the two programs
  differently in the last bits (it does inside the vmapped epoch). Why: a rollout's activations
  ([7, 50,000, 200] f32, 280 MB a layer) go to memory and back between every layer; a piece's
  (5.6 MB) stay in the caches. Measured on a 2-core Xeon: a MOPO epoch of 20 steps and a
  50,000 x 5 rollout 0.87x the time of the one-piece program (benchmarks/bench_epoch_changes.txt).
  """
  chex.assert_rank([obs, action], 2)
  chex.assert_equal_shape_prefix([obs, action], 1)
  obs_dim = obs.shape[-1]
  if dyn.params["max_logvar"].shape[-1] != obs_dim + 1:
    raise ValueError(f"The dynamics model predicts {dyn.params['max_logvar'].shape[-1] - 1} state "
                     f"dims but obs has {obs_dim}: train or load a model for this environment.")
  # The named scope: a phase of the epoch (train.PHASES); metadata only.
  with jax.named_scope("dynamics"):
    return pieces.map_rows(lambda o, a: _predict(dyn, o, a, config, members),
                           rewrites.in_effect().predict_rows, obs, action, out_row_axis=1)


def _predict(dyn: DynamicsState, obs, action, config, members):
  """predict's arithmetic on one piece of rows."""
  obs_dim = obs.shape[-1]
  params, num = dyn.params, config.dynamics.dyn_members
  if members is not None:
    params = dict(params, members=jax.tree.map(lambda p: p[members], params["members"]))
    num = members.shape[0]
  x = (jnp.concatenate([obs, action], axis=-1) - dyn.input_mean) / dyn.input_std
  x = jnp.broadcast_to(x, (num,) + x.shape)
  mean, logvar = apply(config, params, x, flat_clamp=True)
  var = jnp.exp(logvar)
  return obs + mean[..., :obs_dim], var[..., :obs_dim], mean[..., obs_dim], var[..., obs_dim]


def step(dyn: DynamicsState, obs, action, key, config, every_member: bool = False) -> StepResult:
  """One model transition per row with a uniformly random elite per row. See StepResult.

  every_member: run every member's network and return their Gaussians (StepResult.ensemble), for
  a penalty of the whole ensemble (the rollout asks when its algorithm's penalty is one); False
  runs the elites' only (E of M networks). Either way the same key picks the same elite and noise
  per row, so the rows are the same.
  """
  batch, obs_dim = obs.shape
  k_elite, k_noise = jax.random.split(key)
  slot = jax.random.randint(k_elite, (batch,), 0, dyn.elites.shape[0])    # index into elites
  elite = dyn.elites[slot]
  rows = jnp.arange(batch)
  if every_member:
    ensemble = Gaussians(*predict(dyn, obs, action, config))
    predicted, pick = ensemble, lambda a: a[elite, rows]  # noqa: E731
  else:
    ensemble = None
    predicted = predict(dyn, obs, action, config, members=dyn.elites)
    pick = lambda a: a[slot, rows]  # noqa: E731
  mean_s, var_s, mean_r, var_r = map(pick, predicted)
  noise = jax.random.normal(k_noise, (batch, obs_dim + 1), obs.dtype)
  next_obs = mean_s + jnp.sqrt(var_s) * noise[:, :obs_dim]
  reward = mean_r + jnp.sqrt(var_r) * noise[:, obs_dim]
  return StepResult(next_obs=next_obs, reward=reward, next_obs_mean=mean_s, next_obs_var=var_s,
                    reward_mean=mean_r, reward_var=var_r, elite=elite.astype(jnp.int32),
                    ensemble=ensemble)


def init_state(key, obs_dim: int, action_dim: int, config) -> DynamicsState:
  """An untrained ensemble (identity normaliser, elites 0..E-1): for tests and shape templates."""
  params = make_module(config, obs_dim).init(
      key, jnp.zeros((config.dynamics.dyn_members, 1, obs_dim + action_dim)))["params"]
  return DynamicsState(params=params, input_mean=jnp.zeros((obs_dim + action_dim,)),
                       input_std=jnp.ones((obs_dim + action_dim,)),
                       elites=jnp.arange(config.dynamics.dyn_elites, dtype=jnp.int32))
