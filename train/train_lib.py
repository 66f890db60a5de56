"""`train_and_evaluate(config, workdir)`: the whole training program, importable from a
notebook. The loop itself lives in `train.program.loop`; this name stays for the README's
`train.train_lib.train_and_evaluate` and for code written against it."""

from train.program.loop import train_and_evaluate

__all__ = ["train_and_evaluate"]
