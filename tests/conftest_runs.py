"""A tiny run folder shared by the analysis tests (experiments.mm_vs_mc, experiments.uncertainty).

Import the fixture into a test module (`from tests.conftest_runs import tiny_run  # noqa: F401`).

The folder is what experiments.run leaves on disk (config.json through workdir.Workdir, with the
identity of its data, a
checkpoint of the whole CellState saved through its RunCheckpointer as launch.train_runs saves it),
but its state is the freshly initialised one (train_lib.init_cells with untrained dynamics), not a
trained one: a real tiny `launch.train_runs` costs ~85 s of compilation on the 2-core test machine,
and the analyses only need networks of the run's shapes, read back through the run's own loaders.
The dataset is the 2,000-step hopper-random build tests/test_run.py uses, in the session's
MINARI_DATASETS_PATH.
"""
import pytest

DATASET = "hopper-random"
TINY = dict(epochs=2, steps_per_epoch=5, rollout_batch_size=32, eval_every=1, eval_episodes=1,
            num_seeds=2)


@pytest.fixture(scope="session")
def tiny_run(hopper_random_2000, tmp_path_factory):
  """(workdir, CellState [2 seeds]) of a 2-seed MOMBO run folder on hopper-random."""
  import jax

  from mombo_jax.core import buffer, dynamics, train as train_lib
  from mombo_jax.data import provenance, transitions as transitions_lib
  from mombo_jax.records.workdir import Workdir
  from mombo_jax.run import run_state
  from mombo_jax.settings import config as config_lib
  workdir = str(tmp_path_factory.mktemp("tiny_mombo_run"))
  wd = Workdir(workdir)
  config = config_lib.make_config(DATASET, "mombo", preset="tiny", **TINY)
  transitions = transitions_lib.load_transitions(DATASET)
  # config.json records the identity of the data, as experiments.run writes it (Launch.prepare).
  record = wd.check_data(wd.check_config(config, DATASET)[0],
                         provenance.dataset_identity(DATASET, transitions))[0]
  wd.write_config(record)
  real = buffer.from_transitions(transitions)
  keys = jax.random.split(jax.random.PRNGKey(0), config.num_seeds)
  obs_dim, action_dim = real.obs.shape[1], real.action.shape[1]
  # One compilation each instead of an eager init op by op (seconds on a busy 2-core machine).
  dyn = jax.jit(jax.vmap(lambda k: dynamics.init_state(k, obs_dim, action_dim, config)))(keys)
  state = jax.jit(train_lib.init_cells, static_argnums=1)(keys, config, real, dyn)
  ckpt = run_state.checkpointer(wd)
  ckpt.save(config.epochs, state, {"epoch": config.epochs, "diverged": []})
  ckpt.close()
  return workdir, state
