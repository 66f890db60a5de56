"""The full models: encoder-decoder `Transformer` and GPT-style `DecoderOnlyTransformer`.

Both models also run incrementally for generation, over a KV cache that is an explicit
pytree passed in and returned (as Gemma does; `flax_transformer.cache` defines it,
`init_cache` builds it). `extend(tokens (B, T), cache, lengths_B=...)` runs T new tokens per
sequence in one pass (a whole prompt: parallel prefill; or one token: a decoding step),
writes their keys/values at slots `index[b] + t`, and advances `index[b]` by `lengths[b]`
(default T). Sequence b's token at slot j sits at position j, so right-padded prompts of
different lengths share one cache: the padding slots past `lengths[b]` are overwritten by
the next tokens and never attended to. New tokens that would not fit in the cache raise
a ValueError where the cache index is concrete (`cache.check_cache_room`); under
`jit` the row's logits are NaN instead, or, with `config.debug_checks`, a checkify check
raises (`flax_transformer.checked`).

Packed sequences (training and scoring, not the cache): several examples share one row,
told apart by int segment ids `(B, T)`, 1, 2, ... per example and 0 at padding. Each token
then attends only within its own segment (causally in the decoder; a target token reads
only the source of its own segment), and positions restart at 0 in each segment
(`functional.segment_positions`, unless positions are given). Without segment ids the
models run exactly as before.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import traverse_util

from flax_transformer.blocks import Decoder, Encoder
from flax_transformer.cache import cache_length, check_cache_kind, check_cache_room
from flax_transformer.checks.arguments import as_array, is_concrete
from flax_transformer.checks.tokens import check_packing, check_segment_ids, check_tokens
from flax_transformer.checks.traced import runtime_check
from flax_transformer.config import TransformerConfig
from flax_transformer.functional.masks import cross_attention_mask, self_attention_mask
from flax_transformer.layers import Embed


def _packed_positions(
    tokens_BT: jax.Array,
    segment_ids_BT: jax.Array | None,
    positions_BT: jax.Array | None,
    config: TransformerConfig,
    names: tuple[str, str, str],
) -> jax.Array | None:
    """Check a packed row's segment ids and positions and return the positions to use
    (`checks.tokens.check_packing`): the given ones, else `segment_positions(segment_ids_BT)`
    when the row is packed, else None (the stack numbers 0..T-1)."""
    return check_packing(
        tokens_BT,
        segment_ids_BT,
        positions_BT,
        config.max_len,
        config.pad_id,
        names,
        debug_checks=config.debug_checks,
    )


def _extend_decoder(
    decoder: Decoder,
    config: TransformerConfig,
    vocab_size: int,
    tokens_BT: jax.Array,
    cache: dict,
    lengths_B: jax.Array | None,
    encoded_BSD: jax.Array | None,
) -> tuple[jax.Array, dict]:
    """Run `tokens_BT` through `decoder` over `cache`: the body of both models' `extend`."""
    checks = config.debug_checks
    tokens_BT = check_tokens(tokens_BT, vocab_size, config.max_len, "tokens", debug_checks=checks)
    batch, length = tokens_BT.shape
    index_B = cache["index"]
    if jnp.shape(index_B) != (batch,):
        raise ValueError(
            f"the cache holds {jnp.shape(index_B)} sequences (cache['index']), but tokens are "
            f"{tokens_BT.shape} (B, T); build the cache with init_cache(config, B={batch}, L)."
        )
    check_cache_room(cache, length, lengths_B, debug_checks=checks)
    slots = cache_length(cache)
    config.check_length(slots, "cache")
    positions_BT = index_B[:, None] + jnp.arange(length)[None, :]
    # Query t of sequence b sees the cache slots up to its own position (causal over slots);
    # slots past it hold padding or nothing yet.
    self_mask_B1TL = jnp.arange(slots)[None, None, None, :] <= positions_BT[:, None, :, None]
    cross_mask_B11S = None
    if "source_mask" in cache:
        cross_mask_B11S = cache["source_mask"][:, None, None, :]
    logits_BTV, decoder_cache = decoder(
        tokens_BT,
        encoded_BSD,
        self_mask_B1TL,
        cross_mask_B11S,
        positions_BT=positions_BT,
        cache=cache["decoder"],
        cache_index=index_B,
    )
    chex.assert_shape(logits_BTV, (batch, length, vocab_size))
    advance_B = jnp.full((batch,), length, jnp.int32) if lengths_B is None else lengths_B
    # Unchecked under jit, a row whose tokens do not fit would attend without their keys
    # (the cache drops writes past its last slot): give it NaN instead of drifted logits.
    overflow_B = index_B + advance_B > slots
    logits_BTV = jnp.where(overflow_B[:, None, None], jnp.nan, logits_BTV)
    return logits_BTV, {
        **cache,
        "index": index_B + advance_B.astype(jnp.int32),
        "decoder": decoder_cache,
    }


