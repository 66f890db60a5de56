"""Experiment configs: one ml_collections `get_config()` per file (see `train.main`)."""
