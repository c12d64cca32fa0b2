"""Issue #43: a run's matmul precision is a setting (Config.matmul_precision, --matmul_precision,
config.json's `matmul_precision`), float32 by default; every dot of the programs a run compiles
(the epoch, the dynamics training) carries it whatever JAX's default around them (a GPU's: TF32);
groups of other precisions never share a program; the CPU computes both alike.

The programs are lowered, not compiled (the dots' precision is in the lowered text): cheap.
"""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mombo_jax.core import buffer, cells_program, dynamics, train as train_lib, xla_options
from mombo_jax.core.critics import CriticEnsemble
from mombo_jax.core.epoch_settings import epoch_settings
from mombo_jax.dynamics import dynamics_training
from mombo_jax.errors import UserError
from mombo_jax.records import workdir as workdir_lib
from mombo_jax.run.run_specs import RunSpec, check_runs
from mombo_jax.settings import config as config_lib

S_DIM, A_DIM, N = 11, 3, 64
PRECISIONS = config_lib.MATMUL_PRECISIONS
# How each setting reads in the lowered program (jax.default_matmul_precision's mapping).
HLO = {"float32": "HIGHEST", "tensorfloat32": "HIGH"}
CPU_ONLY = pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's arithmetic")


def _tiny(**kw):
  """MOMBO (moment-matched critics: variance matmuls too), one hidden layer of 8 everywhere."""
  return config_lib.make_config("hopper-random", "mombo", "tiny", steps_per_epoch=2,
                                rollout_batch_size=8, rollout_length=1, batch_size=8,
                                actor_hidden=(8,), critic_hidden=(8,), dyn_hidden=(8,),
                                dyn_weight_decay=(2.5e-5, 1e-4), **kw)


def _dots(text):
  """[(lhs, rhs) precision] of every dot_general in a lowered program, and how many there are."""
  found = re.findall(r"stablehlo\.dot_general[^\n]*precision = \[(\w+), (\w+)\]", text)
  return found, text.count("stablehlo.dot_general")


def test_the_setting_its_default_its_check_and_its_record():
  assert config_lib.Config().matmul_precision == "float32"
  config = _tiny(matmul_precision="tensorfloat32")
  assert config.settings()["matmul_precision"] == "tensorfloat32"
  assert workdir_lib.config_record(config, "hopper-random")["matmul_precision"] == "tensorfloat32"
  assert workdir_lib.config_from_record(workdir_lib.config_record(config, "hopper-random"))[0] \
      == config
  assert epoch_settings(config).matmul_precision == "tensorfloat32"
  assert epoch_settings(config) != epoch_settings(_tiny())      # another compiled program
  with pytest.raises(ValueError, match="matmul_precision must be one of float32, tensorfloat32"):
    config.replace(matmul_precision="highest")                 # JAX's name: not a setting


def test_the_flag_sets_it():
  from absl import flags  # experiments' flag parser: absl, loaded only by this test

  from experiments import run
  before = set(flags.FLAGS)
  run.define_flags()
  try:
    flags.FLAGS(["run", "--matmul_precision=tensorfloat32"])
    assert run._settings()["matmul_precision"] == "tensorfloat32"
    flags.FLAGS.unparse_flags()
    flags.FLAGS(["run"])
    assert "matmul_precision" not in run._settings()          # unset: the Config's float32
  finally:
    for name in set(flags.FLAGS) - before:
      delattr(flags.FLAGS, name)
    flags.FLAGS.unparse_flags()


def test_runs_of_other_precisions_never_share_a_program(tmp_path):
  config = _tiny()
  specs = [RunSpec(config, "hopper-random", str(tmp_path / "a")),
           RunSpec(config.replace(beta=2.0, matmul_precision="tensorfloat32"), "hopper-random",
                   str(tmp_path / "b"))]
  with pytest.raises(UserError, match="matmul_precision: 'float32' for hopper-random vs "
                                      "'tensorfloat32'"):
    check_runs(specs)


