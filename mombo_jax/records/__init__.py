"""A run's records on disk, read without JAX: its folder and names (workdir), config.json,
metrics.csv / summary.json (outputs), finding runs (run_search). Its checkpoints:
run/run_state.py."""
