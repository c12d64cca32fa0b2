"""Making datasets (experiments.collect, import_d4rl, describe): what a build is asked (options),
how each quality is made (recipes), the online SAC run (sac_run; its settings, compiled updates
and evaluation: online_sac) and its checkpoints (sac_checkpoints), episodes recorded, cut and
mixed (recording), the actors saved to record again (saved_actors), the Minari writer
(dataset_writer; the read side is data/minari_io.py), D4RL's files imported (d4rl) and their
physics checked (d4rl_physics), and dataset cards (cards)."""
