"""What the run computes, built from the config's sections: the tasks, the optimizer, the
jitted steps, metrics, decoding, fine-tuning and pretrained weights."""
