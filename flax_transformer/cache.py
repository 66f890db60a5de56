"""The generation cache: an explicit pytree passed into the models and returned (as Gemma does).

    {'index': int32 (B,)          tokens already in the cache, per sequence,
     'decoder': {...},             keys/values per decoder layer (`init_decoder_cache`),
     'source_mask': bool (B, S)}   Transformer only: which encoder positions are real tokens
                                   (all False until `Transformer.prefill` encodes a source).

`Transformer.prefill` / `.extend` and `DecoderOnlyTransformer.extend` read and return it. A
sequence's token at slot j sits at position j, and every sequence has its own `index`, so a
batch of right-padded prompts of different lengths shares one cache. The decoder tree
mirrors the parameter tree ('layers_0', ... unrolled; 'layers' with a leading layer axis
under `nn.scan`), so it works for both stacks (`blocks.stacks._stack` splits it per layer).

The structure belongs to the models that read and write it, so it sits below them (it
imports only `checks` and `config`); `decoding` builds its loops on it and re-exports
`init_cache`, `select_rows`, `check_cache_room` (and `decoding.cache`, this module's old
place, still names everything here).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from flax_transformer.checks.arguments import check_int, is_concrete
from flax_transformer.checks.traced import runtime_check
from flax_transformer.config import TransformerConfig


def init_decoder_cache(
    config: TransformerConfig,
    batch: int,
    length: int,
    source_length: int | None = None,
    dtype=None,
) -> dict:
    """An empty (zero) KV cache for the decoder stack of `config`.

    Args:
      config: the model config (layer count, heads, `scan_layers`).
      batch: B, sequences decoded together (beams count as sequences).
      length: L, slots per sequence: the longest prompt plus the tokens to generate.
      source_length: S of the encoder output for cross-attention; None for decoder-only.
      dtype: storage dtype of keys/values; default `config.dtype`.

    Returns:
      The 'decoder' tree of the module docstring, keys/values `(B, K, L, H)` (cross: `(B, K, S,
      H)`), K = `config.kv_heads` (`num_kv_heads`, default N), with a leading `(num_layers,)`
      axis on every leaf when `config.scan_layers`.
    """
    dtype = dtype or config.dtype

    def zeros(slots):
        # Head-major (B, K, slots, H), K key/value heads: see `layers.attention`.
        shape = (batch, config.kv_heads, slots, config.head_dim)
        return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}

    layer = {"self_attention": zeros(length)}
    if source_length is not None:
        layer["cross_attention"] = zeros(source_length)
    num_layers = config.decoder_layers
    if config.scan_layers:
        return {"layers": jax.tree.map(lambda x: jnp.stack([x] * num_layers), layer)}
    return {f"layers_{i}": layer for i in range(num_layers)}


def init_cache(
    config: TransformerConfig, batch: int, length: int, source_length: int | None = None
) -> dict:
    """An empty cache (the tree of the module docstring).

    Args:
      config: the model config.
      batch: B, sequences decoded together (beams count as sequences).
      length: L, cache slots per sequence (longest prompt + tokens to generate); at most
        `config.max_len`, the positions the model knows.
      source_length: S, the encoder input length, for `Transformer`; None for
        `DecoderOnlyTransformer`.

    Raises:
      TypeError / ValueError: sizes that are not positive ints, or a length past max_len.
    """
    if not isinstance(config, TransformerConfig):
        raise TypeError(f"init_cache needs a TransformerConfig, got {type(config).__name__}.")
    check_int("init_cache", "batch", batch, low=1)
    check_int("init_cache", "length", length, low=1)
    if source_length is not None:
        check_int("init_cache", "source_length", source_length, low=1)
    config.check_length(length, "cache")
    cache = {
        "index": jnp.zeros((batch,), jnp.int32),
        "decoder": init_decoder_cache(config, batch, length, source_length),
    }
    if source_length is not None:
        # No source yet: `prefill` writes the real mask. An `extend` before it attends to
        # no source key (and raises where the mask is concrete).
        cache["source_mask"] = jnp.zeros((batch, source_length), jnp.bool_)
    return cache


def _scanned(cache: dict) -> bool:
    """Whether the decoder cache comes from an `nn.scan` stack (leading layer axis)."""
    return "layers" in cache["decoder"]


def cache_length(cache: dict) -> int:
    """L, the number of self-attention slots per sequence."""
    first_layer = next(iter(cache["decoder"].values()))
    # Keys are (B, K, L, H), after a leading layer axis under nn.scan.
    return first_layer["self_attention"]["k"].shape[-2]


def check_cache_room(
    cache: dict, length: int, lengths_B: jax.Array | None = None, *, debug_checks: bool = False
) -> None:
    """Raise ValueError if `length` new tokens per sequence do not fit in the cache.

    Sequence b writes its new tokens at slots `index[b], index[b] + 1, ...`; its real ones,
    `lengths_B[b]` of them (default `length`), must end by slot L - 1. (Right-padding past
    `lengths_B[b]` may fall off the end: it is never attended to.)

    The check runs where `cache['index']` (and `lengths_B`) are concrete arrays, as
    `models.check_tokens` checks token ids. Under `jit` they are tracers: with
    `debug_checks` the same conditions become `checkify` checks (`flax_transformer.checked`
    raises them); without, nothing is checked here and the models give NaN logits to every
    row whose tokens do not fit (their keys would be dropped from the cache). Size the cache
    for the longest prompt plus every token to generate, `init_cache(config, B, L)`, as the
    `generate_*` functions do.

    Args:
      cache: the cache of the module docstring.
      length: T, the new tokens per sequence of this call.
      lengths_B: int `(B,)`, the real ones among them, each in [0, T]; None: all T.
      debug_checks: turn the conditions into checkify checks where the values are traced.
    """
    index_B = cache["index"]
    slots = cache_length(cache)
    if lengths_B is not None and not jnp.issubdtype(jnp.asarray(lengths_B).dtype, jnp.integer):
        raise TypeError(
            f"lengths_B must be int token counts (B,), got dtype {jnp.asarray(lengths_B).dtype}; "
            "a fractional count would be truncated."
        )
    if not is_concrete(index_B, lengths_B):
        new_B = length if lengths_B is None else lengths_B
        if lengths_B is not None:
            runtime_check(
                debug_checks,
                (lengths_B >= 0) & (lengths_B <= length),
                f"lengths_B holds counts in [{{low}}, {{high}}], outside [0, T={length}]: the "
                "real tokens of each row of this call.",
                low=jnp.min(lengths_B),
                high=jnp.max(lengths_B),
            )
        runtime_check(
            debug_checks,
            index_B + new_B <= slots,
            f"KV cache overflow: the cache has {slots} slots and a sequence would need "
            "{need}; build it with init_cache(config, batch, length) for a length that holds "
            "the prompt plus every token to generate.",
            need=jnp.max(index_B + new_B),
        )
        return
    index_B = np.asarray(index_B)
    if lengths_B is None:
        new_B = np.full(index_B.shape, length)
    else:
        new_B = np.asarray(lengths_B)
        if new_B.shape != index_B.shape or new_B.min() < 0 or new_B.max() > length:
            raise ValueError(
                f"lengths_B={new_B.tolist()} must hold one count in [0, T={length}] per "
                f"sequence (B={index_B.shape[0]}): the real tokens of each row of this call."
            )
    end_B = index_B + new_B
    if end_B.max() > slots:
        b = int(np.argmax(end_B))
        raise ValueError(
            f"KV cache overflow: the cache has {slots} slots, sequence {b} has filled "
            f"{int(index_B[b])} (cache index) and {int(new_B[b])} new tokens would need "
            f"{int(end_B[b])}. Build the cache with init_cache(config, batch, length) for a "
            f"length >= {int(end_B.max())}: the prompt plus every token to generate."
        )


def check_cache_kind(
    cache: Any, encoder_decoder: bool, method: str, config: TransformerConfig | None = None
) -> None:
    """ValueError unless `cache` is a cache of the right model kind (see module docstring).

    A `Transformer` needs the cross-attention parts, `init_cache(..., source_length=S)`; a
    `DecoderOnlyTransformer` must not have them. With `config`, the cache's layers (count,
    scanned or not) and key/value heads and head width must be the ones `init_cache(config,
    ...)` builds: a cache of another config is refused, naming what differs.
    """
    if not isinstance(cache, dict) or "index" not in cache or "decoder" not in cache:
        got = sorted(cache) if isinstance(cache, dict) else type(cache).__name__
        raise ValueError(
            f"{method}: cache must be the dict that decoding.init_cache returns ('index', "
            f"'decoder', ...), got {got}."
        )
    has_source = "source_mask" in cache
    if encoder_decoder and not has_source:
        raise ValueError(
            f"{method}: this cache has no cross-attention part (a decoder-only cache); build "
            "one for the encoder-decoder Transformer with init_cache(config, batch, length, "
            "source_length=S)."
        )
    if not encoder_decoder and has_source:
        raise ValueError(
            f"{method}: this cache has a cross-attention part (an encoder-decoder cache); "
            "build one for the DecoderOnlyTransformer with init_cache(config, batch, length)."
        )
    if config is not None:
        _check_cache_config(cache, config, method)


def _check_cache_config(cache: dict, config: TransformerConfig, method: str) -> None:
    """ValueError unless the cache's decoder tree has `config`'s layers, heads and widths."""
    num_layers = config.decoder_layers
    expected = ["layers"] if config.scan_layers else [f"layers_{i}" for i in range(num_layers)]
    decoder = cache["decoder"]
    got = sorted(decoder) if isinstance(decoder, dict) else type(decoder).__name__
    fix = (
        "build the cache from the model's own config: init_cache(model.config, batch, length, ...)."
    )
    if not isinstance(decoder, dict) or sorted(decoder) != sorted(expected):
        layout = "scanned (one 'layers' entry)" if config.scan_layers else "unrolled"
        raise ValueError(
            f"{method}: the cache's decoder layers {got} are not this model's {num_layers} "
            f"{layout} layers ({expected[:3]}{'...' if len(expected) > 3 else ''}); it was "
            f"built for another config: {fix}"
        )
    lead = (num_layers,) if config.scan_layers else ()
    for name, layer in decoder.items():
        shape = tuple(jnp.shape(layer["self_attention"]["k"]))
        want = (*lead, config.kv_heads, config.head_dim)
        if len(shape) != len(lead) + 4 or shape[: len(lead)] + shape[-3:-2] + shape[-1:] != want:
            raise ValueError(
                f"{method}: cache['decoder'][{name!r}] keys have shape {shape}, but this "
                f"model needs {(*lead, 'B', config.kv_heads, 'L', config.head_dim)} "
                f"(kv heads {config.kv_heads}, head width {config.head_dim}); it was built for "
                f"another config: {fix}"
            )


def select_rows(cache: dict, rows_R: jax.Array) -> dict:
    """The cache of sequences `rows_R` `(R,)` (a gather on the batch axis of every leaf).

    Beam search uses it to copy each surviving beam's cache to its new slot.
    """
    decoder_axis = 1 if _scanned(cache) else 0
    out = {k: jnp.take(v, rows_R, axis=0) for k, v in cache.items() if k != "decoder"}
    out["decoder"] = jax.tree.map(
        lambda x: jnp.take(x, rows_R, axis=decoder_axis), cache["decoder"]
    )
    return out


def move_rows(cache: dict, rows_R: jax.Array) -> dict:
    """`select_rows(cache, rows_R)` for a same-size reorder whose sources stay put, in place.

    Row r takes the contents of row `rows_R[r]`. Precondition: every source row keeps its
    own contents, `rows_R[rows_R[r]] == rows_R[r]` for every r (beam search places each
    hypothesis's first child in its parent's row, so only the rows of hypotheses that left
    no child are overwritten, and nobody reads those). Then the rows can be copied one by
    one in any order, and only the rows that change are touched: a `fori_loop` over them
    with one dynamic slice and in-place update per leaf. `select_rows` instead gathers
    every row of every layer into a new cache each beam step, a copy of the whole cache per
    token; at a third of the rows moving, a toy of this cache's shapes ran 2-3x faster this
    way.

    Args:
      cache: the cache of the module docstring, R rows.
      rows_R: int `(R,)` satisfying the precondition (not checked: it is traced).
    """
    batch_rows = rows_R.shape[0]
    moved_R = rows_R != jnp.arange(batch_rows)
    # The moved rows first, then the rest; the loop visits the first `count` of them.
    order_R = jnp.argsort(~moved_R, stable=True)
    decoder_axis = 1 if _scanned(cache) else 0

    def copy_row(x, axis, dest, src):
        row = jax.lax.dynamic_slice_in_dim(x, src, 1, axis)
        return jax.lax.dynamic_update_slice_in_dim(x, row, dest, axis)

    def body(j, cache):
        dest = order_R[j]
        src = rows_R[dest]
        out = {k: copy_row(v, 0, dest, src) for k, v in cache.items() if k != "decoder"}
        out["decoder"] = jax.tree.map(
            lambda x: copy_row(x, decoder_axis, dest, src), cache["decoder"]
        )
        return out

    return jax.lax.fori_loop(0, jnp.sum(moved_R), body, cache)
