"""What the models check and build from their token inputs, before any compute is spent.

`check_tokens` (exported) and, for packed sequences, `check_packing` (segment ids and
positions) raise ValueError for bad inputs; `self_attention_mask` and
`cross_attention_mask` build the padding, causal and segment masks of the attentions.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from flax_transformer.functional import AttentionMask, segment_positions
from flax_transformer.functional.checks import as_array, is_concrete, runtime_check


def check_tokens(
    tokens: jax.Array, vocab_size: int, max_len: int, name: str, *, debug_checks: bool = False
) -> jax.Array:
    """Raise ValueError for a bad token array before any compute is spent; return it.

    A nested Python list of ids is converted (`jnp.asarray`) and returned as an array;
    anything else that is not an array raises TypeError naming `name`.

    Shape, dtype and length are checked always; the id range for concrete arrays. Under
    `jit` the ids are tracers: with `debug_checks` the range becomes a `checkify` check
    (`flax_transformer.checked` raises it); without, an id outside [0, vocab_size) embeds
    as NaN (`layers.Embed`), so the logits of its row turn NaN.
    """
    tokens = as_array("", name, tokens)
    if tokens.ndim != 2:
        raise ValueError(f"{name} must be int token ids of shape (B, T), got {tokens.shape=}.")
    if not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise ValueError(f"{name} must hold integer token ids, got dtype {tokens.dtype}.")
    if 0 in tokens.shape:
        raise ValueError(
            f"{name} is empty, {tokens.shape=}: pass at least one sequence of at least one token."
        )
    if tokens.shape[1] > max_len:
        raise ValueError(
            f"{name} length {tokens.shape[1]} exceeds TransformerConfig.max_len={max_len}; "
            "shorten the input or raise max_len."
        )
    if is_concrete(tokens):
        check_token_range(tokens, vocab_size, name)
    else:
        runtime_check(
            debug_checks,
            (tokens >= 0) & (tokens < vocab_size),
            f"{name} holds token ids in [{{low}}, {{high}}], outside the vocabulary [0, "
            f"{vocab_size}); check the tokenizer's vocab_size against "
            "TransformerConfig.vocab_size.",
            low=tokens.min(),
            high=tokens.max(),
        )
    return tokens


def check_token_range(ids, vocab_size: int, name: str) -> None:
    """Raise ValueError naming the first id outside [0, vocab_size) and where it sits.

    The project's one id-range check: the models (concrete inputs), generation and the
    training program's data all call it. Unchecked, a bad id would reach the embedding
    lookup, which gives it a NaN row (`layers.Embed`): an error here names it instead.

    Args:
        ids: integer token ids, any shape (array-like, concrete).
        vocab_size: ids must lie in [0, vocab_size).
        name: what the ids are, for the message (e.g. "src_tokens", "train split").
    """
    values = np.asarray(ids)
    if values.size and not np.issubdtype(values.dtype, np.integer):
        raise ValueError(f"{name}: token ids must be integers, got dtype {values.dtype}.")
    bad = np.argwhere((values < 0) | (values >= vocab_size))
    if bad.size:
        where = tuple(int(i) for i in bad[0])
        raise ValueError(
            f"{name} holds token id {values[where]} at {where}, outside the vocabulary "
            f"[0, {vocab_size}); check the tokenizer's vocab_size against "
            "TransformerConfig.vocab_size."
        )


def check_packing(
    tokens_BT: jax.Array,
    segment_ids_BT: jax.Array | None,
    positions_BT: jax.Array | None,
    max_len: int,
    names: tuple[str, str, str],
    *,
    debug_checks: bool = False,
) -> jax.Array | None:
    """Check a packed row's segment ids and positions; return the positions to use.

    Segment ids must be int `(B, T)` like the tokens, positions int `(B|1, T)` in
    `[0, max_len)` (their range is checked for concrete arrays, and under `jit` with
    `debug_checks`). Positions default to `segment_positions(segment_ids)` when segment ids
    are given, else None (0..T-1).
    """
    tokens_name, segments_name, positions_name = names
    for name, ids, batches in (
        (segments_name, segment_ids_BT, (tokens_BT.shape[0],)),
        (positions_name, positions_BT, (1, tokens_BT.shape[0])),
    ):
        if ids is None:
            continue
        if (
            ids.ndim != 2
            or ids.shape[0] not in batches
            or ids.shape[1] != tokens_BT.shape[1]
            or not jnp.issubdtype(ids.dtype, jnp.integer)
        ):
            raise ValueError(
                f"{name} must be int ids of the shape of {tokens_name} {tokens_BT.shape}, got "
                f"{ids.dtype} {ids.shape}; give one id per token."
            )
    if positions_BT is None:
        return None if segment_ids_BT is None else segment_positions(segment_ids_BT)
    check_positions(positions_BT, max_len, positions_name, debug_checks=debug_checks)
    return positions_BT


def check_positions(
    positions: jax.Array, max_len: int, name: str, *, debug_checks: bool = False
) -> None:
    """ValueError for positions outside [0, max_len) (concrete); a checkify check under `jit`
    with `debug_checks`. Unchecked, such a position reads NaN from the position table."""
    message = (
        f"{name} holds positions in [{{low}}, {{high}}], outside [0, "
        f"TransformerConfig.max_len={max_len}); raise max_len or fix the positions."
    )
    if is_concrete(positions):
        values = np.asarray(positions)
        if values.size and (values.min() < 0 or values.max() >= max_len):
            raise ValueError(message.format(low=values.min(), high=values.max()))
    else:
        runtime_check(
            debug_checks,
            (positions >= 0) & (positions < max_len),
            message,
            low=positions.min(),
            high=positions.max(),
        )


def self_attention_mask(
    tokens_BT: jax.Array, pad_id: int, causal: bool, segment_ids_BT: jax.Array | None = None
) -> AttentionMask:
    """Keys that are not padding (and, if causal, not in the future; if packed, in the
    query's own segment), as an `AttentionMask`; `.dense(T, T)` is `(B, 1, T, T)`."""
    return AttentionMask(
        key_valid_BS=tokens_BT != pad_id,
        q_segments_BT=segment_ids_BT,
        kv_segments_BS=segment_ids_BT,
        causal=causal,
    )


def cross_attention_mask(
    src_BS: jax.Array,
    pad_id: int,
    src_segment_ids_BS: jax.Array | None = None,
    tgt_segment_ids_BT: jax.Array | None = None,
) -> AttentionMask:
    """Source keys that are not padding (`.dense` is `(B, 1, 1, S)`), or, when packed,
    target segment s reads source segment s only (`(B, 1, T, S)`). Segment ids come both or
    neither."""
    if (src_segment_ids_BS is None) != (tgt_segment_ids_BT is None):
        raise ValueError(
            "packed translation needs both src_segment_ids and tgt_segment_ids (target "
            "segment s reads source segment s), got only one; pass both or neither."
        )
    if src_segment_ids_BS is not None and src_segment_ids_BS.shape != src_BS.shape:
        raise ValueError(
            f"src_segment_ids must have the shape of src_tokens {src_BS.shape}, got "
            f"{src_segment_ids_BS.shape}; give one id per source token."
        )
    return AttentionMask(
        key_valid_BS=src_BS != pad_id,
        q_segments_BT=tgt_segment_ids_BT,
        kv_segments_BS=src_segment_ids_BS,
    )
