"""Files that survive a crash: Orbax checkpoints (checkpoint: the public calls, save_pytree /
load_pytree and RunCheckpointer's keep-N and fall-back; checkpoint_step: one step's format, written
and read verified, and the errors), their manifests (manifest), a checkpoint folder seen without
Orbax (checkpoint_files), one writer per folder (locks) and every file written whole or not at
all (atomic).

The checkpoint part (checkpoint.py, checkpoint_step.py, checkpoint_files.py, manifest.py) is
larger than a call of Orbax because Orbax alone leaves five things to its caller, each of which a
run has met:
  - a byte flipped inside a stored chunk restores silently as wrong numbers: every leaf is
    checked against a CRC32 manifest (per shard for arrays split over devices), manifest.py;
  - a template that differs from what was saved is cast or mis-read silently: it is compared with
    the manifest first and every difference listed (checkpoint_step.read_step);
  - a killed writer or deleter leaves folders Orbax then warns about or mis-lists: they are found
    and removed without Orbax (checkpoint_files.leftovers), before Orbax reads the folder
    (run/run_state.remove_leftovers);
  - a full disk fails deep inside tensorstore: the room is checked before writing and the OS's
    cause named (checkpoint_files.room_problem, os_cause);
  - a truncated chunk aborts a read whose other reads then print a traceback each: they are
    dropped (checkpoint_files.quiet_aborted_reads), and a run falls back past the step with one
    line (RunCheckpointer.restore).
"""
