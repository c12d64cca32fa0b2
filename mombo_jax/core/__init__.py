"""The compiled program, pure JAX (no environment, dataset, checkpoint or flag package; no
environment variable read): moment matching (moments, propagate with propagate_interp,
propagate_full (its ReLU covariance in relu_covariance), propagate_door, propagate_where and
closed_forms; monte_carlo the reference it is checked against; mm_bounds the paper's bounds;
lowrank_moments the input's low-rank covariance carried through a ReLU MLP, picked for MOMBO's
targets by the moment mode that algorithms parses),
the networks and their initial values (critics, inits, actor_policy), SAC and the algorithms
(sac, targets, algorithms: the registry), the dynamics model and what ends a rollout (dynamics,
termination), rollouts into the ring buffer (rollout, pieces, buffer), the epoch and its chunks
over cells (train, epoch_settings: what a program is keyed by, key_scheme), how the cells sit on
devices and compile (placement, cell_layout, xla_options), and #29's CPU rewrites chosen per
backend (rewrites)."""
