"""A trained policy as a plain Python object: numpy observations in, env actions out.

    policy = mombo_jax.load_policy("runs/hopper-medium-replay/mombo-elite_spread/s0x4", seed=2)
    action = policy(obs)                     # obs [obs_dim] -> [A]; obs [B, obs_dim] -> [B, A]

`load_policy(source)` reads either a run workdir (its config.json and newest valid checkpoint, of
which only the actors' parameters are read: a partial restore through workdir.Workdir) or a file
that `Policy.save` / `export_policy` wrote (flax msgpack: the actor's parameters and the metadata
that rebuilds the network; no run, config.json or Orbax needed to read it).

The action is exactly the one evaluation sends to the env (evaluate.Evaluator): the actor sees
the raw observation as float32 (nothing in mombo_jax normalises the actor's input), the
deterministic action is tanh(mean) (critics.deterministic_action), and envs.to_env_action maps
it from [-1, 1] to the env's action bounds in their dtype (the identity for the MuJoCo tasks). So
`env.step(policy(obs))` is evaluation's step, and the returns match the run's metrics.csv on the
same env seeds (tests/test_run.py).

Seeds: a run's checkpoint holds the actors of all its seeds on a leading axis [S]; seed s is index
s - config.seed. A seed that diverged during training (frozen at its last healthy state, left out
of the run's summary) is refused unless allow_diverged=True.

Export format (FORMAT): msgpack of {"meta": {...}, "params": the actor's variables {"params":
{Dense_i: {kernel, bias}}}}; meta holds the format tag, env, dataset, dims, the actor's hidden
sizes and log-std clamp, the env's action bounds, seed, epoch, the run's config.json as a JSON
string and a CRC32 of the parameters (a flipped byte is refused, not used).
"""
from __future__ import annotations

import dataclasses
import json
import os
import zlib
from typing import Any, Optional

import jax
import numpy as np
from flax import serialization

from mombo_jax import __version__
from mombo_jax.core import actor_policy
from mombo_jax.env import envs
from mombo_jax.errors import UserError
from mombo_jax.records.workdir import Workdir
from mombo_jax.run import run_state

FORMAT = "mombo_jax.policy/1"
_EXPORT_HINT = ("export one with: python -m experiments.export --run=DIR --seed=S "
                "--out=policy.msgpack")


def _actor_fns(hidden_dims, action_dim, log_std_min, log_std_max):
  """The actor's jitted functions (actor_policy's one cache, per actor shape)."""
  return actor_policy.actor_functions(actor_policy.ActorShape.of(hidden_dims, action_dim,
                                                                 log_std_min, log_std_max))


def _to_numpy(tree):
  return jax.tree.map(lambda x: np.asarray(jax.device_get(x)), tree)


def _crc(params) -> int:
  """CRC32 over the parameters' bytes, leaves in flattening order."""
  crc = 0
  for leaf in jax.tree.leaves(params):
    crc = zlib.crc32(np.ascontiguousarray(leaf).tobytes(), crc)
  return crc


@dataclasses.dataclass(frozen=True, eq=False)
class _Bounds:
  """The env's action space as envs.to_env_action reads it (low, high [A], dtype)."""
  low: np.ndarray
  high: np.ndarray
  dtype: Any


