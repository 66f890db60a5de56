"""Generation for both models: KV cache, parallel prefill, greedy, sampling, beam search.

cache      the KV cache pytree's old place: `init_cache`, `select_rows`, `check_cache_room`
           are re-exported here from `flax_transformer.cache`, where the models own it
sampling   pure logits filters: temperature, `top_k_mask`, `top_p_mask`, `choose_tokens`
steppers   one step interface over both models, with or without the cache
search     the loops: `sample_loop` (one token at a time), `beam_search`
strategies how tokens are chosen, as one hashable value that runs its loop: `Greedy`,
           `Sample`, `Beam` (bases `Strategy`, `TokenByToken`)
generate   the public entry points `generate_translation`, `generate_text`
"""

from flax_transformer.cache import check_cache_room, init_cache, select_rows
from flax_transformer.decoding.generate import generate_text, generate_translation
from flax_transformer.decoding.sampling import (
    MASKED_LOGIT,
    choose_tokens,
    filter_logits,
    top_k_mask,
    top_p_mask,
)
from flax_transformer.decoding.search import LogitsHook, beam_search, length_penalty, sample_loop
from flax_transformer.decoding.strategies import Beam, Greedy, Sample, Strategy, TokenByToken

__all__ = [
    "MASKED_LOGIT",
    "Beam",
    "Greedy",
    "LogitsHook",
    "Sample",
    "Strategy",
    "TokenByToken",
    "beam_search",
    "check_cache_room",
    "choose_tokens",
    "filter_logits",
    "generate_text",
    "generate_translation",
    "init_cache",
    "length_penalty",
    "sample_loop",
    "select_rows",
    "top_k_mask",
    "top_p_mask",
]
