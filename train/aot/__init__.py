"""Ahead-of-time compilation without the chips (`python -m train.compile`): the topology
compile, the HLO and traced cost counts, and the GPU target configs (gpu_specs/)."""
