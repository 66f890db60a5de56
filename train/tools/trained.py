"""`load_trained(workdir)`: a finished (or running) run read back for inference. It lives in
`train.program.trained` (the program's floor, where the weights of a run started from another
run are read too); this name stays for the README's `train.tools.trained.load_trained`."""

from train.program.trained import TrainedModel, load_trained

__all__ = ["TrainedModel", "load_trained"]