# Parameter paths a config option adds, and the option to name when a tree holds them but
# the config does not: first match wins.
_PARAM_HINTS = (
    (r"(query|key)_norm_scale$", "qk_norm=True"),
    (r"(^|/)lora_", "lora_rank > 0 (with lora_targets naming that projection)"),
    (r"(^|/)logits/kernel$", "tie_output_embedding=False"),
    (r"(^|/)logits(/|_)bias$", "output_bias=True"),
    (r"^target_embed/", "share_embeddings=False"),
    (r"(^|/)positions/pos_embedding$", "positional='learned'"),
    (r"(^|/)ffn/wg_", "activation='swiglu' or 'geglu'"),
    (r"attention/\w+_bias$", "attention_bias=True (or use_bias=True)"),
    (r"ffn/\w+_bias$", "ffn_bias=True (or use_bias=True)"),
    (r"norm\w*/bias$", "norm='layernorm' with norm_bias=True (or use_bias=True)"),
    (
        r"attention/(qkv|query|kv)_kernel$",
        "num_kv_heads (qkv_kernel: K = N heads; "
        "query_kernel + kv_kernel: K < N, or cross-attention)",
    ),
    (r"(^|/)final_norm/", "final_norm=True"),
    (
        r"(^|/)layers_\d+/",
        "num_layers (or num_encoder_layers / num_decoder_layers), or scan_layers=False",
    ),
    (r"(^|/)layers/", "scan_layers=True"),
)


def _param_hint(path: str) -> str:
    for pattern, hint in _PARAM_HINTS:
        if re.search(pattern, path):
            return hint
    return "another model's parameters"


@functools.lru_cache(maxsize=64)
def _expected_param_paths(model_type: type, config: TransformerConfig) -> frozenset[str]:
    """The 'params' paths `model_type(config).init` builds, from `jax.eval_shape` (nothing
    computed), once per (model, config): the tree depends on neither input shape nor
    `debug_checks`, so a `(1, 1)` dummy batch traces it."""
    model = model_type(config.replace(debug_checks=False))
    tokens = jnp.zeros((1, 1), jnp.int32)
    args = (tokens, tokens) if model_type is Transformer else (tokens,)
    shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), *args))
    return frozenset(traverse_util.flatten_dict(nn.unbox(shapes["params"]), sep="/"))


