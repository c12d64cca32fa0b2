"""Files that survive a crash: Orbax checkpoints, their manifests, folder locks."""
