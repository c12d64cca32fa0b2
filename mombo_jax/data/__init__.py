"""Datasets read: names (no I/O), Minari reading, transitions, provenance, scores."""
