"""Files: atomic outputs, checkpoints, content fingerprints, installed assets and paths."""
