"""What the run computes: the tasks, the jitted steps, metrics, decoding, fine-tuning and
pretrained weights."""
