"""core/xla_options (#29): the CPU dot choice read from MOMBO_JAX_CPU_DOTS (above the core, by
settings/environment.py), the compiler options it gives, and that a program built with
xla_options.jit compiles without YNNPACK dot fusions."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mombo_jax.core import xla_options
from mombo_jax.settings import environment

ENV = "MOMBO_JAX_CPU_DOTS"
YNN = "__ynn_fusion"      # the fusion kind XLA:CPU writes in the HLO text of a YNNPACK dot
CPU_ONLY = pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU options")


def test_cpu_dots_reads_the_environment(monkeypatch):
  monkeypatch.delenv(ENV, raising=False)
  assert environment.DOTS_ENV == ENV and environment.CPU_DOTS == xla_options.CPU_DOTS
  assert environment.cpu_dots() == "eigen"
  for value, want in (("eigen", "eigen"), (" XLA ", "xla"), ("Eigen\n", "eigen"), ("xla", "xla")):
    monkeypatch.setenv(ENV, value)
    assert environment.cpu_dots() == want
  for bad in ("ynn", "", "eigen,xla"):
    monkeypatch.setenv(ENV, bad)
    with pytest.raises(ValueError, match=f"{ENV}=.*'eigen'.*'xla'"):
      environment.cpu_dots()


@CPU_ONLY
def test_options_per_choice_and_backend(monkeypatch):
  assert xla_options.options() == {"xla_cpu_experimental_ynn_fusion_type": ""}
  assert xla_options.options("eigen") == {"xla_cpu_experimental_ynn_fusion_type": ""}
  assert xla_options.options("xla") is None
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")    # the option concerns XLA:CPU only
  assert xla_options.options("eigen") is None
  monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
  with pytest.raises(ValueError, match="cpu_dots='nonsense'"):
    xla_options.options("nonsense")


@CPU_ONLY
def test_an_option_this_jaxlib_refuses_is_dropped():
  assert xla_options._accepted((("xla_cpu_no_such_option_for_mombo_jax", "1"),)) is None


@CPU_ONLY
def test_jit_compiles_dots_without_ynnpack(monkeypatch):
  """A [64, 64] @ [64, 64] dot: plain jax.jit hands it to YNNPACK on this jaxlib (checked, so the
  test would notice an XLA that no longer does), xla_options.jit does not; cpu_dots='xla'
  (MOMBO_JAX_CPU_DOTS=xla, passed down) gives XLA's default again. Same values to float32
  rounding."""
  x = jnp.asarray(np.random.default_rng(0).normal(size=(64, 64)), jnp.float32)

  def f(a, b):
    return jnp.tanh(a @ b)

  def hlo(jitted):
    return jitted.lower(x, x).compile().as_text()

  ours = xla_options.jit(f)
  assert YNN not in hlo(ours)
  # Whether XLA picks YNNPACK for this dot may depend on the CPU: the contrast is checked where it
  # does (on the x86-64 machines this was written on, it does).
  if YNN in hlo(jax.jit(f)):
    assert YNN in hlo(xla_options.jit(f, "xla"))
  np.testing.assert_allclose(ours(x, x), jax.jit(f)(x, x), rtol=1e-5, atol=1e-6)


def test_a_bad_choice_is_refused_before_any_work(monkeypatch, tmp_path):
  """preflight.validate (every launch's first check) refuses a bad MOMBO_JAX_CPU_DOTS with a
  UserError (one `error:` line in the CLI) before it looks at anything else."""
  from mombo_jax.errors import UserError
  from mombo_jax.run import preflight
  monkeypatch.setenv(ENV, "fast")
  with pytest.raises(UserError, match=ENV):
    preflight.validate(None, None, str(tmp_path / "w"))
