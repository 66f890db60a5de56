"""Decoding with a trained model: translation and sampling, for evaluation and the CLI tools.

Both go through `flax_transformer.generate_translation` and `generate_text` (KV-cache
decoding; greedy unless the options ask for beams or sampling). What they read of the
experiment config travels as one frozen `train.config.sections.DecodeOptions` (the eval section's
`decode`); a command-line flag changes a copy (`dataclasses.replace`), never the config. The
options turn into one decoding strategy (`Greedy`, `Sample` or `Beam`) here, beside the
decoding they drive: `translation_strategy`, `text_strategy`. The scores of decoded text
live here too: BLEU and chrF (sacrebleu) and the share of outputs that loop.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from flax_transformer import Beam, Greedy, Sample, generate_text, generate_translation
from train.config.sections import DecodeOptions, EvalConfig
from train.core import distributed
from train.data.batching import default_bucket_lengths
from train.data.tokenizer import Tokenizer


def cut_at_eos(ids: np.ndarray, eos_id: int) -> list[int]:
    """The ids `(T,)` of one generated row before its first `eos_id` (all when it has none)."""
    ids = np.asarray(ids).tolist()
    return ids[: ids.index(eos_id)] if eos_id in ids else ids


def _pad_rows(rows: list[list[int]], num_rows: int, length: int, pad_id: int) -> np.ndarray:
    """(num_rows, length) int32, right-padded with `pad_id`; missing rows repeat the last
    one, so they finish decoding with it instead of running to the length limit."""
    rows = rows + [rows[-1]] * (num_rows - len(rows))
    out = np.full((num_rows, length), pad_id, np.int32)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


def translation_strategy(options: DecodeOptions) -> Greedy | Beam:
    """Beam search when `options.beam_size` > 1, else greedy decoding (translation never
    samples)."""
    if options.beam_size > 1:
        return Beam(options.beam_size, options.length_penalty)
    return Greedy()


def text_strategy(options: DecodeOptions) -> Greedy | Sample:
    """Sampling when `options.temperature` > 0, filtered by top_k and top_p; else greedy
    decoding, which has nothing for top_k/top_p to filter, so the run's values go unused."""
    if options.temperature > 0:
        return Sample(options.temperature, options.top_k, options.top_p)
    return Greedy()


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
            _pad_rows(rows, size, length, tokenizer.pad_id),
            bos_id=tokenizer.bos_id,
            eos_id=tokenizer.eos_id,
            max_new_tokens=max_new,
            strategy=translation_strategy(options),
        )
        generated = np.asarray(jax.device_get(generated))
        for row, index in enumerate(chunk):
            outputs[index] = tokenizer.decode(cut_at_eos(generated[row], tokenizer.eos_id))
    return outputs


