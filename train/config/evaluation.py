"""The evaluation's sections: `EvalConfig` (validation, BLEU, the report's samples) and the
decoding options it holds (`DecodeOptions`, one frozen value that travels to the decoding
instead of the whole config), checked when made.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, ClassVar

import ml_collections

from train.config.checks import check_non_negative_ints, check_positive_ints, is_int, is_real


class DecodeOptionError(ValueError):
    """A decoding option out of range: `option=value: expected.`

    `named(name)` is the same error under the name the user wrote: `--config.beam_size` for
    the experiment config (`DecodeOptions.from_config`), `--beam_size` for a tool's flag.
    """

    def __init__(self, option: str, value: Any, expected: str):
        super().__init__(f"{option}={value!r}: {expected}.")
        self.option, self.value, self.expected = option, value, expected

    def named(self, name: str) -> ValueError:
        """The error with the option called `name` (e.g. `--config.decode_batch_size`)."""
        return ValueError(f"{name}={self.value!r}: {self.expected}.")


@dataclasses.dataclass(frozen=True)
class DecodeOptions:
    """How to decode; the defaults are those of `configs/default.py`.

    Every option is checked when the options are made (or `dataclasses.replace`d): a bad one
    raises `DecodeOptionError`, which `from_config` names as the config field it came from.

    Attributes:
        max_len: the model's longest sequence (sources, and prompt + continuation).
        bucket_lengths: source lengths padded to (few shapes compile); () = powers of two
            from 8, then max_len.
        batch_size: sentences translated together.
        max_decode_len: tokens generated at most; 0 = as many as fit; less than max_len.
        beam_size: beam width; 1 = greedy.
        length_penalty: beam search length penalty alpha (GNMT), >= 0.
        temperature: sampling temperature; 0 = greedy.
        top_k: sample among the k most likely tokens; 0 = all.
        top_p: nucleus sampling mass in (0, 1]; 1 = off.
        seed: the sampling key's seed when no key is given; non-negative.
    """

    max_len: int
    bucket_lengths: tuple[int, ...] = ()
    batch_size: int = 64
    max_decode_len: int = 0
    beam_size: int = 1
    length_penalty: float = 0.6
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    # The experiment-config field each option is read from.
    CONFIG_FIELDS: ClassVar[Mapping[str, str]] = {
        "max_len": "max_len",
        "bucket_lengths": "bucket_lengths",
        "batch_size": "decode_batch_size",
        "max_decode_len": "max_decode_len",
        "beam_size": "beam_size",
        "length_penalty": "length_penalty",
        "temperature": "temperature",
        "top_k": "top_k",
        "top_p": "top_p",
        "seed": "seed",
    }

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict) -> DecodeOptions:
        """The options an experiment config sets.

        Raises:
            ValueError: an option out of range, named as `--config.<field>=<value>`.
        """
        values = {option: config[field] for option, field in cls.CONFIG_FIELDS.items()}
        values["bucket_lengths"] = tuple(values["bucket_lengths"])
        try:
            return cls(**values)
        except DecodeOptionError as err:
            raise err.named(f"--config.{cls.CONFIG_FIELDS[err.option]}") from None

    def __post_init__(self):
        for name, low, what in (
            ("max_len", 1, "must be a positive integer"),
            ("batch_size", 1, "must be a positive integer"),
            ("beam_size", 1, "must be a positive integer"),
            ("max_decode_len", 0, "must be a non-negative integer"),
            ("top_k", 0, "must be a non-negative integer"),
            ("seed", 0, "must be a non-negative integer"),
        ):
            value = getattr(self, name)
            if not is_int(value) or value < low:
                raise DecodeOptionError(name, value, what)
        if not is_real(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise DecodeOptionError("top_p", self.top_p, "must be in (0, 1]")
        for name, meaning in (("temperature", "0 = greedy"), ("length_penalty", "0 = none")):
            value = getattr(self, name)
            if not is_real(value) or not math.isfinite(value):  # NaN passes every comparison
                raise DecodeOptionError(name, value, f"must be a finite number >= 0 ({meaning})")
            if value < 0:
                raise DecodeOptionError(name, value, f"must be >= 0 ({meaning})")
        if self.max_decode_len >= self.max_len:
            raise DecodeOptionError(
                "max_decode_len", self.max_decode_len, f"must be < max_len={self.max_len} or 0"
            )


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """Validation, BLEU and the samples of the final report (`train.tasks`,
    `train.tasks.common.inference`).

    Attributes:
        num_eval_batches: validation batches per evaluation; 0 = all.
        bleu_examples, bleu_tokenize, report_beam_size, copy_baseline, num_samples,
            sample_prompts: the config fields of the same names.
        decode: how to decode (beam size, length penalty, sampling, batch size...).
    """

    num_eval_batches: int
    bleu_examples: int
    bleu_tokenize: str
    report_beam_size: int
    copy_baseline: bool
    num_samples: int
    sample_prompts: tuple[str, ...]
    decode: DecodeOptions

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict) -> EvalConfig:
        """The eval section; the decoding options check themselves (`DecodeOptions`) and
        are named as the config fields they come from."""
        return cls(
            num_eval_batches=config.num_eval_batches,
            bleu_examples=config.bleu_examples,
            bleu_tokenize=config.bleu_tokenize,
            report_beam_size=config.report_beam_size,
            copy_baseline=config.copy_baseline,
            num_samples=config.num_samples,
            sample_prompts=tuple(config.sample_prompts),
            decode=DecodeOptions.from_config(config),
        )

    def __post_init__(self):
        check_positive_ints(self, "report_beam_size")
        check_non_negative_ints(self, "num_eval_batches", "bleu_examples", "num_samples")
