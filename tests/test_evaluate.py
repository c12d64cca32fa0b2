"""evaluate.py: shapes, determinism, a hand-stepped constant-action check, masking, aulc; env_pool's
worker processes (same returns for any number, errors, no child left) and the evaluation of all a
launch's runs at once, as the launch does it (evaluation.build_evaluators, then
evaluation.Evaluation's background thread and its write)."""
import os
import signal

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mombo_jax.core.critics import TanhGaussianActor
from mombo_jax.env import env_pool, envs, evaluate
from mombo_jax.settings.config import make_config

HOPPER_OBS, HOPPER_ACT = 11, 3


@pytest.fixture(scope="module")
def config():
  return make_config("hopper-random", preset="tiny", actor_hidden=(8,))


def _random_params(config, num_seeds, obs_dim=HOPPER_OBS, action_dim=HOPPER_ACT, seed=0):
  actor = TanhGaussianActor(config.agent.actor_hidden, action_dim, config.agent.log_std_min,
                            config.agent.log_std_max)
  keys = jax.random.split(jax.random.PRNGKey(seed), num_seeds)
  return jax.vmap(lambda k: actor.init(k, jnp.zeros((1, obs_dim))))(keys)


def _numpy_params(config, num_seeds, seed=0, obs_dim=HOPPER_OBS, action_dim=HOPPER_ACT,
                  actions=None):
  """Random actor variables [S, ...] as numpy arrays (as the training loop hands them to
  evaluation), made without compiling anything: Dense kernels [in, out] ~ N(0, 1 / in). With
  `actions` [S, A]: tanh(mean) is actions[s] for every observation (as _constant_params)."""
  rng = np.random.default_rng(seed)
  # ..., mean and log-std heads
  ins = [obs_dim, *config.agent.actor_hidden, config.agent.actor_hidden[-1]]
  params = {}
  for i, (n_in, n_out) in enumerate(zip(ins, [*config.agent.actor_hidden, action_dim, action_dim])):
    params[f"Dense_{i}"] = dict(
        kernel=rng.normal(0.0, n_in ** -0.5, (num_seeds, n_in, n_out)).astype(np.float32),
        bias=rng.normal(0.0, 0.1, (num_seeds, n_out)).astype(np.float32))
  if actions is not None:
    for layer in params.values():
      layer["kernel"][:] = 0.0
    params[f"Dense_{len(config.agent.actor_hidden)}"]["bias"][:] = np.arctanh(actions)
  return {"params": params}


def _constant_params(config, actions, obs_dim):
  """Actor variables [S, ...] whose tanh(mean) is actions[s] for every observation: all kernels
  zero, the mean head's bias atanh(actions[s])."""
  actions = np.asarray(actions, np.float32)
  params = _random_params(config, len(actions), obs_dim, actions.shape[1])
  params = jax.tree.map(jnp.zeros_like, params)
  mean_head = f"Dense_{len(config.agent.actor_hidden)}"
  params["params"][mean_head]["bias"] = jnp.arctanh(jnp.asarray(actions))
  return params


def _manual_return(env_id, seed, action, horizon):
  """Undiscounted return of one plain gymnasium episode with a constant action, and its length."""
  env = gym.make(env_id, max_episode_steps=horizon)
  env.reset(seed=int(seed))
  total, steps = 0.0, 0
  while True:
    _, reward, terminated, truncated, _ = env.step(np.asarray(action, np.float32))
    total += reward
    steps += 1
    if terminated or truncated:
      env.close()
      return total, steps


def test_shape_and_determinism(config):
  params = _random_params(config, num_seeds=2)
  a = evaluate.run(params, config, "hopper", episodes=3, seed=5, max_episode_steps=20)
  b = evaluate.run(params, config, "hopper-random", episodes=3, seed=5, max_episode_steps=20)
  c = evaluate.run(params, config, "hopper", episodes=3, seed=6, max_episode_steps=20)
  assert a.shape == (2, 3) and a.dtype == np.float64 and np.all(np.isfinite(a))
  np.testing.assert_array_equal(a, b)        # same seed (and short or dataset name) -> same returns
  assert not np.array_equal(a, c)            # another seed -> other start states
  assert len(np.unique(a)) == a.size         # every episode starts from its own state


