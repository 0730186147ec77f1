"""Everything that touches an outside system: day files, decoders, dead letters, MLflow."""
