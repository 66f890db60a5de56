"""The run's configuration: the frozen sections a ConfigDict becomes (sections) and the checks
that refuse a bad one before anything is built (config_lib)."""
