"""What the models check of their token inputs, before any compute is spent.

`check_tokens` (exported) and, for packed sequences, `check_packing` (segment ids and
positions, with `check_segment_ids` for the ids' values) raise ValueError for bad inputs;
`check_token_range` is the one id-range check, shared with `train/`'s data path. The masks
the models build from the tokens are `functional.masks.self_attention_mask` and
`cross_attention_mask`. The positions of packed rows, `segment_positions` (re-exported as
`functional.segment_positions`), are part of the packing convention these checks hold, so
they live here and `check_packing` returns them; `checks` stays below `functional`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from flax_transformer.checks.arguments import as_array, is_concrete
from flax_transformer.checks.traced import runtime_check


def check_tokens(
    tokens: jax.Array,
    vocab_size: int,
    max_len: int | None,
    name: str,
    *,
    debug_checks: bool = False,
) -> jax.Array:
    """Raise ValueError for a bad token array before any compute is spent; return it.

    A nested Python list of ids is converted (`jnp.asarray`) and returned as an array;
    anything else that is not an array raises TypeError naming `name`.

    Shape, dtype and length are checked always; the id range for concrete arrays. Under
    `jit` the ids are tracers: with `debug_checks` the range becomes a `checkify` check
    (`flax_transformer.checked` raises it); without, an id outside [0, vocab_size) embeds
    as NaN (`layers.Embed`), so the logits of its row turn NaN.

    Args:
        tokens: int token ids `(B, T)` (array-like).
        vocab_size: ids must lie in [0, vocab_size).
        max_len: the longest T allowed; None leaves the length to the caller (generation
            checks the prompt together with the tokens it will add).
        name: what the tokens are, for the message (`src_tokens`, `generate_text:
            prompt_tokens`).
        debug_checks: turn the range check of traced ids into a `checkify` check.

    Returns:
        The ids as an int32 array.
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
    if max_len is not None and tokens.shape[1] > max_len:
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
    return tokens.astype(jnp.int32)


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
    pad_id: int,
    names: tuple[str, str, str],
    *,
    debug_checks: bool = False,
) -> jax.Array | None:
    """Check a packed row's segment ids and positions; return the positions to use.

    Segment ids must be int `(B, T)` like the tokens and follow `check_segment_ids`,
    positions int `(B|1, T)` in `[0, max_len)` (values checked for concrete arrays, and
    under `jit` with `debug_checks`). Either may be None.

    Returns:
      The positions given; else `segment_positions(segment_ids_BT)` when segment ids are
      given; else None (the models number 0..T-1).
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
    if segment_ids_BT is not None:
        check_segment_ids(tokens_BT, segment_ids_BT, pad_id, names[:2], debug_checks=debug_checks)
    if positions_BT is None:
        return None if segment_ids_BT is None else segment_positions(segment_ids_BT)
    check_positions(positions_BT, max_len, positions_name, debug_checks=debug_checks)
    return positions_BT


def segment_positions(segment_ids: jax.Array) -> jax.Array:
    """Positions of packed tokens: 0, 1, 2, ... restarting at every new segment.

    A segment is a run of equal ids along the last axis (ids 1, 2, ...; 0 is padding), so
    each packed example is numbered as if it stood alone at the start of a row.

    Args:
      segment_ids: int `(B, T)` (any leading axes, or `(T,)`); each example one contiguous run.

    Returns:
      int32 positions, same shape; 0 at padding (segment 0).
    """
    segment_ids = jnp.asarray(segment_ids)
    if segment_ids.ndim < 1 or not jnp.issubdtype(segment_ids.dtype, jnp.integer):
        raise ValueError(
            "segment_positions needs int segment ids (B, T) or (T,), got "
            f"{segment_ids.dtype} {segment_ids.shape=}."
        )
    length = segment_ids.shape[-1]
    index_T = jnp.arange(length, dtype=jnp.int32)
    starts = jnp.concatenate(
        [
            jnp.ones((*segment_ids.shape[:-1], 1), jnp.bool_),
            segment_ids[..., 1:] != segment_ids[..., :-1],
        ],
        axis=-1,
    )
    # Index of the first token of each token's run: the running max of the run starts.
    start_index = jax.lax.cummax(jnp.where(starts, index_T, 0), axis=segment_ids.ndim - 1)
    return jnp.where(segment_ids != 0, index_T - start_index, 0).astype(jnp.int32)


def check_segment_ids(
    tokens_BT: jax.Array,
    segment_ids_BT: jax.Array,
    pad_id: int,
    names: tuple[str, str],
    *,
    debug_checks: bool = False,
) -> None:
    """ValueError for segment ids that break the packing rules, naming row, position, value.

    The rules (docs/api.md, "Packed sequences"): 0 marks padding, so a real token (not
    `pad_id`) in segment 0 is refused (ids counted from 0 would make the first example
    padding: it attends to nothing); and each example is one contiguous run of its id, so
    an id that comes back after another id is refused (its two runs would attend to each
    other). Concrete arrays are checked here; under `jit` the same two rules are checkify
    checks with `debug_checks`, and nothing without.

    Args:
      tokens_BT: int token ids `(B, T)`.
      segment_ids_BT: int `(B, T)`, the shape of the tokens (checked by the caller).
      pad_id: the padding token, the one token allowed in segment 0.
      names: the tokens' and the segment ids' argument names, for the messages.
    """
    tokens_name, segments_name = names
    unlabelled_message = (
        f"{segments_name} is 0 (padding) at ({{row}}, {{position}}), where {tokens_name} holds "
        f"the real token {{token}} (pad_id={pad_id}); number a row's examples 1, 2, ... and "
        "keep 0 for padding (ids counted from 0 would make the first example padding: add 1)."
    )
    reopened_message = (
        f"{segments_name} holds segment id {{value}} again at ({{row}}, {{position}}), after "
        "another id; each packed example must be one contiguous run of its own id (two runs "
        "of one id attend to each other): give every example in a row a new id 1, 2, 3, ..."
    )
    if is_concrete(tokens_BT, segment_ids_BT):
        # numpy, not jnp: inside a `jit` trace jnp would turn even concrete arrays into tracers.
        tokens, segments = np.asarray(tokens_BT), np.asarray(segment_ids_BT)
        bad = np.argwhere((segments == 0) & (tokens != pad_id))
        if bad.size:
            row, position = (int(i) for i in bad[0])
            token = int(tokens[row, position])
            raise ValueError(unlabelled_message.format(row=row, position=position, token=token))
        for row, ids in enumerate(segments):
            starts = np.flatnonzero(np.diff(ids, prepend=ids[:1] - 1) != 0)
            starts = starts[ids[starts] != 0]
            _, first = np.unique(ids[starts], return_index=True)
            again = np.setdiff1d(np.arange(len(starts)), first)
            if again.size:
                position = int(starts[again.min()])
                raise ValueError(
                    reopened_message.format(value=ids[position], row=row, position=position)
                )
        return
    if not debug_checks:
        return
    unlabelled = (segment_ids_BT == 0) & (tokens_BT != pad_id)
    flat = jnp.argmax(unlabelled.reshape(-1))
    length = tokens_BT.shape[1]
    runtime_check(
        True,
        ~unlabelled,
        unlabelled_message,
        row=flat // length,
        position=flat % length,
        token=tokens_BT.reshape(-1)[flat],
    )
    reopened_BT = _reopened(segment_ids_BT)
    flat = jnp.argmax(reopened_BT.reshape(-1))
    runtime_check(
        True,
        ~reopened_BT,
        reopened_message,
        value=segment_ids_BT.reshape(-1)[flat],
        row=flat // length,
        position=flat % length,
    )


def _reopened(segment_ids_BT: jax.Array) -> jax.Array:
    """bool `(B, T)`: True where a run of a nonzero id starts whose id already ran earlier
    in the row (traceable; the check under `jit`)."""
    starts_BT = jnp.concatenate(
        [
            jnp.ones_like(segment_ids_BT[:, :1], jnp.bool_),
            segment_ids_BT[:, 1:] != segment_ids_BT[:, :-1],
        ],
        axis=1,
    )
    starts_BT &= segment_ids_BT != 0
    # Each row's run-start ids, stably sorted by id: a run start whose sorted neighbour
    # before it holds the same id is a later run of that id (stable: it comes later).
    keyed_BT = jnp.where(starts_BT, segment_ids_BT, 0)
    order_BT = jnp.argsort(keyed_BT, axis=1, stable=True)
    sorted_BT = jnp.take_along_axis(keyed_BT, order_BT, axis=1)
    repeat_BT = jnp.concatenate(
        [
            jnp.zeros_like(sorted_BT[:, :1], jnp.bool_),
            (sorted_BT[:, 1:] == sorted_BT[:, :-1]) & (sorted_BT[:, 1:] != 0),
        ],
        axis=1,
    )
    rows_B1 = jnp.arange(segment_ids_BT.shape[0])[:, None]
    return jnp.zeros_like(repeat_BT).at[rows_B1, order_BT].set(repeat_BT)


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
