"""Real environments: MuJoCo envs, their worker pool, evaluation, stop and resume."""
