"""core/rewrites (issue 43): #29's CPU rewrites chosen per backend, as the cells' layout is. The
choices passed down from MOMBO_JAX_PREDICT_ROWS / MOMBO_JAX_CRITIC_MATMUL (settings/environment.py
reads them; a bad value is refused before any work), the backend's defaults (1000 rows and the
written-out gradients on CPU, one piece and JAX's transpose rule elsewhere), the CPU's default
program the one it was (the same compiled program as the explicit CPU choices), and an epoch
without the rewrites close to one with them. (Each rewrite alone against the plain program:
tests/test_fast_paths.py; the core reads no environment variable: tests/test_cell_layout.py.)"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mombo_jax.core import buffer, cells_program, dynamics, rewrites, train as train_lib
from mombo_jax.errors import InvalidArgument, UserError
from mombo_jax.run import preflight
from mombo_jax.settings import config as config_lib, environment

ROWS_ENV, MATMUL_ENV = "MOMBO_JAX_PREDICT_ROWS", "MOMBO_JAX_CRITIC_MATMUL"


def test_the_environment_passes_the_choices_down(monkeypatch):
  assert (environment.PREDICT_ROWS_ENV, environment.CRITIC_MATMUL_ENV) == (ROWS_ENV, MATMUL_ENV)
  assert environment.CRITIC_MATMULS == rewrites.CRITIC_MATMULS
  monkeypatch.delenv(ROWS_ENV, raising=False)
  monkeypatch.delenv(MATMUL_ENV, raising=False)
  assert (environment.predict_rows(), environment.critic_matmul()) == (None, None)
  for value, want in ((" None ", None), ("250", 250)):
    monkeypatch.setenv(ROWS_ENV, value)
    assert rewrites.choose(environment.predict_rows()).predict_rows == want
  for how in rewrites.CRITIC_MATMULS:
    monkeypatch.setenv(MATMUL_ENV, how.upper())
    assert rewrites.choose(critic_matmul=environment.critic_matmul()).critic_matmul == how
  for value in ("0", "-5", "1e3", "all"):
    monkeypatch.setenv(ROWS_ENV, value)
    with pytest.raises(InvalidArgument, match=f"{ROWS_ENV}=.*positive.*'none'"):
      environment.predict_rows()
  monkeypatch.setenv(MATMUL_ENV, "cublas")
  with pytest.raises(InvalidArgument, match=f"{MATMUL_ENV}='cublas'.*'rewrite'.*'jax'"):
    environment.critic_matmul()
  with pytest.raises(ValueError, match="predict_rows=0"):
    rewrites.Rewrites(0, "rewrite")
  with pytest.raises(ValueError, match="critic_matmul='cublas'"):
    rewrites.choose(critic_matmul="cublas")


def test_a_launch_compiles_with_the_environments_choices(monkeypatch):
  """program.compile_choices: what compile_chunk (every launch) passes make_cells_chunk."""
  from mombo_jax.run import program
  monkeypatch.setenv(ROWS_ENV, "250")
  monkeypatch.setenv(MATMUL_ENV, "jax")
  monkeypatch.setenv("MOMBO_JAX_CELLS", "vmap")
  got = program.compile_choices()
  assert got["choices"] == rewrites.Rewrites(250, "jax") and got["layout"] == "vmap"
  for env in (ROWS_ENV, MATMUL_ENV, "MOMBO_JAX_CELLS"):
    monkeypatch.delenv(env)
  assert program.compile_choices()["choices"] == rewrites.choose()


@pytest.mark.parametrize("env", [ROWS_ENV, MATMUL_ENV])
def test_a_bad_choice_is_refused_before_any_work(monkeypatch, tmp_path, env):
  monkeypatch.setenv(env, "sometimes")
  with pytest.raises(UserError, match=env):
    preflight.validate(None, None, str(tmp_path / "w"))
  assert not (tmp_path / "w").exists()


def test_the_backend_chooses_the_defaults(monkeypatch):
  """CPU: the measured rewrites (1000 rows, gradients written out); any other backend: one piece
  and JAX's own transpose rule. What a traced program reads (in_effect) is its own choice inside
  `tracing`, the backend's default outside; explicit choices win on every backend."""
  cpu = rewrites.Rewrites(rewrites.PREDICT_ROWS, "rewrite")
  monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
  assert rewrites.choose() == cpu == rewrites.in_effect()
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  plain = rewrites.choose()
  assert plain == rewrites.Rewrites(None, "jax") == rewrites.in_effect()
  assert rewrites.choose(1000, "rewrite") == cpu and rewrites.choose("none").predict_rows is None
  with rewrites.tracing(cpu):
    assert rewrites.in_effect() == cpu
    with rewrites.tracing(None):            # None: the backend's defaults
      assert rewrites.in_effect() == plain
    assert rewrites.in_effect() == cpu
  assert rewrites.in_effect() == plain


