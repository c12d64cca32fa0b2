"""core/cell_layout: the layout passed down from MOMBO_JAX_CELLS (settings/environment.py reads it;
loop on CPU by default), refused with a clear error before any work when it names no layout. (That a
looped cell trains as its own one-cell program: tests/test_train.py.)"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mombo_jax.core import cell_layout
from mombo_jax.errors import InvalidArgument, UserError
from mombo_jax.run import preflight
from mombo_jax.settings import environment

ENV = "MOMBO_JAX_CELLS"


def test_the_layout_is_loop_on_cpu_unless_the_environment_says(monkeypatch):
  assert environment.CELLS_ENV == ENV and environment.LAYOUTS == cell_layout.LAYOUTS
  monkeypatch.delenv(ENV, raising=False)
  assert environment.cells() is None
  assert cell_layout.layout(environment.cells()) == (
      "loop" if jax.default_backend() == "cpu" else "vmap")
  for how in cell_layout.LAYOUTS:
    monkeypatch.setenv(ENV, f" {how.upper()} ")
    assert cell_layout.layout(environment.cells()) == how
  monkeypatch.setenv(ENV, "scan")
  with pytest.raises(InvalidArgument, match=f"{ENV}='scan'.*'vmap'.*'loop'"):
    environment.cells()
  with pytest.raises(ValueError, match="'scan'"):
    cell_layout.layout("scan")


def test_the_core_reads_no_environment_variable():
  """The core takes MOMBO_JAX_CELLS / MOMBO_JAX_CPU_DOTS as arguments: no module of core/ reads
  os.environ (settings/environment.py does, above it)."""
  import os
  core = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "mombo_jax",
                      "core")
  readers = [f for f in sorted(os.listdir(core)) if f.endswith(".py")
             and any(s in open(os.path.join(core, f)).read() for s in ("os.environ", "getenv"))]
  assert readers == []


def test_a_bad_layout_is_refused_before_any_work(monkeypatch, tmp_path):
  monkeypatch.setenv(ENV, "parallel")
  with pytest.raises(UserError, match=ENV):
    preflight.validate(None, None, str(tmp_path / "w"))
  assert not (tmp_path / "w").exists()


def test_both_layouts_map_an_epoch_over_cells_alike():
  """A toy epoch: state [C] and metrics [C, ...] come back in cell order in both layouts, and a
  cell's result is its own (key and Cell of that cell); an unknown layout is a ValueError."""
  def epoch(state, real, key, cell):
    new = state * real + jax.random.uniform(key) + cell
    return new, {"twice": jnp.stack([new, 2 * new])}

  state, keys, cells = jnp.arange(3.0), jax.random.split(jax.random.PRNGKey(0), 3), jnp.arange(3)
  out = {how: jax.jit(cell_layout.over_cells(epoch, how))(state, 2.0, keys, cells)
         for how in cell_layout.LAYOUTS}
  want = np.array([epoch(state[c], 2.0, keys[c], cells[c])[0] for c in range(3)])
  for new, metrics in out.values():
    np.testing.assert_allclose(new, want, rtol=1e-6)
    assert metrics["twice"].shape == (3, 2)
    np.testing.assert_allclose(metrics["twice"][:, 1], 2 * want, rtol=1e-6)
  with pytest.raises(ValueError, match="scan"):
    cell_layout.over_cells(epoch, "scan")


def test_map_cells_maps_any_mix_of_mapped_and_shared_arguments():
  """map_cells (the dynamics training's pieces): arguments mapped (0) or shared (None), pytree
  outputs of several shapes, each row the cell's own; looped equals vmapped here (elementwise);
  an axis other than 0 / None is refused."""
  def fn(a, shared, b):
    return {"sum": a + shared, "outer": jnp.outer(b, shared)}, jnp.sum(b)

  a, shared, b = (jnp.arange(6.0).reshape(3, 2), jnp.array([10.0, 20.0]),
                  jnp.arange(9.0).reshape(3, 3))
  out = {how: jax.jit(cell_layout.map_cells(fn, (0, None, 0), how))(a, shared, b)
         for how in cell_layout.LAYOUTS}
  for c in range(3):
    want = fn(a[c], shared, b[c])
    for got in out.values():
      jax.tree.map(lambda g, w: np.testing.assert_array_equal(g[c], w), got, want)
  assert out["loop"][0]["outer"].shape == (3, 3, 2)
  with pytest.raises(ValueError, match="in_axes"):
    cell_layout.map_cells(fn, (1, None, 0), "loop")
