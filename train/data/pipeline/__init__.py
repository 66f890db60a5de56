"""A run's data, whichever path reads it: `input_pipeline.open_dataset`, the one entry point
of the training loop, and the in-memory path (`in_memory.build_dataset`) beside the token
stores (`train.data.store`, `train.data.chat`)."""
