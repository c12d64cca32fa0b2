"""Model rollouts: branches stop at terminals, rows chain (obs = previous next_obs, obs_var =
previous next_obs_var), variances come from the producing elite, MOPO penalty, seed vmapping."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mombo_jax.core import buffer, dynamics, rollout
from mombo_jax.settings import config as config_lib

S, A, N, K = 3, 2, 64, 4
TERM_THRESHOLD = 0.3     # the test's termination: action[0] > 0.3 (about 35 % per step)


def _config(**kw):
  return config_lib.make_config(
      "hopper-medium", dyn_hidden=(16, 16), dyn_weight_decay=(2.5e-5, 5e-5, 1e-4), dyn_members=3,
      dyn_elites=2, rollout_length=K, **kw)


def _policy(obs, key):
  return jax.random.uniform(key, (obs.shape[0], A), minval=-1.0, maxval=1.0)


def _term(obs, action, next_obs):
  return action[:, 0] > TERM_THRESHOLD


@pytest.fixture(scope="module")
def setup():
  cfg = _config()
  dyn = jax.jit(lambda k: dynamics.init_state(k, S, A, cfg))(jax.random.PRNGKey(0))
  # Non-trivial normaliser and elites (member 1 is not an elite: it must never be used).
  dyn = dyn.replace(input_mean=jnp.full((S + A,), 0.1), input_std=jnp.full((S + A,), 2.0),
                    elites=jnp.asarray([2, 0], jnp.int32))
  start = jax.random.normal(jax.random.PRNGKey(1), (N, S))
  return cfg, dyn, start


_JITTED = {}
_predict = jax.jit(dynamics.predict, static_argnums=3)


def _run(cfg, dyn, start, key, capacity=N * K):
  """rollout.run into a fresh ring, jitted once per config (tests share the compilations)."""
  if cfg not in _JITTED:
    _JITTED[cfg] = jax.jit(lambda k, d, s, b: rollout.run(k, _policy, d, s, b, cfg, _term))
  return _JITTED[cfg](key, dyn, start, buffer.init_ring(capacity, S, A))


def _elite_match(dyn, cfg, buf, beta=0.0):
  """For each filled row, the member whose Gaussian it carries (asserts there is exactly one)."""
  s_mean, s_var, r_mean, r_var = _predict(dyn, buf.data.obs, buf.data.action, cfg)
  rows = jax.tree.map(lambda x: np.asarray(x)[:int(buf.count)], buf.data)
  s_mean, s_var, r_mean, r_var = (np.asarray(x)[:, :int(buf.count)]
                                  for x in (s_mean, s_var, r_mean, r_var))
  std_all = jnp.sqrt(jnp.concatenate([s_var, r_var[..., None]], -1))
  penalty = np.asarray(jnp.max(jnp.linalg.norm(std_all, axis=-1), axis=0))
  match = []
  for m in range(cfg.dynamics.dyn_members):
    ok = (np.all(np.isclose(rows.next_obs_mean, s_mean[m], rtol=1e-5, atol=1e-6), -1)
          & np.all(np.isclose(rows.next_obs_var, s_var[m], rtol=1e-5, atol=1e-7), -1)
          & np.isclose(rows.reward_var, r_var[m], rtol=1e-5, atol=1e-7)
          & np.isclose(rows.reward_mean, r_mean[m] - beta * penalty, rtol=1e-5, atol=1e-5))
    match.append(ok)
  match = np.stack(match)
  assert np.all(match.sum(0) == 1), "every row must carry exactly one member's Gaussian"
  return match.argmax(0)


def test_rollout_chains_stops_at_terminals_and_stores_variances(setup):
  cfg, dyn, start = setup
  buf, metrics = _run(cfg, dyn, start, jax.random.PRNGKey(2))
  data = jax.tree.map(np.asarray, buf.data)
  count = int(buf.count)
  # Reconstruct the branches: rows are step-major, alive branches in order within a step.
  alive = np.ones(N, bool)
  prev_next = np.asarray(start)
  prev_var = np.zeros((N, S), np.float32)
  pos = 0
  for t in range(K):
    ids = np.flatnonzero(alive)
    rows = slice(pos, pos + len(ids))
    np.testing.assert_allclose(data.obs[rows], prev_next[ids], rtol=1e-6)
    np.testing.assert_allclose(data.obs_var[rows], prev_var[ids], rtol=1e-6)
    if t == 0:
      assert np.all(data.obs_var[rows] == 0)
    done = data.action[rows, 0] > TERM_THRESHOLD
    np.testing.assert_array_equal(data.done[rows], done.astype(np.float32))
    prev_next = np.zeros((N, S), np.float32)
    prev_var = np.zeros((N, S), np.float32)
    prev_next[ids], prev_var[ids] = data.next_obs[rows], data.next_obs_var[rows]
    alive[ids[done]] = False
    pos += len(ids)
  assert pos == count, "no rows after a branch's terminal, none missing"
  assert 0 < alive.sum() < N and count < N * K        # both outcomes occurred
  np.testing.assert_allclose(metrics["length"], count / N, rtol=1e-6)
  np.testing.assert_allclose(metrics["terminated_frac"], 1 - alive.mean(), rtol=1e-6)
  np.testing.assert_allclose(metrics["num_added"], count)
  np.testing.assert_allclose(metrics["reward"], np.mean(data.reward[:count]), rtol=1e-5)
  assert np.all(data.next_obs_var[:count] > 0) and np.all(data.reward_var[:count] > 0)
  elite = _elite_match(dyn, cfg, buf)
  assert set(np.unique(elite)) == {0, 2}
  # Samples differ from the means (noise was drawn) but stay within a few stds of them.
  z = (data.next_obs[:count] - data.next_obs_mean[:count]) / np.sqrt(data.next_obs_var[:count])
  assert 0.7 < np.std(z) < 1.3


def test_mopo_penalises_reward(setup):
  plain_cfg, dyn, start = setup
  cfg = _config(algo="mopo", beta=2.0)
  buf, metrics = _run(cfg, dyn, start, jax.random.PRNGKey(2))
  count = int(buf.count)
  rows = jax.tree.map(lambda x: x[:count], buf.data)
  _elite_match(dyn, plain_cfg, buf, beta=2.0)   # predict reads only the dyn_* fields
  assert metrics["penalty"] > 0
  # Same key as the MOMBO run: identical samples, so the rewards differ by exactly the penalty.
  plain, _ = _run(plain_cfg, dyn, start, jax.random.PRNGKey(2))
  np.testing.assert_allclose(np.mean(plain.data.reward[:count]) - np.mean(rows.reward),
                             2.0 * metrics["penalty"], rtol=1e-4)


def _half(agent, batch, key, *, dyn, config, term_fn=None):
  """A registered record's own penalty: 0.5 + |action[0]| per row [B] (not MOPO's)."""
  del agent, key, dyn, config, term_fn
  return 0.5 + jnp.abs(batch.action[:, 0])


def test_a_registered_reward_penalty_is_the_records_own(setup):
  """A record with penalise_reward subtracts beta x ITS penalty in the rollouts, row by row (not
  MOPO's); the metric (`penalty`) reports its mean."""
  from mombo_jax.core import algorithms, targets
  algorithms.register(algorithms.Algorithm("toy_reward_penalty", targets.mopo, _half,
                                           penalise_reward=True, references="mopo"))
  plain_cfg, dyn, start = setup
  cfg = _config(algo="toy_reward_penalty", beta=2.0)
  buf, metrics = _run(cfg, dyn, start, jax.random.PRNGKey(2))
  plain, _ = _run(plain_cfg, dyn, start, jax.random.PRNGKey(2))
  count = int(buf.count)
  assert count == int(plain.count) > 0
  want = np.asarray(plain.data.reward[:count]) - 2.0 * (
      0.5 + np.abs(np.asarray(buf.data.action[:count, 0])))
  np.testing.assert_allclose(np.asarray(buf.data.reward[:count]), want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(
      float(metrics["penalty"]),
      np.mean(0.5 + np.abs(np.asarray(buf.data.action[:count, 0]))), rtol=1e-5)


def _max_reward_std(ensemble):
  """A registered record's own EnsemblePenalty: max over all members of the reward's std [B]."""
  return jnp.sqrt(ensemble.reward_var).max(0)


def test_a_records_ensemble_penalty_comes_from_the_one_model_step(setup):
  """A penalty of every member's Gaussians is an ordinary value (targets.EnsemblePenalty, as
  MOPO's): a record holding its own gets it from the rollout's one model step (one ensemble
  forward per step) and loses beta x it from each row's reward."""
  from mombo_jax.core import algorithms, targets
  algorithms.register(algorithms.Algorithm(
      "toy_ensemble_penalty", targets.mopo, targets.EnsemblePenalty(_max_reward_std),
      penalise_reward=True, references="mopo"))
  plain_cfg, dyn, start = setup
  cfg = _config(algo="toy_ensemble_penalty", beta=2.0)
  jaxpr = jax.make_jaxpr(lambda k, d, s, b: rollout.run(k, _policy, d, s, b, cfg, _term))(
      jax.random.PRNGKey(0), dyn, start, buffer.init_ring(N * K, S, A))
  assert _ensemble_forwards(jaxpr.jaxpr, (S + A, cfg.dynamics.dyn_hidden[0])) == 1
  buf, metrics = _run(cfg, dyn, start, jax.random.PRNGKey(2))
  plain, _ = _run(plain_cfg, dyn, start, jax.random.PRNGKey(2))
  count = int(buf.count)
  assert count == int(plain.count) > 0
  _, _, _, r_var = _predict(dyn, buf.data.obs, buf.data.action, plain_cfg)
  u = np.sqrt(np.asarray(r_var)[:, :count]).max(0)
  np.testing.assert_allclose(np.asarray(buf.data.reward[:count]),
                             np.asarray(plain.data.reward[:count]) - 2.0 * u, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(float(metrics["penalty"]), u.mean(), rtol=1e-5)


def _ensemble_forwards(jaxpr, first_kernel_tail):
  """How many dot_generals of `jaxpr` (its sub-programs too: scan, map, pjit, custom rules) take
  a kernel of shape [members, *first_kernel_tail]: the dynamics ensemble's first layer, one per
  forward pass of the ensemble."""
  count = 0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      count += any(tuple(v.aval.shape[1:]) == first_kernel_tail and len(v.aval.shape) == 3
                   for v in eqn.invars)
    for param in eqn.params.values():
      for sub in (param if isinstance(param, (tuple, list)) else (param,)):
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          count += _ensemble_forwards(inner, first_kernel_tail)
  return count


@pytest.mark.parametrize("algo,target", [("mombo", "lcb"), ("mombo", "elite_spread"),
                                         ("mombo", "mixture"), ("mobile", None), ("mopo", None)])
def test_every_built_in_rollout_steps_the_ensemble_once_per_model_step(setup, algo, target):
  """One ensemble forward per rollout step: the K steps are one lax.scan whose body must hold ONE
  pass of the dynamics ensemble (MOPO's penalty comes out of that step's all-member prediction,
  not from a second dynamics.step: issue 43's double step, which left the values unchanged)."""
  _, dyn, start = setup
  cfg = _config(algo=algo, beta=1.0, **({"target": target} if target else {}))
  jaxpr = jax.make_jaxpr(lambda k, d, s, b: rollout.run(k, _policy, d, s, b, cfg, _term))(
      jax.random.PRNGKey(0), dyn, start, buffer.init_ring(N * K, S, A))
  tail = (S + A, cfg.dynamics.dyn_hidden[0])
  assert dyn.params["members"]["layer_0"]["kernel"].shape[1:] == tail
  assert _ensemble_forwards(jaxpr.jaxpr, tail) == 1


def test_only_the_elites_run_except_for_mopo(setup):
  """NaN weights in the non-elite member 1: MOMBO / MOBILE rollouts are exactly as with a healthy
  member 1; MOPO's penalty takes every member, so its rows all turn non-finite and are dropped."""
  cfg, dyn, start = setup
  broken = dyn.replace(params=dict(dyn.params, members=jax.tree.map(
      lambda p: p.at[1].set(jnp.nan), dyn.params["members"])))
  buf, metrics = _run(cfg, dyn, start, jax.random.PRNGKey(3))
  got, got_metrics = _run(cfg, broken, start, jax.random.PRNGKey(3))
  assert int(got.count) == int(buf.count) > 0 and float(got_metrics["nonfinite_frac"]) == 0.0
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, b), got.data, buf.data)
  assert "penalty" not in metrics
  mopo, mopo_metrics = _run(_config(algo="mopo", beta=2.0), broken, start, jax.random.PRNGKey(3))
  assert int(mopo.count) == 0 and float(mopo_metrics["nonfinite_frac"]) == 1.0


def test_elite_only_step_matches_the_all_member_step(setup):
  """dynamics.step runs the elites' networks only (E of M: XLA's flop count drops accordingly)
  unless asked for every member's Gaussians (every_member, for a penalty of the whole ensemble),
  and draws the same elite and noise per row either way."""
  cfg, dyn, start = setup
  action = jax.random.uniform(jax.random.PRNGKey(4), (N, A), minval=-1.0, maxval=1.0)
  step = jax.jit(dynamics.step, static_argnums=(4, 5))
  args = (dyn, start, action, jax.random.PRNGKey(5), cfg)
  flops = []
  for every_member in (True, False):
    cost = step.lower(*args, every_member).compile().cost_analysis()
    flops.append((cost[0] if isinstance(cost, list) else cost)["flops"])
  assert cfg.dynamics.dyn_members == 3 and cfg.dynamics.dyn_elites == 2
  assert flops[1] < flops[0] * 2.5 / 3, flops         # 2 of 3 networks, plus the shared work
  full, elites = step(*args, True), step(*args, False)
  assert elites.ensemble is None and full.ensemble.next_obs_var.shape == (3, N, S)
  np.testing.assert_array_equal(elites.elite, full.elite)
  assert set(np.unique(np.asarray(full.elite))) == {0, 2}
  for name in ("next_obs", "reward", "next_obs_mean", "next_obs_var", "reward_mean",
               "reward_var"):
    np.testing.assert_allclose(elites[name], full[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_vmaps_over_seeds_and_matches_single_runs(setup):
  cfg, dyn, start = setup
  dyns = jax.tree.map(lambda x: jnp.stack([x, x * 1.01]), dyn)
  dyns = dyns.replace(elites=jnp.asarray([[2, 0], [1, 2]], jnp.int32))
  keys = jax.random.split(jax.random.PRNGKey(5), 2)
  bufs = jax.vmap(lambda _: buffer.init_ring(2 * N, S, A))(jnp.arange(2))
  run = jax.jit(jax.vmap(lambda k, d, b: rollout.run(k, _policy, d, start, b, cfg, _term)))
  out_bufs, metrics = run(keys, dyns, bufs)
  assert metrics["reward"].shape == (2,)
  for i in range(2):
    single, m = _run(cfg, jax.tree.map(lambda x: x[i], dyns), start, keys[i], capacity=2 * N)
    assert int(single.count) == int(out_bufs.count[i])
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b[i], rtol=1e-5, atol=1e-6),
                 single.data, out_bufs.data)


def test_runaway_branches_end_and_nonfinite_rows_are_never_written(setup):
  """|next_obs| >= rollout_obs_limit ends a branch with a terminal row; a NaN/inf model output
  ends it without writing the row; the metrics stay finite (selection, not multiplication)."""
  cfg, dyn, start = setup
  start = np.array(start)
  runaway, nan_rows, inf_rows = np.arange(0, 8), np.arange(8, 12), np.arange(12, 16)
  start[runaway, 1] = 1e3            # next_obs = obs + small delta: |x| >= 100 at once
  start[nan_rows, 0] = np.nan
  start[inf_rows, 2] = np.inf
  buf, metrics = _run(cfg, dyn, jnp.asarray(start), jax.random.PRNGKey(2))
  count = int(buf.count)
  data = jax.tree.map(lambda x: np.asarray(x)[:count], buf.data)
  for field in jax.tree.leaves(data):
    assert np.all(np.isfinite(field)), "a non-finite row reached the ring"
  first = np.isin(np.arange(N), np.concatenate([nan_rows, inf_rows]), invert=True)
  # Step 0 writes one row per branch except the non-finite ones, in branch order.
  n0 = int(first.sum())
  np.testing.assert_allclose(data.obs[:n0, 1], start[first, 1], rtol=1e-6)
  big = np.abs(data.obs[:n0, 1]) >= 100
  assert big.sum() == len(runaway)
  assert np.all(data.done[:n0][big] == 1.0), "a runaway transition must be terminal"
  # Those branches stopped: no later row starts from a state with |x| >= 100.
  assert np.all(np.abs(data.obs[n0:]) < 100)
  for v in metrics.values():
    assert np.isfinite(v)
  np.testing.assert_allclose(metrics["nonfinite_frac"], 8 / N, rtol=1e-6)
  # Without the rule, the runaway branches go on.
  loose = _config(rollout_obs_limit=None)
  buf2, _ = _run(loose, dyn, jnp.asarray(start), jax.random.PRNGKey(2))
  rows2 = np.asarray(buf2.data.obs)[:int(buf2.count)]
  assert np.sum(np.abs(rows2[:, 1]) >= 100) > len(runaway)