@dataclasses.dataclass(frozen=True, eq=False)
class Policy:
  """One seed's trained actor. Call it: `action = policy(obs, sample=False, key=None)`.

  params: the actor's variables {"params": {Dense_i: {kernel, bias}}} (numpy, one seed).
  env_name ('hopper'), dataset (trained on), obs_dim, action_dim; hidden_dims, log_std_min,
  log_std_max: the actor network (critics.TanhGaussianActor); action_low / action_high [A] and
  action_dtype: the env's action space; seed, epoch: which seed of the run and the checkpoint's
  epoch; config: the run's config.json record (dict); source: where it was loaded from; eval_env:
  the env its run was evaluated in (envs.eval_env_spec of the dataset, plain data; None: a file
  saved before it was recorded, whose dataset tells), what rendering builds.
  """
  params: Any
  env_name: str
  dataset: str
  obs_dim: int
  action_dim: int
  hidden_dims: tuple
  log_std_min: float
  log_std_max: float
  action_low: np.ndarray
  action_high: np.ndarray
  action_dtype: str
  seed: int
  epoch: int
  config: dict
  source: str = ""
  eval_env: Optional[dict] = None

  def __post_init__(self):
    # Placed once: every call reuses the device copy.
    object.__setattr__(self, "_device_params", jax.device_put(self.params))
    object.__setattr__(self, "_bounds", _Bounds(np.asarray(self.action_low, np.float64),
                                                np.asarray(self.action_high, np.float64),
                                                np.dtype(self.action_dtype)))

  def __call__(self, obs, sample: bool = False, key=None) -> np.ndarray:
    """The env action for obs [obs_dim] -> [A], or obs [B, obs_dim] -> [B, A] (numpy, in the
    env's action bounds and dtype, ready for env.step).

    sample=False (default): deterministic, tanh(mean), evaluation's action.
    sample=True: a ~ tanh(N(mean, std)), as in training; needs `key`, a jax.random key or an int
      seed (the same key gives the same actions; draw a new one per call for fresh noise).
    """
    obs = np.asarray(obs, np.float32)
    if obs.ndim not in (1, 2) or obs.shape[-1] != self.obs_dim:
      raise ValueError(f"obs must have shape [{self.obs_dim}] or [B, {self.obs_dim}] for "
                       f"{self.env_name}, got {obs.shape}.")
    batch = obs[None] if obs.ndim == 1 else obs
    fns = _actor_fns(self.hidden_dims, self.action_dim, self.log_std_min, self.log_std_max)
    if sample:
      if key is None:
        raise ValueError("sample=True needs key=: a jax.random key or an int seed.")
      if isinstance(key, (int, np.integer)):
        key = jax.random.PRNGKey(int(key))
      action = fns.sample(self._device_params, batch, key)
    else:
      action = fns.mode(self._device_params, batch)
    action = envs.to_env_action(np.asarray(action), self._bounds)
    return action[0] if obs.ndim == 1 else action

  def metadata(self) -> dict:
    """What a saved policy stores beside its parameters (JSON types)."""
    return dict(format=FORMAT, env_name=self.env_name, dataset=self.dataset,
                obs_dim=int(self.obs_dim), action_dim=int(self.action_dim),
                hidden_dims=[int(h) for h in self.hidden_dims],
                log_std_min=float(self.log_std_min), log_std_max=float(self.log_std_max),
                action_low=[float(x) for x in self.action_low],
                action_high=[float(x) for x in self.action_high],
                action_dtype=str(np.dtype(self.action_dtype)), seed=int(self.seed),
                epoch=int(self.epoch), config=json.dumps(self.config),
                params_crc32=_crc(self.params), mombo_jax_version=__version__,
                **({} if self.eval_env is None else {"eval_env": json.dumps(self.eval_env)}))

  def save(self, path: str) -> str:
    """Writes the policy to `path` (flax msgpack, atomically: a temporary file renamed into
    place); load_policy(path) reads it back. Returns path."""
    blob = serialization.msgpack_serialize({"meta": self.metadata(),
                                            "params": _to_numpy(self.params)})
    tmp = f"{path}.tmp{os.getpid()}"
    try:
      os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
      with open(tmp, "wb") as f:
        f.write(blob)
      os.replace(tmp, path)
    except OSError as e:
      if os.path.isfile(tmp):
        os.remove(tmp)
      raise UserError(f"Cannot write the policy to {path} ({e}); pass a writable `path`.",
                      params=("path",)) from None
    return path

  def __repr__(self):
    return (f"Policy({self.env_name}, dataset={self.dataset}, seed={self.seed}, "
            f"epoch={self.epoch}, obs_dim={self.obs_dim}, action_dim={self.action_dim}, "
            f"hidden={list(self.hidden_dims)}, source={self.source!r})")


