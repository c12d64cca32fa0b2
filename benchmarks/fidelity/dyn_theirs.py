"""The references' side of the dynamics and rollout comparisons (dynamics_side.py): their
EnsembleDynamics, EnsembleDynamicsModel, StandardScaler, termination functions, rollouts and
replay buffers, imported UNCHANGED from --reference (adinlab/MOMBO for mombo, OfflineRL-Kit for
mobile and mopo), built with our weights and fed the draws our keys made (dyn_ours).

Nothing of their code is copied or edited. What is replaced, each while one of their calls runs
and listed by `load` / `float64_stubs` (every record prints the lines):
- imports: gym (an empty module: annotations and a file the dynamics never run), and for
  OfflineRL-Kit torch.utils.tensorboard (SummaryWriter: their logger's, never constructed here);
- their draws: `torch.utils.data.random_split` (the train / holdout split), `np.random.randint`
  (the bootstrap), `np.random.uniform` (the per-epoch reshuffle), `np.random.normal` (the
  rollout's noise) and `np.random.choice` (the elite per row) return what our keys drew, through
  a stand-in for the `np` / `torch` names of their module, which forwards everything else;
- float64 only: the same stand-in reads `torch.float32` (their model's input cast,
  models/dynamics_model.py `forward`) and `np.float32` (their step's sample and penalty casts) as
  float64; their model is `.double()`-ed;
- their Logger: an object with its five methods as no-ops and a temporary model_dir.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
import tempfile
import types

import numpy as np

# --algo -> the reference it is compared with (MOMBO's targets share its dynamics and rollout).
REFERENCES = {"mombo": "adinlab/MOMBO", "mombo-lcb": "adinlab/MOMBO", "mobile": "OfflineRL-Kit",
              "mopo": "OfflineRL-Kit"}


class Stand(types.ModuleType):
  """A module's stand-in: the names given, everything else read from `base`."""

  def __init__(self, base, **names):
    super().__init__(base.__name__)
    self._base = base
    self.__dict__.update(names)

  def __getattr__(self, name):
    return getattr(self._base, name)


@contextlib.contextmanager
def standing(module, **names):
  """module's globals `names` (e.g. np=Stand(np, random=...)) replaced while the block runs."""
  old = {k: module.__dict__[k] for k in names}
  module.__dict__.update(names)
  try:
    yield
  finally:
    module.__dict__.update(old)


def _stub_imports(kit: bool):
  """Installs the import stubs where the real modules are missing (once per process; a stub is a
  module without a file) and returns a line for each stub in use."""
  notes = []
  if "gym" not in sys.modules and importlib.util.find_spec("gym") is None:
    names = ["gym", "gym.envs", "gym.envs.mujoco", "gym.envs.mujoco.mujoco_env"]
    for parent, name in zip([None] + names, names):
      sys.modules[name] = types.ModuleType(name)
      if parent:
        setattr(sys.modules[parent], name.rsplit(".", 1)[1], sys.modules[name])
    sys.modules["gym"].spaces = types.SimpleNamespace(Space=object)
    sys.modules["gym"].Env = object
  if "gym" in sys.modules and getattr(sys.modules["gym"], "__file__", None) is None:
    env = sys.modules["gym"].envs.mujoco.mujoco_env
    env.MujocoEnv = getattr(env, "MujocoEnv", object)
    notes.append("gym: an empty module (gym.spaces.Space, gym.Env: annotations; "
                 "gym.envs.mujoco.mujoco_env.MujocoEnv: an annotation of OfflineRL-Kit's "
                 "mujoco_oracle_dynamics.py, never run here)")
  board = "torch.utils.tensorboard"
  if kit and board not in sys.modules and importlib.util.find_spec("tensorboard") is None:
    sys.modules[board] = types.ModuleType(board)
    sys.modules[board].SummaryWriter = object
  if kit and board in sys.modules and getattr(sys.modules[board], "__file__", None) is None:
    notes.append("torch.utils.tensorboard: a module with SummaryWriter = object (imported by "
                 "offlinerlkit/utils/logger.py; tensorboard is not installed; never constructed)")
  return notes


