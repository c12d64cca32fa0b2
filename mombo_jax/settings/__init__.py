"""What a run is set to: one frozen `Config` per run, its presets and `make_config` (config), the
groups it is made of, each read whole by what it sets (groups), each algorithm's reference
settings tables by source (references), and the environment variables, read here and passed down
to the core (environment)."""