def check_param_paths(model: nn.Module, params: Any, fn: str, *, missing_too: bool = False) -> None:
    """ValueError if `params` (a 'params' tree) holds entries `model` does not use.

    Flax ignores entries a model never reads, so parameters trained with an option
    (`qk_norm`, LoRA, biases, an untied head, ...) would apply without error to a model
    built without it, their learned values unused. The paths are compared with those of
    `model.init` (`jax.eval_shape`, cached per config): at trace time under `jit`, nothing
    per step. `missing_too` also names the paths the model needs that `params` lacks
    (flax reports those itself, at the first one read).

    Raises:
      ValueError: naming the extra (and missing) paths and the config option that would
        use each.
    """
    have = traverse_util.flatten_dict(params, sep="/") if isinstance(params, Mapping) else {}
    if not have and not missing_too:
        return
    want = _expected_param_paths(type(model), model.config)
    extra = sorted(set(have) - want)
    missing = sorted(want - set(have)) if missing_too else []
    if not extra and not missing:
        return
    name = type(model).__name__
    parts = []
    if extra:
        hints = sorted({_param_hint(path) for path in extra})
        shown = ", ".join(extra[:8]) + (f", ... ({len(extra)} in all)" if len(extra) > 8 else "")
        parts.append(
            f"params hold {len(extra)} entries {name}(config) does not use: {shown}; they "
            f"would be ignored without a word. The config option that uses them: "
            f"{'; '.join(hints)}. Build the model with the config the parameters were "
            "trained with, or drop those entries"
        )
    if missing:
        parts.append(f"params lack {len(missing)} entries {name}(config) needs: {missing[:8]}")
    raise ValueError(f"{fn}: " + "; and ".join(parts) + ".")


def _params_of(variables: Any) -> Any:
    """The 'params' collection of `apply`'s variables, or None (flax reports its absence)."""
    return variables.get("params") if isinstance(variables, Mapping) else None


def _output_head(
    config: TransformerConfig, variables: Any, embed_name: str
) -> tuple[jax.Array, jax.Array | None]:
    """`(kernel (D, V), bias (V,) or None)` of the head, read from `variables` (or its
    'params'): the tied embedding's transpose or the `logits` kernel, and its bias."""
    params = nn.unbox(_params_of(variables) or variables)
    decoder = params["decoder"]
    if config.tie_output_embedding:
        kernel_DV = params[embed_name]["embedding"].T
        bias_V = decoder.get("logits_bias") if config.output_bias else None
    else:
        kernel_DV = decoder["logits"]["kernel"]
        bias_V = decoder["logits"].get("bias") if config.output_bias else None
    return kernel_DV, bias_V


def _embed(cfg: TransformerConfig, vocab_size: int, name: str) -> Embed:
    """A token embedding of the config's width, init and dtypes."""
    return Embed(
        vocab_size,
        cfg.d_model,
        init_std=cfg.embed_init_std,
        dtype=cfg.dtype,
        param_dtype=cfg.param_dtype,
        name=name,
    )


