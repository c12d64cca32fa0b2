"""What the harness puts around the reference's code (torch side), each piece named in the output:
their random draws answered with ours, their float32 casts read as float64 in the float64 run, and
the recorders that read their intermediates (gradients as their optimiser steps see them, targets
and penalties). None of it changes their arithmetic.
"""
from __future__ import annotations

import contextlib
import types
from typing import Dict, List

import numpy as np
import torch
import torch.distributions.normal as torch_normal

DTYPES = {"float32": torch.float32, "float64": torch.float64}

DRAWS_NOTE = ("their random draws (torch.distributions.normal._standard_normal, which "
              "Normal.rsample calls, and torch.randn_like) answered, call by call and "
              "shape-checked, with the draws our keys made (ours.draws)")


@contextlib.contextmanager
def our_draws(queue: List[np.ndarray], dtype):
  """Within: their standard-normal draws pop `queue` in order (shape-checked); all must be used."""
  queue = list(queue)

  def pop(shape):
    if not queue:
      raise AssertionError(f"their code drew {tuple(shape)} beyond the draws our step made")
    eps = queue.pop(0)
    if tuple(eps.shape) != tuple(shape):
      raise AssertionError(f"their draw {tuple(shape)} met our draw {eps.shape}: the order of "
                           "draws differs")
    return torch.as_tensor(np.asarray(eps), dtype=dtype)

  def standard_normal(shape, dtype=None, device=None):
    return pop(shape)

  def randn_like(x, **kwargs):
    return pop(x.shape)

  saved = torch_normal._standard_normal, torch.randn_like
  torch_normal._standard_normal, torch.randn_like = standard_normal, randn_like
  try:
    yield
  finally:
    torch_normal._standard_normal, torch.randn_like = saved
  if queue:
    raise AssertionError(f"their step left {len(queue)} of our draws unused")


class _Torch64(types.ModuleType):
  """`torch` with torch.float32 reading as torch.float64 (for a module's global name `torch`)."""

  def __init__(self):
    super().__init__("torch")
    self.float32 = torch.float64

  def __getattr__(self, name):
    return getattr(torch, name)


def float64_casts(modules) -> str:
  """Point each module's `torch` at _Torch64; returns the output's line naming them."""
  for module in modules:
    module.torch = _Torch64()
  names = ", ".join(m.__name__ for m in modules)
  return (f"float64 run: torch.float32 read as torch.float64 in {names} (their forward passes cast "
          "inputs to float32; nothing else changes)")


def float64_default() -> str:
  """torch's default dtype float64 (for the float64 run); returns the output's line."""
  torch.set_default_dtype(torch.float64)
  return ("float64 run: torch's default dtype float64 (adinlab/MOMBO policies/mombo.py:173 "
          "`(1 - terminals * 1.0)` makes a bool tensor a default-dtype one, float32 otherwise, "
          "which rounded gamma to float32's 0.99 + 9.5e-9 on the model rows' targets)")


def record_grads(optim, named: Dict[str, torch.nn.Parameter], into: dict):
  """Wrap optim.step so that it first copies the gradients of `named` into `into` (name ->
  array), as that step sees them."""
  step = optim.step

  def recorded(*args, **kwargs):
    for name, p in named.items():
      if p.grad is not None:
        into[name] = p.grad.detach().numpy().copy()
    return step(*args, **kwargs)

  optim.step = recorded


def record_targets(modules: Dict[str, torch.nn.Module], elements: int, into: dict):
  """The Bellman target y each critic regresses on, read from its loss's gradient: the first call
  of each critic in a learn() is its loss's Q (their code: critics(obs, actions) first), and for
  a loss mean((Q - y)^2) over `elements` entries dL/dQ = 2 (Q - y) / elements. into['y_<name>']
  gets y [B]; clear `into` before each learn()."""
  def hook(name):
    def forward_hook(module, inputs, output):
      q = output[0] if isinstance(output, tuple) else output
      if f"q_{name}" in into or not q.requires_grad:
        return
      into[f"q_{name}"] = q.detach().numpy().copy()

      def grad_hook(g):
        into[f"y_{name}"] = (into[f"q_{name}"] - g.detach().numpy() * (elements / 2.0))[:, 0]
      q.register_hook(grad_hook)
    return forward_hook

  for name, module in modules.items():
    module.register_forward_hook(hook(name))


def copy_into(named: Dict[str, torch.nn.Parameter], arrays: Dict[str, np.ndarray]):
  """Their parameters set to ours (same names: ours.actor_arrays / critic_arrays)."""
  if set(named) != set(arrays):
    raise AssertionError(f"parameter names differ: {sorted(set(named) ^ set(arrays))}")
  with torch.no_grad():
    for name, p in named.items():
      if tuple(p.shape) != arrays[name].shape:
        raise AssertionError(f"{name}: theirs {tuple(p.shape)}, ours {arrays[name].shape}")
      p.copy_(torch.as_tensor(np.array(arrays[name]), dtype=p.dtype))   # a writable copy


def arrays(named: Dict[str, torch.nn.Parameter]) -> Dict[str, np.ndarray]:
  return {name: p.detach().numpy().copy() for name, p in named.items()}


def linear(prefix: str, layers) -> Dict[str, torch.nn.Parameter]:
  """{'<prefix>.<i>.weight', '<prefix>.<i>.bias'} of nn.Linear layers in call order."""
  out = {}
  for i, layer in enumerate(layers):
    out[f"{prefix}.{i}.weight"] = layer.weight
    out[f"{prefix}.{i}.bias"] = layer.bias
  return out


def linears(sequential):
  """The nn.Linear layers of an nn.Sequential (their MLP: Linear, ReLU, Linear, ReLU, ...)."""
  return [m for m in sequential if isinstance(m, torch.nn.Linear)]
