"""Evaluation: validation loss / perplexity / accuracy, BLEU and chrF, and model outputs.

Translation and sampling go through `flax_transformer.generate_translation` and
`generate_text` (KV-cache decoding; greedy unless the config asks for beams or sampling).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np

from flax_transformer import generate_text, generate_translation
from train import data, distributed
from train.metrics import summarize
from train.tokenizer import Tokenizer

_SUM_KEYS = ("loss", "nll", "correct", "tokens")


def evaluate_loss(
    eval_step: Callable, params: Any, batches: Sequence, put_batch: Callable, chars_per_token=None
) -> dict[str, float]:
    """Validation metrics over `batches` (no dropout, no label smoothing).

    Returns:
        `metrics.summarize` of the summed metrics: loss, nll, perplexity, accuracy, tokens
        (and bits_per_char when chars_per_token is given).
    """
    sums = dict.fromkeys(_SUM_KEYS, 0.0)
    pending = [eval_step(params, put_batch(batch)) for batch in batches]
    for step_sums in jax.device_get(pending):
        for key in _SUM_KEYS:
            sums[key] += float(step_sums[key])
    return summarize(sums, chars_per_token)


def _cut_at_eos(ids: np.ndarray, eos_id: int) -> list[int]:
    ids = ids.tolist()
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
    config: ml_collections.ConfigDict,
    beam_size: int | None = None,
) -> list[str]:
    """Translates sentences with the config's decoding settings.

    Sources are sorted by length and padded to the bucket lengths, so few shapes compile.

    Args:
        model: a `Transformer`.
        params: its parameters (the 'params' collection).
        tokenizer: the run's tokenizer.
        sources: source sentences.
        config: the experiment config (max_len, bucket_lengths, decode_batch_size,
            max_decode_len, beam_size, length_penalty).
        beam_size: overrides config.beam_size (1 = greedy).

    Returns:
        One translation per source, in the input order.

    Raises:
        ValueError: a source longer than max_len tokens.
    """
    encoded = [tokenizer.encode(text) for text in sources]
    for index, ids in enumerate(encoded):
        if len(ids) > config.max_len:
            raise ValueError(
                f"Source {index} has {len(ids)} tokens, more than max_len={config.max_len}: "
                f"{sources[index][:60]!r}...; shorten it."
            )
    buckets = tuple(config.bucket_lengths) or data.default_bucket_lengths(config.max_len)
    max_new = config.max_decode_len or config.max_len - 1
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    outputs: list[str] = [""] * len(encoded)
    size = config.decode_batch_size
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
            beam_size=beam_size or config.beam_size,
            length_penalty=config.length_penalty,
        )
        generated = np.asarray(jax.device_get(generated))
        for row, index in enumerate(chunk):
            outputs[index] = tokenizer.decode(_cut_at_eos(generated[row], tokenizer.eos_id))
    return outputs


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


def sample_text(
    model,
    params: Any,
    tokenizer: Tokenizer,
    prompts: Sequence[str],
    config: ml_collections.ConfigDict,
    rng: jax.Array | None = None,
    max_new_tokens: int | None = None,
) -> list[str]:
    """Continues each prompt with the language model (greedy unless temperature > 0).

    Args:
        model: a `DecoderOnlyTransformer`.
        params: its parameters.
        tokenizer: the run's tokenizer.
        prompts: text prompts; each is fed as BOS + its tokens.
        config: max_len, max_decode_len, temperature, top_k, top_p (the last two only
            when temperature > 0: greedy decoding has nothing for them to filter).
        rng: PRNG key for sampling (default: key(config.seed)).
        max_new_tokens: tokens to generate (default: max_decode_len, or as many as fit).

    Returns:
        The prompt followed by its continuation, one string per prompt.

    Raises:
        ValueError: a prompt leaves no room for new tokens within max_len.
    """
    rows = [[tokenizer.bos_id, *tokenizer.encode(p)] for p in prompts]
    longest = max(len(r) for r in rows)
    room = config.max_len - longest
    max_new = max_new_tokens or config.max_decode_len or room
    if max_new < 1 or max_new > room:
        raise ValueError(
            f"A prompt of {longest - 1} tokens leaves room for {room} new tokens within "
            f"max_len={config.max_len}, but {max_new} were asked; shorten the prompt."
        )
    sampling = {}
    if config.temperature > 0:  # greedy otherwise: top_k/top_p would be refused, not ignored
        sampling = dict(
            temperature=config.temperature,
            top_k=config.top_k,
            top_p=config.top_p,
            rng=jax.random.key(config.seed) if rng is None else rng,
        )
    generated = generate_text(
        model,
        {"params": params},
        _pad_rows(rows, len(rows), longest),
        np.asarray([len(r) for r in rows], np.int32),
        eos_id=tokenizer.eos_id,
        max_new_tokens=max_new,
        **sampling,
    )
    generated = np.asarray(jax.device_get(generated))
    return [
        tokenizer.decode(row[1:] + _cut_at_eos(generated[i], tokenizer.eos_id))
        for i, row in enumerate(rows)
    ]


def format_samples(
    rows: Sequence[tuple[str, ...]], headers: Sequence[str], width: int = 100
) -> str:
    """A text block with one labelled line per field (e.g. source, reference, model) for each
    sample, samples separated by rules, so the texts line up for comparison."""
    if not rows:
        return ""
    rule = "-" * width
    blocks = []
    for row in rows:
        label_width = max(len(h) for h in headers)
        blocks.append(
            "\n".join(
                f"{h.rjust(label_width)}: {text}" for h, text in zip(headers, row, strict=True)
            )
        )
    return rule + "\n" + f"\n{rule}\n".join(blocks) + "\n" + rule


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


def _score_line(name: str, scores: dict) -> str:
    return f"{name}: BLEU {scores['bleu']:.2f}, chrF {scores['chrf']:.2f}" + (
        f", {100 * scores['repeated_4gram']:.1f}% of outputs repeat a 4-gram"
        if "repeated_4gram" in scores
        else ""
    )


def format_report(results: dict) -> str:
    """The text printed at the end of a run: validation metrics, BLEU/chrF, samples."""
    valid = results["valid"]
    lines = [
        "",
        f"Validation after {results['step']} steps: loss {valid['nll']:.3f}, perplexity "
        f"{valid['perplexity']:.1f}, token accuracy {100 * valid['accuracy']:.1f}%"
        + (f", {valid['bits_per_char']:.3f} bits/char" if "bits_per_char" in valid else ""),
    ]
    if "bleu" in results:
        bleu = results["bleu"]
        lines.append(f"On {bleu['examples']} validation sentences:")
        lines.append("  " + _score_line(f"model, {bleu['decoding']}", bleu))
        if "bleu_beam" in results:
            beam = results["bleu_beam"]
            lines.append("  " + _score_line(f"model, {beam['decoding']}", beam))
        if "copy_baseline" in results:
            lines.append(
                "  " + _score_line("copy the source unchanged (baseline)", results["copy_baseline"])
            )
        headers = ("source", "reference", "model")
        rows = [(s["source"], s["reference"], s["model"]) for s in results["samples"]]
        if rows and "model_beam" in results["samples"][0]:
            headers = (*headers, "model (beam)")
            rows = [
                (*row, s["model_beam"]) for row, s in zip(rows, results["samples"], strict=True)
            ]
        lines.append(format_samples(rows, headers))
    elif results["samples"]:
        rows = [(s["prompt"], s["model"]) for s in results["samples"]]
        lines.append(format_samples(rows, ("prompt", "model")))
    return "\n".join(lines)


def validation_bleu(
    config: ml_collections.ConfigDict, dataset, model, params: Any, beam_size: int = 1
) -> tuple[dict, list[str]]:
    """BLEU/chrF of the model's translations of the first `bleu_examples` validation pairs.

    Every process of a multi-process run must call it (they share the decoding), with
    `params` whole in each (`distributed.host_copy`).

    Returns:
        ({bleu, chrf, repeated_4gram, examples, decoding}, the translations).
    """
    pairs = dataset.valid_examples[: config.bleu_examples]
    # With several processes each translates its share of the sentences; all gather them.
    mine = [pairs[i][0] for i in distributed.share_of(len(pairs))]
    translated = translate(model, params, dataset.tokenizer, mine, config, beam_size=beam_size)
    hypotheses = distributed.gather_texts(translated, len(pairs))
    scores = bleu_and_chrf(hypotheses, [t for _, t in pairs], config.bleu_tokenize)
    decoding = "greedy" if beam_size == 1 else f"beam {beam_size}"
    return {
        **scores,
        "repeated_4gram": repeated_ngram_share(hypotheses),
        "examples": len(pairs),
        "decoding": decoding,
    }, hypotheses
