"""One forward pass of a model, with every attention it computed: the record the pictures
(`train.tools.attention_figures`) and the explorer page (`train.tools.explorer`) draw from.

`MultiHeadAttention` sows into the 'intermediates' collection, when that is mutable, its
weights ('attention_weights') and what they came from ('attention_inputs': queries, keys,
values and mask). `attention_record` runs the model once with that collection mutable and
gathers both per attention kind, layer by layer, for batch element 0. Beside it stand the
names both views give what they show: the attention kinds, the tokens' pieces, and which
positional pairs are drawn as curves.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from flax_transformer.checks.generation import unbox_params
from train.tasks import task_of

# (queries side, keys side, label) of each attention kind `attention_record` returns.
ATTENTION_KINDS = {
    "encoder_self": ("source", "source", "encoder self-attention"),
    "decoder_self": ("target", "target", "decoder causal self-attention"),
    "decoder_cross": ("target", "source", "cross-attention (decoder queries, source keys)"),
}
PE_CURVES = 5  # (sin) dimensions drawn as curves, spread from the fastest pair to the slowest


def token_pieces(tokenizer, ids: Sequence[int]) -> list[str]:
    """The tokenizer's piece for each id (`id_to_piece`), else the id's decoded text."""
    to_piece = getattr(tokenizer, "id_to_piece", None)
    if to_piece is not None:
        return [to_piece(int(i)) for i in ids]
    return [tokenizer.decode([int(i)]) or f"#{int(i)}" for i in ids]


def curve_dims(dim: int, count: int = PE_CURVES) -> list[int]:
    """Sine dimensions 2i of `count` pairs spread evenly from the fastest pair (i = 0, a
    period of 2π positions) to the slowest (i = dim/2 - 1, a period near 2π·base)."""
    pairs = dim // 2
    chosen = sorted({round(j * (pairs - 1) / max(count - 1, 1)) for j in range(count)})
    return [2 * i for i in chosen]


def model_variables(model: nn.Module, params: Any) -> dict:
    """`{'params': plain arrays}` from what a caller holds: `model.init`'s output (the
    variables dict, boxed or unboxed, as `generate_*` take it) or its `['params']`."""
    return unbox_params(params, task_of(model).stacks, "train.visualize")


def _modules_with_weights(tree, path=()):
    """(path, dict) of every module in an 'intermediates' tree that sowed attention weights."""
    if isinstance(tree, Mapping):
        if "attention_weights" in tree:
            yield path, tree
        for key, sub in tree.items():
            yield from _modules_with_weights(sub, (*path, str(key)))


def _per_layer(value, scanned: bool) -> list[np.ndarray]:
    """Batch element 0 of a sown value, one array per layer (nn.scan stacks layers first)."""
    value = np.asarray(value)
    return [value[i, 0] for i in range(value.shape[0])] if scanned else [value[0]]


@functools.lru_cache(maxsize=8)
def _recording_apply(model: nn.Module):
    """`model.apply` with 'intermediates' mutable, compiled once per model (and input
    shapes): unjitted, a scanned stack is traced again on every call."""
    return jax.jit(functools.partial(model.apply, mutable=["intermediates"]))


def attention_record(model: nn.Module, params: Any, *inputs) -> dict:
    """One forward pass, with every attention's weights, queries, keys, values and mask.

    Args:
        model: a `Transformer` (inputs: source, decoder ids) or `DecoderOnlyTransformer`.
        params: `model.init`'s output (boxed or not) or its `['params']`.
        *inputs: int ids `(B, S)`, `(B, T)` (or `(B, T)` for the language model); the
            record is of batch element 0.

    Returns:
        `{kind: {...}, 'logits': (T, V)}` with kind 'encoder_self', 'decoder_self' or
        'decoder_cross' (those the model has), each holding float32 'weights' `(L, N, T, S)`
        (the sown ones), 'q' `(L, N, T, H)`, 'k' and 'v' `(L, N, S, H)` (a key/value head
        repeated for each query head it serves), 'scores' `(L, N, T, S)` = q·k/√H as the
        attention computes them in float32, and bool 'mask' `(L, N, T, S)` (True = may
        attend).
    """
    variables = model_variables(model, params)
    logits, state = _recording_apply(model)(variables, *inputs)
    found: dict[str, list] = {}
    for path, sown in _modules_with_weights(state["intermediates"]):
        stack = "encoder" if "encoder" in path else "decoder"
        kind = "cross" if "cross_attention" in path else "self"
        layer = next((k for k in path if k.startswith("layers")), "")
        scanned = layer == "layers"
        (weights,) = sown["attention_weights"]
        (given,) = sown["attention_inputs"]
        sown_arrays = (weights, given["q"], given["k"], given["v"], given["mask"])
        arrays = [_per_layer(a, scanned) for a in sown_arrays]
        order = int(layer.split("_")[1]) if "_" in layer else 0
        found.setdefault(f"{stack}_{kind}", []).append((order, list(zip(*arrays, strict=True))))
    record: dict = {"logits": np.asarray(logits[0], np.float32)}
    for name, entries in found.items():
        layers = [per for _, per_layer in sorted(entries, key=lambda e: e[0]) for per in per_layer]
        weights_LNTS = np.stack([w for w, *_ in layers]).astype(np.float32)
        q_LTNH, k_LSKH, v_LSKH = (
            np.stack([layer[i] for layer in layers]).astype(np.float32) for i in (1, 2, 3)
        )
        # Query head i reads key/value head i // (N / K), as `multi_head_attention` groups.
        group = q_LTNH.shape[2] // k_LSKH.shape[2]
        k_LSNH, v_LSNH = (np.repeat(a, group, axis=2) for a in (k_LSKH, v_LSKH))
        q_LNTH, k_LNSH, v_LNSH = (np.swapaxes(a, 1, 2) for a in (q_LTNH, k_LSNH, v_LSNH))
        scale = np.float32(1.0 / math.sqrt(q_LNTH.shape[-1]))
        scores_LNTS = jnp.einsum(
            "lnth,lnsh->lnts", q_LNTH, k_LNSH, preferred_element_type=jnp.float32
        )
        record[name] = {
            "weights": weights_LNTS,
            "q": q_LNTH,
            "k": k_LNSH,
            "v": v_LNSH,
            "scores": np.asarray(scores_LNTS * scale, np.float32),
            "mask": np.stack([layer[4] for layer in layers]).astype(bool),
        }
    return record


def attention_maps(model: nn.Module, params: Any, *inputs) -> dict[str, np.ndarray]:
    """Attention weights of one forward pass, per stack and kind, for batch element 0.

    `params` as in `attention_record`. Returns `{'encoder_self' | 'decoder_self' |
    'decoder_cross': (L, N, T, S) float32 arrays}`.
    """
    record = attention_record(model, params, *inputs)
    return {name: kinds["weights"] for name, kinds in record.items() if name != "logits"}
