"""Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms",
arXiv:2302.06675; `optax.lion`): the sign of an interpolation of momentum and gradient, so
every coordinate moves by the full rate. Take `--config.learning_rate` 3-10x lower than
AdamW's (and, with weight decay, `--config.weight_decay` as much higher); it reads the
generic weight_decay, and b1, b2 of its own (the generic ones are Adam's).

Options (`--config.optimizer.lion.<field>`):
    b1   interpolation of momentum and gradient in the update, in [0, 1) (the paper's 0.9)
    b2   decay of the momentum, in [0, 1) (the paper's 0.99)
"""

from __future__ import annotations

import dataclasses

import optax

from train.formats.optimizers.registry import Entry, is_real, option_error, register

NAME = "lion"


@dataclasses.dataclass(frozen=True)
class LionOptions:
    """Lion's own options (the module docstring)."""

    b1: float = 0.9
    b2: float = 0.99

    def __post_init__(self):
        for field in ("b1", "b2"):
            value = getattr(self, field)
            if not is_real(value) or not 0.0 <= value < 1.0:
                raise option_error(NAME, field, value, "must be in [0, 1)")


def _build(section, options: LionOptions, rate) -> optax.GradientTransformation:
    return optax.lion(rate(None), b1=options.b1, b2=options.b2, weight_decay=section.weight_decay)


LION = register(Entry(NAME, _build, options=LionOptions))
