"""How the next tokens are chosen, as one value: `Greedy()`, `Sample(...)` or `Beam(...)`.

A strategy is a frozen dataclass that checks its own fields when it is built, so a
combination that means nothing (top-k with greedy decoding, a temperature for beam search)
cannot be written. Strategies are hashable and compare by value.

A strategy also holds the behaviour its fields mean: `decode(stepper, rng, ...)` runs the
whole generation over a `steppers.Stepper`. The strategies that choose each token from that
step's logits alone (`Greedy`, `Sample`) derive from `TokenByToken` and define only
`next_tokens(logits, rng)`, as Gemma's samplers define `get_next_tokens`; they share one
loop, `search.sample_loop`. `Beam` keeps hypotheses across steps and runs
`search.beam_search`. A new sampler is one `TokenByToken` subclass: nothing else dispatches
on the class.

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
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from flax_transformer.checks.arguments import check_int, is_concrete
from flax_transformer.checks.generation import check_rng
from flax_transformer.decoding import search
from flax_transformer.decoding.sampling import argmax_first, filter_logits
from flax_transformer.decoding.search import LENGTH_PENALTY_BASE, LogitsHook
from flax_transformer.decoding.steppers import Stepper

# The values that mean "off" / "the default" for the older keywords.
DEFAULT_BEAM_SIZE = 1
# GNMT's length penalty exponent alpha; Wu et al. (2016) tune it in [0.6, 1.0].
DEFAULT_LENGTH_PENALTY = 0.6
DEFAULT_TEMPERATURE = 0.0  # greedy
TOP_K_OFF = 0
TOP_P_OFF = 1.0


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


def check_penalty_range(fn: str, alpha: float, max_new_tokens: int) -> None:
    """ValueError if the GNMT penalty ((5 + n) / 6) ** alpha overflows float32 for n <= N:
    every score would then be -0.0, and beam search would rank its hypotheses at random."""
    if not is_concrete(alpha):
        return
    base = (LENGTH_PENALTY_BASE + max_new_tokens) / (LENGTH_PENALTY_BASE + 1.0)
    largest = math.log(float(np.finfo(np.float32).max)) / math.log(base)
    if alpha > largest:
        raise ValueError(
            f"{fn}: length_penalty={alpha!r} makes the length penalty ((5 + n) / 6) ** "
            f"{alpha!r} overflow float32 by n = max_new_tokens = {max_new_tokens}, which ties "
            f"every beam; use a length_penalty <= {largest:.1f} (GNMT uses 0.6-1.0)."
        )


def _set(obj: Any, **fields: Any) -> None:
    for name, value in fields.items():
        object.__setattr__(obj, name, value)  # the dataclasses are frozen


def _unchecked(cls, **fields: Any):
    """An instance with the given fields and no `__post_init__`: pytree unflattening hands
    over tracers (and jax's own placeholders), which the checks cannot and need not read."""
    obj = object.__new__(cls)
    _set(obj, **fields)
    return obj


class Strategy:
    """How a generation chooses its tokens; the base of `Greedy`, `Sample` and `Beam`.

    Attributes:
      draws: whether `decode` needs a PRNG key (the generation functions' `rng`).
    """

    draws: ClassVar[bool] = False

    def check(self, fn: str, *, vocab: int, max_new_tokens: int, return_logits: bool) -> None:
        """ValueError for what the fields alone cannot tell (the generation's V and N)."""

    def decode(
        self,
        stepper: Stepper,
        rng: jax.Array | None,
        *,
        max_new_tokens: int,
        eos_id: jax.Array | None,
        pad_id: int,
        logits_hook: LogitsHook | None,
        return_logits: bool,
    ) -> jax.Array | tuple[jax.Array, jax.Array]:
        """The generated tokens `(B, N)` (with `return_logits`, also the logits `(B, N, V)`).

        Args:
          stepper: the model's next-token logits, step by step.
          rng: a PRNG key if `draws`, else None.
          max_new_tokens, eos_id, pad_id, logits_hook, return_logits: as in
            `search.sample_loop`.
        """
        raise NotImplementedError


class TokenByToken(Strategy):
    """A strategy that chooses each step's tokens from that step's logits alone.

    Subclasses define `next_tokens`; all share one loop, `search.sample_loop`, which stops
    each sequence at its EOS. Step i draws with the key `fold_in(rng, i)`.
    """

    def next_tokens(self, logits_BV: jax.Array, rng: jax.Array | None) -> jax.Array:
        """int32 `(B,)`: the next token of every row, from float32 `logits_BV` `(B, V)`
        (padding and a hook's bans already at `MASKED_LOGIT`); `rng` None unless `draws`."""
        raise NotImplementedError

    def decode(self, stepper, rng, *, return_logits, **loop):
        def choose(logits_BV, step):
            key = None if rng is None else jax.random.fold_in(rng, step)
            return self.next_tokens(logits_BV, key)

        return search.sample_loop(stepper, choose, return_logits=return_logits, **loop)


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class Greedy(TokenByToken):
    """The most likely token at every step (argmax; ties go to the lowest token id) among
    all tokens but `pad_id`.

    Every strategy never emits `pad_id`: it is masked out of each step's logits (the model
    masks padding keys, so a generated pad could not be read back), and only fills the
    positions after a sequence's EOS. Where pad is the most likely token, the argmax is the
    most likely other one.
    """

    def next_tokens(self, logits_BV, rng):
        return argmax_first(logits_BV)

    def tree_flatten(self):
        return (), None

    @classmethod
    def tree_unflatten(cls, aux, leaves):
        return cls()


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class Sample(TokenByToken):
    """A token drawn from softmax(logits / temperature), optionally from the top tokens only.

    Needs a PRNG key: `rng=` of the generation function. `pad_id` is never drawn (as in
    `Greedy`).

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

    draws: ClassVar[bool] = True

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
        # A built Sample holds a Python float; under jit a filtering top_p is a tracer (a
        # leaf) while an off one stays the Python float 1.0 (part of the tree's structure).
        off = isinstance(self.top_p, float) and self.top_p == TOP_P_OFF
        return None if off else self.top_p

    def check(self, fn, *, vocab, max_new_tokens, return_logits):
        if self.top_k > vocab:
            raise ValueError(f"{fn}: top_k={self.top_k!r} must be an int in [0, {vocab}] (0: off).")

    def next_tokens(self, logits_BV, rng):
        filtered_BV = filter_logits(
            logits_BV, temperature=self.temperature, top_k=self.top_k, top_p=self.nucleus
        )
        return jax.random.categorical(rng, filtered_BV, axis=-1).astype(jnp.int32)

    def tree_flatten(self):
        return (self.temperature, self.nucleus), self.top_k

    @classmethod
    def tree_unflatten(cls, top_k, leaves):
        temperature, nucleus = leaves
        top_p = TOP_P_OFF if nucleus is None else nucleus
        return _unchecked(cls, temperature=temperature, top_k=top_k, top_p=top_p)


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class Beam(Strategy):
    """Beam search: K = `size` live hypotheses per sequence and, apart, the K best finished
    ones, scored by log-probability divided by GNMT's length penalty
    `((5 + n) / 6) ** length_penalty` (Wu et al. 2016), n the tokens generated, EOS
    included. A finished hypothesis is never pushed out by a live one; the search stops
    when no live hypothesis can still beat the worst finished one (`search.beam_search`).
    `pad_id` is masked before the log-softmax, so no hypothesis extends with it (as in
    `Greedy`).

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

    def check(self, fn, *, vocab, max_new_tokens, return_logits):
        check_penalty_range(fn, self.length_penalty, max_new_tokens)
        if return_logits:
            raise ValueError(
                f"{fn}: return_logits=True is for beam_size=1 (one sequence per prompt): "
                f"Greedy() or Sample(...), not {self}."
            )

    def decode(self, stepper, rng, *, return_logits, **loop):
        del rng, return_logits  # draws nothing; `check` refuses return_logits
        return search.beam_search(stepper, beam_size=self.size, alpha=self.length_penalty, **loop)

    def tree_flatten(self):
        return (self.length_penalty,), self.size

    @classmethod
    def tree_unflatten(cls, size, leaves):
        return _unchecked(cls, size=size, length_penalty=leaves[0])


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


def check_strategy(
    fn: str, config, strategy: Any, *, max_new_tokens: int, rng: Any, return_logits: bool
) -> None:
    """What a strategy cannot check alone: the vocabulary, the length, the key, the outputs.

    Raises:
      TypeError: `strategy` is not a `Strategy` (`Greedy`, `Sample`, `Beam`).
      ValueError: what `strategy.check` refuses (a top_k larger than the vocabulary, a beam
        length penalty that overflows float32 within `max_new_tokens`, `return_logits` with
        beam search); a strategy that draws without a PRNG key (or with a malformed one).
    """
    if not isinstance(strategy, Strategy):
        raise TypeError(
            f"{fn}: strategy={strategy!r} must be Greedy(), Sample(temperature, top_k, top_p) "
            "or Beam(size, length_penalty) (from flax_transformer), or None for the keywords."
        )
    strategy.check(
        fn,
        vocab=config.output_vocab_size,
        max_new_tokens=max_new_tokens,
        return_logits=return_logits,
    )
    if strategy.draws and rng is None:
        raise ValueError(
            f"{fn}: {strategy} samples and needs a PRNG key: pass rng=jax.random.key(0), or "
            "Greedy() (temperature=0.0) for greedy decoding."
        )
    if rng is not None:
        check_rng(fn, rng)
