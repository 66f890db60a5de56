"""Text in, batches out: the corpus table (corpora/), the tokenizers and their one factory
(tokenizers), length bucketing and packing, the in-memory path (in_memory) and the entry
point that chooses between it and a token store (input_pipeline)."""
