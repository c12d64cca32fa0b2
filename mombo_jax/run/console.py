"""What a launch tells its user: progress lines (only the main process of a multi-process run
speaks; CONSOLE is the same as an object for the layers below, dynamics_store.get_dynamics) and
the exit status that says a run finished with diverged seeds."""

from mombo_jax.run import distributed

EXIT_DIVERGED = 3           # the run finished, but at least one seed diverged and was left out


def log(msg):
  """Progress output; in a multi-process run only process 0 speaks."""
  if distributed.is_main():
    print(msg, flush=True)


class LaunchConsole:
  """A launch's lines as the layers below take them (an object with line(text), as
  dynamics_store.Console): `log`'s."""

  def line(self, text: str):
    log(text)


CONSOLE = LaunchConsole()