def load(algo: str, path: str):
  """(namespace of their modules: ens (ensemble_dynamics), model (dynamics_model), scaler, term
  (termination_fns), buffer, rollout (the policy class whose `rollout` we call); [stub lines])."""
  algo = algo.split("-")[0]
  kit = algo != "mombo"
  notes = _stub_imports(kit)
  sys.path.insert(0, os.path.abspath(path))
  if kit:
    names = dict(ens="offlinerlkit.dynamics.ensemble_dynamics",
                 model="offlinerlkit.modules.dynamics_module", nets="offlinerlkit.nets",
                 scaler="offlinerlkit.utils.scaler", term="offlinerlkit.utils.termination_fns",
                 buffer="offlinerlkit.buffer.buffer",
                 policy=f"offlinerlkit.policy.model_based.{algo}")
  else:
    names = dict(ens="dynamics.ensemble_dynamics", model="models.dynamics_model",
                 nets="models.nets", scaler="utils.scaler", term="utils.termination_fns",
                 buffer="utils.buffer", policy="policies.mombo")
  mods = types.SimpleNamespace(**{k: importlib.import_module(v) for k, v in names.items()})
  for name, module in vars(mods).items():
    if not os.path.realpath(module.__file__).startswith(os.path.realpath(path)):
      raise SystemExit(f"their module {names[name]} was imported from {module.__file__}, not from "
                       f"{path}: another package of that name is on sys.path first; run the "
                       "harness in a fresh process")
  mods.rollout = {"mombo": "MOMBOPolicy", "mobile": "MOBILEPolicy",
                  "mopo": "MOPOPolicy"}[algo]
  mods.rollout = getattr(mods.policy, mods.rollout).rollout
  notes.append("their draws (random_split, np.random.randint / uniform / normal / choice) return "
               "what our keys drew, through a stand-in for their module's np / torch name")
  return mods, notes


def float64_stubs():
  return ["float64: torch.float32 in their model's forward (its input cast; MOMBO "
          "models/dynamics_model.py:87, OfflineRL-Kit offlinerlkit/modules/dynamics_module.py:87) "
          "and np.float32 in their EnsembleDynamics.step (the sample and penalty casts) read as "
          "float64, their model .double()-ed"]


# ---------------------------------------------------------------------------- their objects

def _layers(model):
  """Their EnsembleLinear layers under our parameter names (layer_i, out)."""
  return {**{f"layer_{i}": layer for i, layer in enumerate(model.backbones)},
          "out": model.output_layer}


def put_params(model, params):
  """Our EnsembleDynamics params into their EnsembleDynamicsModel. The layouts agree but for the
  bias: our vmapped Dense kernel is [M, in, out] as their EnsembleLinear weight; our bias [M, out]
  is their [M, 1, out]. Their saved_weight / saved_bias (the snapshots) get the same values, as
  their __init__ copies the initial weights."""
  import torch
  for name, layer in _layers(model).items():
    kernel = np.asarray(params["members"][name]["kernel"])
    bias = np.asarray(params["members"][name]["bias"])[:, None, :]
    for attr, value in (("weight", kernel), ("saved_weight", kernel), ("bias", bias),
                        ("saved_bias", bias)):
      getattr(layer, attr).data = torch.as_tensor(value.copy(), dtype=getattr(layer, attr).dtype)
  for attr in ("max_logvar", "min_logvar"):
    getattr(model, attr).data = torch.as_tensor(np.asarray(params[attr]).copy(),
                                                dtype=getattr(model, attr).dtype)


def get_params(model):
  """Their model's current parameters in our tree layout (numpy)."""
  members = {name: {"kernel": layer.weight.detach().numpy().copy(),
                    "bias": layer.bias.detach().numpy()[:, 0, :].copy()}
             for name, layer in _layers(model).items()}
  return {"members": members, "max_logvar": model.max_logvar.detach().numpy().copy(),
          "min_logvar": model.min_logvar.detach().numpy().copy()}


def build(mods, cfg, params, dtype: str, penalty_coef: float = 0.0):
  """Their EnsembleDynamics as their train scripts build it (adinlab/MOMBO train.py,
  OfflineRL-Kit run_example/run_mopo.py / run_mobile.py: Adam over model.parameters() at the
  dynamics lr, a StandardScaler, the task's termination function; MOPO's penalty_coef = beta),
  with our params."""
  import torch
  shape, training = cfg.dynamics, cfg.dynamics_training
  model = mods.model.EnsembleDynamicsModel(
      obs_dim=params["max_logvar"].shape[0] - 1,
      action_dim=params["members"]["layer_0"]["kernel"].shape[1] - params["max_logvar"].shape[0]
      + 1, hidden_dims=list(shape.dyn_hidden), num_ensemble=shape.dyn_members,
      num_elites=shape.dyn_elites, weight_decays=list(training.dyn_weight_decay), device="cpu")
  if dtype == "float64":
    model = model.double()
  put_params(model, params)
  optim = torch.optim.Adam(model.parameters(), lr=training.dyn_lr)
  term = mods.term.get_termination_fn(task=cfg.env_name)
  return mods.ens.EnsembleDynamics(model, optim, mods.scaler.StandardScaler(), term,
                                   penalty_coef=penalty_coef)


