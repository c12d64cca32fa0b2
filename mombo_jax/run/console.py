"""What a launch tells its user: progress lines (only the main process of a multi-process run
speaks) and the exit status that says a run finished with diverged seeds."""

from mombo_jax.run import distributed

EXIT_DIVERGED = 3           # the run finished, but at least one seed diverged and was left out


def log(msg):
  """Progress output; in a multi-process run only process 0 speaks."""
  if distributed.is_main():
    print(msg, flush=True)
