"""The layout every GPU user runs, end to end on the CPU: cells vmapped (MOMBO_JAX_CELLS=vmap, the
default on a GPU; the CPU loops them, core/cell_layout.py). A grid of 2 betas x 2 seeds (4 cells in
one program, its dynamics trained over seeds vmapped too) through launch.train_runs, stopped after
one of two epochs and resumed, ends bit for bit where the same grid run without a stop ends.
Part b of the device record (benchmarks/device/gpu_tests.py) runs this file on the GPU."""
import jax
import numpy as np
import pytest

from mombo_jax.core import cell_layout
from mombo_jax.records.workdir import Workdir
from mombo_jax.run import run_specs, run_state
from mombo_jax.settings import environment
from tests.launches import train_grid

# One hidden layer of 8 a network: the programs compile faster; the claims (the vmapped layout
# stopped and resumed is the uninterrupted one, bit for bit) do not depend on depth or width.
TINY = dict(epochs=2, steps_per_epoch=5, rollout_batch_size=32, eval_every=1, eval_episodes=1,
            num_seeds=2, actor_hidden=(8,), critic_hidden=(8,), dyn_hidden=(8,),
            dyn_weight_decay=(2.5e-5, 1e-4))
BETAS = [0.5, 3.0]


def _grid(root, dataset):
  return run_specs.plan_runs("hopper-random", "mombo", "tiny", dict(TINY), [dataset], BETAS,
                                root=str(root))


def _state(workdir):
  state, _ = run_state.restore(Workdir(workdir))
  return state


@pytest.mark.slow
def test_a_vmapped_grid_stopped_and_resumed_ends_where_the_uninterrupted_one_ends(
    hopper_random_2000, tmp_path, monkeypatch):
  monkeypatch.setenv(environment.CELLS_ENV, "vmap")
  seen = []
  over_cells = cell_layout.over_cells
  monkeypatch.setattr(cell_layout, "over_cells",
                      lambda epoch, how: seen.append(how) or over_cells(epoch, how))
  straight = _grid(tmp_path / "straight", hopper_random_2000)
  summaries = train_grid(straight)
  assert seen and set(seen) == {"vmap"}            # the epoch program was built vmapped
  assert all(s is not None and s["seeds"] == [0, 1] and not s["diverged"] for s in summaries)

  stopped = _grid(tmp_path / "stopped", hopper_random_2000)
  assert train_grid(stopped, stop_after=1) == [None] * len(BETAS)
  assert [Workdir(g.workdir).checkpointer_steps() for g in stopped] == [["1"]] * len(BETAS)
  resumed = train_grid(stopped)
  for a, b, s, r in zip(straight, stopped, summaries, resumed):
    # Bit for bit: the same program (4 cells, vmapped), keys fold_in(seed, epoch), data and beta.
    jax.tree.map(np.testing.assert_array_equal, _state(a.workdir), _state(b.workdir))
    assert r["final_normalized_score"] == s["final_normalized_score"]
    assert r["aulc"] == s["aulc"]
    with open(f"{a.workdir}/metrics.csv") as f, open(f"{b.workdir}/metrics.csv") as g:
      assert f.read() == g.read()
  # The betas are cells of one program, each trained with its own beta.
  critics = [jax.tree.leaves(_state(g.workdir).agent.critic.params) for g in straight]
  assert not all(np.array_equal(x, y) for x, y in zip(*critics))