S_DIM, A_DIM, N, SEEDS = 11, 3, 128, 2


@pytest.fixture(scope="module")
def tiny():
  """A MOPO program of 2 cells with a rollout of 40 rows (3 pieces of 16 under Rewrites(16, ..)),
  its fresh state and arguments."""
  cfg = config_lib.make_config("hopper-random", "mopo", preset="tiny", steps_per_epoch=3,
                               rollout_batch_size=40, rollout_length=2, batch_size=16,
                               actor_hidden=(8,), critic_hidden=(8,), dyn_hidden=(8,),
                               dyn_weight_decay=(2.5e-5, 1e-4))
  rng = np.random.default_rng(0)
  f = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)  # noqa: E731
  obs = f(N, S_DIM).at[:, 0].set(1.25).at[:, 1].set(0.0)   # healthy hopper heights / angles
  zeros = jnp.zeros((N, S_DIM), jnp.float32)
  real = buffer.Batch(obs=obs, action=jnp.tanh(f(N, A_DIM)), reward=f(N), next_obs=obs,
                      done=jnp.zeros(N, jnp.float32), obs_var=zeros, next_obs_mean=obs,
                      next_obs_var=zeros, reward_mean=jnp.zeros(N), reward_var=jnp.zeros(N))
  keys = jax.random.split(jax.random.PRNGKey(0), SEEDS)
  dyn = jax.vmap(lambda k: dynamics.init_state(k, S_DIM, A_DIM, cfg))(keys)
  state = jax.device_get(train_lib.init_cells(keys, cfg, real, dyn))
  stacked, cells = train_lib.single_dataset(real, cfg, SEEDS)
  return cfg, state, (stacked, jax.random.split(jax.random.PRNGKey(3), SEEDS), cells)


def _epoch(tiny, choices):
  cfg, state, args = tiny
  fn = cells_program.make_cells_epoch(cfg, SEEDS, choices=choices)
  return fn, jax.device_get(fn(jax.tree.map(jnp.asarray, state), *args))


def test_the_cpu_keeps_its_program_and_the_plain_one_is_close(tiny):
  """On CPU, no choice passed is the explicit CPU choice: one compiled program (bit for bit the
  program #29 measured). The plain program (one piece, JAX's transpose rule: the default off the
  CPU) trains the same epoch to float32 rounding: same rollout rows written, metrics and agent to
  1e-4 relative (the two programs sum in other orders)."""
  if jax.default_backend() == "cpu":
    assert cells_program.make_cells_epoch(tiny[0], SEEDS) is cells_program.make_cells_epoch(
        tiny[0], SEEDS, choices=rewrites.Rewrites(1000, "rewrite"))
  _, (pieces_state, pieces_metrics) = _epoch(tiny, rewrites.Rewrites(16, "rewrite"))
  _, (plain_state, plain_metrics) = _epoch(tiny, rewrites.Rewrites(None, "jax"))
  np.testing.assert_array_equal(pieces_metrics["rollout/num_added"],
                                plain_metrics["rollout/num_added"])
  assert np.all(pieces_metrics["rollout/num_added"] > 0)
  for name in ("critic_loss", "actor_loss", "rollout/reward", "rollout/penalty"):
    np.testing.assert_allclose(pieces_metrics[name], plain_metrics[name], rtol=1e-4, atol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
               pieces_state.agent.critic.params, plain_state.agent.critic.params)
