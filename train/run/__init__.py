"""A run's life on disk and across processes: the run directory, the checkpointer, the
distributed setup, and the failures a run reports with their exit statuses."""
