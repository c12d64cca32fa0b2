"""The compiled core, pure JAX: moments, SAC, targets, dynamics, rollouts, the epoch."""
