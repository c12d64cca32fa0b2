"""Initial parameter values against the references' formulas (mombo_jax/core/inits.py).

Actor and critics: torch.nn.Linear's default, kernel and bias U(-1/sqrt(fan_in), 1/sqrt(fan_in))
(adinlab/MOMBO models/nets.py, models/dist.py). Dynamics members: EnsembleLinear's kernel
trunc_normal_(std = 1/(2 sqrt(fan_in))) cut at the ABSOLUTE values -2, 2, zero bias, log-variance
bounds 0.5 / -10 (adinlab/MOMBO models/nets.py, models/dynamics_model.py).

Each layer's values are pooled over several initialisation keys (vmapped) at the real networks'
sizes and compared with the formula: the support (no value outside it, the largest close to its
edge), the std, and a Kolmogorov-Smirnov distance to the reference's CDF. The keys are fixed, so
the checks are deterministic; their tolerances are ~4 sampling standard errors.
"""
import math

import jax
import numpy as np
import pytest
from flax.traverse_util import flatten_dict
from scipy import stats

from mombo_jax.core import dynamics, inits, sac
from mombo_jax.settings import config as config_lib

OBS, ACT = 17, 6          # walker2d / halfcheetah sizes
KEYS = 16                 # initialisations pooled per layer


def _ks_limit(n):
  return 2.2 / math.sqrt(n)        # KS distance at p ~ 1e-4 (Kolmogorov's asymptotic law)


def check_uniform(x, bound, name):
  """x drawn from U(-bound, bound): support, edge, std, mean and KS."""
  x = np.asarray(x, np.float64).ravel()
  n, sigma = x.size, bound / math.sqrt(3.0)
  assert n >= 32, name
  top = np.max(np.abs(x))
  assert top <= bound * (1 + 1e-6), f"{name}: max |w| {top:.4g} beyond the bound {bound:.4g}"
  # P(max |w| < bound (1 - t)) = (1 - t)^n ~ e^-10.
  t = min(0.5, 10.0 / n)
  assert top >= bound * (1 - t), f"{name}: max |w| {top:.4g} far inside the bound {bound:.4g}"
  # A uniform's kurtosis is 1.8: the sample std's relative error is ~ sqrt(0.8 / n) / 2.
  tol = 0.01 + 2.0 * math.sqrt(0.8 / n)
  assert abs(x.std() / sigma - 1) <= tol, f"{name}: std {x.std():.4g}, formula {sigma:.4g}"
  assert abs(x.mean()) <= 4 * sigma / math.sqrt(n), f"{name}: mean {x.mean():.4g}"
  ks = stats.kstest(x, stats.uniform(-bound, 2 * bound).cdf).statistic
  assert ks <= _ks_limit(n), f"{name}: KS distance {ks:.4g} to U(-{bound:.4g}, {bound:.4g})"


def trunc_normal_std(std, a, b):
  """The std of N(0, std^2) cut to [a, b] (a = -b)."""
  beta = b / std
  phi = math.exp(-0.5 * beta**2) / math.sqrt(2 * math.pi)
  mass = math.erf(beta / math.sqrt(2))
  return std * math.sqrt(1 - 2 * beta * phi / mass)


def check_trunc_normal(x, std, a, b, name):
  """x drawn from N(0, std^2) cut to the absolute interval [a, b] (torch.nn.init.trunc_normal_)."""
  x = np.asarray(x, np.float64).ravel()
  n = x.size
  assert n >= 1000, name
  assert x.min() >= a and x.max() <= b, f"{name}: values outside [{a}, {b}]"
  sigma = trunc_normal_std(std, a, b)
  assert abs(x.std() / sigma - 1) <= 0.01 + 2.0 * math.sqrt(2.0 / n), (
      f"{name}: std {x.std():.4g}, formula {sigma:.4g}")
  # Not cut at +-2 std the way Flax's truncated_normal is (its largest value is 2.27 std): with
  # n >= 1000 draws of a normal cut at >= 4 std, some lie beyond 3 std (P(none) < 0.07^(n/25)).
  if b / std >= 4:
    assert np.max(np.abs(x)) >= 3 * std, f"{name}: max |w| {np.max(np.abs(x)):.4g} < 3 std"
  cut = stats.truncnorm(a / std, b / std, scale=std)
  ks = stats.kstest(x, cut.cdf).statistic
  assert ks <= _ks_limit(n), f"{name}: KS distance {ks:.4g} to the truncated normal"


def _pool(tree):
  """Per layer {name: {"kernel": [K, ..., in, out], "bias": [K, ..., out]}} (K keys, members)."""
  return {name: {k: np.asarray(v) for k, v in layer.items()} for name, layer in tree.items()}


@pytest.fixture(scope="module")
def cfg():
  c = config_lib.make_config("walker2d-medium", "mombo", preset="paper")
  assert tuple(c.agent.actor_hidden) == (256, 256) and tuple(c.agent.critic_hidden) == (256, 256)
  return c


@pytest.fixture(scope="module")
def agents(cfg):
  """KEYS agents from sac.init_agent, the path training and the online-SAC collector take."""
  keys = jax.random.split(jax.random.key(0), KEYS)
  return jax.vmap(lambda k: sac.init_agent(k, OBS, ACT, cfg, total_steps=1))(keys)


