"""The tests' short forms of a launch (launch.train_runs with run_specs.RunSpecs and LaunchOptions):
one run alone (`train_run`), or several (`train_grid`), options as keywords."""
from mombo_jax.run import launch
from mombo_jax.run.run_specs import RunSpec


def train_run(config, dataset, workdir, dynamics_dir=None, **options):
  """One run alone: its summary, or None when options' stop_after ended the launch early."""
  return launch.train_runs([RunSpec(config, dataset, workdir, dynamics_dir)],
                      launch.LaunchOptions(**options))[0]


def train_grid(specs, **options):
  """Every run of `specs` in one launch: their summaries (None each when stopped early)."""
  return launch.train_runs(specs, launch.LaunchOptions(**options))
