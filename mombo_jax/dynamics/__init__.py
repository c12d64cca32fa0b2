"""The dynamics ensemble's life, one file a step (the model, its forward pass and loss are pure JAX
in core/dynamics.py):

1. its data: transitions as (obs, action) -> (next_obs - obs, reward) arrays, each seed's train /
   holdout split ............................................................ training_data.py
2. train: bootstrap samples, the compiled epoch, the loop, resumable stops .. dynamics_training.py
3. validate and pick elites: holdout MSE, snapshots, early stopping, elites ...... validation.py
4. the reuse key: what must match for a saved ensemble to serve a run, and the folder its
   training settings name ........................................................... reuse.py
5. save and load, shapes checked before any array is read ................. saved_dynamics.py
6. the store: a run's get-or-train under a lock, read top to bottom in get_dynamics (the place
   and key worked out once: reuse.Shelf), legacy saves refused ............... dynamics_store.py

experiments.train_dynamics trains ensembles ahead of the runs (pretrain.py); a sweep's plan of
which cells share one: mombo_jax/run/sweep_dynamics.py.
"""
