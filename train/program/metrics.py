"""Metrics and logging: summaries of step sums, what the user sees during training (the
progress bar, interval summaries, divergence checks), and where records go (`metrics.jsonl`,
TensorBoard events, a loss-curve PNG); validation loss (`evaluate_loss`) and the report
printed at the end of a run (`format_report`).

Step metrics stay on the device until a summary is due (every `log_every_steps`, and before
every checkpoint), so the host never waits on the accelerator between steps; then they are
fetched together and checked for NaN/inf, so a diverged run stops with the step named, before
a bad state can be checkpointed.

Every record is one JSON line `{"step": s, "split": "train" | "valid" | "bleu", ...,
"wall_s": t}` in the run directory's metrics file; the same scalars go to its TensorBoard
folder as `<split>/<name>` (`train.core.rundir` names both). `wall_s` (`RunClock`) is the
seconds since the command started, start-up and compilation included, so time to quality
reads off any run; TensorBoard gets it as `<split>/wall_s` and as each event's wall time
(its "relative" axis is then the same clock, across resumes too).
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from train.core.failures import RunFailure
from train.core.rundir import RunDir, atomic_savefig, atomic_write_text

# The metrics a step returns as sums over its tokens (`train.program.steps`).
SUM_KEYS = ("loss", "nll", "correct", "tokens")

# Perplexity overflows float64 above exp(709); report inf beyond this loss.
_MAX_LOG_PERPLEXITY = 700.0


def summarize(sums: Mapping[str, float], chars_per_token: float | None = None) -> dict:
    """Per-token means from summed step metrics.

    Args:
        sums: 'loss', 'nll', 'correct', 'tokens' summed over batches (numbers).
        chars_per_token: characters per target token; adds bits per character when given.

    Returns:
        {'loss', 'nll', 'perplexity', 'accuracy', 'tokens'} and maybe 'bits_per_char'.
    """
    tokens = max(float(sums["tokens"]), 1.0)
    nll = float(sums["nll"]) / tokens
    out = {
        "loss": float(sums["loss"]) / tokens,
        "nll": nll,
        "perplexity": math.exp(nll) if nll < _MAX_LOG_PERPLEXITY else math.inf,
        "accuracy": float(sums["correct"]) / tokens,
        "tokens": int(sums["tokens"]),
    }
    if chars_per_token:
        out["bits_per_char"] = nll / math.log(2) / chars_per_token
    return out


class RunClock:
    """The seconds a run has taken: since its command started, start-up and compilation
    included; a resumed run counts on from the seconds its last checkpoint recorded.

    So a resumed run's clock adds the restart (start-up, compilation, restore) and leaves
    out the steps lost after that checkpoint, which are trained again and counted then:
    the clock is the time the run's records cost, as if it had never stopped, plus its
    restarts. Where the stopped run kept a record written after its checkpoint (the report
    of a run that ended at that step), the restart counts on from that record's clock.
    Monotonic (`time.perf_counter`) within a process.
    """

    def __init__(self, started: float | None = None):
        """Args: started: `time.time()` when the command started (e.g. `train.main` reads
        it before importing anything heavy); None: now."""
        now_epoch, now = time.time(), time.perf_counter()
        started = now_epoch if started is None else started
        self._origin = now - (now_epoch - started)  # the start on the perf_counter clock
        self._started_epoch = started
        self.offset = 0.0

    def resume(self, seconds: float) -> None:
        """Counts on from `seconds`, the clock a checkpoint recorded."""
        self.offset = float(seconds)

    def resume_after(self, seconds: float) -> None:
        """Counts on from `seconds` where that is later than the checkpoint's clock: a record
        the interrupted run kept was written after its checkpoint (the report of a run that
        stopped at that step), so the restart comes after it and no record goes back in time."""
        self.offset = max(self.offset, float(seconds))

    def seconds(self) -> float:
        """The run's seconds so far."""
        return self.offset + time.perf_counter() - self._origin

    def epoch(self, seconds: float) -> float:
        """The `time.time()` at which a run that never stopped would have reached `seconds`
        (TensorBoard's event wall time)."""
        return self._started_epoch - self.offset + seconds