class Transformer(nn.Module):
    """Encoder-decoder Transformer (Vaswani et al. 2017, §3; Happy-LLM ch. 2).

    `apply(params, src_BS, tgt_BT)` -> float32 logits `(B, T, V)`. `tgt_BT` are the decoder
    inputs (BOS then the target shifted right); padding (`config.pad_id`) is masked in
    every attention. Dropout is on when `deterministic=False` (rng stream 'dropout').
    Packed rows take `src_segment_ids_BS` and `tgt_segment_ids_BT` (module docstring).
    """

    config: TransformerConfig

    @nn.nowrap
    def apply(self, variables, *args, **kwargs):
        """`nn.Module.apply`, after checking that `variables['params']` holds nothing this
        config does not use (`check_param_paths`; trace time only under `jit`)."""
        check_param_paths(self, _params_of(variables), f"{type(self).__name__}.apply")
        return super().apply(variables, *args, **kwargs)

    def setup(self):
        cfg = self.config
        src_embed = _embed(cfg, cfg.vocab_size, "embed")
        tgt_embed = src_embed
        if not cfg.share_embeddings:
            tgt_embed = _embed(cfg, cfg.output_vocab_size, "target_embed")
        self.encoder = Encoder(cfg, src_embed)
        self.decoder = Decoder(cfg, tgt_embed, cross_attention=True)

    def encode(
        self,
        src_BS: jax.Array,
        *,
        segment_ids_BS: jax.Array | None = None,
        positions_BS: jax.Array | None = None,
        deterministic: bool = True,
    ) -> jax.Array:
        """Source ids `(B, S)` -> encoded `(B, S, D)`.

        Packed sources take int `segment_ids_BS` `(B, S)` (0 = padding): attention stays
        within each segment, and `positions_BS` default to `segment_positions(segment_ids_BS)`.
        """
        cfg = self.config
        checks = cfg.debug_checks
        src_BS = check_tokens(
            src_BS, cfg.vocab_size, cfg.max_len, "src_tokens", debug_checks=checks
        )
        names = ("src_tokens", "src_segment_ids", "src_positions")
        positions_BS = _packed_positions(src_BS, segment_ids_BS, positions_BS, cfg, names)
        encoded = self.encoder(
            src_BS,
            self_attention_mask(src_BS, cfg.pad_id, False, segment_ids_BS),
            deterministic=deterministic,
            positions_BS=positions_BS,
        )
        chex.assert_shape(encoded, (*src_BS.shape, cfg.d_model))
        return encoded

    def decode(
        self,
        encoded_BSD: jax.Array,
        src_BS: jax.Array,
        tgt_BT: jax.Array,
        *,
        src_segment_ids_BS: jax.Array | None = None,
        tgt_segment_ids_BT: jax.Array | None = None,
        tgt_positions_BT: jax.Array | None = None,
        deterministic: bool = True,
    ) -> jax.Array:
        """Decoder over the encoder output: `(B, S, D)`, `(B, S)`, `(B, T)` -> logits `(B, T, V)`.

        `src_BS` is needed only for its padding mask. Packed rows take both segment ids,
        `src_segment_ids_BS` and `tgt_segment_ids_BT` (target segment s reads source segment
        s only); `tgt_positions_BT` default to `segment_positions(tgt_segment_ids_BT)`.
        """
        return self._decode(
            encoded_BSD,
            src_BS,
            tgt_BT,
            src_segment_ids_BS=src_segment_ids_BS,
            tgt_segment_ids_BT=tgt_segment_ids_BT,
            tgt_positions_BT=tgt_positions_BT,
            deterministic=deterministic,
            head=True,
        )

    def _decode(
        self,
        encoded_BSD,
        src_BS,
        tgt_BT,
        *,
        src_segment_ids_BS,
        tgt_segment_ids_BT,
        tgt_positions_BT,
        deterministic: bool,
        head: bool,
    ) -> jax.Array:
        """`decode`, or with `head=False` the final hidden states `(B, T, D)`."""
        cfg = self.config
        checks = cfg.debug_checks
        vocab = cfg.output_vocab_size
        tgt_BT = check_tokens(tgt_BT, vocab, cfg.max_len, "tgt_tokens", debug_checks=checks)
        src_BS = as_array("Transformer.decode", "src_tokens", src_BS)
        chex.assert_rank(encoded_BSD, 3)
        chex.assert_equal_shape_prefix([encoded_BSD, src_BS], 2)
        names = ("tgt_tokens", "tgt_segment_ids", "tgt_positions")
        positions_BT = _packed_positions(tgt_BT, tgt_segment_ids_BT, tgt_positions_BT, cfg, names)
        cross_mask = cross_attention_mask(
            src_BS, cfg.pad_id, src_segment_ids_BS, tgt_segment_ids_BT
        )
        if src_segment_ids_BS is not None:
            # Checked again here (encode checked them too) as decode is public on its own.
            src_names = ("src_tokens", "src_segment_ids")
            check_segment_ids(
                src_BS, src_segment_ids_BS, cfg.pad_id, src_names, debug_checks=checks
            )
        logits = self.decoder(
            tgt_BT,
            encoded_BSD,
            self_attention_mask(tgt_BT, cfg.pad_id, True, tgt_segment_ids_BT),
            cross_mask,
            deterministic=deterministic,
            positions_BT=positions_BT,
            head=head,
        )
        chex.assert_shape(logits, (*tgt_BT.shape, cfg.output_vocab_size if head else cfg.d_model))
        return logits

    def __call__(
        self,
        src_BS: jax.Array,
        tgt_BT: jax.Array,
        *,
        src_segment_ids_BS: jax.Array | None = None,
        tgt_segment_ids_BT: jax.Array | None = None,
        src_positions_BS: jax.Array | None = None,
        tgt_positions_BT: jax.Array | None = None,
        deterministic: bool = True,
    ) -> jax.Array:
        """Source ids `(B, S)`, decoder input ids `(B, T)` -> float32 logits `(B, T, V)`.

        Packed rows: int segment ids `(B, S)` and `(B, T)`, both or neither (0 = padding,
        1, 2, ... the examples, the same id for an example's source and target); positions
        default to restarting at 0 in each segment.
        """
        return self._forward(
            src_BS,
            tgt_BT,
            src_segment_ids_BS=src_segment_ids_BS,
            tgt_segment_ids_BT=tgt_segment_ids_BT,
            src_positions_BS=src_positions_BS,
            tgt_positions_BT=tgt_positions_BT,
            deterministic=deterministic,
            head=True,
        )

    def _forward(
        self,
        src_BS,
        tgt_BT,
        *,
        src_segment_ids_BS,
        tgt_segment_ids_BT,
        src_positions_BS,
        tgt_positions_BT,
        deterministic: bool,
        head: bool,
    ) -> jax.Array:
        """`__call__`, or with `head=False` the final hidden states `(B, T, D)`."""
        src_BS = as_array("Transformer", "src_tokens", src_BS)
        tgt_BT = as_array("Transformer", "tgt_tokens", tgt_BT)
        # Another rank is named by encode/decode's token checks.
        if src_BS.ndim == tgt_BT.ndim == 2 and src_BS.shape[0] != tgt_BT.shape[0]:
            raise ValueError(
                f"src and tgt need the same batch size: {src_BS.shape=}, {tgt_BT.shape=}."
            )
        encoded = self.encode(
            src_BS,
            segment_ids_BS=src_segment_ids_BS,
            positions_BS=src_positions_BS,
            deterministic=deterministic,
        )
        return self._decode(
            encoded,
            src_BS,
            tgt_BT,
            src_segment_ids_BS=src_segment_ids_BS,
            tgt_segment_ids_BT=tgt_segment_ids_BT,
            tgt_positions_BT=tgt_positions_BT,
            deterministic=deterministic,
            head=head,
        )

    def hidden_states(
        self,
        src_BS: jax.Array,
        tgt_BT: jax.Array,
        *,
        src_segment_ids_BS: jax.Array | None = None,
        tgt_segment_ids_BT: jax.Array | None = None,
        src_positions_BS: jax.Array | None = None,
        tgt_positions_BT: jax.Array | None = None,
        deterministic: bool = True,
    ) -> jax.Array:
        """`__call__` without the head: the decoder's final hidden states `(B, T, D)` in
        `config.dtype`, after the final norm, for a loss that applies the head itself block
        by block (`functional.blocked_cross_entropy` with `output_head(params)`). The
        head's parameters stay in `params`, unread."""
        return self._forward(
            src_BS,
            tgt_BT,
            src_segment_ids_BS=src_segment_ids_BS,
            tgt_segment_ids_BT=tgt_segment_ids_BT,
            src_positions_BS=src_positions_BS,
            tgt_positions_BT=tgt_positions_BT,
            deterministic=deterministic,
            head=False,
        )

    @nn.nowrap
    def output_head(self, variables: Any) -> tuple[jax.Array, jax.Array | None]:
        """The head `(kernel (D, V), bias (V,) or None)` in `variables` (or their 'params'):
        the target embedding's transpose when tied, else the `logits` kernel. The logits
        are `hidden_states @ kernel + bias` in float32 (the policy of
        `functional.precision`), soft-capped by `config.logits_soft_cap`."""
        name = "embed" if self.config.share_embeddings else "target_embed"
        return _output_head(self.config, variables, name)

    def prefill(
        self,
        src_BS: jax.Array,
        tgt_BT: jax.Array,
        cache: dict,
        *,
        lengths_B: jax.Array | None = None,
    ) -> tuple[jax.Array, dict]:
        """Encode the source once and run the decoder prompt `tgt_BT` over an empty cache.

        Fills the cross-attention keys/values of every layer from the encoder output (later
        `extend` calls reuse them) and the self-attention keys/values of the prompt.

        Args:
          src_BS: source ids `(B, S)`; padding masked.
          tgt_BT: decoder prompt `(B, T)`, usually `[[BOS]] * B`; right-padded if the
            prompts differ in length.
          cache: from `decoding.init_cache(config, B, L, source_length=S)`.
          lengths_B: real prompt length per sequence (default T).

        Returns:
          `(logits (B, T, V) float32, cache)`; row `lengths_B[b] - 1` predicts the next token.

        Raises:
          ValueError: the prompt does not fit in the cache (checked before the encoder runs,
            where the cache index is concrete; see `cache.check_cache_room` for
            what happens under `jit`).
        """
        cfg = self.config
        check_cache_kind(cache, True, "Transformer.prefill", cfg)
        src_BS = as_array("Transformer.prefill", "src_tokens", src_BS)
        tgt_BT = as_array("Transformer.prefill", "tgt_tokens", tgt_BT)
        if cache["source_mask"].shape != src_BS.shape:
            raise ValueError(
                f"Transformer.prefill: the cache was built for sources of shape "
                f"{cache['source_mask'].shape} (B, S), but src_BS is {src_BS.shape}; build it "
                f"with init_cache(config, B, L, source_length={src_BS.shape[-1]})."
            )
        check_cache_room(cache, tgt_BT.shape[1], lengths_B, debug_checks=cfg.debug_checks)
        encoded_BSD = self.encode(src_BS)
        cache = {**cache, "source_mask": src_BS != cfg.pad_id}
        vocab = cfg.output_vocab_size
        return _extend_decoder(self.decoder, cfg, vocab, tgt_BT, cache, lengths_B, encoded_BSD)

    def extend(
        self, tgt_BT: jax.Array, cache: dict, *, lengths_B: jax.Array | None = None
    ) -> tuple[jax.Array, dict]:
        """Decoder over `tgt_BT` `(B, T)` after a `prefill`: `(logits (B, T, V), cache)`.

        The encoder output is not needed: cross-attention reads its cached keys/values.
        Raises ValueError, as `DecoderOnlyTransformer.extend`, if the tokens do not fit, and
        if the cache holds no encoded source (a fresh `init_cache` never passed through
        `prefill`). Under `jit` the second is a checkify check with `debug_checks`;
        unchecked, such a cache has no visible source key and cross-attention adds zeros.
        """
        cfg = self.config
        check_cache_kind(cache, True, "Transformer.extend", cfg)
        message = (
            "Transformer.extend: the cache holds no encoded source (its source_mask is all "
            "False): run Transformer.prefill(src, prompt, cache) first, then extend."
        )
        if is_concrete(cache["source_mask"]):
            if not np.asarray(cache["source_mask"]).any():
                raise ValueError(message)
        else:
            runtime_check(cfg.debug_checks, jnp.any(cache["source_mask"]), message)
        vocab = cfg.output_vocab_size
        return _extend_decoder(self.decoder, cfg, vocab, tgt_BT, cache, lengths_B, None)