def test_constant_action_matches_plain_gymnasium(config):
  """Seed 0 pushes hard and falls over (terminates) before the horizon; seed 1 stands still and is
  cut by the time limit. Later steps of the fallen env must not count."""
  horizon, episodes, seed = 80, 2, 3
  actions = np.array([[1.0 - 1e-3, -0.9, 0.9], [0.0, 0.0, 0.0]], np.float32)
  params = _constant_params(config, actions, HOPPER_OBS)
  got = evaluate.run(params, config, "hopper", episodes, seed, max_episode_steps=horizon)
  start_seeds = evaluate.env_seeds(seed, len(actions), episodes)
  lengths = np.zeros((len(actions), episodes), int)
  for s in range(len(actions)):
    for e in range(episodes):
      want, lengths[s, e] = _manual_return("Hopper-v5", start_seeds[s, e], actions[s], horizon)
      np.testing.assert_allclose(got[s, e], want, rtol=1e-5)
  assert lengths[0].max() < horizon and lengths[1].min() == horizon   # both end conditions seen
  assert not np.allclose(got[0], got[1])


def test_reused_evaluator_matches_fresh_envs(config):
  """One env set for a sequence of evaluations (one that ends with a fallen env, left as it fell:
  seed 0 falls before the horizon, see the test above) gives each evaluation the returns of fresh
  envs."""
  horizon = 80
  falling = _constant_params(config, [[1.0 - 1e-3, -0.9, 0.9], [0.0, 0.0, 0.0]], HOPPER_OBS)
  random = _random_params(config, num_seeds=2, seed=4)
  calls = [(falling, 3), (random, 5), (falling, 3), (random, 6)]
  with evaluate.Evaluator(config, "hopper", num_seeds=2, episodes=2,
                          max_episode_steps=horizon) as evaluator:
    pool = evaluator.pool
    reused = [evaluator.run(params, seed) for params, seed in calls]
    assert evaluator.pool is pool
    with pytest.raises(ValueError, match="2 seed"):
      evaluator.run(_random_params(config, num_seeds=3), 0)
  for (params, seed), got in zip(calls, reused):
    fresh = evaluate.run(params, config, "hopper", 2, seed, max_episode_steps=horizon)
    np.testing.assert_array_equal(got, fresh)
  np.testing.assert_array_equal(reused[0], reused[2])
  assert not np.array_equal(reused[1], reused[3])


def test_action_bounds_are_rescaled(config, monkeypatch):
  """An env with bounds [-2, 2] (Pendulum) gets low + (a + 1) / 2 * (high - low) = 2a."""
  monkeypatch.setattr(envs, "make_env",
                      lambda name, max_episode_steps: gym.make("Pendulum-v1",
                                                               max_episode_steps=max_episode_steps))
  actions = np.array([[0.25], [-0.5]], np.float32)
  got = evaluate.run(_constant_params(config, actions, 3), config, "pendulum", 1, seed=0,
                     max_episode_steps=10)
  start_seeds = evaluate.env_seeds(0, 2, 1)
  for s in range(2):
    want, _ = _manual_return("Pendulum-v1", start_seeds[s, 0], 2.0 * actions[s], 10)
    np.testing.assert_allclose(got[s, 0], want, rtol=1e-5)


def test_bad_inputs(config):
  params = _random_params(config, num_seeds=2)
  single = jax.tree.map(lambda x: x[0], params)
  with pytest.raises(ValueError, match="leading seed axis"):
    evaluate.run(single, config, "hopper", 1, 0, max_episode_steps=2)
  with pytest.raises(ValueError, match="episodes"):
    evaluate.run(params, config, "hopper", 0, 0)


def test_aulc():
  scores = np.array([[10.0, 20.0], [30.0, 40.0], [50.0, 0.0]])          # [T=3, S=2]
  np.testing.assert_allclose(evaluate.aulc(scores), [30.0, 20.0])
  np.testing.assert_allclose(evaluate.aulc(scores[:1]), [10.0, 20.0])
  with pytest.raises(ValueError, match=r"\[T, S\]"):
    evaluate.aulc(np.ones(3))


# ------------------------------------------------------------- env_pool: workers, all cells at once