def load_policy(source: str, seed: Optional[int] = None, *, step: Optional[int] = None,
                allow_diverged: bool = False) -> Policy:
  """The trained policy in `source`: a run workdir or a file written by Policy.save /
  export_policy.

  seed: which seed of the run (default: the run's first, config.seed); for a file, None or the
    seed it holds. UserError for a seed the run does not have.
  step: a workdir's checkpoint step (default: the newest valid one).
  allow_diverged: load a seed that diverged in training (its actor frozen at its last healthy
    epoch) instead of refusing it.
  Every problem a user can fix is one UserError line (missing path, not a run, a corrupt or
  foreign file, a bad seed or step).
  """
  source = os.fspath(source)
  if os.path.isdir(source):
    return _from_workdir(source, seed, step, allow_diverged)
  if os.path.isfile(source):
    if step is not None:
      raise UserError(f"{source} is a saved policy: it holds one checkpoint, so step= does not "
                      "apply; pass a run workdir to choose a step.", params=("step",))
    return _from_file(source, seed)
  raise UserError(f"{source} does not exist; pass a run workdir (of experiments.run) or a policy "
                  f"file ({_EXPORT_HINT}).")


def export_policy(workdir: str, seed: Optional[int], out: str, *, step: Optional[int] = None,
                  allow_diverged: bool = False) -> Policy:
  """Loads seed `seed` of the run in `workdir` (see load_policy) and saves it to `out`."""
  policy = load_policy(workdir, seed, step=step, allow_diverged=allow_diverged)
  policy.save(out)
  return policy


def _action_space(env_name: str):
  """(low [A], high [A], dtype name) of the env's action space, as evaluation builds the env."""
  env = envs.make_env(env_name)
  try:
    space = env.action_space
    return (np.asarray(space.low, np.float64), np.asarray(space.high, np.float64),
            str(np.dtype(space.dtype)))
  finally:
    env.close()


def _from_workdir(path: str, seed: Optional[int], step: Optional[int],
                  allow_diverged: bool) -> Policy:
  wd = Workdir(path)
  record = wd.read_record()
  config, dataset = wd.read_config()
  first, last = config.seed, config.seed + config.num_seeds - 1
  seed = first if seed is None else int(seed)
  if not first <= seed <= last:
    raise UserError(f"{path} holds seeds {first}..{last}; seed {seed} is not one of them. Pass "
                    + (f"one of seed={first} .. seed={last}." if last > first else
                       f"seed={first}."), params=("seed",))
  if step is not None:
    ckpt = run_state.checkpointer(wd, keep=None) if os.path.isdir(wd.checkpoints) else None
    steps = ckpt.steps() if ckpt else []
    if ckpt:
      ckpt.close()
    if int(step) not in steps:
      raise UserError(f"{path} has no checkpoint step {step} (it has {steps or 'none'}); pass "
                      "one of those or leave the step out for the newest.")
  template = run_state.state_template(wd, config)
  part, meta = run_state.restore(wd, {"agent": {"actor": {"params": template.agent.actor.params}}},
                                 step=step, partial=True)
  epoch = int(meta.get("epoch", meta.get("step", -1)))
  diverged = {int(d["seed"]): d for d in meta.get("diverged", [])}
  if seed in diverged and not allow_diverged:
    d = diverged[seed]
    raise UserError(f"Seed {seed} of {path} diverged at epoch {d.get('epoch')} "
                    f"({d.get('quantity')}); its actor is frozen at its last healthy state. Pick "
                    "another seed, or pass allow_diverged=True to load it anyway.",
                    params=("allow_diverged",))
  params = _to_numpy(jax.tree.map(lambda x: x[seed - first], part["agent"]["actor"]["params"]))
  low, high, dtype = _action_space(config.env_name)
  return Policy(params=params, env_name=config.env_name, dataset=dataset,
                obs_dim=envs.OBS_DIM[config.env_name], action_dim=envs.ACTION_DIM[config.env_name],
                hidden_dims=tuple(config.agent.actor_hidden),
                log_std_min=float(config.agent.log_std_min),
                log_std_max=float(config.agent.log_std_max), action_low=low, action_high=high,
                action_dtype=dtype, seed=seed, epoch=epoch, config=record, source=path,
                eval_env=envs.eval_env_spec(dataset))


