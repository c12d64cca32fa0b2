"""The epoch's CPU fast paths (#29): critics.matmul (the weight gradient as x^T g, so the vmapped
training step needs no transposes) and dynamics.predict in pieces of rows, each chosen per backend
(core/rewrites.py: on CPU both, elsewhere neither; these tests pick them with rewrites.tracing)."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mombo_jax.core import critics, dynamics, rewrites, xla_options
from mombo_jax.settings import config as config_lib

CPU_ONLY = pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's compiled program")


@pytest.fixture(autouse=True)
def _full_precision_dots():
  """Float32 dots on every backend (no TF32 on a GPU): the comparisons below are to 1e-5."""
  with jax.default_matmul_precision("highest"):
    yield


def _plain(x, kernel):
  """The matmul before #29: lax.dot_general with JAX's own transpose rule."""
  return jax.lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())))


def _normal(seed, *shape):
  return jnp.asarray(np.random.default_rng(seed).normal(size=shape), jnp.float32)


def _loss(mm):
  """A scalar of mm(x, kernel) [..., F] whose cotangent g differs per entry (sin, then weights)."""
  def loss(x, kernel):
    out = mm(x, kernel)
    w = jnp.linspace(-1.0, 2.0, out.size, dtype=jnp.float32).reshape(out.shape)
    return jnp.sum(jnp.sin(out) * w)
  return loss


def _assert_grads_match(got, want):
  for g, w in zip(got, want):
    assert g.shape == w.shape and g.dtype == jnp.float32
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("features", [4, 1])          # 1: a scalar head (the gemv branch)
@pytest.mark.parametrize("x_shape", [(6, 5), (3, 6, 5)])
@pytest.mark.parametrize("how", rewrites.CRITIC_MATMULS)
def test_matmul_value_and_gradients_equal_the_plain_matmul(x_shape, features, how):
  x, kernel = _normal(0, *x_shape), _normal(1, 5, features)
  with rewrites.tracing(rewrites.choose(critic_matmul=how)):
    out = critics.matmul(x, kernel)
    got = jax.grad(_loss(critics.matmul), argnums=(0, 1))(x, kernel)
  assert out.shape == x_shape[:-1] + (features,)
  np.testing.assert_array_equal(out, x @ kernel)
  want = jax.grad(_loss(lambda a, b: a @ b), argnums=(0, 1))(x, kernel)
  assert got[0].shape == x_shape and got[1].shape == (5, features)
  _assert_grads_match(got, want)


@pytest.mark.parametrize("kernel_axes", [0, None])
def test_matmul_gradients_under_two_vmaps(kernel_axes):
  """vmap of vmap (the training cells on top of the critics' members), with the kernel batched
  like x or shared by the batch."""
  x = _normal(2, 2, 3, 6, 5)
  kernel = _normal(3, 2, 3, 5, 4) if kernel_axes == 0 else _normal(3, 5, 4)

  def grads(mm):
    g = jax.grad(_loss(mm), argnums=(0, 1))
    return jax.vmap(jax.vmap(g, in_axes=(0, kernel_axes)), in_axes=(0, kernel_axes))(x, kernel)

  got, want = grads(critics.matmul), grads(_plain)
  assert got[0].shape == (2, 3, 6, 5) and got[1].shape == (2, 3, 5, 4)
  _assert_grads_match(got, want)


def test_dot_general_hook_serves_only_x_at_kernel():
  x, kernel = _normal(4, 6, 5), _normal(5, 5, 4)
  np.testing.assert_array_equal(
      critics._dot_general(x, kernel, (((1,), (0,)), ((), ()))), critics.matmul(x, kernel))
  with pytest.raises(ValueError, match="dimension numbers"):
    critics._dot_general(x, kernel.T, (((1,), (1,)), ((), ())))
  with pytest.raises(ValueError, match="dimension numbers"):
    critics._dot_general(x[None], kernel[None], (((2,), (1,)), ((0,), (0,))))
  with pytest.raises(ValueError, match="precision"):
    critics._dot_general(x, kernel, (((1,), (0,)), ((), ())), precision=jax.lax.Precision.HIGHEST)


def _other_dots(hlo: str) -> list:
  """The output shapes of the dots in compiled HLO text not in the standard form
  [.., M, K] x [.., K, N] (the left operand contracting its last axis, the right one its first axis
  after the batch axes)."""
  others = []
  for line in hlo.splitlines():
    m = re.search(r"= (\S+) dot\(%([\w.\-]+), %([\w.\-]+)\)(.*)", line)
    if not m:
      continue
    lhs_shape = re.search(r"%" + re.escape(m.group(2)) + r" = \w+\[([\d,]*)\]", hlo)
    rank = len(lhs_shape.group(1).split(",")) if lhs_shape else None
    dims = dict(re.findall(r"(\w+_dims)=\{([\d,]*)\}", m.group(4)))
    batch = len([d for d in dims.get("lhs_batch_dims", "").split(",") if d])
    standard = (dims.get("lhs_contracting_dims") == str(rank - 1) if rank else False) and \
        dims.get("rhs_contracting_dims") == str(batch)
    if not standard:
      others.append(m.group(1).split("{")[0])
  return others


