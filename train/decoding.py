"""Decoding with a trained model: translation and sampling, for evaluation and the CLI tools.

Both go through `flax_transformer.generate_translation` and `generate_text` (KV-cache
decoding; greedy unless the options ask for beams or sampling). What they read of the
experiment config travels as one frozen `DecodeOptions`, built once with `from_config`; a
command-line flag changes a copy (`dataclasses.replace`), never the config. The options
turn into one decoding strategy (`Greedy`, `Sample` or `Beam`) where they are used. The scores of
decoded text live here too: BLEU and chrF (sacrebleu) and the share of outputs that loop.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import jax
import ml_collections
import numpy as np

from flax_transformer import Beam, Greedy, Sample, generate_text, generate_translation
from train import distributed
from train.batching import default_bucket_lengths
from train.tokenizer import Tokenizer

if TYPE_CHECKING:
    from train.sections import EvalConfig


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


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


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
            if not _is_int(value) or value < low:
                raise DecodeOptionError(name, value, what)
        if not _is_real(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise DecodeOptionError("top_p", self.top_p, "must be in (0, 1]")
        for name, meaning in (("temperature", "0 = greedy"), ("length_penalty", "0 = none")):
            value = getattr(self, name)
            if not _is_real(value) or not math.isfinite(value):  # NaN passes every comparison
                raise DecodeOptionError(name, value, f"must be a finite number >= 0 ({meaning})")
            if value < 0:
                raise DecodeOptionError(name, value, f"must be >= 0 ({meaning})")
        if self.max_decode_len >= self.max_len:
            raise DecodeOptionError(
                "max_decode_len", self.max_decode_len, f"must be < max_len={self.max_len} or 0"
            )

    def translation_strategy(self) -> Greedy | Beam:
        """Beam search when beam_size > 1, else greedy decoding (translation never samples)."""
        if self.beam_size > 1:
            return Beam(self.beam_size, self.length_penalty)
        return Greedy()

    def text_strategy(self) -> Greedy | Sample:
        """Sampling when temperature > 0, filtered by top_k and top_p; else greedy decoding,
        which has nothing for top_k/top_p to filter, so the run's values go unused."""
        if self.temperature > 0:
            return Sample(self.temperature, self.top_k, self.top_p)
        return Greedy()


def cut_at_eos(ids: np.ndarray, eos_id: int) -> list[int]:
    """The ids `(T,)` of one generated row before its first `eos_id` (all when it has none)."""
    ids = np.asarray(ids).tolist()
    return ids[: ids.index(eos_id)] if eos_id in ids else ids


def _pad_rows(rows: list[list[int]], num_rows: int, length: int) -> np.ndarray:
    """(num_rows, length) int32, right-padded; missing rows repeat the last one, so they
    finish decoding with it instead of running to the length limit."""
    rows = rows + [rows[-1]] * (num_rows - len(rows))
    out = np.zeros((num_rows, length), np.int32)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


def translate(
    model,
    params: Any,
    tokenizer: Tokenizer,
    sources: Sequence[str],
    options: DecodeOptions,
) -> list[str]:
    """Translates sentences (greedy, or beam search when `options.beam_size` > 1).

    Sources are sorted by length and padded to the bucket lengths, so few shapes compile.

    Args:
        model: a `Transformer`.
        params: its parameters (the 'params' collection).
        tokenizer: the run's tokenizer.
        sources: source sentences.
        options: max_len, bucket_lengths, batch_size, max_decode_len, beam_size,
            length_penalty.

    Returns:
        One translation per source, in the input order.

    Raises:
        ValueError: a source longer than max_len tokens.
    """
    encoded = [tokenizer.encode(text) for text in sources]
    for index, ids in enumerate(encoded):
        if len(ids) > options.max_len:
            raise ValueError(
                f"Source {index} has {len(ids)} tokens, more than max_len={options.max_len}: "
                f"{sources[index][:60]!r}...; shorten it."
            )
    buckets = options.bucket_lengths or default_bucket_lengths(options.max_len)
    max_new = options.max_decode_len or options.max_len - 1
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    outputs: list[str] = [""] * len(encoded)
    size = options.batch_size
    for start in range(0, len(order), size):
        chunk = order[start : start + size]
        rows = [encoded[i] or [tokenizer.eos_id] for i in chunk]
        length = next(b for b in buckets if b >= max(len(r) for r in rows))
        generated = generate_translation(
            model,
            {"params": params},
            _pad_rows(rows, size, length),
            bos_id=tokenizer.bos_id,
            eos_id=tokenizer.eos_id,
            max_new_tokens=max_new,
            strategy=options.translation_strategy(),
        )
        generated = np.asarray(jax.device_get(generated))
        for row, index in enumerate(chunk):
            outputs[index] = tokenizer.decode(cut_at_eos(generated[row], tokenizer.eos_id))
    return outputs


