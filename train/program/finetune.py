"""Fine-tuning recipes: which parameters train, at what rate (`--config.freeze`,
`--config.pretrained_lr_scale`, LoRA through `--config.model.lora_rank`).

Every parameter gets one label (`param_labels`), and `train.formats.optimizers.make_optimizer`
gives each label its optax transformation with `optax.multi_transform`:

    'train'       new parameters (LoRA adapters): the full learning rate
    'pretrained'  loaded parameters: `pretrained_lr_scale` of it (1 = full fine-tuning)
    'frozen'      not updated, no optimizer state (`optax.set_to_zero`)

With LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models",
arXiv:2106.09685) every loaded parameter is frozen and only the adapters train, so the
optimizer holds state for the adapters alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax

from flax_transformer import TransformerConfig
from train.config.freeze import EMBEDDINGS, LAYERS, Freeze, check_freeze, parse_freeze  # noqa: F401
from train.config.sections import OptimizerConfig

# Parameter leaves that are embedding tables (token and learned positions).
_EMBEDDING_PATHS = (("embed", "embedding"), ("decoder", "positions", "pos_embedding"))


def is_adapter(path: tuple[str, ...]) -> bool:
    """A LoRA adapter leaf (its name holds 'lora')."""
    return any("lora" in str(name) for name in path)


def _layer_index(path: tuple[str, ...]) -> int | None:
    for name in path:
        if str(name).startswith("layers_") and str(name)[7:].isdigit():
            return int(str(name)[7:])
    return None


def label(path: tuple[str, ...], optimizer: OptimizerConfig, model: TransformerConfig) -> str:
    """The group of the parameter at `path` ('train', 'pretrained' or 'frozen')."""
    if is_adapter(path):
        return "train"
    if getattr(model, "lora_rank", 0):
        return "frozen"
    freeze = parse_freeze(optimizer.freeze)
    if freeze.embeddings and any(path[-len(p) :] == p for p in _EMBEDDING_PATHS):
        return "frozen"
    layer = _layer_index(path)
    if layer is not None and layer < freeze.layers:
        return "frozen"
    return "pretrained"


def _keys(path) -> tuple[str, ...]:
    return tuple(getattr(k, "key", getattr(k, "name", str(k))) for k in path)


def param_labels(optimizer: OptimizerConfig, model: TransformerConfig) -> Callable[[Any], Any]:
    """The callable `optax.multi_transform` takes: parameters -> a tree of labels."""

    def labels(params):
        return jax.tree_util.tree_map_with_path(
            lambda path, _: label(_keys(path), optimizer, model), params
        )

    return labels


def frozen_mask(optimizer: OptimizerConfig, model: TransformerConfig) -> Callable[[Any], Any]:
    """Parameters -> a tree of bools, True for the 'frozen' group: what the train step
    takes no gradient of (`train.program.steps.train_step`'s `frozen`)."""
    labels = param_labels(optimizer, model)

    def frozen(params):
        return jax.tree.map(lambda group: group == "frozen", labels(params))

    return frozen


def summary(params: Mapping, opt_state: Any, labels: Callable | None) -> str:
    """One line: trainable parameters of all, and the optimizer state's bytes."""
    leaves = jax.tree_util.tree_leaves_with_path(params)
    total = sum(x.size for _, x in leaves)
    if labels is None:
        trainable = total
    else:
        tree = labels(params)
        trainable = sum(
            x.size
            for x, group in zip(jax.tree.leaves(params), jax.tree.leaves(tree), strict=True)
            if group != "frozen"
        )
    state_bytes = sum(
        x.size * x.dtype.itemsize for x in jax.tree.leaves(opt_state) if hasattr(x, "dtype")
    )
    return (
        f"Trainable parameters: {trainable:,} of {total:,} "
        f"({100 * trainable / max(total, 1):.2f}%); optimizer state {state_bytes / 2**20:,.1f} MiB."
    )