def _children() -> set:
  """PIDs of this process's children, zombies included (Linux: /proc; else an empty set)."""
  import glob
  out = set()
  for path in glob.glob(f"/proc/{os.getpid()}/task/*/children"):
    with open(path) as f:
      out.update(int(p) for p in f.read().split())
  return out


def _gone(pid) -> bool:
  """No process (not even a zombie) has this PID any more."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return True
  return False


def test_worker_processes_give_the_same_returns_and_leave_no_child(config):
  """W = 2 worker processes (envs interleaved over them) give W = 1's returns, for evaluations
  in a row; the workers are their own sessions (a terminal's Ctrl-C reaches the parent only) and
  ignore SIGINT; close() reaps them."""
  horizon = 40
  params = _numpy_params(config, num_seeds=3, seed=2)
  # Cell 0 falls (terminates) at step ~10 and is stepped no more; cells 1, 2 stand to the limit.
  falling = _numpy_params(config, 3, actions=np.array([[1.0 - 1e-3, -0.9, 0.9], [0.0] * 3,
                                                       [0.0] * 3]))
  seeds = np.arange(15).reshape(3, 5) * 7 + 1              # reset seeds [S, episodes]
  calls = [(params, 3), (falling, 4), (params, seeds)]
  with evaluate.Evaluator(config, "hopper", 3, 5, max_episode_steps=horizon) as one:
    assert one.workers == 1 and one.pool.pids() == []
    want = [one.run(p, s) for p, s in calls]
  evaluator = evaluate.Evaluator(config, "hopper", 3, 5, max_episode_steps=horizon, workers=2)
  pids = evaluator.pool.pids()
  try:
    assert evaluator.workers == 2 and len(pids) == 2
    assert all(os.getsid(pid) != os.getsid(0) for pid in pids)
    os.kill(pids[0], signal.SIGINT)
    for (p, s), w in zip(calls, want):
      np.testing.assert_array_equal(evaluator.run(p, s), w)
    assert not np.array_equal(want[0], want[2])               # explicit reset seeds are used
    with pytest.raises(ValueError, match=r"actions \[15, 3\]"):
      evaluator.pool.step(np.zeros((15, 1), np.float32))   # Hopper takes 3 actions, not 1
  finally:
    evaluator.close()
    evaluator.close()                                        # twice: harmless
  assert all(_gone(pid) for pid in pids)


def test_a_killed_worker_is_a_clear_error(config):
  pool = env_pool.EnvPool(envs.make_env("hopper", max_episode_steps=5), num_envs=4, workers=3)
  pids = pool.pids()
  try:
    assert len(pids) == 3
    pool.reset(np.arange(4))
    os.kill(pids[1], signal.SIGKILL)
    with pytest.raises(env_pool.WorkerError, match=rf"env worker 1 of 3 \(pid {pids[1]}\) died "
                       r"while stepping its envs \(killed by signal 9 \(SIGKILL\)\)"):
      pool.step(np.zeros((4, HOPPER_ACT), np.float32))
  finally:
    pool.close()
  assert all(_gone(pid) for pid in pids)


def test_a_failing_worker_is_a_clear_error():
  """A worker's exception comes back as a WorkerError with its traceback, and the pool closes."""
  import dataclasses
  import types
  env = envs.make_env("hopper", max_episode_steps=5)
  bad = types.SimpleNamespace(observation_space=env.observation_space,
                              action_space=env.action_space, close=env.close,
                              spec=dataclasses.replace(env.spec, kwargs={"no_such_option": 1}))
  before = _children()
  with pytest.raises(env_pool.WorkerError, match=r"env worker \d of 2 \(pid \d+\) failed while "
                     r"building its envs:\n(.|\n)*Traceback(.|\n)*no_such_option"):
    env_pool.EnvPool(bad, num_envs=2, workers=2)
  assert _children() <= before                              # both workers reaped


def test_auto_workers(monkeypatch):
  monkeypatch.setattr(env_pool, "host_cores", lambda: 16)
  assert env_pool.auto_workers(1) == env_pool.auto_workers(env_pool.MIN_ENVS_FOR_WORKERS - 1) == 1
  assert env_pool.auto_workers(10) == 10 // env_pool.ENVS_PER_WORKER
  assert env_pool.auto_workers(48 * 10) == env_pool.auto_workers(16 * 10) == 16
  assert env_pool.auto_workers(48 * 10, cores=2) == 2


def test_evaluating_all_runs_at_once_equals_each_run_alone(config, tmp_path, monkeypatch,
                                                           capsys):
  """The launch's evaluation (launch.Launch.evaluate: evaluation.build_evaluators, one Evaluator
  for every cell, here over 2 workers; an evaluation.Evaluation computing the returns in its thread,
  then its write in the main thread) writes each run's metrics.csv rows exactly as
  an Evaluator of the run's own does; a run with another eval_episodes gets its own Evaluator,
  the others share one."""
  import functools

  from mombo_jax.records.workdir import Workdir
  from mombo_jax.run import evaluation, host_run, overestimation
  from mombo_jax.run.run_specs import RunSpec
  monkeypatch.setattr(evaluate, "Evaluator",
                      functools.partial(evaluate.Evaluator, max_episode_steps=30))
  configs = [config.replace(seed=0, num_seeds=2, eval_episodes=2),
             config.replace(seed=7, num_seeds=1, eval_episodes=2, beta=2.0),
             config.replace(seed=3, num_seeds=2, eval_episodes=1)]
  actors = _numpy_params(config, num_seeds=5, seed=9)       # every cell's actor [C=5, ...]
  last = {"q_mean": np.arange(5.0), "critic_loss": np.ones(5)}

  def host_runs(name, evaluations):
    runs, offset = [], 0
    for i, c in enumerate(configs):
      wd = Workdir(str(tmp_path / name / str(i)))
      os.makedirs(wd.path)
      seeds = np.arange(c.seed, c.seed + c.num_seeds)
      r = host_run.HostRun(RunSpec(c, "hopper-random", wd.path), several_runs=True)
      r.cell_slice, r.q = (slice(offset, offset + c.num_seeds),
                           overestimation.OverestimationWatch(seeds, 100.0))
      runs.append(r)
      offset += c.num_seeds
    try:
      for done in (1, 2):
        evaluations(runs, done)
    finally:
      for r in runs:
        if r.evaluator is not None:
          r.evaluator.close()
    return runs

  def evaluate_alone(r, done):
    """Run r evaluated by an Evaluator of its own (the reference)."""
    c = r.config
    if r.evaluator is None:
      r.evaluator = evaluate.Evaluator(c, c.env_name, c.num_seeds, c.evaluation.eval_episodes)
    r.mark_point(done, last)
    r.write_evaluation(r.evaluator.run(jax.tree.map(lambda x: x[r.cell_slice], actors),
                                       seed=r.eval_seed(done)))

  alone = host_runs("alone", lambda runs, done: [evaluate_alone(r, done) for r in runs])

  def evaluate_in_the_loop(runs, epoch):
    """What Launch.evaluate does at an evaluation point (on process 0)."""
    for r in runs:
      r.mark_point(epoch, last)
    evaluation.build_evaluators(runs, workers=2)
    before = [len(r.rows) for r in runs]
    point = evaluation.Evaluation(runs, actors, epoch, rate=1.0, eta=0.0)
    point.join()
    # The thread computes returns only: the main thread writes them (finish).
    assert point.error is None and [len(r.rows) for r in runs] == before
    point.write()

  together = host_runs("together", evaluate_in_the_loop)
  assert together[0].evaluator is together[1].evaluator is not together[2].evaluator
  assert together[0].evaluator.workers == 2
  for a, b in zip(alone, together):
    assert len(a.rows) == 2 * a.config.num_seeds
    assert a.rows == b.rows
    assert Workdir(b.folder.path).read_rows() == a.folder.read_rows()
  assert len({r["return_mean"] for r in together[0].rows + together[2].rows}) == 8
  # finish's log line, one per run and evaluation point, names the run.
  lines = [l for l in capsys.readouterr().out.splitlines() if l.startswith("epoch ")]
  assert len(lines) == 2 * len(configs), lines
  assert lines[1].startswith("epoch 1/") and "[hopper-random beta=2 seeds 7..7]" in lines[1]
