"""The dataset a run trains on: loaded, or, when missing and the collector knows it by its short
name, built by experiments.collect in a child process (which a stop request is passed on to).
Errors are errors.UserError; a build the user stopped raises errors.Interrupted."""
import sys

from mombo_jax.data import names, provenance, transitions as transitions_lib
from mombo_jax.env import envs
from mombo_jax.errors import DatasetNotFoundError, Interrupted, UserError
from mombo_jax.run.console import log
from mombo_jax.signals import run_child


def load_or_build(dataset, config, build_missing, build_steps, download=False, require_full=False,
                  should_stop=None):
  """Transitions of `dataset`; a missing dataset that the collector knows by its short name is
  built with `build_steps` per recorded dataset when build_missing is True (any quality: random,
  the SAC qualities, the mixed ones) or "random" (random datasets only: the quick/tiny presets'
  default, as the others need an online SAC run first). A reduced build of a recipe (fewer
  transitions than its recipe's size) is refused when require_full. should_stop: the launch's
  StopFlag; a build it stopped raises errors.Interrupted (the collector keeps its progress)."""
  try:
    transitions = transitions_lib.load_transitions(dataset, download=download)
  except DatasetNotFoundError as e:
    try:
      quality = names.parse_name(dataset)[1]
    except ValueError:
      quality = None                  # a Minari id: nothing here can build it
    if not quality or not (build_missing is True or (build_missing and quality == "random")):
      hint = ("" if not quality or quality == "random" else
              " Or pass build_missing=True to have this run build it (an online SAC run first).")
      raise UserError(str(e) + hint, params=("build_missing",)) from None
    recipe = "mixed" if quality.endswith("pct") else quality
    sac = "" if quality == "random" else (
        "; it needs an online SAC run up to its medium point (about 20 minutes for hopper on a "
        "2-core CPU)" + (" and on to 1M steps for the expert (hours)" if "expert" in quality
                         else ""))
    log(f"Dataset {dataset} is missing: building it locally with the collector "
        f"({build_steps} steps per recorded dataset{sac}).")
    full = provenance.RECIPE_STEPS.get(recipe)
    if full and build_steps < min(full, 1_000_000):
      log(f"note: this is a REDUCED build of {dataset} ({build_steps} steps per recorded dataset "
          "where the recipe has 1M); paper-preset runs will refuse it until it is rebuilt with "
          f"`python -m experiments.collect --env={dataset} --overwrite`.")
    # A separate process: experiments.collect defines absl flags of its own.
    cmd = [sys.executable, "-m", "experiments.collect", f"--env={dataset}",
           f"--steps={build_steps}", f"--seed={config.seed}"]
    code = run_child(cmd, should_stop)
    # The collector checkpoints and stops on Ctrl-C (one process group) or the stop passed on.
    signum = (getattr(should_stop, "signum", None) if should_stop is not None and should_stop()
              else (-code if code < 0 else code - 128 if code in (130, 143) else None))
    if signum:
      raise Interrupted(signum, f"building {dataset} (the collector resumes from its "
                        "checkpoint)") from None
    if code != 0:
      raise UserError(f"Building {dataset} failed: {' '.join(cmd)}") from None
    transitions = transitions_lib.load_transitions(dataset)
  except ValueError as e:
    raise UserError(f"dataset={dataset}: {e}", params=("dataset",)) from None
  small = provenance.smaller_than_recipe(dataset)
  if small and require_full:
    raise UserError(small + " (paper settings expect the full dataset)")
  if small:
    log(f"note: {small.split(' Rebuild')[0]} Training on it as asked.")
  env = config.env_name
  if transitions.actions.shape[1] != envs.ACTION_DIM[env] or \
      transitions.observations.shape[1] != envs.OBS_DIM[env]:
    raise UserError(f"Dataset {dataset} has obs dim {transitions.observations.shape[1]} and action "
                    f"dim {transitions.actions.shape[1]}, but {env} needs {envs.OBS_DIM[env]} and "
                    f"{envs.ACTION_DIM[env]}; check `dataset` / `env`.", params=("dataset", "env"))
  return transitions
