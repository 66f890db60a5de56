"""Adam (Kingma and Ba 2015; the paper's optimizer) and AdamW (Loshchilov and Hutter 2019:
weight decay decoupled from the gradient), on the generic fields b1, b2, eps and (AdamW)
weight_decay. No options of their own."""

from __future__ import annotations

import optax

from train.formats.optimizers.registry import Entry, register


def _adam(section, options, rate) -> optax.GradientTransformation:
    return optax.adam(rate(None), b1=section.b1, b2=section.b2, eps=section.eps)


def _adamw(section, options, rate) -> optax.GradientTransformation:
    return optax.adamw(
        rate(None), b1=section.b1, b2=section.b2, eps=section.eps, weight_decay=section.weight_decay
    )


ADAM = register(Entry("adam", _adam))
ADAMW = register(Entry("adamw", _adamw))
