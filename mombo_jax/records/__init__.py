"""A training launch: groups, runner, workdir, checks, dynamics store, outputs, logs."""
