"""Real environments: MuJoCo envs made and stepped with action rescaling (envs), every cell's
policy evaluated in one pass (evaluate), the evaluation's envs over worker processes (env_pool),
and the host state an exact resume of a host loop needs, as JSON (host_state)."""
