"""The preference task's own options, `--config.tasks.dpo.<field>` (the config section is
made from them, `train.config.tasks.config_section`): which objective, its constants, and
where the reference log-probabilities come from."""

from __future__ import annotations

import dataclasses
import math

from train.config.tasks import option_error
from train.tasks.dpo.objective import LOSS_TYPES

# The task's name: its options section is `--config.tasks.<NAME>`.
NAME = "dpo"

# `--config.tasks.dpo.reference` values.
REFERENCES = ("precomputed", "adapters_off")


@dataclasses.dataclass(frozen=True)
class DpoOptions:
    """`--config.tasks.dpo`: read by the task when it is configured (`DpoTask.configured`).

    Attributes:
        loss: 'sigmoid' (DPO, Rafailov et al. 2023), 'ipo' or 'simpo' (`LOSS_TYPES`).
        beta: the inverse temperature of the implicit reward, > 0 (0.1 is DPO's and TRL's
            default).
        label_smoothing: the probability that a preference is flipped, in [0, 0.5)
            (conservative DPO; sigmoid and simpo only).
        simpo_gamma: SimPO's target reward margin, >= 0 (loss 'simpo' only).
        reference: 'precomputed' (the starting weights' log-probabilities, computed once
            before step 1 and kept in the run directory) or 'adapters_off' (the model with
            its LoRA adapters switched off, at every step).
    """

    loss: str = "sigmoid"
    beta: float = 0.1
    label_smoothing: float = 0.0
    simpo_gamma: float = 0.0
    reference: str = REFERENCES[0]

    def __post_init__(self):
        if self.loss not in LOSS_TYPES:
            raise option_error(NAME, "loss", self.loss, f"must be one of {LOSS_TYPES}")
        for field in ("beta", "label_smoothing", "simpo_gamma"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise option_error(NAME, field, value, "must be a number")
            if not math.isfinite(value):
                raise option_error(NAME, field, value, "must be a finite number")
        if not self.beta > 0:
            raise option_error(NAME, "beta", self.beta, "must be > 0 (DPO's usual value is 0.1)")
        if not 0.0 <= self.label_smoothing < 0.5:
            raise option_error(
                NAME,
                "label_smoothing",
                self.label_smoothing,
                "must be in [0, 0.5) (the probability that a preference label is flipped)",
            )
        if not self.simpo_gamma >= 0:
            raise option_error(NAME, "simpo_gamma", self.simpo_gamma, "must be >= 0")
        if self.reference not in REFERENCES:
            raise option_error(NAME, "reference", self.reference, f"must be one of {REFERENCES}")
