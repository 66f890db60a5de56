"""Muon (Jordan et al. 2024, the modded-nanogpt speedrun's split): `optax.contrib.muon`
(momentum orthogonalised by Newton-Schulz) for the hidden matrices of the layers, attention
and feed-forward kernels and the LoRA adapters beside them
(`flax_transformer.muon_partition`), on a schedule of the run's shape peaking at its own
`learning_rate`; `optax.adamw` with the generic fields (b1, b2, eps, weight_decay,
`--config.learning_rate`) for the rest: embeddings, positions, norms, biases, QK-norm scales
and an untied head.

Options (`--config.optimizer.muon.<field>`):
    learning_rate   the matrices' peak rate (0.02: the default run's measured best)
    momentum        Nesterov momentum of the matrices, in [0, 1)
    weight_decay    decoupled weight decay of the matrices, >= 0
"""

from __future__ import annotations

import dataclasses

import optax

from flax_transformer import muon_dimension_numbers, muon_partition
from train.formats.optimizers.registry import Entry, is_real, option_error, register

NAME = "muon"


@dataclasses.dataclass(frozen=True)
class MuonOptions:
    """Muon's own options (the module docstring)."""

    learning_rate: float = 0.02
    momentum: float = 0.95
    weight_decay: float = 0.0

    def __post_init__(self):
        if not is_real(self.learning_rate) or self.learning_rate <= 0:
            raise option_error(NAME, "learning_rate", self.learning_rate, "must be a number > 0")
        if not is_real(self.momentum) or not 0.0 <= self.momentum < 1.0:
            raise option_error(NAME, "momentum", self.momentum, "must be in [0, 1)")
        if not is_real(self.weight_decay) or self.weight_decay < 0:
            raise option_error(NAME, "weight_decay", self.weight_decay, "must be non-negative")


def _build(section, options: MuonOptions, rate) -> optax.GradientTransformation:
    adamw = optax.adamw(
        rate(None), b1=section.b1, b2=section.b2, eps=section.eps, weight_decay=section.weight_decay
    )
    # Every parameter this group holds is a matrix, so optax's muon puts none in its own
    # Adam (which would be NAdam, with Muon's eps); the others get the config's AdamW.
    matrices = optax.contrib.muon(
        rate(options.learning_rate),
        beta=options.momentum,
        weight_decay=options.weight_decay,
        nesterov=True,
        muon_weight_dimension_numbers=muon_dimension_numbers,
    )
    return optax.multi_transform({"muon": matrices, "adamw": adamw}, muon_partition)


MUON = register(Entry(NAME, _build, options=MuonOptions))
