"""mombo_jax.propagate refuses what it cannot answer: moments that are not a Gaussian's (checked at
the door, before fn is traced), an operation inside a library (the error names the user's line and
layer), and a random value multiplied by something derived from it (x * f(x)); and it computes a
value combined with itself exactly (x * x, x + x, x - x).

Monte Carlo checks of the exact rules: tests/test_propagate_mc.py."""
import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

from mombo_jax.errors import InvalidArgument
from mombo_jax.moment_matching import door, propagate as propagate_module
from mombo_jax.moment_matching.propagate import MomentsError, PropagateError, propagate

B, D = 3, 4
LINEAR = lambda x: x @ jnp.ones((D, 2))  # noqa: E731


def _pair(var=None):
  mean = jnp.asarray(np.random.default_rng(0).normal(size=(B, D)), jnp.float32)
  return mean, jnp.full((B, D), 0.5, jnp.float32) if var is None else var


def _counted(fn):
  """fn, and a list that grows each time it is traced: a refusal at the door leaves it empty."""
  calls = []
  return (lambda *a: calls.append(1) or fn(*a)), calls


@pytest.mark.parametrize("value, what", [(-1.0, "negative entries .the first -1.0"),
                                         (np.nan, "NaN or infinite entries .the first nan"),
                                         (np.inf, "NaN or infinite entries .the first inf")])
def test_bad_variances_are_refused_before_any_work(value, what):
  var = jnp.full((B, D), 0.5).at[1, 2].set(value)
  fn, calls = _counted(LINEAR)
  with pytest.raises(MomentsError, match=rf"argument 0's var has 1 {what}.*index \(1, 2\)"):
    propagate(fn)(_pair(var))
  assert not calls
  with pytest.raises(MomentsError, match="argument 0's mean .*NaN"):
    propagate(LINEAR)((jnp.full((B, D), np.nan), var * 0))
  # The example: a linear net used to return variance -4.
  with pytest.raises(PropagateError, match="negative"):
    propagate(LINEAR)((jnp.ones((B, D)), -jnp.ones((B, D))))


def test_shapes_that_do_not_fit_name_both_shapes_even_under_jit():
  mean, _ = _pair()
  for mode in ("diagonal", "full"):
    fn, calls = _counted(LINEAR)
    g = jax.jit(propagate(fn, covariance=mode))
    with pytest.raises(MomentsError, match=r"shape \(3, 5\).*mean of shape \(3, 4\)"):
      g((mean, jnp.ones((B, D + 1))))
    assert not calls
  # A covariance in the diagonal mode: told to pass covariance='full' or its diagonal.
  with pytest.raises(MomentsError, match=r"\(3, 4, 4\).*covariance='full'.*jnp.diagonal"):
    propagate(LINEAR)((mean, jnp.broadcast_to(jnp.eye(D), (B, D, D))))
  # A covariance shared by the rows, in the full mode: told how to broadcast it.
  with pytest.raises(MomentsError, match=r"expected \(3, 4\) .* or \(3, 4, 4\).*broadcast_to"):
    propagate(LINEAR, covariance="full")((mean, jnp.eye(D)))
  # A var tree that is not the mean's, and a leaf named by its path.
  with pytest.raises(MomentsError, match="tree structure"):
    propagate(lambda t: t["a"])(({"a": mean}, {"b": mean}))
  with pytest.raises(MomentsError, match=r"argument 1 \['b'\]'s var"):
    propagate(lambda p, t: t["a"] + t["b"], argnums=1)(
        None, ({"a": mean, "b": mean}, {"a": 0 * mean, "b": -1 - 0 * mean}))
  # Broadcastable variances are still accepted in the diagonal mode.
  chex.assert_shape(propagate(LINEAR)((mean, jnp.float32(0.5))), ((B, 2), (B, 2)))