def their_np(dtype: str, **random):
  """A stand-in for their module's `np`: np.random's named samplers replaced by `random`, and in
  float64 runs np.float32 read as float64 (their step's casts)."""
  casts = {"float32": np.float64} if dtype == "float64" else {}
  return Stand(np, random=Stand(np.random, **random), **casts)


def model_names(dtype: str) -> dict:
  """Their model module's globals for a float64 run: torch.float32 (forward's input cast) read as
  float64; nothing in float32."""
  import torch
  return {"torch": Stand(torch, float32=torch.float64)} if dtype == "float64" else {}


# ------------------------------------------------------------------------------- their training

def _data(transitions, dtype):
  """Their train(data) dict (their buffer's sample_all: rewards [N, 1])."""
  return {"observations": np.asarray(transitions.observations, dtype),
          "actions": np.asarray(transitions.actions, dtype),
          "next_observations": np.asarray(transitions.next_observations, dtype),
          "rewards": np.asarray(transitions.rewards, dtype).reshape(-1, 1)}


def _training_draws(trace, positions, reorder):
  """Their train()'s three samplers, returning our draws: random_split -> our split; randint ->
  epoch 1's bootstrap order (positions in the training split); uniform -> values whose argsort
  reshuffles epoch e's order into epoch e + 1's (after the last epoch: any)."""
  calls = {"uniform": 0}

  def random_split(rows, sizes):
    assert tuple(sizes) == (len(trace.train_idx), len(trace.holdout_idx)), sizes
    return (types.SimpleNamespace(indices=trace.train_idx.tolist()),
            types.SimpleNamespace(indices=trace.holdout_idx.tolist()))

  def randint(high, size):
    assert tuple(size) == positions[0].shape and high == positions[0].shape[1], (high, size)
    return positions[0].copy()

  def uniform(size):
    e = calls["uniform"]
    calls["uniform"] += 1
    if e + 1 >= len(positions):
      return np.random.default_rng(e).uniform(size=size)
    p = reorder(positions[e], positions[e + 1])
    u = np.empty(p.shape)
    np.put_along_axis(u, p, np.broadcast_to(np.arange(p.shape[1], dtype=float), p.shape), axis=1)
    return u
  return random_split, randint, uniform