class MetricsWriter:
    """Appends records to `metrics.jsonl` and TensorBoard; resumes without duplicates."""

    def __init__(self, run: RunDir, resume_step: int = 0, clock: RunClock | None = None):
        """Opens the writers.

        Args:
            run: the run directory.
            resume_step: the step training restarts from; records of later steps (written
                by the interrupted run after its last checkpoint) are removed from the JSONL;
                those kept are never written twice.
            clock: adds `wall_s` (its seconds when the record is written) to every record;
                None adds nothing.
        """
        from tensorboardX import SummaryWriter  # heavy import, only where written

        self.path = run.metrics
        kept = []
        if self.path.exists():
            kept = [r for r in read_metrics(self.path) if r["step"] <= resume_step]
            atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))
        # (step, split) of every record in the file: a resumed run that evaluates a step again
        # (e.g. the final one, when results.json was lost) must not log it twice.
        self._written = {(r["step"], r["split"]) for r in kept}
        walls = [r["wall_s"] for r in kept if isinstance(r.get("wall_s"), (int, float))]
        if clock is not None and walls:
            clock.resume_after(max(walls))
        self._tb = SummaryWriter(str(run.tensorboard))
        self.clock = clock

    def write(self, step: int, split: str, values: Mapping[str, float]) -> None:
        """Writes one record; non-finite numbers are stored as strings ('nan', 'inf').

        A record whose (step, split) is already in the file is not written again. With a
        clock, the record gets `wall_s` (unless `values` has one) and its TensorBoard
        events that wall time.
        """
        if (int(step), split) in self._written:
            return
        self._written.add((int(step), split))
        record = {"step": int(step), "split": split}
        walltime = None
        if self.clock is not None:
            values = {**values, "wall_s": values.get("wall_s", self.clock.seconds())}
            walltime = self.clock.epoch(float(values["wall_s"]))
        for name, value in values.items():
            value = float(value)
            record[name] = value if math.isfinite(value) else str(value)
            self._tb.add_scalar(f"{split}/{name}", value, int(step), walltime=walltime)
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def close(self) -> None:
        self._tb.close()


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """All records of a `metrics.jsonl` (a truncated last line is skipped)."""
    records = []
    for line in pathlib.Path(path).read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut short by a kill
    return records


def plot_loss_curve(run: RunDir) -> pathlib.Path | None:
    """Plots train and validation loss against step from the run's metrics into its
    loss-curve PNG.

    Returns:
        The PNG path, or None when there is nothing to plot.
    """
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    from matplotlib import pyplot as plt

    path = run.metrics
    if not path.exists():
        return None
    records = read_metrics(path)
    fig, ax = plt.subplots(figsize=(7, 4))
    plotted = False
    for split, key, label in (
        ("train", "nll", "train"),  # without label smoothing, like the validation loss
        ("valid", "nll", "validation"),
    ):
        points = [(r["step"], r[key]) for r in records if r["split"] == split and key in r]
        points = [(s, v) for s, v in points if isinstance(v, float)]
        if points:
            steps, values = np.asarray(points).T
            ax.plot(steps, values, marker="o" if split == "valid" else None, label=label)
            plotted = True
    if not plotted:
        plt.close(fig)
        return None
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats per target token)")
    ax.grid(alpha=0.3)
    ax.legend()
    out = run.loss_curve
    fig.tight_layout()
    atomic_savefig(fig, out, dpi=100)
    plt.close(fig)
    return out


class TrainingDivergedError(RunFailure):
    """The loss (or the parameters) became NaN or infinite."""


def progress_bar(total: int, initial: int, enabled: bool = True):
    """A tqdm bar over train steps; in a log file (not a terminal) it updates every 30 s.

    `enabled=False` (processes other than 0 of a multi-process run) shows nothing.
    """
    from tqdm import tqdm

    interactive = sys.stderr.isatty()
    return tqdm(
        total=total,
        initial=initial,
        unit="step",
        dynamic_ncols=True,
        mininterval=0.5 if interactive else 30.0,  # a log file gets a line every 30 s
        desc="train",
        disable=not enabled,
    )


