"""What a run is set to: the Config, its presets, the reference settings tables."""
