"""The KJV language model of lm_kjv.py with a Llama-style decoder: RMSNorm, rotary positions,
a SwiGLU feed-forward and grouped-query attention.

    python -m train.main --config configs/lm_kjv_llama.py --workdir runs/lm_kjv_llama
    python -m train.sample --workdir runs/lm_kjv_llama --prompt "And God said"

Same data, tokenizer, width, depth, optimizer and schedule as lm_kjv.py; only the decoder's
options differ. The SwiGLU hidden width is 8/3 of d_model rounded up to a multiple of 16 (688
for 256), so its three kernels hold about the parameters of GPT-2's two of width 4 d_model;
two key/value heads serve the four query heads, halving the KV cache. A trained run exports
to Hugging Face's LlamaForCausalLM with `flax_transformer.export_llama` (docs/interop.md).
"""

import ml_collections

from configs import lm_kjv


def get_config() -> ml_collections.ConfigDict:
    """lm_kjv with a Llama-style decoder; every other field as in lm_kjv.py."""
    config = lm_kjv.get_config()
    config.model.norm = "rmsnorm"  # RMSNorm: no centring, no shift
    config.model.layer_norm_eps = 1e-6  # Llama's rms_norm_eps
    config.model.positional = "rope"  # rotary positions on queries and keys, nothing added
    config.model.rope_base = 10000.0  # rotary frequency base (Llama 2's rope_theta)
    config.model.activation = "swiglu"  # gated feed-forward, silu(x Wg) * (x Wu) -> Wd
    config.model.d_ff = 688  # SwiGLU hidden width: 8/3 * 256 rounded up to 16
    config.model.num_kv_heads = 2  # grouped-query attention: 2 K/V heads for 4 query heads
    config.model.use_bias = False  # no biases in projections, feed-forward or norms
    config.model.scale_embeddings = False  # Llama adds nothing to the embedding to balance
    return config
