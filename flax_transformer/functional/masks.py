"""Attention masks. Convention: bool arrays, True where a query may attend to a key.

The attention functions take a mask of rank 2, `(T, S)`, shared by every example and head,
or of rank 4, `(B|1, N|1, T, S)`. The builders here return shapes that combine into those:
`causal_mask(T)` is `(T, T)`, `padding_mask` of `(B, S)` tokens is `(B, 1, 1, S)`, and
`combine_masks` broadcasts them to `(B, 1, T, S)`.

`AttentionMask` keeps the facts a mask is built from (padding keys, causal, segment ids)
apart, for the kernels that take them so (`layers.attention_op`); `AttentionMask.dense()`
is the bool array of the same mask.

Packed sequences: several examples share one row, each token labelled with the segment id
of its example (1, 2, ...; 0 is padding). `segment_mask` lets a query see only the keys of
its own segment; AND it with the causal mask for a decoder, and use the target and source
segment ids together for cross-attention (target segment s sees source segment s only).
"""

from __future__ import annotations

import dataclasses
import functools
import operator

import jax
import jax.numpy as jnp

from flax_transformer.checks.arguments import check_bool_mask, check_int


def causal_mask(length: int) -> jax.Array:
    """Lower-triangular `(T, T)` mask: position t sees positions 0..t (the paper §3.2.3;
    Raschka ch. 3.5)."""
    try:
        if isinstance(length, bool):
            raise TypeError
        length = operator.index(length)  # accepts numpy integers, rejects floats
    except TypeError:
        raise ValueError(f"causal_mask needs a positive int length, got {length!r}.") from None
    if length < 1:
        raise ValueError(f"causal_mask needs a positive int length, got {length!r}.")
    return jnp.tril(jnp.ones((length, length), dtype=jnp.bool_))


def padding_mask(tokens: jax.Array, pad_id: int = 0) -> jax.Array:
    """Key mask that hides padding tokens.

    Args:
      tokens: int token ids, `(B, S)` for a batch or `(S,)` for one sequence.
      pad_id: the padding id.

    Returns:
      bool, True for real tokens: `(B, 1, 1, S)` for `(B, S)` tokens, the singletons standing
      for the head and query axes, so that it broadcasts against `(B, N, T, S)` scores (and
      `combine_masks(causal_mask(T), padding_mask(tokens))` is `(B, 1, T, S)`); `(1, S)` for
      `(S,)` tokens, a rank-2 mask whose singleton is the query axis, for the single-example
      `dot_product_attention` or for one sequence's `(T, S)` mask.
    """
    tokens = jnp.asarray(tokens)
    if not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise TypeError(
            f"padding_mask needs int token ids, got dtype {tokens.dtype}; for a ready bool "
            "(B, S) mask of real tokens use valid[:, None, None, :]."
        )
    check_int("padding_mask", "pad_id", pad_id)
    if tokens.ndim == 1:
        return (tokens != pad_id)[None, :]
    if tokens.ndim == 2:
        return (tokens != pad_id)[:, None, None, :]
    raise ValueError(
        f"padding_mask needs token ids of shape (B, S) or (S,), got {tokens.shape=}; "
        "flatten extra leading axes into the batch first."
    )


def combine_masks(*masks: jax.Array | None) -> jax.Array | None:
    """Logical AND of masks broadcast together; `None` entries are skipped.

    Returns None when every mask is None (attend everywhere). Broadcasting aligns trailing
    axes, so combine masks of rank 2 `(T, S)` and rank 4 `(B|1, N|1, T, S)` only: a rank-3
    operand would put its first axis on the heads, and is refused (ValueError), as are
    other ranks. Two rank-2 masks are both read as `(T, S)`: a `(B, S)` padding mask must
    be made rank 4 first (`mask[:, None, None, :]`, or `padding_mask(tokens)`); the
    attention functions refuse a rank-2 result when B == T, where the two readings clash.

    Raises:
      TypeError: a mask is not bool (for an additive float mask m pass `m == 0`).
      ValueError: a mask of rank other than 2 or 4, or masks that do not broadcast.
    """
    present = [
        check_bool_mask("combine_masks", m, f"masks[{i}]")
        for i, m in enumerate(masks)
        if m is not None
    ]
    if not present:
        return None
    for m in present:
        if m.ndim not in (2, 4):
            raise ValueError(
                f"combine_masks: a mask of shape {m.shape} has rank {m.ndim}; combine masks of "
                "rank 2, (T, S), and rank 4, (B|1, N|1, T, S): for a (B, S) padding mask pass "
                "mask[:, None, None, :] (padding_mask(tokens) builds it), for (B, T, S) "
                "mask[:, None]."
            )
    try:
        shape = jnp.broadcast_shapes(*(m.shape for m in present))
    except ValueError as err:
        raise ValueError(
            f"combine_masks: masks of shapes {[m.shape for m in present]} do not broadcast "
            "together (rank 2 is read as (T, S)); a (B, S) padding mask needs "
            "mask[:, None, None, :], or padding_mask(tokens)."
        ) from err
    out = present[0]
    for m in present[1:]:
        out = jnp.logical_and(out, m)
    return jnp.broadcast_to(out, shape)


