"""`--config.model.dtype='auto'`: the compute dtype chosen for the host the run is on
(`train.core.compute_dtype.resolve_dtype`), put into the model's fields before the
`TransformerConfig` is made, and logged once with its reason.

The config keeps 'auto' (config.json records it), so a run resumed on another kind of host
chooses again for that host; the model config the run builds holds the chosen dtype.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from typing import Any

from train.core import compute_dtype

# Rows of the dot measured on a CPU with bfloat16 matrix instructions: a batch's worth of
# tokens through the feed-forward (the speed ratio barely depends on it; 1,024 keeps the
# measurement near a second).
MEASURE_ROWS = 1024


@functools.lru_cache(maxsize=8)
def _choice(backend: str, d_model: int, d_ff: int) -> compute_dtype.DtypeChoice:
    choice = compute_dtype.resolve_dtype(
        compute_dtype.AUTO, backend=backend, shape=(MEASURE_ROWS, d_model, d_ff)
    )
    logging.info("Compute dtype %s", choice.reason)
    return choice


def with_chosen_dtype(fields: Mapping[str, Any]) -> dict[str, Any]:
    """`fields` (a model section as a dict, with `d_model` and `d_ff`) with `dtype='auto'`
    replaced by the host's choice; any other dtype as it is."""
    fields = dict(fields)
    if fields.get("dtype") == compute_dtype.AUTO:
        import jax

        choice = _choice(jax.default_backend(), int(fields["d_model"]), int(fields["d_ff"]))
        fields["dtype"] = choice.dtype
    return fields