def _recording(dyn, coef: float, kept_step):
  """Wraps dyn's learn, validate and model.update_save (instance attributes over their methods,
  which run unchanged) to record into the returned dict: losses[e][b] (the loss terms of
  minibatch b before its Adam step: their learn's loss, the decay by their get_decay_loss, the
  logvar-bound term, nll the rest), params[k] (after Adam step k where kept_step(k, n_batches)),
  holdout_mse[e] (their validate), kept[e] (the members their update_save snapshots). Their learn
  is called once per minibatch, on that minibatch: the same slices and steps as one call."""
  import torch
  rec = dict(losses=[], params={}, holdout_mse=[], kept=[])
  learn, validate, update_save = dyn.learn, dyn.validate, dyn.model.update_save

  def learn_by_batch(inputs, targets, batch_size, logvar_loss_coef):
    losses, n_batches = [], -(-inputs.shape[1] // batch_size)
    for start in range(0, inputs.shape[1], batch_size):
      m = dyn.model
      with torch.no_grad():
        decay = float(m.get_decay_loss())
        bound = float(coef * m.max_logvar.sum() - coef * m.min_logvar.sum())
      total = learn(inputs[:, start:start + batch_size], targets[:, start:start + batch_size],
                    batch_size, logvar_loss_coef)
      losses.append(dict(total=total, nll=total - decay - bound, decay=decay,
                         logvar_bound=bound))
      k = len(rec["losses"]) * n_batches + len(losses)
      if kept_step(k, n_batches):
        rec["params"][k] = get_params(m)
    rec["losses"].append(losses)
    return float(np.mean([x["total"] for x in losses]))

  def validate_recorded(inputs, targets):
    out = validate(inputs, targets)
    rec["holdout_mse"].append(np.asarray(out))
    rec["kept"].append(np.zeros(len(out), bool))
    return out

  def update_save_recorded(indexes):
    rec["kept"][-1][indexes] = True
    return update_save(indexes)

  dyn.learn, dyn.validate = learn_by_batch, validate_recorded
  dyn.model.update_save = update_save_recorded
  return rec


def train_epochs(mods, dyn, cfg, transitions, trace, positions, reorder, kept_step, dtype):
  """Their EnsembleDynamics.train for len(positions) epochs (max_epochs) on our split and
  orders (_training_draws), recorded (_recording). Returns the record (as dyn_ours
  .TrainingTrace's fields) with their final model's params, elites and scaler."""
  import torch
  training = cfg.dynamics_training
  rec = _recording(dyn, training.dyn_logvar_coef, kept_step)
  split, randint, uniform = _training_draws(trace, positions, reorder)
  their_torch = Stand(torch, utils=types.SimpleNamespace(
      data=types.SimpleNamespace(random_split=split)))
  with tempfile.TemporaryDirectory() as tmp, \
      standing(mods.ens, np=their_np(dtype, randint=randint, uniform=uniform), torch=their_torch), \
      standing(mods.model, **model_names(dtype)):
    logger = types.SimpleNamespace(log=_none, logkv=_none, set_timestep=_none, dumpkvs=_none,
                                   model_dir=tmp)
    dyn.train(_data(transitions, dtype), logger, max_epochs=len(positions),
              max_epochs_since_update=training.dyn_patience, batch_size=training.dyn_batch_size,
              holdout_ratio=training.dyn_holdout_ratio, logvar_loss_coef=training.dyn_logvar_coef)
  rec.update(final=get_params(dyn.model), elites=dyn.model.elites.data.numpy().copy(),
             mu=dyn.scaler.mu[0], std=dyn.scaler.std[0])
  return rec


def _none(*args, **kwargs):
  return None


def predict(mods, dyn, obs, action, dtype):
  """Their model's Gaussians on rows, as their step computes them before sampling (scaler,
  forward, `mean[..., :-1] += obs`, exp): next_obs_mean, next_obs_var [M, B, S], reward_mean,
  reward_var [M, B]."""
  import torch
  with standing(mods.model, **model_names(dtype)), torch.no_grad():
    mean, logvar = dyn.model(dyn.scaler.transform(np.concatenate([obs, action], axis=-1)))
  mean, var = mean.numpy(), np.exp(logvar.numpy())
  return mean[..., :-1] + obs, var[..., :-1], mean[..., -1], var[..., -1]


# -------------------------------------------------------------------------------- their rollout

def rollout(mods, dyn, cfg, start_obs, policy, elite, noise, dtype):
  """Their policy's rollout(start_obs, K) (MOMBOPolicy / MOBILEPolicy / MOPOPolicy.rollout) with
  `policy(obs) -> action` as select_action and their dynamics.step fed our draws: per step and
  row, our elite [K, R] (np.random.choice) and our noise [K, R, O] at [elite, row] of the
  [M, B, O] array np.random.normal returns (NaN elsewhere: a use of another member's noise would
  show). Their rollout drops ended branches; `rows` [K] tracks which of our R branches each of
  their rows is. Returns (their transitions, rows, their per-step info dicts, their buffer's
  arrays after add_batch)."""
  state = {"t": 0, "rows": np.arange(start_obs.shape[0])}
  rows, infos = [], []
  step = dyn.step

  def step_with_our_draws(obs, action):
    t, idx = state["t"], state["rows"]
    full = np.full((cfg.dynamics.dyn_members, len(idx), noise.shape[-1]), np.nan)
    full[elite[t, idx], np.arange(len(idx))] = noise[t, idx]

    def normal(size):
      assert tuple(size) == full.shape, size
      return full

    def choice(elites, size):
      assert size == len(idx) and set(elite[t, idx]) <= set(np.asarray(elites).tolist())
      return elite[t, idx]
    with standing(mods.ens, np=their_np(dtype, normal=normal)), \
        standing(mods.model, np=their_np("float32", choice=choice), **model_names(dtype)):
      out = step(obs, action)
    rows.append(idx)
    infos.append(out[-1])
    state["t"], state["rows"] = t + 1, idx[~np.asarray(out[-2]).reshape(-1)]
    return out

  dyn.step = step_with_our_draws
  them = types.SimpleNamespace(dynamics=dyn, select_action=lambda obs, deterministic=False:
                               policy(obs))
  transitions, _ = mods.rollout(them, start_obs, cfg.rollout.rollout_length)
  dyn.step = step
  n_rows = len(transitions["obss"])
  buf = mods.buffer.ReplayBuffer(buffer_size=n_rows, obs_shape=(start_obs.shape[1],),
                                 obs_dtype=np.float32, action_dim=transitions["actions"].shape[1],
                                 action_dtype=np.float32)
  buf.add_batch(**transitions)
  stored = {k: v[:n_rows].copy() for k, v in vars(buf).items()
            if isinstance(v, np.ndarray) and v.ndim >= 1 and len(v) == n_rows}
  return transitions, rows, infos, stored
