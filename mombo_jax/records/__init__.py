"""A run's records on disk, no JAX loaded: its folder and the names in it (workdir), config.json,
metrics.csv and summary.json (outputs), finding runs under folders (run_search)."""
