"""The dynamics ensemble's life beside its pure model (core/dynamics.py): its training and early
stopping, saving and the reuse key, the store of trained ensembles."""