@pytest.fixture(scope="module")
def epoch_args():
  """(state [1], datasets, keys, cells) of a one-cell _tiny() program."""
  config = _tiny()
  rng = np.random.default_rng(0)
  f = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)  # noqa: E731
  obs, zeros = f(N, S_DIM), jnp.zeros((N, S_DIM), jnp.float32)
  real = buffer.Batch(obs=obs, action=jnp.tanh(f(N, A_DIM)), reward=f(N), next_obs=obs,
                      done=jnp.zeros(N, jnp.float32), obs_var=zeros, next_obs_mean=obs,
                      next_obs_var=zeros, reward_mean=jnp.zeros(N), reward_var=jnp.zeros(N))
  keys = jax.random.split(jax.random.PRNGKey(0), 1)
  dyn = jax.tree.map(lambda x: x[None],
                     dynamics.init_state(jax.random.PRNGKey(1), S_DIM, A_DIM, config))
  stacked, cells = train_lib.single_dataset(real, config, 1)
  return train_lib.init_cells(keys, config, real, dyn), stacked, keys, cells


@pytest.mark.parametrize("precision", PRECISIONS)
def test_every_dot_of_the_epoch_carries_the_runs_precision(epoch_args, precision):
  """Lowered inside JAX's default precision context ('bfloat16': DEFAULT, TF32 on a GPU), as an
  unpinned program would be on a GPU: the epoch's own pin wins, in the rollout, the critic and
  actor updates and their gradients alike."""
  program = cells_program.make_cells_epoch(_tiny(matmul_precision=precision), 1)
  with jax.default_matmul_precision("bfloat16"):
    found, count = _dots(program.lower(*epoch_args).as_text())
  assert count >= 20 and len(found) == count           # forward, backward, every network
  assert set(found) == {(HLO[precision], HLO[precision])}


@pytest.mark.parametrize("precision", PRECISIONS)
def test_every_dot_of_the_dynamics_training_carries_the_runs_precision(precision):
  fns = dynamics_training._compiled_as(
      dynamics_training._dyn_config(_tiny(matmul_precision=precision)), None)
  inputs = jax.ShapeDtypeStruct((N, S_DIM + A_DIM), jnp.float32)
  targets = jax.ShapeDtypeStruct((N, S_DIM + 1), jnp.float32)
  key = jax.random.PRNGKey(0)
  with jax.default_matmul_precision("bfloat16"):
    st = jax.eval_shape(fns.init, key, inputs, targets)
    order = jax.eval_shape(fns.plan, st)
    carry = dynamics_training._Carry(params=st.params, opt_state=st.opt_state)
    data = dynamics_training._Data(inputs=inputs, targets=targets)
    texts = [fns.steps.lower(st, carry, data, order, 0, 1),
             fns.end.lower(st, st.params, st.opt_state, inputs, targets, jnp.int32(1))]
    found, count = _dots("\n".join(t.as_text() for t in texts))
  assert count >= 6 and len(found) == count            # the training step and the holdout loss
  assert set(found) == {(HLO[precision], HLO[precision])}


@CPU_ONLY
def test_the_cpu_computes_both_precisions_alike():
  """XLA:CPU ignores the precision: a moment-matched critic's values and gradients are the same
  bits at both (so CPU results did not move when the pin came in, and no CPU test can tell the
  precisions apart: tests/matmul_precision.py emulates TF32 for that)."""
  net = CriticEnsemble((16, 16), 2)
  rng = np.random.default_rng(1)
  obs = jnp.asarray(rng.normal(size=(4, S_DIM)), jnp.float32)
  act = jnp.asarray(rng.uniform(-1, 1, size=(4, A_DIM)), jnp.float32)
  params = net.init(jax.random.PRNGKey(1), obs, act)

  def loss(p):
    mean, var = net.apply(p, obs, act, 0.1 * jnp.ones_like(obs))
    return jnp.sum(mean) + jnp.sum(var)

  out = {p: jax.jit(xla_options.at_precision(jax.value_and_grad(loss), p))(params)
         for p in PRECISIONS}
  jax.tree.map(np.testing.assert_array_equal, out["float32"], out["tensorfloat32"])