class DecoderOnlyTransformer(nn.Module):
    """GPT-style causal language model: a decoder stack without cross-attention.

    `apply(params, tokens_BT)` -> float32 logits `(B, T, V)`; logit t predicts token t+1.
    Packed rows take `segment_ids_BT` (module docstring).
    """

    config: TransformerConfig

    @nn.nowrap
    def apply(self, variables, *args, **kwargs):
        """`nn.Module.apply`, after checking that `variables['params']` holds nothing this
        config does not use (`check_param_paths`; trace time only under `jit`)."""
        check_param_paths(self, _params_of(variables), f"{type(self).__name__}.apply")
        return super().apply(variables, *args, **kwargs)

    def setup(self):
        cfg = self.config
        self.embed = _embed(cfg, cfg.vocab_size, "embed")
        self.decoder = Decoder(cfg, self.embed, cross_attention=False)

    def __call__(
        self,
        tokens_BT: jax.Array,
        *,
        segment_ids_BT: jax.Array | None = None,
        positions_BT: jax.Array | None = None,
        deterministic: bool = True,
    ) -> jax.Array:
        """Token ids `(B, T)` -> float32 logits `(B, T, V)`.

        Args:
          tokens_BT: int token ids; `config.pad_id` is masked.
          segment_ids_BT: int `(B, T)` for packed rows: 1, 2, ... per example, 0 at padding;
            each token attends causally within its own segment. None: one sequence per row.
          positions_BT: int `(B|1, T)` positions; default `segment_positions(segment_ids_BT)`
            when packed, else 0..T-1.
          deterministic: False turns dropout on ('dropout' rng stream).
        """
        return self._forward(tokens_BT, segment_ids_BT, positions_BT, deterministic, head=True)

    def hidden_states(
        self,
        tokens_BT: jax.Array,
        *,
        segment_ids_BT: jax.Array | None = None,
        positions_BT: jax.Array | None = None,
        deterministic: bool = True,
    ) -> jax.Array:
        """`__call__` without the head: the final hidden states `(B, T, D)` in
        `config.dtype`, after the final norm, for a loss that applies the head itself block
        by block (`functional.blocked_cross_entropy` with `output_head(params)`). The
        head's parameters stay in `params`, unread."""
        return self._forward(tokens_BT, segment_ids_BT, positions_BT, deterministic, head=False)

    @nn.nowrap
    def output_head(self, variables: Any) -> tuple[jax.Array, jax.Array | None]:
        """The head `(kernel (D, V), bias (V,) or None)` in `variables` (or their 'params'):
        the embedding's transpose when tied, else the `logits` kernel. The logits are
        `hidden_states @ kernel + bias` in float32 (the policy of `functional.precision`),
        soft-capped by `config.logits_soft_cap`."""
        return _output_head(self.config, variables, "embed")

    def _forward(self, tokens_BT, segment_ids_BT, positions_BT, deterministic, *, head: bool):
        """`__call__`, or with `head=False` the final hidden states `(B, T, D)`."""
        cfg = self.config
        checks = cfg.debug_checks
        tokens_BT = check_tokens(
            tokens_BT, cfg.vocab_size, cfg.max_len, "tokens", debug_checks=checks
        )
        names = ("tokens", "segment_ids", "positions")
        positions_BT = _packed_positions(tokens_BT, segment_ids_BT, positions_BT, cfg, names)
        out = self.decoder(
            tokens_BT,
            None,
            self_attention_mask(tokens_BT, cfg.pad_id, True, segment_ids_BT),
            None,
            deterministic=deterministic,
            positions_BT=positions_BT,
            head=head,
        )
        chex.assert_shape(out, (*tokens_BT.shape, cfg.vocab_size if head else cfg.d_model))
        return out

    def extend(
        self, tokens_BT: jax.Array, cache: dict, *, lengths_B: jax.Array | None = None
    ) -> tuple[jax.Array, dict]:
        """Run `tokens_BT` `(B, T)` over the cache: a prompt (prefill) or one new token.

        Args:
          tokens_BT: token ids; prompts of different lengths right-padded.
          cache: from `decoding.init_cache(config, B, L)` or a previous `extend`.
          lengths_B: real tokens per row (default T); the cache index advances by this.

        Returns:
          `(logits (B, T, V) float32, cache)`; logits at row `lengths_B[b] - 1` predict the
          next token of sequence b.

        Raises:
          ValueError: the new tokens do not fit, `index[b] + lengths_B[b]` exceeds the
            cache's L slots (it names L, the index and the count). Checked where the cache
            index is a concrete array. Under `jit` it is a tracer: with
            `config.debug_checks` the overflow is a checkify check (`checked` raises it);
            without, writes past slot L - 1 are dropped and the row's logits are NaN. Size
            the cache with `init_cache(config, B, L)` for every token, as `generate_text`
            does. Also a cache of the encoder-decoder model.
        """
        cfg = self.config
        check_cache_kind(cache, False, "DecoderOnlyTransformer.extend", cfg)
        return _extend_decoder(self.decoder, cfg, cfg.vocab_size, tokens_BT, cache, lengths_B, None)