def test_torch_linear_init_function():
  key = jax.random.key(1)
  for fan_in, fan_out in ((1, 4096), (23, 2048), (256, 256)):
    bound = 1 / math.sqrt(fan_in)
    check_uniform(inits.torch_linear_kernel(key, (fan_in, fan_out)), bound, f"kernel {fan_in}")
    check_uniform(inits.torch_linear_bias(fan_in)(key, (4096,)), bound, f"bias {fan_in}")
  with pytest.raises(ValueError, match="fan_in"):
    inits.torch_linear_kernel(key, (3,))
  with pytest.raises(ValueError, match="fan_in"):
    inits.torch_linear_bias(0)


def test_ensemble_linear_init_function():
  """fan_in 1: std 0.5, so the absolute cut at +-2 is at 4 std and 200k draws reach it."""
  key = jax.random.key(2)
  w = np.asarray(inits.ensemble_linear_kernel(key, (1, 200_000)))
  assert w.dtype == np.float32
  check_trunc_normal(w, 0.5, -2.0, 2.0, "fan_in 1")
  assert np.max(np.abs(w)) >= 1.9          # ~29 draws beyond 3.8 std are expected
  for fan_in in (14, 200):
    std = 1 / (2 * math.sqrt(fan_in))
    check_trunc_normal(inits.ensemble_linear_kernel(key, (fan_in, 4096)), std, -2.0, 2.0,
                       f"fan_in {fan_in}")
  assert not np.any(np.asarray(inits.ensemble_linear_bias(key, (7,))))


def test_actor_layers_are_torch_linear(agents, cfg):
  layers = _pool(agents.actor.params["params"])
  # hidden layers, then the mean head, then the log-std head (sac.actor_layers' order)
  fan_ins = [OBS] + list(cfg.agent.actor_hidden) + [cfg.agent.actor_hidden[-1]]
  assert sorted(layers) == [f"Dense_{i}" for i in range(len(fan_ins))]
  for i, fan_in in enumerate(fan_ins):
    layer = layers[f"Dense_{i}"]
    assert layer["kernel"].shape[-2] == fan_in
    for part in ("kernel", "bias"):
      check_uniform(layer[part], 1 / math.sqrt(fan_in), f"actor Dense_{i} {part}")


def test_critic_layers_are_torch_linear(agents, cfg):
  """Both critics (the member axis) and the target copy; the MM path shares these parameters."""
  layers = _pool(agents.critic.params["params"]["members"])
  fan_ins = [OBS + ACT] + list(cfg.agent.critic_hidden)
  assert sorted(layers) == [f"MMDense_{i}" for i in range(len(fan_ins))]
  for i, fan_in in enumerate(fan_ins):
    layer = layers[f"MMDense_{i}"]
    assert layer["kernel"].shape[-2] == fan_in
    for part in ("kernel", "bias"):
      check_uniform(layer[part], 1 / math.sqrt(fan_in), f"critic MMDense_{i} {part}")
  jax.tree.map(np.testing.assert_array_equal, agents.critic.params, agents.target_critic_params)


def test_dynamics_layers_are_ensemble_linear(cfg):
  obs_dim, act_dim = 11, 3                     # hopper: the smallest fan_in, the widest cut
  keys = jax.random.split(jax.random.key(3), 2)
  states = jax.vmap(lambda k: dynamics.init_state(k, obs_dim, act_dim, cfg))(keys)
  layers = _pool(states.params["members"])
  hidden = tuple(cfg.dynamics.dyn_hidden)
  fan_ins = [obs_dim + act_dim] + list(hidden)
  names = [f"layer_{i}" for i in range(len(hidden))] + ["out"]
  assert sorted(layers) == sorted(names)
  for name, fan_in in zip(names, fan_ins):
    kernel, bias = layers[name]["kernel"], layers[name]["bias"]
    assert kernel.shape[:2] == (2, cfg.dynamics.dyn_members) and kernel.shape[-2] == fan_in
    check_trunc_normal(kernel, 1 / (2 * math.sqrt(fan_in)), -2.0, 2.0, f"dynamics {name}")
    assert not np.any(bias), f"dynamics {name} bias must start at zero"
  assert cfg.dynamics.dyn_max_logvar_init == 0.5 and cfg.dynamics.dyn_min_logvar_init == -10.0
  np.testing.assert_array_equal(states.params["max_logvar"], np.full((2, obs_dim + 1), 0.5))
  np.testing.assert_array_equal(states.params["min_logvar"], np.full((2, obs_dim + 1), -10.0))


def test_checkpoint_shapes_unchanged(cfg):
  """Only the values changed: the parameter trees (names, shapes) are the ones saved runs hold."""
  agent = jax.eval_shape(lambda: sac.init_agent(jax.random.key(0), OBS, ACT, cfg, total_steps=1))
  actor = {k: v.shape for k, v in flatten_dict(agent.actor.params["params"], sep="/").items()}
  assert actor == {"Dense_0/kernel": (OBS, 256), "Dense_0/bias": (256,),
                   "Dense_1/kernel": (256, 256), "Dense_1/bias": (256,),
                   "Dense_2/kernel": (256, ACT), "Dense_2/bias": (ACT,),
                   "Dense_3/kernel": (256, ACT), "Dense_3/bias": (ACT,)}
  critic = {k: v.shape for k, v in
            flatten_dict(agent.critic.params["params"]["members"], sep="/").items()}
  assert critic == {"MMDense_0/kernel": (2, OBS + ACT, 256), "MMDense_0/bias": (2, 256),
                    "MMDense_1/kernel": (2, 256, 256), "MMDense_1/bias": (2, 256),
                    "MMDense_2/kernel": (2, 256, 1), "MMDense_2/bias": (2, 1)}