def sample_text(
    model,
    params: Any,
    tokenizer: Tokenizer,
    prompts: Sequence[str],
    options: DecodeOptions,
    rng: jax.Array | None = None,
    max_new_tokens: int | None = None,
) -> list[str]:
    """Continues each prompt with the language model (greedy unless temperature > 0).

    Args:
        model: a `DecoderOnlyTransformer`.
        params: its parameters.
        tokenizer: the run's tokenizer.
        prompts: text prompts; each is fed as BOS + its tokens.
        options: max_len, max_decode_len, temperature, top_k, top_p (the last two only
            when temperature > 0: greedy decoding has nothing for them to filter), seed.
        rng: PRNG key for sampling (default: key(options.seed)).
        max_new_tokens: tokens to generate (default: max_decode_len, or as many as fit).

    Returns:
        The prompt followed by its continuation, one string per prompt.

    Raises:
        ValueError: a prompt leaves no room for new tokens within max_len.
    """
    rows = [[tokenizer.bos_id, *tokenizer.encode(p)] for p in prompts]
    longest = max(len(r) for r in rows)
    room = options.max_len - longest
    max_new = max_new_tokens or options.max_decode_len or room
    if max_new < 1 or max_new > room:
        raise ValueError(
            f"A prompt of {longest - 1} tokens leaves room for {room} new tokens within "
            f"max_len={options.max_len}, but {max_new} were asked; shorten the prompt."
        )
    strategy = options.text_strategy()
    if not isinstance(strategy, Sample):
        rng = None  # greedy decoding draws nothing
    elif rng is None:
        rng = jax.random.key(options.seed)
    generated = generate_text(
        model,
        {"params": params},
        _pad_rows(rows, len(rows), longest),
        np.asarray([len(r) for r in rows], np.int32),
        eos_id=tokenizer.eos_id,
        max_new_tokens=max_new,
        strategy=strategy,
        rng=rng,
    )
    generated = np.asarray(jax.device_get(generated))
    return [
        tokenizer.decode(row[1:] + cut_at_eos(generated[i], tokenizer.eos_id))
        for i, row in enumerate(rows)
    ]


def bleu_and_chrf(
    hypotheses: Sequence[str], references: Sequence[str], tokenize: str
) -> dict[str, float]:
    """Corpus BLEU and chrF (sacrebleu), each 0-100.

    Args:
        hypotheses: model translations.
        references: one reference per hypothesis.
        tokenize: sacrebleu BLEU tokenizer ('13a', 'char', 'intl', ...).
    """
    import sacrebleu

    return {
        "bleu": sacrebleu.corpus_bleu(
            list(hypotheses), [list(references)], tokenize=tokenize
        ).score,
        "chrf": sacrebleu.corpus_chrf(list(hypotheses), [list(references)]).score,
    }


def repeated_ngram_share(texts: Sequence[str], n: int = 4) -> float:
    """Share of texts in which some run of `n` words (split at whitespace) occurs twice: the
    loops of a decoder that ignores its source ("to the king of Israel, and to the king...").

    Args:
        texts: model outputs.
        n: n-gram length in words.

    Returns:
        A fraction in [0, 1]; 0 for no texts.
    """

    def repeats(text: str) -> bool:
        words = text.split()
        grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
        return len(set(grams)) < len(grams)

    return sum(map(repeats, texts)) / len(texts) if texts else 0.0


def validation_bleu(
    evaluation: EvalConfig, dataset, model, params: Any, beam_size: int = 1
) -> tuple[dict, list[str]]:
    """BLEU/chrF of the model's translations of the first `bleu_examples` validation pairs.

    `evaluation` is the run's eval section (`train.sections.EvalConfig`): bleu_examples,
    bleu_tokenize and the decoding options, whose beam size `beam_size` replaces.

    Every process of a multi-process run must call it (they share the decoding), with
    `params` whole in each (`distributed.host_copy`).

    Returns:
        ({bleu, chrf, repeated_4gram, examples, decoding}, the translations).
    """
    pairs = dataset.valid_examples[: evaluation.bleu_examples]
    # With several processes each translates its share of the sentences; all gather them.
    mine = [pairs[i][0] for i in distributed.share_of(len(pairs))]
    options = dataclasses.replace(evaluation.decode, beam_size=beam_size)
    translated = translate(model, params, dataset.tokenizer, mine, options)
    hypotheses = distributed.gather_texts(translated, len(pairs))
    scores = bleu_and_chrf(hypotheses, [t for _, t in pairs], evaluation.bleu_tokenize)
    decoding = "greedy" if beam_size == 1 else f"beam {beam_size}"
    return {
        **scores,
        "repeated_4gram": repeated_ngram_share(hypotheses),
        "examples": len(pairs),
        "decoding": decoding,
    }, hypotheses