def continuation_budgets(prompt_lengths: Sequence[int], max_len: int, asked: int) -> list[int]:
    """The new tokens each prompt is continued by: `asked`, or fewer where the prompt leaves
    less room within `max_len`; 0 asked: as many as the longest prompt leaves room for.

    Args:
        prompt_lengths: each prompt's tokens, BOS included.
        max_len: the model's longest sequence (prompt + continuation).
        asked: tokens asked for (`max_decode_len`, or a tool's `--max_new_tokens`); 0: fit.

    Returns:
        One budget per prompt, each >= 1.

    Raises:
        ValueError: a prompt leaves no room for one new token (names it and its length).
    """
    for index, length in enumerate(prompt_lengths):
        if length >= max_len:
            raise ValueError(
                f"Prompt {index} has {length - 1} tokens (+ BOS), which leaves no room for a "
                f"new token within max_len={max_len}; shorten it to at most {max_len - 2} "
                "tokens or raise max_len."
            )
    if not asked:
        return [max_len - max(prompt_lengths)] * len(prompt_lengths)
    return [min(asked, max_len - length) for length in prompt_lengths]


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

    A prompt too long for the tokens asked (prompt + continuation > max_len) is continued
    by as many as fit, with a warning (`continuation_budgets`); prompts of different budgets
    are decoded apart.

    Args:
        model: a `DecoderOnlyTransformer`.
        params: its parameters.
        tokenizer: the run's tokenizer.
        prompts: text prompts; each is fed as its tokens, after the BOS where the tokenizer
            starts a sequence with one (`SpecialIds.prompt`).
        options: max_len, max_decode_len, temperature, top_k, top_p (the last two only
            when temperature > 0: greedy decoding has nothing for them to filter), seed.
        rng: PRNG key for sampling (default: key(options.seed)).
        max_new_tokens: tokens to generate (default: max_decode_len, or as many as fit).

    Returns:
        The prompt followed by its continuation, one string per prompt.

    Raises:
        ValueError: a prompt leaves no room for new tokens within max_len.
    """
    rows = [tokenizer.specials.prompt(tokenizer.encode(p)) for p in prompts]
    asked = max_new_tokens or options.max_decode_len
    budgets = continuation_budgets([len(r) for r in rows], options.max_len, asked)
    for index, budget in enumerate(budgets):
        if asked and budget < asked:
            logging.warning(
                "Prompt %d (%d tokens) leaves room for %d new tokens within max_len=%d: it is "
                "continued by %d, not %d.", index, len(tokenizer.encode(prompts[index])), budget,
                options.max_len, budget, asked,
            )  # fmt: skip
    strategy = text_strategy(options)
    if not isinstance(strategy, Sample):
        rng = None  # greedy decoding draws nothing
    elif rng is None:
        rng = jax.random.key(options.seed)
    outputs: list[str] = [""] * len(rows)
    for budget in sorted(set(budgets), reverse=True):  # one group in the usual case
        group = [i for i, b in enumerate(budgets) if b == budget]
        longest = max(len(rows[i]) for i in group)
        generated = generate_text(
            model,
            {"params": params},
            _pad_rows([rows[i] for i in group], len(group), longest, tokenizer.pad_id),
            np.asarray([len(rows[i]) for i in group], np.int32),
            eos_id=tokenizer.eos_id,
            max_new_tokens=budget,
            strategy=strategy,
            rng=rng,
        )
        generated = np.asarray(jax.device_get(generated))
        for row, index in enumerate(group):
            continuation = cut_at_eos(generated[row], tokenizer.eos_id)
            outputs[index] = tokenizer.decode(rows[index] + continuation)  # specials dropped
    return outputs


# A chat prompt's width is rounded up to a multiple of this, so that prompts of many lengths
# compile few shapes (a 30-layer model's decoding takes seconds to compile per shape).
_PROMPT_WIDTH_STEP = 32


def cut_at_stop(ids: np.ndarray, stop_ids: Sequence[int]) -> list[int]:
    """The ids `(T,)` of one generated row before the first of `stop_ids` (all if none)."""
    ids = np.asarray(ids).tolist()
    ends = [ids.index(stop) for stop in stop_ids if stop in ids]
    return ids[: min(ends)] if ends else ids


def chat_replies(
    model,
    params: Any,
    tokenizer: Tokenizer,
    prompts: Sequence[Sequence[int]],
    options: DecodeOptions,
    stop_ids: Sequence[int],
    *,
    rng: jax.Array | None = None,
    max_new_tokens: int | None = None,
) -> list[str]:
    """A chat model's reply to each prompt: decoded with the KV cache after the prompt's
    ids (which end with the template's generation prompt, `ChatEncoder.prompt_ids`), cut
    at the first stop id (the end of turn, or the EOS), as text.

    Prompts are sorted by length and decoded `options.batch_size` at a time, each batch
    padded to a width rounded up to `_PROMPT_WIDTH_STEP`, so few shapes compile. A batch
    stops at its rows' end of turn (`stop_ids[0]`); a row that writes another stop id
    first (the EOS) is cut there.

    Args:
        model: a `DecoderOnlyTransformer`.
        params: its parameters.
        tokenizer: the run's tokenizer (decodes the replies).
        prompts: each prompt's ids, complete (nothing is added).
        options: max_len, batch_size, max_decode_len, temperature, top_k, top_p, seed.
        stop_ids: the ids a reply ends at (`ChatEncoder.stop_ids`), the end of turn first.
        rng: PRNG key for sampling (default: key(options.seed)).
        max_new_tokens: tokens to generate at most (default: max_decode_len, or as many as
            fit).

    Returns:
        One reply per prompt, in the input order.

    Raises:
        ValueError: a prompt leaves no room for a new token within max_len.
    """
    if not prompts:
        return []
    lengths = [len(p) for p in prompts]
    asked = max_new_tokens or options.max_decode_len
    budgets = continuation_budgets(lengths, options.max_len, asked)
    strategy = text_strategy(options)
    if not isinstance(strategy, Sample):
        rng = None
    elif rng is None:
        rng = jax.random.key(options.seed)
    order = sorted(range(len(prompts)), key=lengths.__getitem__)
    replies: list[str] = [""] * len(prompts)
    size = options.batch_size
    for batch, start in enumerate(range(0, len(order), size)):
        chunk = order[start : start + size]
        new = min(budgets[i] for i in chunk)
        longest = max(lengths[i] for i in chunk)
        step = _PROMPT_WIDTH_STEP
        width = min(-(-longest // step) * step, options.max_len - new)
        generated = generate_text(
            model,
            {"params": params},
            _pad_rows([list(prompts[i]) for i in chunk], size, width, tokenizer.pad_id),
            np.asarray([lengths[i] for i in chunk] + [lengths[chunk[-1]]] * (size - len(chunk))),
            eos_id=stop_ids[0],
            max_new_tokens=new,
            strategy=strategy,
            rng=None if rng is None else jax.random.fold_in(rng, batch),
        )
        generated = np.asarray(jax.device_get(generated))
        for row, index in enumerate(chunk):
            replies[index] = tokenizer.decode(cut_at_stop(generated[row], stop_ids))
    return replies


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


def check_bleu_tokenize(name: str) -> None:
    """Refuses a BLEU tokenizer that scoring would fail on: sacrebleu missing, a name it does
    not know, or one whose extra packages or model are missing (built once here, as
    scoring builds it).

    Raises:
        ValueError: names `--config.bleu_tokenize` and the fix.
    """
    try:
        from sacrebleu.metrics import BLEU
    except ImportError as err:
        raise ValueError(
            f"BLEU needs sacrebleu ({err}); pip install sacrebleu, or set "
            "--config.bleu_examples=0 to score no translations."
        ) from None
    try:
        BLEU(tokenize=name)
    except KeyError:
        raise ValueError(
            f"--config.bleu_tokenize={name!r}: not a sacrebleu tokenizer; use one of "
            f"{tuple(BLEU.TOKENIZERS)} ('13a' for English, 'char' or 'ja-mecab' for Japanese)."
        ) from None
    except (ImportError, RuntimeError, OSError) as err:
        first = next((line for line in str(err).splitlines() if line.strip()), repr(err))
        raise ValueError(
            f"--config.bleu_tokenize={name!r} cannot be used here: {first.strip()} ; install "
            "what it needs or choose another (e.g. '13a', 'char')."
        ) from None


def check_strategy(strategy, *, vocab_size: int, max_new_tokens: int, fields: str) -> None:
    """Refuses a decoding strategy that generation would refuse (a top_k above the vocabulary,
    a length penalty that overflows within `max_new_tokens`), naming the config `fields`
    that made it.

    Raises:
        ValueError: generation's own message, after the fields.
    """
    try:
        strategy.check(
            "decoding", vocab=vocab_size, max_new_tokens=max_new_tokens, return_logits=False
        )
    except ValueError as err:
        raise ValueError(f"{fields}: {err}") from None


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

    `evaluation` is the run's eval section (`train.config.sections.EvalConfig`): bleu_examples,
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
