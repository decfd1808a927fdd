"""Hardware preset data files (*.toml); loaded by replay.hardware.config."""
