"""unifloral's MOPO (EmptyJackson/unifloral algorithms/mopo.py + algorithms/dynamics.py), imported
UNCHANGED from a checkout the user names, set up on benchmarks/peers/work.py's synthetic work.

What is stubbed or changed (load() returns these lines; every record prints them):
- d4rl, gym, wandb: empty modules put in sys.modules before the import. mopo.py / dynamics.py
  import them at the top but use them only in their `__main__` blocks (datasets, evaluation,
  logging), which never run here.
- jax.tree_map: set to jax.tree.map where JAX no longer has it (removed in JAX 0.6; unifloral's
  code calls it). Same function.
- distrax and tyro are NOT stubbed: they must be installed (pip install distrax tyro).
- The objects their `__main__` builds from a d4rl dataset and a saved dynamics model are built
  here the same way from the synthetic data and an untrained ensemble (Theirs.__init__).
- Their main loop calls `jax.lax.scan(_agent_train_step_fn, ...)` outside jit; here that scan is
  jax.jit-ed and compiled ahead of time (no donation, as theirs), with the initial carry cast to
  the types the scan returns, so that one compilation serves every span (unmodified, their loop
  recompiles in its first calls as the carry's weak types become strong).
Nothing of their training step, rollout, networks or optimisers is replaced.
"""
import os
import sys
import types

import jax
import jax.numpy as jnp

from benchmarks.peers import work as work_lib


def load(path: str):
  """(namespace with mopo, dynamics, termination_fns modules, [lines saying what was stubbed])."""
  algos = os.path.join(os.path.abspath(path), "algorithms")
  if not os.path.isfile(os.path.join(algos, "mopo.py")):
    raise SystemExit(f"--unifloral={path}: no algorithms/mopo.py there; pass the folder of a "
                     "checkout of EmptyJackson/unifloral (git clone it).")
  notes = []
  for name in ("d4rl", "gym", "wandb"):
    sys.modules[name] = types.ModuleType(name)
    notes.append(f"{name}: an empty module in sys.modules (used only by unifloral's __main__ "
                 "code: datasets, evaluation, logging)")
  for name in ("distrax", "tyro"):
    try:
      __import__(name)
    except ImportError:
      raise SystemExit(f"unifloral needs {name}: pip install distrax tyro (for this benchmark "
                       "only; not a mombo_jax requirement).") from None
  if not hasattr(jax, "tree_map"):
    jax.tree_map = jax.tree.map
    notes.append(f"jax.tree_map = jax.tree.map (JAX {jax.__version__} has no jax.tree_map; the "
                 "same function under its current name)")
  flags = os.environ.get("XLA_FLAGS")
  sys.path.insert(0, algos)
  import dynamics  # noqa: E402  (unifloral's algorithms/dynamics.py)
  import mopo  # noqa: E402
  import termination_fns  # noqa: E402
  if os.environ.get("XLA_FLAGS") != flags:
    notes.append(f"their modules set XLA_FLAGS={os.environ.get('XLA_FLAGS')!r} at import (a GPU "
                 "flag; left as they set it)")
  notes.append("their __main__-built objects built here from synthetic data and an untrained "
               "ensemble; their scan jitted and compiled ahead of time with the carry's types "
               "fixed (no recompiles)")
  return types.SimpleNamespace(mopo=mopo, dynamics=dynamics, termination_fns=termination_fns,
                               path=os.path.abspath(path)), notes


def _git_head(path):
  try:
    with open(os.path.join(path, ".git", "HEAD")) as f:
      ref = f.read().strip()
    if ref.startswith("ref:"):
      with open(os.path.join(path, ".git", ref[5:])) as f:
        return f.read().strip()[:10]
    return ref[:10]
  except OSError:
    return "unknown"


