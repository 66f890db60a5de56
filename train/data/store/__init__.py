"""The token store on disk: its format (token_store), what goes in (store_inputs), the writer
`python -m train.prepare` runs (store_prepare) and the batches a run reads (store_pipeline)."""
