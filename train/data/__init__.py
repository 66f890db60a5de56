"""Text in, batches out, in memory: the corpora, the tokenizers, length bucketing, packing, and
the pipeline that builds a run's dataset (input_pipeline)."""