_META_TYPES = dict(env_name=str, dataset=str, obs_dim=int, action_dim=int, hidden_dims=list,
                   log_std_min=float, log_std_max=float, action_low=list, action_high=list,
                   action_dtype=str, seed=int, epoch=int, config=str, params_crc32=int)


def _shapes(tree) -> list:
  """[(shape, dtype name)] of the leaves."""
  return [(tuple(np.shape(x)), np.dtype(x.dtype).name) for x in jax.tree.leaves(tree)]


def _from_file(path: str, seed: Optional[int]) -> Policy:
  try:
    with open(path, "rb") as f:
      raw = f.read()
  except OSError as e:
    raise UserError(f"Cannot read the policy file {path} ({e}).") from None
  try:
    tree = serialization.msgpack_restore(raw)
  except Exception as e:  # msgpack raises several types for bytes that are not its format
    raise UserError(f"{path} is not a readable policy file (msgpack: {type(e).__name__}); "
                    f"it is truncated or not a policy: {_EXPORT_HINT}") from None
  meta = tree.get("meta") if isinstance(tree, dict) else None
  found = meta.get("format") if isinstance(meta, dict) else None
  if found != FORMAT:
    raise UserError(f"{path} is not a mombo_jax policy file (format {found!r}, expected "
                    f"{FORMAT!r}); {_EXPORT_HINT}")
  bad = [k for k, t in _META_TYPES.items()
         if not isinstance(meta.get(k), t) and not (t is float and isinstance(meta.get(k), int))]
  if bad or not isinstance(tree.get("params"), dict):
    raise UserError(f"{path} is a damaged policy file (metadata {', '.join(bad) or 'params'} "
                    f"missing or of the wrong type); {_EXPORT_HINT}")
  params = tree["params"]
  try:   # a damaged file may hold anything here: every failure is "does not fit"
    hidden = tuple(int(h) for h in meta["hidden_dims"])
    want = _actor_fns(hidden, meta["action_dim"], meta["log_std_min"],
                      meta["log_std_max"]).init_shapes(meta["obs_dim"])
    fits = (jax.tree.structure(params) == jax.tree.structure(want)
            and _shapes(params) == _shapes(want))
  except (AttributeError, TypeError, ValueError):
    hidden, fits = meta["hidden_dims"], False
  if not fits:
    raise UserError(f"{path} is a damaged policy file: its parameters do not fit the "
                    f"{list(hidden)} actor its metadata describes; {_EXPORT_HINT}")
  if _crc(params) != meta["params_crc32"]:
    raise UserError(f"{path} is a damaged policy file: its parameters fail their CRC32 check "
                    f"(the bytes were altered); {_EXPORT_HINT}")
  if seed is not None and int(seed) != meta["seed"]:
    raise UserError(f"{path} holds seed {meta['seed']}, not {seed}; leave the seed out or export "
                    f"seed {seed} from its run.")
  try:
    config = json.loads(meta["config"])
    eval_env = json.loads(meta["eval_env"]) if "eval_env" in meta else None
  except (TypeError, ValueError):
    raise UserError(f"{path} is a damaged policy file (its config or eval_env record is not "
                    f"JSON); {_EXPORT_HINT}") from None
  if eval_env is not None and not (isinstance(eval_env, dict)
                                   and isinstance(eval_env.get("id"), str)):
    raise UserError(f"{path} is a damaged policy file (its eval_env record is not an env spec); "
                    f"{_EXPORT_HINT}")
  return Policy(params=params, env_name=meta["env_name"], dataset=meta["dataset"],
                obs_dim=meta["obs_dim"], action_dim=meta["action_dim"], hidden_dims=hidden,
                log_std_min=float(meta["log_std_min"]), log_std_max=float(meta["log_std_max"]),
                action_low=np.asarray(meta["action_low"], np.float64),
                action_high=np.asarray(meta["action_high"], np.float64),
                action_dtype=meta["action_dtype"], seed=meta["seed"], epoch=meta["epoch"],
                config=config, source=path, eval_env=eval_env)
