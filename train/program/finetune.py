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

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax

from flax_transformer import TransformerConfig
from train.config.sections import OptimizerConfig, fail

EMBEDDINGS = "embeddings"
LAYERS = "layers:"
# Parameter leaves that are embedding tables (token and learned positions).
_EMBEDDING_PATHS = (("embed", "embedding"), ("decoder", "positions", "pos_embedding"))


@dataclasses.dataclass(frozen=True)
class Freeze:
    """What `--config.freeze` names: the embedding tables, and the first `layers` layers."""

    embeddings: bool = False
    layers: int = 0


def parse_freeze(spec: str) -> Freeze:
    """`--config.freeze` ('embeddings', 'layers:N', both comma-separated, or '').

    Raises:
        ValueError: an unknown part (names the value and the choices).
    """
    embeddings, layers = False, 0
    for part in filter(None, (p.strip() for p in spec.split(","))):
        if part == EMBEDDINGS:
            embeddings = True
        elif part.startswith(LAYERS) and part[len(LAYERS) :].isdigit():
            layers = int(part[len(LAYERS) :])
        else:
            raise fail(
                "freeze",
                spec,
                f"{part!r} is not a parameter group; use 'embeddings' and/or 'layers:N' "
                "(the first N layers), comma-separated",
            )
    return Freeze(embeddings, layers)


def check_freeze(optimizer: OptimizerConfig, model: TransformerConfig, fine_tuning: bool):
    """The fine-tuning fields against the model, before any step.

    Raises:
        ValueError: freezing without `init_from`, or with LoRA (which freezes every
            pretrained parameter), more layers than the model has, or frozen layers of a
            scanned stack (one stacked parameter holds every layer).
    """
    if not fine_tuning:
        field = "freeze" if optimizer.freeze else "pretrained_lr_scale"
        raise fail(
            field,
            getattr(optimizer, field),
            "applies to a run from pretrained weights; set --config.init_from=DIR",
        )
    if getattr(model, "lora_rank", 0):  # every pretrained parameter is frozen already
        field = "freeze" if optimizer.freeze else "pretrained_lr_scale"
        raise fail(
            field,
            getattr(optimizer, field),
            "does nothing with LoRA (--config.model.lora_rank > 0): every pretrained "
            "parameter is frozen and only the adapters train; leave it at its default",
        )
    freeze = parse_freeze(optimizer.freeze)
    if freeze.layers > model.decoder_layers:
        raise fail(
            "freeze",
            optimizer.freeze,
            f"the model has {model.decoder_layers} layers; freeze at most that many",
        )
    if freeze.layers and model.scan_layers:
        raise fail(
            "freeze",
            optimizer.freeze,
            "with --config.model.scan_layers=True all layers are one stacked parameter and "
            "cannot be frozen apart; set scan_layers=False",
        )


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
