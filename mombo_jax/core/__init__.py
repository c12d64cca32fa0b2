"""The compiled program, pure JAX (no environment, dataset, checkpoint or flag package; no
environment variable read), a user of the moment-matching library below it
(mombo_jax/moment_matching): the networks and their initial values (critics, inits,
actor_policy), SAC and the algorithms (sac, targets, algorithms: the registry), the dynamics
model and what ends a rollout (dynamics, termination), rollouts into the ring buffer (rollout,
pieces, buffer), one cell's epoch (train, epoch_settings: what a program is keyed by,
key_scheme), the epoch and its chunks over the cell axis, sharded (cells_program), how the cells
sit on devices and compile (placement, cell_layout, xla_options), and #29's CPU rewrites chosen
per backend (rewrites)."""
