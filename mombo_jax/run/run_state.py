"""A run's training state on disk, where JAX lives: the Orbax checkpointer of its folder
(checkpointer), the leftovers of a killed save removed (remove_leftovers), the typed template of
its CellState [S] (state_template) and a checkpoint restored against it (restore). The folder's
layout and names, config.json and the outputs: mombo_jax.records.workdir (no JAX, for the report).
"""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import List, Optional

import jax
import jax.numpy as jnp

from mombo_jax.core import buffer, dynamics, train as train_lib
from mombo_jax.core.key_scheme import cell_keys
from mombo_jax.env import envs
from mombo_jax.errors import UserError
from mombo_jax.records.workdir import Workdir
from mombo_jax.storage import checkpoint, checkpoint_files


def checkpointer(wd: Workdir, keep: Optional[int] = 3) -> checkpoint.RunCheckpointer:
  """The run's checkpoint.RunCheckpointer over wd.checkpoints (keep None: keep all, for
  reading)."""
  return checkpoint.RunCheckpointer(wd.checkpoints, keep=keep)


def remove_leftovers(wd: Workdir) -> List[str]:
  """Removes what a killed or failed launch left under wd.checkpoints before Orbax sees it: the
  unfinished checkpoint folders of a save (Orbax's *.orbax-checkpoint-tmp*) and the step folders
  of a delete of an old step cut off (checkpoint_files.leftovers); call only while holding the
  run's lock (wd.lock()). Returns one line per removal ("removed <path>, <what it was>")."""
  return checkpoint_files.remove_leftovers(wd.checkpoints)


def state_template(wd: Workdir, config=None):
  """jax.eval_shape of the run's CellState [S]: what its checkpoints restore against, built
  from wd's config.json (or `config`) and the env's dims alone: nothing is trained or read."""
  if config is None:
    config, _ = wd.read_config()
  obs_dim, act_dim = envs.OBS_DIM[config.env_name], envs.ACTION_DIM[config.env_name]
  # init reads only the real data's dims: one-row stand-ins.
  dims = dict(obs=obs_dim, action=act_dim, next_obs=obs_dim, obs_var=obs_dim,
              next_obs_mean=obs_dim, next_obs_var=obs_dim)
  real = buffer.Batch(**{f.name: jax.ShapeDtypeStruct((1, dims[f.name]) if f.name in dims
                                                      else (1,), jnp.float32)
                         for f in dataclasses.fields(buffer.Batch)})
  return jax.eval_shape(functools.partial(_init_cells, config=config, real=real, obs_dim=obs_dim,
                                          act_dim=act_dim), cell_keys(config)[1])


def _init_cells(keys, *, config, real, obs_dim, act_dim):
  """train.init_cells with untrained dynamics: what state_template traces."""
  dyn = jax.vmap(lambda k: dynamics.init_state(k, obs_dim, act_dim, config))(keys)
  return train_lib.init_cells(keys, config, real, dyn)


def restore(wd: Workdir, template=None, step: Optional[int] = None, partial: bool = False):
  """(state, checkpoint metadata) of wd's newest valid (or `step`'s) checkpoint, restored
  against `template` (default: state_template(wd)); partial: template is a sub-tree of the saved
  state (e.g. the actors only) and only its leaves are read. UserError when there is none or it
  cannot be read."""
  if not os.path.isdir(wd.checkpoints):
    raise UserError(f"{wd.path} has no checkpoints folder; pass a run workdir of "
                    "experiments.run that finished at least one evaluation.")
  if template is None:
    template = state_template(wd)
  ckpt = checkpointer(wd, keep=None)
  try:
    return ckpt.restore(template, step=step, partial=partial)
  except checkpoint.CheckpointError as e:
    raise UserError(str(e)) from None
  finally:
    ckpt.close()
