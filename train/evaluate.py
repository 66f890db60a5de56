"""Evaluation: validation loss / perplexity / accuracy, BLEU and chrF, and the final report.

The translations scored here come from `train.decoding` (KV-cache decoding, greedy unless
the config asks for beams).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import ml_collections

from train import distributed
from train.decoding import DecodeOptions, translate
from train.metrics import SUM_KEYS, summarize


def evaluate_loss(
    eval_step: Callable, params: Any, batches: Sequence, put_batch: Callable, chars_per_token=None
) -> dict[str, float]:
    """Validation metrics over `batches` (no dropout, no label smoothing).

    Returns:
        `metrics.summarize` of the summed metrics: loss, nll, perplexity, accuracy, tokens
        (and bits_per_char when chars_per_token is given).
    """
    sums = dict.fromkeys(SUM_KEYS, 0.0)
    pending = [eval_step(params, put_batch(batch)) for batch in batches]
    for step_sums in jax.device_get(pending):
        for key in SUM_KEYS:
            sums[key] += float(step_sums[key])
    return summarize(sums, chars_per_token)


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
    options = dataclasses.replace(DecodeOptions.from_config(config), beam_size=beam_size)
    translated = translate(model, params, dataset.tokenizer, mine, options)
    hypotheses = distributed.gather_texts(translated, len(pairs))
    scores = bleu_and_chrf(hypotheses, [t for _, t in pairs], config.bleu_tokenize)
    decoding = "greedy" if beam_size == 1 else f"beam {beam_size}"
    return {
        **scores,
        "repeated_4gram": repeated_ngram_share(hypotheses),
        "examples": len(pairs),
        "decoding": decoding,
    }, hypotheses