def test_full_covariance_must_be_symmetric_psd_within_rounding():
  mean, _ = _pair()
  rng = np.random.default_rng(1)
  low_rank = rng.normal(size=(B, D, 2))
  # Rank 2 computed in float32: eigenvalues at rounding level on both sides of 0, accepted.
  ok = jnp.asarray(low_rank @ np.swapaxes(low_rank, 1, 2), jnp.float32)
  assert abs(np.linalg.eigvalsh(np.asarray(ok, np.float64)).min()) < 1e-5
  chex.assert_shape(propagate(LINEAR, covariance="full")((mean, ok)), ((B, 2), (B, 2, 2)))
  asym = ok.at[2, 0, 1].add(1.0)
  with pytest.raises(MomentsError, match=r"not symmetric: row 2 has C\[0, 1\]"):
    propagate(LINEAR, covariance="full")((mean, asym))
  indefinite = ok.at[1].add(-0.1 * jnp.trace(ok[1]) * jnp.eye(D))
  with pytest.raises(MomentsError, match="not positive semi-definite: row 1 .*eigenvalue -"):
    propagate(LINEAR, covariance="full")((mean, indefinite))
  with pytest.raises(MomentsError, match="negative"):   # a diagonal given in the full mode
    propagate(LINEAR, covariance="full")((mean, -jnp.ones((B, D))))


def test_values_are_checked_when_concrete_only():
  """Under jit (tracers) only shapes are checked; check_values=False skips the values too."""
  mean, _ = _pair()
  bad = -jnp.ones((B, D))
  _, var = jax.jit(propagate(LINEAR))((mean, bad))
  assert float(var.max()) < 0     # what the door cannot see under jit: docs say so
  _, var = propagate(LINEAR, check_values=False)((mean, bad))
  assert float(var.max()) < 0
  with pytest.raises(MomentsError):   # the same inputs, eager: refused
    propagate(LINEAR)((mean, bad))


def test_checkify_checks_values_under_jit():
  """check_values="checkify" stages the door's value checks under jit (on ffc5631 a negative
  variance or a non-PSD covariance passed jit silently with plausible output)."""
  mean, var = _pair()
  bad = var.at[1, 2].set(-1.0)
  g = checkify.checkify(jax.jit(propagate(LINEAR, check_values="checkify")))
  err, _ = g((mean, var))
  err.throw()                                                            # good moments pass
  err, _ = g((mean, bad))
  with pytest.raises(Exception, match="argument 0's var has negative entries"):
    err.throw()
  cov = jnp.broadcast_to(jnp.eye(D), (B, D, D)).at[0, 1, 1].set(-1.0)
  err, _ = checkify.checkify(jax.jit(propagate(LINEAR, covariance="full",
                                               check_values="checkify")))((mean, cov))
  with pytest.raises(Exception, match="not symmetric positive semi-definite"):
    err.throw()
  with pytest.raises(InvalidArgument, match="check_values='yes' is not one of"):
    propagate(LINEAR, check_values="yes")


