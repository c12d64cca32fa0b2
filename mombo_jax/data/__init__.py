"""Datasets read (collection/ makes them): the dataset names, owned here and read by settings/
(names; no I/O), local Minari I/O (minari_io), transitions flattened for training with a local
cache (transitions), what a dataset is and how it was made (provenance), D4RL-normalised scores
(scores) and D4RL's published statistics for a build's quality check (d4rl_stats)."""