class TrainLog:
    """Collects per-step metric sums, checks them for NaN/inf, and writes summaries."""

    def __init__(self, checkpointer):
        """Args: the run's Checkpointer (named in the divergence message)."""
        self.checkpointer = checkpointer
        self.pending: list[tuple[int, dict]] = []
        self.restart_clock()

    def restart_clock(self) -> None:
        """Starts a new tokens/s interval (after evaluation or saving, which are not training)."""
        self.tokens, self.start = 0, time.perf_counter()

    def add(self, step: int, metrics: dict, tokens: int) -> None:
        self.pending.append((step, metrics))
        self.tokens += tokens

    def check(self) -> dict[str, float] | None:
        """Fetches the pending step metrics and summarises them.

        Returns:
            {loss, nll, perplexity, accuracy, tokens, grad_norm, learning_rate,
            tokens_per_sec} of the interval, or None if no step is pending.

        Raises:
            TrainingDivergedError: at the first step whose loss or gradient norm is not
                finite, naming it and the last checkpoint kept.
        """
        if not self.pending:
            return None
        fetched = jax.device_get([m for _, m in self.pending])
        for (step, _), metrics in zip(self.pending, fetched, strict=True):
            if not (
                math.isfinite(float(metrics["loss"])) and math.isfinite(float(metrics["grad_norm"]))
            ):
                last = self.checkpointer.latest_step()
                kept = f"step {last}" if last is not None else "none saved yet"
                raise TrainingDivergedError(
                    f"Training diverged at step {step}: loss={float(metrics['loss'])}, "
                    f"grad_norm={float(metrics['grad_norm'])}. The last good checkpoint "
                    f"({kept}) is kept in {self.checkpointer.directory}. Lower "
                    "--config.learning_rate, raise --config.warmup_steps or set "
                    "--config.grad_clip_norm, then rerun (it resumes from that checkpoint)."
                )
        sums = {k: sum(float(m[k]) for m in fetched) for k in SUM_KEYS}
        summary = summarize(sums)
        summary["grad_norm"] = float(np.mean([float(m["grad_norm"]) for m in fetched]))
        summary["learning_rate"] = float(fetched[-1]["learning_rate"])  # the last step's
        elapsed = time.perf_counter() - self.start
        summary["tokens_per_sec"] = self.tokens / max(elapsed, 1e-9)
        self.pending = []
        self.restart_clock()
        return summary


class Target:
    """`--config.target_valid_loss` / `--config.target_bleu`: whether an evaluation reached
    one, and where (the first that did)."""

    def __init__(self, valid_loss: float = 0.0, bleu: float = 0.0):
        """Args: the run section's targets; 0 = none."""
        self.valid_loss, self.bleu = valid_loss, bleu
        self.reached: dict | None = None

    def check(self, metric: str, value: float, step: int, wall_s: float) -> bool:
        """Records and returns whether `value` of `metric` ('valid_loss': at most the target;
        'bleu': at least) reaches a target not reached before."""
        threshold = self.valid_loss if metric == "valid_loss" else self.bleu
        if not threshold or self.reached is not None:
            return False
        if value <= threshold if metric == "valid_loss" else value >= threshold:
            self.reached = {"metric": metric, "value": value, "step": step, "wall_s": wall_s}
            return True
        return False

    def result(self, step: int) -> dict:
        """`results.json`'s 'target': the targets, whether one was reached, and where (else
        the last step)."""
        out = {"valid_loss": self.valid_loss, "bleu": self.bleu, "reached": bool(self.reached)}
        return {**out, **(self.reached or {"step": step})}


# Steps dispatched before one is waited for, in validation (evaluate_loss) and on several
# CPU devices in the training loop (train_lib).
STEPS_IN_FLIGHT = 16


def evaluate_loss(
    eval_step: Callable, params: Any, batches: Sequence, put_batch: Callable, chars_per_token=None
) -> dict[str, float]:
    """Validation metrics over `batches` (no dropout, no label smoothing).

    Returns:
        `metrics.summarize` of the summed metrics: loss, nll, perplexity, accuracy, tokens
        (and bits_per_char when chars_per_token is given).
    """
    sums = dict.fromkeys(SUM_KEYS, 0.0)
    pending = []

    def collect():
        for step_sums in jax.device_get(pending):
            for key in SUM_KEYS:
                sums[key] += float(step_sums[key])
        pending.clear()

    for batch in batches:
        pending.append(eval_step(params, put_batch(batch)))
        # A bounded number of steps in flight: on several CPU devices (train.main's
        # --config.cpu_devices) hundreds of queued steps deadlock XLA's in-process
        # all-reduce (one device's step waits in the collective for a partner never launched).
        if len(pending) == STEPS_IN_FLIGHT:
            collect()
    collect()
    return summarize(sums, chars_per_token)


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
    for split in ("train", "valid"):
        dropped = sum(n for k, n in sizes.items() if k.startswith(f"{split}_dropped_"))
        share = sizes.get(f"{split}_trained_tokens", 0) / max(sizes.get(f"{split}_tokens", 0), 1)
        parts.append(
            f"{split} {sizes.get(split, 0)} kept ({sizes.get(f'{split}_cut', 0)} cut), "
            f"{dropped} dropped, {100 * share:.1f}% of tokens trained"
        )
    return "Conversations: " + "; ".join(parts) + "."
