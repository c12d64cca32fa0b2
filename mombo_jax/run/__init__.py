"""A training launch (experiments.run, experiments.sweep, mombo_jax.fit: fit, the one call both
the command line and Python take): what it trains (run_specs), what is
checked before any data (preflight), the datasets it trains on (run_dataset), the launch itself
(launch: plan, prepare, train_epochs, finish), each run on the host (host_run) with its
overestimation watch (overestimation), its evaluation points (evaluation: every run's returns in
one pass, in a background thread), where the runs resume (resume) and a run's training state on
disk (run_state), the device program (program) and JAX's compilation cache (compilation_cache),
progress lines (console), loggers beyond metrics.csv (loggers), several processes (distributed),
and sweeps: the grid of launches (sweep), its record read back (sweep_record) and which of its
cells share a dynamics ensemble (sweep_dynamics)."""
