"""LoRA on the parameter tree: fold adapters into kernels, mark them, count them.

The adapters themselves live in the layers (`layers.lora`; fields `lora_rank`, `lora_alpha`,
`lora_targets` of `TransformerConfig`): Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large
Language Models", arXiv:2106.09685. Each targeted kernel W is used as
`W + (lora_alpha / lora_rank) * A @ B`; the adapter pair of target t sits beside the kernel
it adapts, as the child `lora_<t>` with params `lora_a` and `lora_b`.

These functions take the parameter tree of either model, `{'params': ...}` or the bare
tree, boxed (`nn.LogicallyPartitioned`) or plain, stacked (`scan_layers`) or unrolled.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from flax_transformer.config import (
    DEFAULT_LORA_ALPHA,
    DEFAULT_LORA_TARGETS,
    LORA_TARGETS,
    TransformerConfig,
)
from flax_transformer.functional.lora import lora_delta

# The leaf names of an adapter pair, and the prefix of the child holding it.
LORA_LEAVES = ("lora_a", "lora_b")
_CHILD = "lora_"
# Input axes of each target's kernel (`(N, H, D)` for the attention output, else `(D, ...)`).
_IN_AXES = {"o": 2}


def lora_mask(params: Any) -> Any:
    """A tree of bools shaped like `params`: True on adapter leaves (`lora_a`, `lora_b`).

    Give it to optax to train the adapters alone, e.g. `optax.multi_transform` with
    `jax.tree.map(lambda m: 'lora' if m else 'frozen', lora_mask(params))` as the labels
    and `optax.set_to_zero()` for 'frozen' (docs/api.md, "LoRA"). A boxed tree gives a
    boxed tree of bools, the same structure again.
    """

    def is_adapter(path, _) -> bool:
        keys = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
        return bool(keys) and keys[-1] in LORA_LEAVES

    return jax.tree_util.tree_map_with_path(is_adapter, params)


def _check_config(fn: str, config: Any) -> None:
    if not isinstance(config, TransformerConfig):
        raise TypeError(f"{fn}: config must be a TransformerConfig, got {type(config).__name__}.")


def _attention_parts(config: TransformerConfig) -> dict[str, tuple[int, int]]:
    """(fan in, fan out) of each attention target, self or cross (the models' encoder
    output, which cross-attention's keys and values read, has width D too)."""
    d, kv = config.d_model, config.kv_heads * config.head_dim
    return {"q": (d, d), "k": (d, kv), "v": (d, kv), "o": (d, d)}


def _ffn_parts(config: TransformerConfig) -> dict[str, tuple[int, int]]:
    d, f = config.d_model, config.d_ff
    return {"up": (d, f), "gate": (d, f), "down": (f, d)}


def lora_param_count(config: TransformerConfig, *, decoder_only: bool) -> int:
    """The number of adapter parameters of a model, in closed form.

    Each targeted projection of fan in `i` and fan out `o` adds `lora_rank * (i + o)`
    (A `(i, r)`, B `(r, o)`), in every layer: the encoder's self-attention and
    feed-forward, the decoder's self-attention, cross-attention (encoder-decoder only) and
    feed-forward. 0 for `lora_rank=0`.

    Args:
      config: the model's config.
      decoder_only: True for `DecoderOnlyTransformer` (no encoder, no cross-attention),
        False for `Transformer`.
    """
    _check_config("lora_param_count", config)
    if not isinstance(decoder_only, bool):
        raise TypeError(f"lora_param_count: decoder_only={decoder_only!r} must be True or False.")
    rank, targets = config.lora_rank, config.lora_targets

    def sublayer(parts: dict[str, tuple[int, int]]) -> int:
        return sum(
            rank * (fan_in + fan_out) for t, (fan_in, fan_out) in parts.items() if t in targets
        )

    attention = sublayer(_attention_parts(config))
    ffn = sublayer(_ffn_parts(config))
    if decoder_only:
        return config.decoder_layers * (attention + ffn)
    encoder = config.encoder_layers * (attention + ffn)
    return encoder + config.decoder_layers * (2 * attention + ffn)  # self + cross


def _kernel_of(module: Mapping, target: str) -> tuple[str, int | None]:
    """The kernel an adapter of `target` sits on in this module, and its part index."""
    if target in ("up", "gate", "down"):
        return {"up": "wi_kernel", "gate": "wg_kernel", "down": "wo_kernel"}[target], None
    if target == "o":
        return "out_kernel", None
    if "qkv_kernel" in module:
        return "qkv_kernel", "qkv".index(target)
    if target == "q":
        return "query_kernel", None
    return "kv_kernel", "kv".index(target)


def _fold(kernel, a, b, scale: float, part: int | None, in_axes: int) -> jax.Array:
    """`kernel + scale * A @ B` (at `part` of a fused kernel) in float32, cast back; the
    same sum the layers compute in their forward pass."""
    if a.ndim > in_axes + 1:  # stacked layers (nn.scan): one more leading axis on every leaf
        fold = lambda k, a_, b_: _fold(k, a_, b_, scale, part, in_axes)  # noqa: E731
        return jax.vmap(fold)(kernel, a, b)
    update = lora_delta(a, b, scale)
    if part is not None:
        update = jnp.expand_dims(update, in_axes)
        pad = [(0, 0)] * kernel.ndim
        pad[in_axes] = (part, kernel.shape[in_axes] - part - 1)
        update = jnp.pad(update, pad)
    return (kernel.astype(jnp.float32) + update).astype(kernel.dtype)


def _merge_module(module: Mapping, scale: float, rank: int, path: str) -> tuple[dict, int]:
    """A module's params with its adapters folded in (recursively); the leaves folded."""
    out, folded = {}, 0
    adapters = {}
    for name, value in module.items():
        if (
            name.startswith(_CHILD)
            and isinstance(value, Mapping)
            and set(value) == set(LORA_LEAVES)
        ):
            adapters[name[len(_CHILD) :]] = value
        elif isinstance(value, Mapping):
            out[name], count = _merge_module(value, scale, rank, f"{path}/{name}")
            folded += count
        else:
            out[name] = value
    for target, pair in adapters.items():
        if target not in LORA_TARGETS:
            raise ValueError(f"merge_lora: {path}/lora_{target} adapts no known projection.")
        kernel_name, part = _kernel_of(out, target)
        if kernel_name not in out:
            raise ValueError(
                f"merge_lora: {path}/lora_{target} has no {kernel_name} beside it to fold into."
            )
        a, b = pair["lora_a"], pair["lora_b"]
        stacked = a.ndim - 1 - _IN_AXES.get(target, 1)  # 1 under nn.scan, else 0
        if a.shape[-1] != rank or b.ndim <= stacked or b.shape[stacked] != rank:
            raise ValueError(
                f"merge_lora: {path}/lora_{target} has rank {a.shape[-1]} (lora_a "
                f"{a.shape}, lora_b {b.shape}), but the config's lora_rank is {rank}."
            )
        out[kernel_name] = _fold(out[kernel_name], a, b, scale, part, _IN_AXES.get(target, 1))
        folded += a.size + b.size
    return out, folded


def merge_lora(config: TransformerConfig, params: Any) -> tuple[TransformerConfig, Any]:
    """Fold every adapter into its kernel: the model without adapters that computes the same.

    Each targeted kernel becomes `W + (lora_alpha / lora_rank) * A @ B`, summed in float32
    and stored in the kernel's own dtype; the `lora_*` children are dropped.

    `lora_alpha` is not stored in the params: the scale is read from `config` alone. Pass
    the config the adapters were trained with; one with another `lora_alpha` merges at
    another scale and nothing can tell (the rank, the targets and the count of adapter
    parameters are checked against the params; alpha cannot be). `train/` keeps a run's
    config, alpha included, in its work directory's `config.json`; PEFT keeps alpha in
    `adapter_config.json`, beside the weights, not in them.

    Args:
      config: the config the params belong to, with the training run's `lora_alpha`
        (`lora_rank > 0`; with 0 and no adapters in `params`, both come back unchanged).
      params: `{'params': ...}` or the bare tree of `Transformer(config)` or
        `DecoderOnlyTransformer(config)`, boxed or plain.

    Returns:
      `(config, params)`: the config with `lora_rank=0` and the other LoRA fields at their
      defaults (equal to the base model's config), and plain (unboxed) params of exactly the
      tree of a model built from it, wrapped in `{'params': ...}` as given.

    Raises:
      ValueError: the adapters found disagree with the config (rank, count, no kernel).
    """
    _check_config("merge_lora", config)
    if not isinstance(params, Mapping):
        raise TypeError(f"merge_lora: params must be a dict of parameters, got {type(params)}.")
    params = nn.unbox(params)
    wrapped = "params" in params and isinstance(params["params"], Mapping)
    tree = params["params"] if wrapped else params
    rank = config.lora_rank
    if rank == 0:
        if any(jax.tree.leaves(lora_mask(tree))):
            raise ValueError(
                "merge_lora: the params hold LoRA adapters but config.lora_rank=0; pass the "
                "config the model was built with."
            )
        return config, params
    merged, folded = _merge_module(tree, config.lora_alpha / rank, rank, "params")
    wanted = lora_param_count(config, decoder_only="encoder" not in merged)
    if folded != wanted:
        raise ValueError(
            f"merge_lora: found {folded} adapter parameters, but config (lora_rank={rank}, "
            f"lora_targets={config.lora_targets}) gives {wanted}; pass the config the model "
            "was built with."
        )
    base = config.replace(
        lora_rank=0, lora_alpha=DEFAULT_LORA_ALPHA, lora_targets=DEFAULT_LORA_TARGETS
    )
    return base, {**params, "params": merged} if wrapped else merged
