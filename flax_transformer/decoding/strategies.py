"""How the next token is chosen, as one value: `Greedy()`, `Sample(...)` or `Beam(...)`.

A strategy is a frozen dataclass that checks its own fields when it is built, so a
combination that means nothing (top-k with greedy decoding, a temperature for beam search)
cannot be written. Strategies are hashable and compare by value.

They are also pytrees: what selects the compiled program (the class, `top_k`, the beam
`size`, whether `top_p` filters at all) is the tree's structure, and the real-valued fields
(`temperature`, a filtering `top_p`, `length_penalty`) are its leaves. Passed to a jitted
function, a new temperature or length penalty therefore reuses the compiled program, and a
new `top_k` or beam size compiles a new one.

`strategy_from_keywords` turns the older keywords of `generate_text` /
`generate_translation` (`beam_size`, `length_penalty`, `temperature`, `top_k`, `top_p`) into
a strategy, with the error messages those keywords always had.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

import jax
import numpy as np

from flax_transformer.functional.checks import check_int

# The values that mean "off" / "the default" for the older keywords.
DEFAULT_BEAM_SIZE = 1
# GNMT's length penalty exponent alpha; Wu et al. (2016) tune it in [0.6, 1.0].
DEFAULT_LENGTH_PENALTY = 0.6
DEFAULT_TEMPERATURE = 0.0  # greedy
TOP_K_OFF = 0
TOP_P_OFF = 1.0


def is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_real(where: str, name: str, value: Any, low: float, what: str, *, strict=False):
    """ValueError unless `value` is a finite real number >= low (> low if `strict`).

    inf is refused as well as NaN: an infinite temperature flattens sampling to uniform over
    the vocabulary, and an infinite length penalty ties every beam.
    """
    if not is_real(value) or not math.isfinite(value):
        raise ValueError(f"{where}: {name}={value!r} must be a finite number {what}.")
    if value < low or (strict and value == low):
        raise ValueError(f"{where}: {name}={value!r} must be {what}.")


def check_top_p(where: str, value: Any) -> None:
    if not is_real(value) or not 0.0 < value <= 1.0:
        raise ValueError(f"{where}: top_p={value!r} must be in (0, 1] (1: off).")


def _set(obj: Any, **fields: Any) -> None:
    for name, value in fields.items():
        object.__setattr__(obj, name, value)  # the dataclasses are frozen


def _unchecked(cls, **fields: Any):
    """An instance with the given fields and no `__post_init__`: pytree unflattening hands
    over tracers (and jax's own placeholders), which the checks cannot and need not read."""
    obj = object.__new__(cls)
    _set(obj, **fields)
    return obj


@dataclasses.dataclass(frozen=True)
class Greedy:
    """The most likely token at every step (argmax; ties go to the lowest token id)."""


@dataclasses.dataclass(frozen=True)
class Sample:
    """A token drawn from softmax(logits / temperature), optionally from the top tokens only.

    Needs a PRNG key: `rng=` of the generation function.

    Attributes:
      temperature: finite, > 0; below 1 sharpens the distribution, above 1 flattens it
        (`Greedy()` is the limit at 0).
      top_k: draw from the k most likely tokens only (ties with the k-th kept); 0: all.
      top_p: draw from the nucleus, the smallest set of most likely tokens whose
        probability reaches top_p (Holtzman et al. 2019); in (0, 1], 1: all.
    """

    temperature: float = 1.0
    top_k: int = TOP_K_OFF
    top_p: float = TOP_P_OFF

    def __post_init__(self):
        check_real(
            "Sample",
            "temperature",
            self.temperature,
            0.0,
            "> 0 (temperature 0 is Greedy())",
            strict=True,
        )
        check_int("Sample", "top_k", self.top_k, 0, ">= 0 (0: off)")
        check_top_p("Sample", self.top_p)
        _set(
            self,
            temperature=float(self.temperature),
            top_k=int(self.top_k),
            top_p=float(self.top_p),
        )

    @property
    def nucleus(self) -> float | jax.Array | None:
        """`top_p` if it filters, None if it is off: a static fact, also under `jit`."""
        return None if _top_p_is_off(self.top_p) else self.top_p


def _top_p_is_off(top_p: Any) -> bool:
    # A built Sample holds a Python float; under jit a filtering top_p is a tracer (a leaf)
    # while an off one stays the Python float 1.0 (part of the tree's structure).
    return isinstance(top_p, float) and top_p == TOP_P_OFF


@dataclasses.dataclass(frozen=True)
class Beam:
    """Beam search: K = `size` live hypotheses per sequence and, apart, the K best finished
    ones, scored by log-probability divided by GNMT's length penalty
    `((5 + n) / 6) ** length_penalty` (Wu et al. 2016), n the tokens generated, EOS
    included. A finished hypothesis is never pushed out by a live one; the search stops
    when no live hypothesis can still beat the worst finished one (`search.beam_search`).

    Attributes:
      size: K, an int >= 1. `Beam(1, 0.0)` gives the tokens of `Greedy()` through the beam
        loop; with a length penalty > 0 it may go on past greedy's EOS to a longer
        hypothesis that scores better. `Greedy()` is cheaper and can return the logits.
      length_penalty: alpha, finite, >= 0 (0: raw log-probability; larger favours longer
        outputs). Generation also refuses an alpha whose penalty would overflow float32
        within its `max_new_tokens`.
    """

    size: int
    length_penalty: float = DEFAULT_LENGTH_PENALTY

    def __post_init__(self):
        check_int("Beam", "size", self.size, 1, ">= 1")
        check_real("Beam", "length_penalty", self.length_penalty, 0.0, ">= 0 (0: none)")
        _set(self, size=int(self.size), length_penalty=float(self.length_penalty))


Strategy = Greedy | Sample | Beam
STRATEGIES = (Greedy, Sample, Beam)

jax.tree_util.register_pytree_node(Greedy, lambda s: ((), None), lambda _, __: Greedy())
jax.tree_util.register_pytree_node(
    Sample,
    lambda s: ((s.temperature, s.nucleus), s.top_k),
    lambda top_k, leaves: _unchecked(
        Sample,
        temperature=leaves[0],
        top_k=top_k,
        top_p=TOP_P_OFF if leaves[1] is None else leaves[1],
    ),
)
jax.tree_util.register_pytree_node(
    Beam,
    lambda s: ((s.length_penalty,), s.size),
    lambda size, leaves: _unchecked(Beam, size=size, length_penalty=leaves[0]),
)


def strategy_from_keywords(
    fn: str,
    *,
    beam_size: int | None = None,
    length_penalty: float | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
) -> Strategy:
    """The strategy the older generation keywords describe (None: the keyword's default).

    beam_size > 1 is `Beam(beam_size, length_penalty)`; otherwise temperature > 0 is
    `Sample(temperature, top_k, top_p)` and temperature 0 is `Greedy()`. The keywords are
    checked as they always were, each error prefixed with `fn`: a temperature, top_k or
    top_p with beam search, and a top_k or top_p with greedy decoding, raise ValueError. A
    length_penalty without beam search is checked (finite, >= 0) and then unused.
    """
    beam_size = DEFAULT_BEAM_SIZE if beam_size is None else beam_size
    alpha = DEFAULT_LENGTH_PENALTY if length_penalty is None else length_penalty
    temperature = DEFAULT_TEMPERATURE if temperature is None else temperature
    top_k = TOP_K_OFF if top_k is None else top_k
    top_p = TOP_P_OFF if top_p is None else top_p
    check_int(fn, "beam_size", beam_size, 1, ">= 1")
    check_real(fn, "length_penalty", alpha, 0.0, ">= 0 (0: none)")
    check_real(fn, "temperature", temperature, 0.0, ">= 0 (0: greedy)")
    check_int(fn, "top_k", top_k, 0, ">= 0 (0: off)")
    check_top_p(fn, top_p)
    sampling, filtering = temperature > 0, bool(top_k) or top_p < TOP_P_OFF
    if beam_size > 1 and (sampling or filtering):
        raise ValueError(
            f"{fn}: beam search (beam_size={beam_size}) is deterministic; it takes no "
            f"temperature/top_k/top_p (got {temperature}, {top_k}, {top_p}). Use beam_size=1 "
            "to sample."
        )
    if not sampling and filtering:
        raise ValueError(
            f"{fn}: top_k={top_k} / top_p={top_p} narrow the tokens a sample is drawn from; "
            "they do nothing with greedy decoding (temperature=0). Pass temperature > 0 (and "
            "rng) to sample, or leave top_k=0 and top_p=1.0."
        )
    if beam_size > 1:
        return Beam(beam_size, alpha)
    return Sample(temperature, top_k, top_p) if sampling else Greedy()
