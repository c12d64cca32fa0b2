"""Files that survive a crash: Orbax checkpoints, their manifests, folder locks.

The checkpoint part (checkpoint.py, checkpoint_files.py, manifest.py) is larger than a call of
Orbax because Orbax alone leaves four things to its caller, each of which a run has met:
  - a byte flipped inside a stored chunk restores silently as wrong numbers: every leaf is
    checked against a CRC32 manifest (per shard for arrays split over devices), manifest.py;
  - a template that differs from what was saved is cast or mis-read silently: it is compared with
    the manifest first and every difference listed (checkpoint._read_step);
  - a killed writer or deleter leaves folders Orbax then warns about or mis-lists: they are found
    and removed without Orbax (checkpoint_files.leftovers), so records/ can clean a run's folder
    without importing it;
  - a full disk fails deep inside tensorstore: the room is checked before writing and the OS's
    cause named (checkpoint_files.room_problem, os_cause).
"""
