"""What the task folders share: the `Task` base class, token cross-entropy (the objective of
every task with a vocabulary head), and decoding a trained model's texts for evaluation and
the tools."""
