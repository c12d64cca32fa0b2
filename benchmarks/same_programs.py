"""Programs unchanged by a refactor of the core: the jaxpr of one training epoch, traced by two
checkouts of the code, is the same text for every algorithm, plain and over cells.

  python3 benchmarks/same_programs.py --base=/path/to/older/checkout --new=.

Each checkout traces (PYTHONPATH=<checkout>, in a process of its own; no compilation: about a
minute of CPU each, 8 min wall on issue #50's shared 2-core machine) train.make_epoch on a tiny
hopper-shaped problem for MOMBO lcb / elite_spread / mixture, MOBILE, MOPO and a registered
record whose reward penalty is its own function, each as the plain program (one dataset, the
config's settings) and as the program over two cells that carry their own rollout length, real
ratio and auto_alpha (train.Cell), traced from the EpochSettings make_cells_chunk traces it from.
The same jaxpr lowers to the same XLA program, so a run gives the same bits; a refactor that only
renames or regroups code shows here in minutes of CPU, where benchmarks/same_runs.py trains runs.
Prints one line per program and exits 1 on any difference.
"""
import argparse
import os
import subprocess
import sys

_TRACE = r"""
import hashlib
import jax, jax.numpy as jnp, numpy as np
from mombo_jax.core import algorithms, buffer, dynamics, targets, train
from mombo_jax.core.epoch_settings import epoch_settings
from mombo_jax.settings import config as config_lib

def half(agent, batch, key, *, dyn, config, term_fn=None):
  return 0.5 + jnp.abs(batch.action[:, 0])

try:
  record = algorithms.Algorithm("toy_half", targets.mopo, half, penalise_reward=True,
                                references="mopo")
except TypeError:                    # code from before the spelling penalise_reward
  record = algorithms.Algorithm("toy_half", targets.mopo, half, penalize_reward=True,
                                references="mopo")
algorithms.register(record)
S, A, N = 11, 3, 300
rng = np.random.default_rng(0)
f = lambda *s: rng.normal(size=s).astype(np.float32)
real = buffer.Batch(obs=f(N, S), action=f(N, A), reward=f(N), next_obs=f(N, S),
                    done=np.zeros((N,), np.float32), obs_var=np.zeros((N, S), np.float32),
                    next_obs_mean=f(N, S), next_obs_var=np.abs(f(N, S)), reward_mean=f(N),
                    reward_var=np.abs(f(N)))
for algo, target in [("mombo", "lcb"), ("mombo", "elite_spread"), ("mombo", "mixture"),
                     ("mobile", None), ("mopo", None), ("toy_half", None)]:
  cfg = config_lib.make_config("hopper-random", algo, preset="tiny", steps_per_epoch=3,
                               rollout_batch_size=16, epochs=2,
                               **(dict(target=target) if target else {}))
  dyn = dynamics.init_state(jax.random.PRNGKey(0), S, A, cfg)
  state = train.init(jax.random.PRNGKey(1), cfg, real, dyn)
  plain = jax.make_jaxpr(train.make_epoch(cfg))(state, real, jax.random.PRNGKey(2))
  # The cells' program as make_cells_chunk builds it: the settings they carry are None in its
  # EpochSettings.
  stacked, cells = train.single_dataset(real, cfg, 2)
  per_cell = ("rollout_length", "real_ratio", "auto_alpha")
  over_cells = jax.vmap(train.make_epoch(epoch_settings(cfg, per_cell), per_cell),
                        in_axes=(0, None, 0, 0))
  cells_jaxpr = jax.make_jaxpr(over_cells)(jax.tree.map(lambda x: jnp.stack([x, x]), state),
                                           stacked, jax.random.split(jax.random.PRNGKey(2), 2),
                                           cells)
  for mode, jaxpr in (("plain", plain), ("cells", cells_jaxpr)):
    text = str(jaxpr)
    print(f"{algo}{'-' + target if target else ''} {mode}",
          hashlib.sha256(text.encode()).hexdigest(), len(text), flush=True)
"""


def _trace(code_root) -> dict:
  env = dict(os.environ, PYTHONPATH=os.path.abspath(code_root), JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "-c", _TRACE], check=True, env=env, capture_output=True,
                       text=True, cwd=os.path.abspath(code_root)).stdout
  rows = [line.rsplit(" ", 2) for line in out.splitlines() if line.strip()]
  return {name: (digest, int(size)) for name, digest, size in rows}


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--base", required=True, help="the older checkout (e.g. a worktree of ffc5631)")
  p.add_argument("--new", default=".", help="the newer checkout")
  args = p.parse_args()
  base, new = _trace(args.base), _trace(args.new)
  differ = 0
  for name in base:
    same = new.get(name) == base[name]
    differ += not same
    print(f"{name}: " + (f"the same jaxpr ({base[name][1]} characters)" if same else
                         f"jaxprs differ ({base[name][1]} vs {new.get(name, (0, 0))[1]} chars)"))
  print(f"{len(base) - differ} of {len(base)} programs the same")
  return 1 if differ or set(new) != set(base) else 0


if __name__ == "__main__":
  sys.exit(main())