def _critic_step_hlo() -> str:
  """Compiled HLO of vmap(grad of a CriticEnsemble(hidden_dims=(8, 8), num_critics=3) loss) over
  a cell axis of size 1, as the runs' one-cell training programs batch it."""
  module = critics.CriticEnsemble(hidden_dims=(8, 8), num_critics=3)
  obs, act = _normal(6, 1, 8, 5), _normal(7, 1, 8, 3)
  params = jax.vmap(module.init)(jax.random.split(jax.random.PRNGKey(0), 1), obs, act)

  def loss(p, o, a):
    return jnp.mean((module.apply(p, o, a) - 1.0) ** 2)

  return xla_options.jit(jax.vmap(jax.grad(loss))).lower(params, obs, act).compile().as_text()


@CPU_ONLY
def test_vmapped_critic_gradient_runs_standard_dots(monkeypatch):
  """The property critics.matmul is for: every dot of the vmapped gradient in the standard form
  that Eigen runs fastest (the weight gradient as x^T g, the input gradient as g kernel^T, both
  transposes written out). With the plain matmul XLA:CPU (jaxlib 0.10.2) contracts the batch rows
  of both operands (weight gradients) or the last axes of both (input gradients): checked below,
  so the test notices an XLA that rewrites them itself. The one exception is the scalar head's
  weight gradient, a gemv on x in place ([.., member, 8, 1]: critics.GEMV_FEATURES)."""
  others = _other_dots(_critic_step_hlo())
  assert len(others) == 1 and others[0].endswith("3,8,1]"), others
  monkeypatch.setattr(critics, "GEMV_FEATURES", 0)    # before tracing: read when the bwd is traced
  assert _other_dots(_critic_step_hlo()) == []
  with rewrites.tracing(rewrites.choose(critic_matmul="jax")):   # JAX's own transpose rule
    assert len(_other_dots(_critic_step_hlo())) > 1


@pytest.fixture(scope="module")
def dyn_setup():
  config = config_lib.make_config("hopper-random", "mopo", preset="tiny")
  obs_dim, act_dim = 4, 2
  dyn = dynamics.init_state(jax.random.PRNGKey(0), obs_dim, act_dim, config)
  dyn = dyn.replace(input_mean=_normal(8, obs_dim + act_dim), input_std=1.0 + jnp.arange(6.0),
                    elites=jnp.asarray([2, 0], jnp.int32))
  return config, dyn, obs_dim, act_dim


@pytest.mark.parametrize("elites", [False, True])
def test_predict_in_pieces_equals_one_piece(dyn_setup, elites):
  """rows = 2 pieces + 5 (the last piece padded): the pieces' outputs have predict's shapes and
  the one-piece values. predict reads the rewrites in effect when traced: each is jitted anew."""
  config, dyn, obs_dim, act_dim = dyn_setup
  rows = 2 * 16 + 5
  obs, act = _normal(9, rows, obs_dim), _normal(10, rows, act_dim)
  members = dyn.elites if elites else None
  k = 2 if elites else config.dynamics.dyn_members

  def run(piece_rows):
    f = lambda o, a: dynamics.predict(dyn, o, a, config, members=members)  # noqa: E731
    with rewrites.tracing(rewrites.choose(predict_rows=piece_rows)):
      return jax.make_jaxpr(f)(obs, act), jax.jit(f)(obs, act)

  jaxpr, pieces = run(16)
  assert "scan" in str(jaxpr)                  # the pieces path ran
  for one_piece in (10 ** 9, "none"):
    jaxpr, whole = run(one_piece)
    assert "scan" not in str(jaxpr)
  shapes = [(k, rows, obs_dim), (k, rows, obs_dim), (k, rows), (k, rows)]
  assert [p.shape for p in pieces] == shapes and [w.shape for w in whole] == shapes
  for p, w in zip(pieces, whole):
    assert np.all(np.isfinite(p))
    np.testing.assert_allclose(p, w, rtol=1e-5, atol=1e-6)


def test_map_rows_pieces_equal_one_call():
  """pieces.map_rows: rows = 3 pieces + 1 (the last padded), one array or a tuple out, the row
  axis first or second; the one-call values, the one-call shapes."""
  from mombo_jax.core import pieces
  x, y = _normal(11, 13, 3), _normal(12, 13, 2)

  def fn(a, b):
    return jnp.tanh(a) * 2.0, jnp.stack([b, -b])             # [R, 3], [2, R, 2]

  whole = fn(x, y)
  for piece_rows in (4, 13, 100):
    got = pieces.map_rows(lambda a, b: fn(a, b)[0], piece_rows, x, y)
    np.testing.assert_allclose(got, whole[0], rtol=1e-6)
    assert got.shape == (13, 3)
    got = pieces.map_rows(lambda a, b: (fn(a, b)[1],), piece_rows, x, y, out_row_axis=1)
    assert got[0].shape == (2, 13, 2)
    np.testing.assert_allclose(got[0], whole[1], rtol=1e-6)


def test_policy_sample_in_pieces_equals_one_piece():
  """The rollout's actor in pieces: the same actions (the noise is drawn for all rows at once)."""
  from mombo_jax.core import sac
  config = config_lib.make_config("hopper-random", "mopo", preset="tiny")
  agent = sac.init_agent(jax.random.PRNGKey(0), 4, 2, config, 10)
  obs, key = _normal(13, 37, 4), jax.random.PRNGKey(5)
  whole = sac.policy_sample(agent, obs, key, config)
  got = jax.jit(lambda o: sac.policy_sample(agent, o, key, config, piece_rows=16))(obs)
  assert got.shape == (37, 2)
  np.testing.assert_allclose(got, whole, rtol=1e-5, atol=1e-6)