class Theirs:
  """unifloral's MOPO on `work` for one seed: span() runs one rollout + work.steps updates."""

  def __init__(self, mods, work: work_lib.Work, data: dict, seed: int):
    mopo, dyn = mods.mopo, mods.dynamics
    self.mods, self.work = mods, work
    self.version = _git_head(mods.path)
    if (work.hidden, work.layers) != (256, 3):
      raise SystemExit("unifloral's actor and critics are fixed at 3x256 (mopo.py).")
    args = mopo.Args(seed=seed, batch_size=work.batch, num_critics=work.critics,
                     rollout_interval=work.steps, rollout_length=work.rollout_length,
                     rollout_batch_size=work.rollout_batch,
                     model_retain_epochs=work.retain_epochs,
                     dataset_sample_ratio=work.real_ratio, step_penalty_coef=work.penalty)
    self.args = args
    # As their __main__ builds the dataset from d4rl.qlearning_dataset.
    dataset = dyn.Transition(
        obs=jnp.array(data["observations"]), action=jnp.array(data["actions"]),
        reward=jnp.array(data["rewards"]), next_obs=jnp.array(data["next_observations"]),
        done=jnp.array(data["terminals"]), next_action=jnp.roll(data["actions"], -1, axis=0))
    self.dataset = dataset
    dummy_obs, dummy_action = jnp.zeros(work_lib.OBS), jnp.zeros(work_lib.ACT)
    self.actor_net = mopo.TanhGaussianActor(work_lib.ACT)
    self.q_net = mopo.VectorQ(args.num_critics)
    self.alpha_net = mopo.EntropyCoef()
    rng = jax.random.PRNGKey(seed)
    rng, rng_actor, rng_q, rng_alpha, rng_dyn = jax.random.split(rng, 5)
    make = mopo.create_train_state
    agent = mopo.AgentTrainState(
        actor=make(args, rng_actor, self.actor_net, [dummy_obs]),
        vec_q=make(args, rng_q, self.q_net, [dummy_obs, dummy_action]),
        vec_q_target=make(args, rng_q, self.q_net, [dummy_obs, dummy_action]),
        alpha=make(args, rng_alpha, self.alpha_net, []))
    # An untrained ensemble as dynamics.py's __main__ builds it; all `members` kept as "elites"
    # so that its MOPO penalty runs as many networks as ours (which runs all 7; with a trained
    # model unifloral keeps its 5 elites and runs 5).
    net = dyn.EnsembleDynamicsModel(obs_dim=work_lib.OBS, action_dim=work_lib.ACT,
                                    num_ensemble=work.members, n_layers=work.dyn_layers,
                                    layer_size=work.dyn_hidden)
    params = net.init(rng_dyn, jnp.zeros(work_lib.OBS + work_lib.ACT))
    model = dyn.EnsembleDynamics(net, params, jnp.arange(work.members),
                                 mods.termination_fns.get_termination_fn("hopper-medium-v2"))
    model.dataset = dataset
    self.model = model
    size = args.rollout_batch_size * args.rollout_length * args.model_retain_epochs
    buffer = jax.tree_map(lambda x: jnp.zeros((size, *x.shape[1:])), dataset)
    self.rollout_fn = model.make_rollout_fn(batch_size=args.rollout_batch_size,
                                            rollout_length=args.rollout_length,
                                            step_penalty_coef=args.step_penalty_coef)
    self.train_step = mopo.make_train_step(args, self.actor_net.apply, self.q_net.apply,
                                           self.alpha_net.apply, dataset, self.rollout_fn)

    def span(carry):
      return jax.lax.scan(self.train_step, carry, None, args.rollout_interval)

    carry = (rng, agent, buffer)
    out = jax.eval_shape(span, carry)[0]
    self.carry = jax.tree.map(lambda x, s: jnp.asarray(x, s.dtype), carry, out)
    self.span_fn = jax.jit(span)

  def compile(self):
    """Compiles the span; returns the seconds it took."""
    seconds, self.compiled = work_lib.timed(lambda: self.span_fn.lower(self.carry).compile())
    return seconds

  def span(self) -> float:
    """Runs one span (compiled beforehand); returns its seconds."""
    seconds, (self.carry, _) = work_lib.timed(self.compiled, self.carry)
    return seconds

  # ---- pieces (profile.py and the FLOP count) -------------------------------------------------

  def policy(self, params):
    # The policy their train step hands the rollout (mopo.py make_train_step).
    return lambda obs, rng: self.actor_net.apply(params, obs).sample(seed=rng)

  def rollout_piece(self):
    """(fn, args): their rollout_fn (model rollout + their buffer update), unchanged."""
    def fn(rng, actor_params, buffer):
      return self.rollout_fn(rng, self.policy(actor_params), buffer)
    _, agent, buffer = self.carry
    return fn, (jax.random.PRNGKey(1), agent.actor.params, buffer)

  def step_piece(self):
    """(fn, args): one of their train steps (batch sampling, alpha, actor, target, critics,
    Polyak) built by their make_train_step with a rollout_fn that returns the buffer as it is,
    so that the lax.cond's rollout branch does no work."""
    step = self.mods.mopo.make_train_step(self.args, self.actor_net.apply, self.q_net.apply,
                                          self.alpha_net.apply, self.dataset,
                                          lambda rng, policy, buffer: buffer)
    return (lambda carry: step(carry, None)), (self.carry,)

  def sample_piece(self):
    """(fn, args): the mixed batch as their step draws it (sample_from_buffer twice, concat)."""
    mopo = self.mods.mopo
    n_real = int(self.args.batch_size * self.args.dataset_sample_ratio)

    def fn(key, buffer):
      k1, k2 = jax.random.split(key)
      real = mopo.sample_from_buffer(self.dataset, n_real, k1)
      syn = mopo.sample_from_buffer(buffer, self.args.batch_size - n_real, k2)
      return jax.tree.map(lambda x, y: jnp.concatenate([x, y]), real, syn)
    return fn, (jax.random.PRNGKey(2), self.carry[2])

  def write_piece(self):
    """(fn, args): their buffer update (dynamics.py _rollout_fn: the rollouts' rows appended by
    concatenate([x[:-n], y[:n]]) on every field) of one rollout's rows."""
    buffer = self.carry[2]
    n = self.args.rollout_batch_size * self.args.rollout_length
    rows = jax.tree.map(lambda x: jnp.ones((n,) + x.shape[1:], x.dtype), buffer)

    def fn(buffer, rows):
      return jax.tree.map(lambda x, y: jnp.concatenate([x[:-n], y[:n]]), buffer, rows)
    return fn, (buffer, rows)
