"""The report printed at the end of a run (`format_report`): validation metrics, the target
line, BLEU/chrF against the copy baseline, a chat run's conversations, and samples lined up
source / reference / model."""

from __future__ import annotations

from collections.abc import Sequence


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


def _score_line(name: str, scores: dict) -> str:
    return f"{name}: BLEU {scores['bleu']:.2f}, chrF {scores['chrf']:.2f}" + (
        f", {100 * scores['repeated_4gram']:.1f}% of outputs repeat a 4-gram"
        if "repeated_4gram" in scores
        else ""
    )


def format_target(target: dict) -> str:
    """The report's line on `--config.target_valid_loss` / `--config.target_bleu`
    (`train.program.loop`'s `results['target']`)."""
    asked = " and ".join(
        f"{name} {target[key]:g}"
        for key, name in (("valid_loss", "validation loss <="), ("bleu", "BLEU >="))
        if target.get(key)
    )
    if not target["reached"]:
        return f"Target ({asked}) not reached in {target['step']} steps."
    what = "validation loss" if target["metric"] == "valid_loss" else "BLEU"
    return (
        f"Target reached: {what} {target['value']:.3f} at step {target['step']}, "
        f"{target['wall_s']:.1f} s after the command started (start-up and compilation "
        f"included; target {asked})."
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
    # A task's own metrics, named as its peers name them ('rewards/accuracies', ...).
    own = {k: v for k, v in valid.items() if "/" in k and isinstance(v, (int, float))}
    if own:
        lines.append("  " + ", ".join(f"{k} {v:.4g}" for k, v in sorted(own.items())))
    if "data" in results:  # a chat run: what became of its conversations
        lines.append(_conversations_line(results["data"]))
    if "target" in results:
        lines.append(format_target(results["target"]))
    if "bleu" in results:
        bleu = results["bleu"]
        lines.append(f"On {bleu['examples']} {bleu.get('of', 'validation sentences')}:")
        lines.append("  " + _score_line(f"model, {bleu['decoding']}", bleu))
        if "bleu_beam" in results:
            beam = results["bleu_beam"]
            lines.append("  " + _score_line(f"model, {beam['decoding']}", beam))
        if "copy_baseline" in results:
            lines.append(
                "  " + _score_line("copy the source unchanged (baseline)", results["copy_baseline"])
            )
        # A translation's source, or the prompt a chat run's model replied to.
        asked = "prompt" if results["samples"] and "prompt" in results["samples"][0] else "source"
        headers = (asked, "reference", "model")
        rows = [tuple(s[h] for h in headers) for s in results["samples"]]
        if rows and "model_beam" in results["samples"][0]:
            headers = (*headers, "model (beam)")
            rows = [
                (*row, s["model_beam"]) for row, s in zip(rows, results["samples"], strict=True)
            ]
        lines.append(format_samples(rows, headers))
    elif results["samples"]:
        headers = [h for h in ("prompt", "reference", "model") if h in results["samples"][0]]
        rows = [tuple(s[h] for h in headers) for s in results["samples"]]
        lines.append(format_samples(rows, headers))
    return "\n".join(lines)


def _conversations_line(sizes: dict) -> str:
    """A chat run's conversations kept, cut and dropped, and its tokens trained (the data
    sizes of `train.data.chat.examples.ChatCounts`)."""
    parts = []
    if "train_pairs" in sizes:  # a preference run (`train.tasks.dpo.pairs.PairCounts.sizes`)
        for split in ("train", "valid"):
            drops = {
                k.removeprefix(f"{split}_dropped_"): n
                for k, n in sizes.items()
                if k.startswith(f"{split}_dropped_") and n
            }
            reasons = ", ".join(f"{n} {reason}" for reason, n in drops.items())
            parts.append(
                f"{split} {sizes[f'{split}_pairs']} kept ({sizes[f'{split}_pairs_cut']} cut), "
                f"{sum(drops.values())} dropped" + (f" ({reasons})" if reasons else "")
            )
        return "Preference pairs: " + "; ".join(parts) + "."
    for split in ("train", "valid"):
        dropped = sum(n for k, n in sizes.items() if k.startswith(f"{split}_dropped_"))
        share = sizes.get(f"{split}_trained_tokens", 0) / max(sizes.get(f"{split}_tokens", 0), 1)
        parts.append(
            f"{split} {sizes.get(split, 0)} kept ({sizes.get(f'{split}_cut', 0)} cut), "
            f"{dropped} dropped, {100 * share:.1f}% of tokens trained"
        )
    return "Conversations: " + "; ".join(parts) + "."
