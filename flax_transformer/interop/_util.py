"""Shared helpers of the weight importers: tensors to arrays, layer stacking, tree checks.

No torch import: a torch tensor is recognised by its `detach` method and converted through
numpy, so these helpers run (and are testable) without torch installed.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import traverse_util

from flax_transformer.config import TransformerConfig


def to_numpy(x: Any, name: str = "tensor") -> np.ndarray:
    """A torch tensor, `nn.Parameter`, module with `.weight` or array -> float32 numpy array.

    torch tensors are upcast to float32 first (numpy has no bfloat16), then copied.
    """
    if x is None:
        raise ValueError(f"{name} is None: the source model lacks a weight the config expects.")
    if hasattr(x, "weight") and not hasattr(x, "detach"):  # an nn.Embedding / nn.Linear
        x = x.weight
    if hasattr(x, "detach"):  # a torch tensor
        x = x.detach().to(device="cpu").float().numpy()
    return np.asarray(x, dtype=np.float32)


def check_shape(x: np.ndarray, shape: tuple[int, ...], name: str) -> np.ndarray:
    """Raise ValueError unless `x.shape == shape`; return `x`."""
    if x.shape != tuple(shape):
        raise ValueError(f"{name} has shape {x.shape}, expected {tuple(shape)} from the config.")
    return x


def layer_norm_params(norm: Any, width: int, use_bias: bool, name: str) -> dict:
    """An `nn.LayerNorm`-like module (`.weight`, `.bias`) -> our `{'scale', 'bias'}`."""
    tree = {"scale": check_shape(to_numpy(norm.weight, f"{name}.weight"), (width,), name)}
    if use_bias:
        tree["bias"] = check_shape(to_numpy(norm.bias, f"{name}.bias"), (width,), name)
    elif getattr(norm, "bias", None) is not None:
        raise ValueError(f"{name} has a bias but the config has use_bias=False.")
    return tree


def stack_layers(layers: list[dict], config: TransformerConfig) -> dict:
    """Per-layer trees -> `{'layers_0': ..., ...}`, or `{'layers': ...}` stacked on axis 0
    when `config.scan_layers` (the layout `nn.scan` gives its parameters)."""
    if config.scan_layers:
        return {"layers": jax.tree.map(lambda *xs: np.stack(xs), *layers)}
    return {f"layers_{i}": layer for i, layer in enumerate(layers)}


def finish_params(params: dict, model: nn.Module, config: TransformerConfig, *args) -> dict:
    """Check `params` against the tree `model.init(*args)` would build, then cast them.

    Every path and shape must match, so a config that disagrees with the source model
    (head count, layer count, final norm, biases) fails here with the paths named, rather
    than silently in the logits.

    Returns:
      `{'params': ...}` of jnp arrays in `config.param_dtype`, ready for `model.apply`.
    """
    if config.lora_rank:
        raise ValueError(
            f"imported weights are a base model's, with no LoRA adapters, but the config has "
            f"lora_rank={config.lora_rank}; import with lora_rank=0, then build the LoRA "
            "model and copy these weights into its params by path (docs/api.md, 'LoRA')."
        )
    # None of the sources (torch's stacks, GPT-2, Llama) has these: importing into them
    # would fail on the missing scales, or, for the parameter-free cap, silently compute
    # another function than the source's.
    speedrun = {
        "qk_norm": config.qk_norm,
        "logits_soft_cap": config.logits_soft_cap,
        "attn_logit_softcapping": config.attn_logit_softcapping,
    }
    kept = [f"{name}={value!r}" for name, value in speedrun.items() if value]
    if kept:
        raise ValueError(
            f"the imported model has no QK-norm and no logit soft-capping, but the config has "
            f"{', '.join(kept)}; import with qk_norm=False, logits_soft_cap=0.0 and "
            "attn_logit_softcapping=None."
        )
    expected = jax.eval_shape(lambda: nn.unbox(model.init(jax.random.key(0), *args)))
    want = traverse_util.flatten_dict(expected["params"], sep="/")
    have = traverse_util.flatten_dict(params, sep="/")
    missing, extra = sorted(set(want) - set(have)), sorted(set(have) - set(want))
    if missing or extra:
        raise ValueError(
            f"imported parameters do not fit {type(model).__name__}(config): missing {missing}, "
            f"unexpected {extra}. Check the config (final_norm, use_bias, tie_output_embedding, "
            "positional, layer counts) against the source model."
        )
    for path, struct in want.items():
        if have[path].shape != struct.shape:
            raise ValueError(
                f"imported parameter {path} has shape {have[path].shape}, the model expects "
                f"{struct.shape}; check d_model, num_heads, d_ff, vocab_size and max_len."
            )
    cast = {k: jnp.asarray(v, dtype=config.param_dtype) for k, v in have.items()}
    return {"params": traverse_util.unflatten_dict(cast, sep="/")}


def check_tied_head(model: Any, embedding: Any, config: TransformerConfig, fn: str) -> None:
    """ValueError if the config ties the output to the embedding but the source model has
    an output layer of its own (`lm_head`) that differs from it: it would go unread."""
    head = getattr(model, "lm_head", None)
    if not config.tie_output_embedding or head is None:
        return
    if not np.array_equal(to_numpy(head, "lm_head"), to_numpy(embedding, "embedding")):
        raise ValueError(
            f"{fn}: the source model's lm_head differs from its token embedding (an untied "
            "output layer), but the config has tie_output_embedding=True, which would leave "
            "lm_head unread; import with tie_output_embedding=False."
        )


def dummy_tokens() -> jax.Array:
    """A `(1, 1)` token batch to trace `model.init` with."""
    return jnp.zeros((1, 1), jnp.int32)


def load_hf_model(model_or_path: Any, class_name: str, caller: str) -> Any:
    """A `transformers` model object as given, or `class_name.from_pretrained` of a local
    directory (`local_files_only`: never downloads).

    Args:
      model_or_path: a model object, or the path of a `save_pretrained` directory.
      class_name: the `transformers` class that loads the directory.
      caller: the public function's name, for messages.
    """
    if not isinstance(model_or_path, (str, os.PathLike)):
        return model_or_path
    path = os.fspath(model_or_path)
    if not os.path.isdir(path):
        raise ValueError(
            f"{caller}: {path!r} is not a directory; pass a model object or a local directory "
            "written by save_pretrained (config.json + weights)."
        )
    try:
        import transformers
    except ImportError as err:
        raise ImportError(f"{caller} from a directory needs `transformers` (and torch).") from err
    return getattr(transformers, class_name).from_pretrained(path, local_files_only=True)
