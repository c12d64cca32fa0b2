"""The fidelity harness's dynamics side, our half (benchmarks/fidelity/dyn_ours.py, no torch): the
draws and orders it derives from our keys, and its step-by-step training and rollout replay, are
what the product's dynamics training and rollout.run do, so the comparison with the references
(benchmarks/fidelity/dynamics_side.py) cannot drift from the product silently."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks.fidelity import dyn_ours
from mombo_jax.core import buffer, dynamics, rollout, termination
from mombo_jax.dynamics import dynamics_training

TINY = dict(dyn_hidden=(16, 16), dyn_weight_decay=(2.5e-5, 5e-5, 1e-4), dyn_members=3,
            dyn_elites=2, dyn_batch_size=64)
EPOCHS, N, BRANCHES = 2, 300, 32


@pytest.fixture(scope="module")
def trained():
  cfg = dyn_ours.config("mopo", EPOCHS + 1, **TINY)
  data = dyn_ours.synthetic(N)
  inputs, targets = dyn_ours.arrays(data, "float32")
  key = jax.random.PRNGKey(3)
  trace = dyn_ours.train_epochs(cfg, key, inputs, targets, EPOCHS, "float32", further=1)
  return cfg, data, key, trace


def test_step_by_step_training_is_the_products(trained):
  # EPOCHS recorded minibatch by minibatch, then one more as the product runs it: the product's
  # EPOCHS + 1 epochs.
  cfg, data, key, trace = trained
  product = dynamics_training.train_ensemble(key, data, cfg, log_fn=lambda line: None)
  np.testing.assert_array_equal(trace.further.elites, product.elites)
  for ours, theirs in zip(jax.tree.leaves(trace.further.params), jax.tree.leaves(product.params)):
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
  assert len(trace.losses) == EPOCHS and np.all(trace.kept[0])      # epoch 1 beats 1e10
  last = trace.params[max(trace.params)]                            # after EPOCHS epochs
  np.testing.assert_array_equal(trace.final.params["max_logvar"], last["max_logvar"])


def test_orders_as_positions_and_their_reshuffle(trained):
  _, _, _, trace = trained
  n_train = trace.train_idx.shape[0]
  assert sorted(np.concatenate([trace.train_idx, trace.holdout_idx])) == list(range(N))
  pos = [dyn_ours.positions(trace.train_idx, order) for order in trace.orders]
  for order, p in zip(trace.orders, pos):
    np.testing.assert_array_equal(trace.train_idx[p], order)
    assert p.shape == (TINY["dyn_members"], n_train) and p.max() < n_train
  # An epoch's order is a reshuffle of the same bootstrap sample; reorder finds the shuffle.
  shuffle = dyn_ours.reorder(pos[0], pos[1])
  np.testing.assert_array_equal(np.take_along_axis(pos[0], shuffle, axis=1), pos[1])
  assert not np.array_equal(pos[0], pos[1])


def test_rollout_draws_and_replay_are_rollout_runs(trained):
  cfg, data, _, trace = trained
  dyn, key = trace.further, jax.random.PRNGKey(7)
  policy = dyn_ours.policy_fn(*dyn_ours.linear_policy())
  start = jnp.asarray(data.observations[:BRANCHES], jnp.float32)
  elite, noise = dyn_ours.rollout_draws(key, BRANCHES, cfg, dyn.elites, "float32")
  # Step 0 by hand: the same elite per row, the sample its noise gives.
  _, k_model = jax.random.split(jax.random.split(key, cfg.rollout.rollout_length)[0])
  out = dynamics.step(dyn, start, policy(start, None), k_model, cfg)
  np.testing.assert_array_equal(out.elite, elite[0])
  np.testing.assert_allclose(out.next_obs, out.next_obs_mean + np.sqrt(out.next_obs_var)
                             * noise[0, :, :-1], rtol=1e-6, atol=1e-6)
  rows, written = dyn_ours.rollout_replay(key, policy, dyn, start, cfg, cfg.beta)
  capacity = BRANCHES * cfg.rollout.rollout_length
  buf, _ = rollout.run(key, policy, dyn, start, buffer.init_ring(capacity, dyn_ours.S, dyn_ours.A),
                       cfg, termination.termination_fn(cfg.env_name),
                       rollout.CellRollout(beta=cfg.beta))
  count = int(buf.count)
  assert count == written.sum() and 0 < count < capacity      # some branches ended
  for ours, name in (("obs", "obs"), ("action", "action"), ("next_obs", "next_obs"),
                     ("reward", "reward"), ("done", "done"), ("obs_var", "obs_var")):
    np.testing.assert_allclose(np.asarray(getattr(buf.data, name))[:count], rows[ours][written],
                               rtol=1e-5, atol=1e-5, err_msg=name)