def segment_mask(q_segments: jax.Array, k_segments: jax.Array) -> jax.Array:
    """Mask of packed sequences: a query sees the keys of its own segment, never padding.

    Segment ids are ints, 0 for padding and 1, 2, ... for the examples packed in a row
    (each example one contiguous run; ids may repeat across rows). Key 0 is hidden from
    every query, so a padding query (segment 0) sees nothing, and the attention functions
    give it zeros.

    Args:
      q_segments: int segment ids of the queries, `(B, T)`, or `(T,)` for one sequence.
      k_segments: int segment ids of the keys, `(B, S)` (the same as `q_segments` for
        self-attention; the source's for cross-attention), or `(S,)`.

    Returns:
      bool `(B, 1, T, S)` (the singleton is the head axis) for batched ids, `(T, S)` for
      single sequences: True where `q_segments[t] == k_segments[s] != 0`.
    """
    q_segments, k_segments = jnp.asarray(q_segments), jnp.asarray(k_segments)
    ranks = (q_segments.ndim, k_segments.ndim)
    batched = ranks == (2, 2) and q_segments.shape[0] == k_segments.shape[0]
    if not (batched or ranks == (1, 1)):
        raise ValueError(
            "segment_mask needs segment ids (B, T) and (B, S) with the same B, or (T,) and "
            f"(S,), got {q_segments.shape=}, {k_segments.shape=}."
        )
    for name, ids in (("q_segments", q_segments), ("k_segments", k_segments)):
        if not jnp.issubdtype(ids.dtype, jnp.integer):
            raise ValueError(f"segment_mask needs int {name} (0 = padding), got {ids.dtype}.")
    same_TS = q_segments[..., :, None] == k_segments[..., None, :]
    mask_TS = jnp.logical_and(same_TS, (k_segments != 0)[..., None, :])
    return mask_TS[:, None] if batched else mask_TS


def check_causal_lengths(what: str, q_len: int, kv_len: int) -> None:
    """ValueError unless T == S: a causal mask is a self-attention mask.

    `causal_mask(T)` lets query t see keys 0..t; with S != T there is no one position of a
    key relative to a query (a top-left-aligned mask would be a silent guess), so every
    place that takes a causal flag refuses it. `what` names the caller's argument.
    """
    if q_len != kv_len:
        raise ValueError(
            f"{what} is for self-attention, T == S; got T={q_len}, S={kv_len}. For another "
            "alignment of queries and keys build the bool (T, S) mask itself and pass it to "
            "multi_head_attention (attention_impl='xla')."
        )


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=("key_valid_BS", "q_segments_BT", "kv_segments_BS"),
    meta_fields=("causal",),
)
@dataclasses.dataclass(frozen=True)
class AttentionMask:
    """A mask described by what builds it, not as a `(B, N, T, S)` array.

    The models build their masks from three facts: which keys are padding, whether the
    attention is causal, and (packed rows) which segment each query and key belongs to.
    Kept apart, those facts are what fused kernels take (Pallas splash attention: a causal
    flag and segment ids; cuDNN: a causal flag), and `dense()` gives the bool array the
    reference attention reads, exactly `combine_masks(padding_mask, causal_mask,
    segment_mask)`.

    Attributes:
      key_valid_BS: bool `(B, S)`, True for real keys (not padding); None: every key.
      q_segments_BT: int `(B, T)` segment ids of the queries (0 = padding), or None (no
        packing); given together with `kv_segments_BS`.
      kv_segments_BS: int `(B, S)` segment ids of the keys, or None.
      causal: query t sees keys s <= t only (self-attention, T == S).
    """

    key_valid_BS: jax.Array | None = None
    q_segments_BT: jax.Array | None = None
    kv_segments_BS: jax.Array | None = None
    causal: bool = False

    def dense(self, q_len: int, kv_len: int) -> jax.Array | None:
        """The bool mask: `(B, 1, T, S)`, or `(T, S)` for a causal mask alone; None for none.

        Args:
          q_len, kv_len: T and S (needed when only `causal` is set).
        """
        if (self.q_segments_BT is None) != (self.kv_segments_BS is None):
            raise ValueError(
                "AttentionMask needs both q_segments_BT and kv_segments_BS, or neither."
            )
        if self.causal:
            check_causal_lengths("a causal AttentionMask", q_len, kv_len)
        keys = None if self.key_valid_BS is None else self.key_valid_BS[:, None, None, :]
        same = None
        if self.q_segments_BT is not None:
            same = segment_mask(self.q_segments_BT, self.kv_segments_BS)
        return combine_masks(keys, causal_mask(q_len) if self.causal else None, same)


def as_dense(mask, q_len: int, kv_len: int):
    """A bool mask array (or None) of a mask that may be an `AttentionMask`."""
    if isinstance(mask, AttentionMask):
        return mask.dense(q_len, kv_len)
    return mask


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
