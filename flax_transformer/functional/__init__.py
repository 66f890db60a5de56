"""Pure jnp functions: every formula of the Transformer as a function of explicit arrays.

Nothing here imports flax. Each function works on a single example (and, for attention, a
single head) unless its name says otherwise; batch and head axes are added with `jax.vmap`.
Dimension letters are those of the package docstring (`flax_transformer`).
"""

from flax_transformer.functional.attention import (
    MASK_RANKS,
    MASK_VALUE,
    broadcast_mask,
    dot_product_attention,
    multi_head_attention,
    simple_self_attention,
    softmax_dtype,
)
from flax_transformer.functional.blocked_loss import (
    DEFAULT_BLOCK_ROWS,
    LABEL_LOGP_NAMES,
    blocked_cross_entropy,
    blocked_label_logps,
)
from flax_transformer.functional.dropout import dropout, keep_mask
from flax_transformer.functional.feed_forward import (
    feed_forward,
    gated_feed_forward,
    gelu,
    gelu_tanh,
    relu_squared,
)
from flax_transformer.functional.lora import lora_delta
from flax_transformer.functional.losses import label_smoothed_cross_entropy
from flax_transformer.functional.masks import (
    AttentionMask,
    causal_mask,
    combine_masks,
    padding_mask,
    segment_mask,
)
from flax_transformer.functional.norms import LAYER_NORM_EPS, RMS_NORM_EPS, layer_norm, rms_norm
from flax_transformer.functional.positions import (
    DEFAULT_ROPE_BASE,
    apply_rope,
    rope_angles,
    segment_positions,
    sinusoidal_positions,
)
from flax_transformer.functional.precision import (
    accumulation_dtype,
    mixed_dot_general,
    mixed_einsum,
)
from flax_transformer.functional.projection import project
from flax_transformer.functional.soft_cap import soft_cap

__all__ = [
    "AttentionMask",
    "DEFAULT_BLOCK_ROWS",
    "LABEL_LOGP_NAMES",
    "DEFAULT_ROPE_BASE",
    "LAYER_NORM_EPS",
    "MASK_RANKS",
    "MASK_VALUE",
    "RMS_NORM_EPS",
    "accumulation_dtype",
    "apply_rope",
    "blocked_cross_entropy",
    "blocked_label_logps",
    "broadcast_mask",
    "causal_mask",
    "combine_masks",
    "dot_product_attention",
    "dropout",
    "feed_forward",
    "gated_feed_forward",
    "gelu",
    "gelu_tanh",
    "keep_mask",
    "label_smoothed_cross_entropy",
    "layer_norm",
    "lora_delta",
    "mixed_dot_general",
    "mixed_einsum",
    "multi_head_attention",
    "padding_mask",
    "project",
    "relu_squared",
    "rms_norm",
    "rope_angles",
    "segment_mask",
    "segment_positions",
    "simple_self_attention",
    "sinusoidal_positions",
    "soft_cap",
    "softmax_dtype",
]