def test_an_eager_call_seen_before_runs_compiled_with_the_same_answer():
  """Eager calls were interpreted op by op every time (~20x a jitted call at width 256,
  benchmarks/bench_propagate_eager.txt); the first still is, later ones with the same fn and
  shapes run one cached compiled program (what they cost: the benchmark)."""
  mean, var = _pair()
  w = jnp.asarray(np.random.default_rng(4).normal(size=(D, 3)), jnp.float32)
  fn = lambda x: jax.nn.relu(x @ w) * 2.0  # noqa: E731
  answers = [propagate(fn)((mean, var)) for _ in range(3)]
  key = propagate_module._key((fn, "diagonal", None, jax.tree.structure([mean]), (True,),
                               ("argument 0",)), [mean], [var])
  assert callable(propagate_module._COMPILED[key])                     # compiled and cached
  for m, v in answers[1:]:
    np.testing.assert_allclose(m, answers[0][0], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(v, answers[0][1], rtol=1e-6, atol=1e-7)
  for _ in range(3):                             # a refused fn stays refused, with its message
    with pytest.raises(PropagateError, match="`tanh`"):
      propagate(jnp.tanh)((mean, var))


def test_a_wide_covariance_is_checked_on_its_device_first():
  """From d = 64 the PSD check runs in the covariance's dtype on its device; the float64 host
  check only confirms a failure and names the row, so the answers are the host check's."""
  d = door._DEVICE_CHECK_D
  factor = np.random.default_rng(2).normal(size=(2, d, 3))
  ok = jnp.asarray(factor @ np.swapaxes(factor, 1, 2), jnp.float32)  # rank 3: singular, PSD
  door.check_input("x", jnp.zeros((2, d)), ok, True)
  bad = ok.at[1].add(-0.1 * jnp.trace(ok[1]) / d * jnp.eye(d))
  with pytest.raises(MomentsError, match="not positive semi-definite: row 1 "):
    door.check_input("x", jnp.zeros((2, d)), bad, True)
  with pytest.raises(MomentsError, match="NaN or infinite"):
    door.check_input("x", jnp.zeros((2, d)), ok.at[0, 3, 3].set(np.nan), True)


class Net(nn.Module):
  """A network with one unsupported layer, written as users write them."""
  layer: str

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(D)(x)
    if self.layer == "LayerNorm":
      x = nn.LayerNorm()(x)   # line: LayerNorm
    elif self.layer == "gelu":
      x = nn.gelu(x)   # line: gelu
    elif self.layer == "sigmoid":
      x = jax.nn.sigmoid(x)   # line: sigmoid
    return nn.Dense(2)(x)


def _line_of(marker):
  with open(__file__) as f:
    return next(i for i, text in enumerate(f, 1) if text.rstrip().endswith(f"# line: {marker}"))


@pytest.mark.parametrize("covariance", ["diagonal", "full"])
@pytest.mark.parametrize("layer, primitive", [("LayerNorm", "rsqrt"), ("gelu", None),
                                              ("sigmoid", "logistic")])
def test_refusal_names_the_users_line_the_layer_then_the_primitive(layer, primitive, covariance):
  mean, var = _pair()
  params = Net(layer).init(jax.random.PRNGKey(0), mean)
  with pytest.raises(PropagateError) as err:
    propagate(Net(layer).apply, argnums=1, covariance=covariance)(params, (mean, var))
  lines = str(err.value).splitlines()
  first = lines[0]
  where = f"test_propagate_door.py:{_line_of(layer)} (Net.__call__)"
  assert where in first and layer in first.split(where)[0], first   # the layer, then where
  assert first.index(where) < first.index("JAX's `"), first           # then JAX's primitive
  if primitive:
    assert f"`{primitive}`" in first, first
  assert "flax/linen" not in first and len(first) < 300, first
  assert lines[1].strip().endswith(f"# line: {layer}")                 # the user's source line
  assert lines[2].startswith("What to do:") and lines[-1].startswith("Supported:"), lines
  assert "leaky relu" in err.value.supported


def test_ensemble_in_full_mode_names_the_users_line():
  class Ensemble(nn.Module):
    @nn.compact
    def __call__(self, x):
      dense = nn.vmap(nn.Dense, variable_axes={"params": 0}, split_rngs={"params": True},
                      in_axes=None, out_axes=0, axis_size=2)
      return dense(3)(x)   # line: ensemble

  mean, var = _pair()
  params = Ensemble().init(jax.random.PRNGKey(0), mean)
  chex.assert_shape(propagate(Ensemble().apply, argnums=1)(params, (mean, var)),
                    ((2, B, 3), (2, B, 3)))
  with pytest.raises(PropagateError, match=rf"test_propagate_door.py:{_line_of('ensemble')} "
                     r"(.|\n)*jax\.vmap\(propagate\("):          # and the way that works
    propagate(Ensemble().apply, argnums=1, covariance="full")(params, (mean, var))
  # That way: one member's network, jax.vmap over the stacked parameters.
  member = lambda p, x: nn.Dense(3).apply(p, x)  # noqa: E731
  got = jax.vmap(propagate(member, argnums=1, covariance="full"), in_axes=(0, None))(
      {"params": params["params"]["VmapDense_0"]}, (mean, var))
  chex.assert_shape(got, ((2, B, 3), (2, B, 3, 3)))
  np.testing.assert_allclose(got[0], propagate(Ensemble().apply, argnums=1)(params, (mean, var))[0],
                             rtol=1e-5, atol=1e-6)


class Dropped(nn.Module):
  deterministic: bool

  @nn.compact
  def __call__(self, x):
    return nn.Dense(2)(nn.Dropout(0.5, deterministic=self.deterministic)(x))   # line: dropout


@pytest.mark.parametrize("covariance", ["diagonal", "full"])
def test_dropout_in_training_mode_is_refused_alike_in_both_modes(covariance):
  """A drawn dropout mask would stand for every sample of the Gaussian (the diagonal mode used to
  keep one fixed mask silently, the full mode to refuse it as an index): both refuse it, naming
  deterministic=True; in evaluation mode dropout is the identity and propagates."""
  mean, var = _pair()
  params = Dropped(True).init(jax.random.PRNGKey(0), mean)
  fn = lambda p, x: Dropped(False).apply(p, x, rngs={"dropout": jax.random.PRNGKey(1)})  # noqa
  with pytest.raises(PropagateError, match=rf"`nn.Dropout` .*test_propagate_door.py:"
                     rf"{_line_of('dropout')} (.|\n)*random draw(.|\n)*deterministic=True"):
    propagate(fn, argnums=1, covariance=covariance)(params, (mean, var))
  m, _ = propagate(Dropped(True).apply, argnums=1, covariance=covariance)(params, (mean, var))
  np.testing.assert_allclose(m, Dropped(True).apply(params, mean), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("covariance", ["diagonal", "full"])
def test_a_value_times_something_derived_from_it_is_refused(covariance):
  mean, var = _pair()
  w1, w2 = (jnp.asarray(np.random.default_rng(s).normal(size=(D, D)), jnp.float32)
            for s in (2, 3))
  for fn, op in [(lambda x: x * jax.nn.relu(x), "`*`"),               # x * f(x)
                 (lambda x: (x @ w1) * (x @ w2), "`*`"),              # a gated (GLU) unit
                 (lambda x: x * (2.0 * x + 1.0), "`*`")]:             # an affine map of x
    with pytest.raises(PropagateError, match=rf"{op} .* both depend on argument 0"):
      propagate(fn, covariance=covariance)((mean, var))
  for fn in (lambda x: 1.0 / x, lambda x: x ** -1, lambda x: x ** 2.5):
    with pytest.raises(PropagateError, match="`/`|`\\*\\*`"):
      propagate(fn, covariance=covariance)((mean, var))
  # Values of independent inputs multiply exactly; so do two leaves of one random pytree.
  prod = lambda t: t["a"] * t["b"]  # noqa: E731
  m, v = propagate(prod)(({"a": mean, "b": mean + 1}, {"a": var, "b": 2 * var}))
  np.testing.assert_allclose(v, var * 2 * var + var * (mean + 1) ** 2 + 2 * var * mean**2,
                             rtol=1e-6)


@pytest.mark.parametrize("covariance", ["diagonal", "full"])
def test_a_value_with_itself_is_exact(covariance):
  m = jnp.asarray([0.5, -1.0, 2.0], jnp.float32)
  v = jnp.asarray([0.1, 2.0, 0.01], jnp.float32)
  diag = (lambda c: c) if covariance == "diagonal" else \
      (lambda c: jnp.diagonal(c, axis1=-2, axis2=-1))
  for fn in (lambda z: z * z, lambda z: z ** 2, lambda z: z ** 2.0, jnp.square,
             lambda z: jax.jit(lambda a, b: a * b)(z, z)):
    mean, out = propagate(fn, covariance=covariance)((m, v))
    # The numbers: m^2 + v and 4 m^2 v + 2 v^2, not the independence answer.
    np.testing.assert_allclose(mean, [0.35, 3.0, 4.01], rtol=1e-6)
    np.testing.assert_allclose(diag(out), [0.12, 16.0, 0.1602], rtol=1e-6)
  twice = propagate(lambda z: z + z, covariance=covariance)((m, v))
  np.testing.assert_allclose(diag(twice[1]), 4 * v, rtol=1e-6)
  zero = propagate(lambda z: z - z, covariance=covariance)((m, v))
  np.testing.assert_array_equal(zero[1], np.zeros_like(zero[1]))
  # Zero variance: the plain function bit for bit.
  for fn in (lambda z: z * z, lambda z: z ** 3 if covariance == "diagonal" else z ** 2, jnp.exp):
    mean, out = jax.jit(propagate(fn, covariance=covariance))((m, 0 * v))
    np.testing.assert_array_equal(mean, jax.jit(fn)(m))
    np.testing.assert_array_equal(out, np.zeros_like(out))
