"""`--config.freeze`, the fine-tuning groups a run keeps fixed, parsed and checked against the
model before any step; the labels they give each parameter are built in
`train.program.finetune`."""

from __future__ import annotations

import dataclasses

from flax_transformer import TransformerConfig
from train.config.sections import OptimizerConfig, fail

EMBEDDINGS = "embeddings"
LAYERS = "layers:"


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
