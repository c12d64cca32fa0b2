"""A run from Python in one call, and experiments.run's own path: `fit` (mombo_jax.fit) plans the
runs (`plan`: one RunSpec, or a --datasets x --betas grid of them) and launches them
(`fit_runs`: LaunchOptions from the preset and the options, then launch.train_runs). Its
parameters are experiments.run's flags under their Python names; anything else is a setting
(config.make_config's override: epochs=, beta=, target=, ...).

    import mombo_jax
    summary = mombo_jax.fit("hopper-random", algo="mombo", preset="tiny", workdir="runs/try")
    print(summary["final_normalized_score_mean"])

(The function is `fit`, as d3rlpy and scikit-learn call theirs; no function is called plain
`train`, tests/test_names.py: the launch is launch.train_runs.)
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Union

from mombo_jax.errors import UserError
from mombo_jax.records.workdir import run_dir
from mombo_jax.run import launch
from mombo_jax.run.compilation_cache import enable_compilation_cache
from mombo_jax.run.run_specs import RunSpec, plan_runs
from mombo_jax.settings import config as config_lib
from mombo_jax.signals import StopFlag


def fit(env: str = "hopper-random", algo: str = "mombo", *, dataset: Optional[str] = None,
        datasets: Optional[Sequence[str]] = None, betas: Optional[Sequence[float]] = None,
        preset: str = "paper", seeds: Optional[int] = None, seed: int = 0,
        workdir: Optional[str] = None, dynamics_dir: Optional[str] = None,
        build_missing: Union[bool, str, None] = None, build_steps: Optional[int] = None,
        download: bool = False, keep_checkpoints: int = 3, allow_small_dataset: bool = False,
        allow_epochs_change: bool = False, stop_after: Optional[int] = None,
        log: Union[str, Sequence[str]] = ("csv",), eval_workers: int = 0,
        compilation_cache: Optional[str] = None, should_stop: Optional[StopFlag] = None,
        **settings) -> Union[Optional[dict], List[Optional[dict]]]:
  """Trains `algo` on `env`'s dataset (or `dataset`) and returns the run's summary (summary.json's
  content); with `datasets` / `betas`, a grid of runs in one program, and a list of summaries in
  their order (datasets x betas). None for a launch that `stop_after` ended early (the same call
  resumes it).

  env: a short dataset name (its paper settings and evaluation env); algo: a registered name or
  MODULE:NAME; preset: "paper" | "quick" | "tiny"; seeds: how many (default the preset's), from
  `seed`; workdir: the run's folder (default runs/<dataset>/<algo>[-target]/s<seed>x<seeds>; for
  a grid, the root of its cells'); the launch options after it are experiments.run's flags of the
  same names (docs/training.md), compilation_cache a folder (default: JAX's as configured),
  should_stop a signals.StopFlag. Every other keyword is a setting (config.make_config's
  overrides: epochs, beta, target, reference, ...). Bad values raise errors.UserError (or
  ValueError naming the setting) before any work."""
  specs = plan(env, algo, dataset=dataset, datasets=datasets, betas=betas, preset=preset,
               seeds=seeds, seed=seed, workdir=workdir, dynamics_dir=dynamics_dir, **settings)
  summaries = fit_runs(
      specs, preset, build_missing=build_missing, build_steps=build_steps, download=download,
      keep_checkpoints=keep_checkpoints, allow_small_dataset=allow_small_dataset,
      allow_epochs_change=allow_epochs_change, stop_after=stop_after, log=log,
      eval_workers=eval_workers, compilation_cache=compilation_cache, should_stop=should_stop)
  return summaries if datasets is not None or betas is not None else summaries[0]


def plan(env: str = "hopper-random", algo: str = "mombo", *, dataset: Optional[str] = None,
         datasets: Optional[Sequence[str]] = None, betas: Optional[Sequence[float]] = None,
         preset: str = "paper", seeds: Optional[int] = None, seed: int = 0,
         workdir: Optional[str] = None, dynamics_dir: Optional[str] = None,
         **settings) -> List[RunSpec]:
  """The RunSpecs `fit` trains: one (dataset default env; workdir default workdir.run_dir under
  runs/), or with datasets / betas a grid (run_specs.plan_runs under workdir, default runs/).
  ValueError from config.make_config for a bad setting of one run (experiments.run names its
  flag); UserError otherwise."""
  grid = datasets is not None or betas is not None
  if grid and (dataset is not None or "beta" in settings):
    raise UserError("pass `dataset` / `beta` for one run, or `datasets` / `betas` for a grid, "
                    "not both.", params=("dataset", "beta", "datasets", "betas"))
  overrides = dict(settings, seed=seed)
  if seeds is not None:                  # else the preset's (config.PRESETS)
    overrides["num_seeds"] = seeds
  if grid:
    return plan_runs(env, algo, preset, overrides, datasets, betas, workdir or "runs",
                     dynamics_dir)
  config = config_lib.make_config(env, algo, preset, **overrides)
  dataset = dataset or env
  workdir = workdir or run_dir("runs", dataset, algo, config.target, seed, config.num_seeds,
                               reference=config.reference, moments=config.agent.moments)
  return [RunSpec(config, dataset, workdir, dynamics_dir)]


def fit_runs(specs: Sequence[RunSpec], preset: str = "paper", *,
             build_missing: Union[bool, str, None] = None, build_steps: Optional[int] = None,
             download: bool = False, keep_checkpoints: int = 3, allow_small_dataset: bool = False,
             allow_epochs_change: bool = False, stop_after: Optional[int] = None,
             log: Union[str, Sequence[str]] = ("csv",), eval_workers: int = 0,
             compilation_cache: Optional[str] = None, should_stop: Optional[StopFlag] = None
             ) -> List[Optional[dict]]:
  """Launches `specs` (launch.train_runs) with the preset's dataset rules (build_missing,
  build_steps and require_full unless given: config.PRESETS) and the options; returns their
  summaries. compilation_cache: JAX's persistent compilation cache folder ("" off; None: as JAX
  is configured)."""
  p = config_lib.PRESETS[preset]
  options = launch.LaunchOptions(
      build_missing=p.build_missing if build_missing is None else build_missing,
      build_steps=build_steps or p.build_steps, keep=keep_checkpoints, stop_after=stop_after,
      download=download, require_full=p.require_full and not allow_small_dataset,
      allow_epochs_change=allow_epochs_change, should_stop=should_stop, log_to=log,
      eval_workers=eval_workers)
  if compilation_cache is not None:
    enable_compilation_cache(compilation_cache)
  return launch.train_runs(specs, options)
