"""Logical axis names for parameters and activations.

Model code names logical axes only; which mesh axis each maps to is configuration
(see the sharding rules in `flax_transformer.sharding`).
"""

BATCH = "batch"
LENGTH = "length"
EMBED = "embed"  # model width D
HEADS = "heads"  # attention heads N
KV_HEADS = "kv_heads"  # key/value heads K of grouped-query attention (when K < N)
KV = "kv"  # head width H
MLP = "mlp"  # feed-forward width F
VOCAB = "vocab"
LAYERS = "layers"  # the stacked-layer axis of nn.scan
QKV = "qkv"  # the 3 (or 2) of a fused Q/K/V kernel; never sharded
LORA = "lora"  # the rank r of a LoRA adapter pair (small); never sharded
