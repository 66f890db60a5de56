"""A corpus read in memory, to batches: load -> split -> tokenize -> filter -> batch.

The corpus and its split come from the corpus table (`train.formats.corpora`), the tokenizer from
the one factory (`train.data.tokenizers`), what an example is made of from the run's task (handed in
as a value, `train.data.dataset.ExampleTask`), and how examples become batches from the run's
`train.data.packing` packer; `build_dataset` wires them as the data section says and checks the ids
that enter the program. The training batches are an `EpochStream`: every epoch reshuffled from
(seed, epoch), resumable exactly.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import logging
import os
from collections.abc import Callable, Sequence

import numpy as np

from flax_transformer.checks.tokens import check_token_range
from train.config.sections import DataConfig
from train.core.rundir import RunDir
from train.data.batching import WHOLE_BATCH, RowShare, filter_by_length
from train.data.dataset import ONE_PROCESS, Dataset, ExampleTask, Processes
from train.data.epoch_stream import EpochStream
from train.data.packing import Packer, get_packer
from train.data.tokenizer import SpecialIds, Tokenizer
from train.data.tokenizers import run_tokenizer
from train.formats.corpora.splits import read_splits
from train.formats.sources import Source

# Below this many training examples (real ones, copies not counted) a run still works but
# learns little that generalises, and its validation scores are noise: worth a warning.
MIN_TRAIN_EXAMPLES = 100

# Marks an example hashed as JSON in `data_fingerprint` (no text field starts with it).
_ESCAPED = "\x00json"


@dataclasses.dataclass
class InMemoryDataset(Dataset):
    """The Dataset of a corpus read in memory (`build_dataset`), whose epochs can also be
    built one by one.

    Attributes:
        build_epoch: rng -> one epoch of training batches (what `EpochStream` iterates).
    """

    build_epoch: Callable[[np.random.Generator], list[dict[str, np.ndarray]]]


@dataclasses.dataclass
class _Examples:
    """One stage of the data on its way to batches: each split's examples, texts or ids.

    Attributes:
        train: the training examples (real ones).
        copies: (target, target) pairs added to the training examples (translation).
        valid: the validation examples.
        valid_texts: the validation examples as text, in step with `valid`.
        num_test: the test examples, which no run reads but whose count it reports.
        dropped: examples dropped as longer than max_len.
        counted: what the task counted while tokenizing (`Task.encode_split`).
    """

    train: list
    copies: list
    valid: list
    valid_texts: list
    num_test: int
    dropped: int = 0
    counted: dict[str, int] = dataclasses.field(default_factory=dict)

    def sizes(self) -> dict[str, int]:
        """The counts a `Dataset` reports (see there)."""
        return {
            "train": len(self.train),
            "copied": len(self.copies),
            "valid": len(self.valid),
            "test": self.num_test,
            "dropped_too_long": self.dropped,
            **self.counted,
        }


def data_fingerprint(task: ExampleTask, train: Sequence, valid: Sequence) -> dict[str, int | str]:
    """Sizes and a SHA-256 of the train and validation texts, in order.

    The hash covers the examples themselves, not the file they came from, so a corpus edited
    in place (a TSV with its columns swapped, lines added) is caught as well as a different
    path or corpus name, and a shipped corpus is covered like a user's file.

    Args:
        task: the run's task (what an example's texts are).
        train, valid: the splits' examples, as text.

    Returns:
        {'train': count, 'valid': count, 'sha256': hex digest}.
    """
    digest = hashlib.sha256()
    for name, examples in (("train", train), ("valid", valid)):
        digest.update(f"[{name} {len(examples)}]\n".encode())
        for example in examples:
            fields = task.fields(example)
            line = "\t".join(fields) + "\n"
            if any("\t" in f or "\n" in f for f in fields):
                # A verbatim document may hold both: escaped, so no two data hash alike
                # (whitespace-normalised fields never do, and hash as they always have).
                line = _ESCAPED + json.dumps(fields) + "\n"
            digest.update(line.encode("utf-8", "surrogatepass"))
    return {"train": len(train), "valid": len(valid), "sha256": digest.hexdigest()}


def copied_target_pairs(pairs: Sequence, share: float, seed: int) -> list:
    """(target, target) pairs made from a `share` of the training pairs' targets.

    Copied monolingual data (Currey et al. 2017, "Copied Monolingual Data Improves
    Low-Resource Neural Machine Translation"): with the target repeated as its own source,
    the source predicts every target token exactly, so the decoder learns to read it (the
    cross-attention alignment) long before the language model of the target side would
    let it. Validation and BLEU still use real pairs only.

    Args:
        pairs: tokenized (source ids, target ids) training pairs.
        share: copies per training pair, in [0, 1].
        seed: which targets are copied (a fixed choice, so a resumed run sees the same data).

    Returns:
        `round(share * len(pairs))` pairs (target ids, target ids).
    """
    rng = np.random.default_rng(seed)
    chosen = rng.choice(len(pairs), size=round(share * len(pairs)), replace=False)
    return [(list(pairs[i][1]), list(pairs[i][1])) for i in sorted(chosen)]


def build_dataset(
    data: DataConfig,
    run: RunDir,
    *,
    task: ExampleTask,
    seed: int,
    num_devices: int = 1,
    share: RowShare = WHOLE_BATCH,
    processes: Processes = ONE_PROCESS,
    source: Source | None = None,
) -> InMemoryDataset:
    """Loads, splits, tokenizes, filters and batches the data section's corpus.

    In a run of several processes every process reads and tokenizes the whole corpus (the
    length buckets and the shuffled order need every example's length, and are then the same
    everywhere), but fills only its `share` of each batch's rows.

    Args:
        data: the data section (`train.config.sections.DataConfig`).
        run: the run directory (SentencePiece model cache).
        task: the run's task (`train.tasks.get_task(data.task)`).
        seed: the run's seed (which training targets are copied).
        num_devices: data-parallel devices; every batch's row count is a multiple of it.
        share: the rows of every batch this process builds (all of them for one process).
        processes: this process's part (`Processes`): process 0 trains SentencePiece on
            first use while the others wait for its file.
        source: the run's pretrained source, open (its tokenizer and chat template are
            taken from it); None: read from the run's snapshot (`RunDir.pretrained`).

    Returns:
        The Dataset; its batches hold `share`'s rows only.

    Raises:
        ValueError: an empty split, or an id outside the vocabulary.
    """
    packer = get_packer(data.packing)
    packer.check(data, num_devices, share)
    texts = _split(data, task)
    tokenizer = _shared_tokenizer(data, run, task.sentences(texts.train), processes, source)
    ids = _tokenize(data, task, tokenizer, texts, source or run.pretrained)
    ids = _with_copies(data.copied_targets, seed, ids)
    if packer.whole_examples:
        ids = _filter(data.max_len, task, ids)
    _warn_if_few(ids.train)
    build_epoch, eval_batches = _batch(
        data, task, packer, ids, num_devices, share, tokenizer.specials
    )
    return InMemoryDataset(
        task=task,
        tokenizer=tokenizer,
        eval_batches=eval_batches,
        valid_examples=ids.valid_texts,
        chars_per_token=_chars_per_label(task, packer, ids, tokenizer.specials),
        sizes=ids.sizes(),
        fingerprint=data_fingerprint(task, texts.train, texts.valid),
        make_stream=lambda seed, saved, start_step: EpochStream(
            build_epoch, seed=seed, state=saved
        ),
        build_epoch=build_epoch,
    )


def _shared_tokenizer(
    data: DataConfig,
    run: RunDir,
    train_texts: list[str],
    processes: Processes,
    source: Source | None,
) -> Tokenizer:
    """The run's tokenizer (`train.data.tokenizers.run_tokenizer`): process 0 makes it first
    (SentencePiece is trained on the train split on first use), then the others read it; a
    pretrained one is `source`'s, where the run hands it."""
    options = {"lossless": not data.collapses_whitespace, "source": source}
    if processes.primary:
        tokenizer = run_tokenizer(data.tokenizer, data.vocab_size, run, train_texts, **options)
    processes.barrier("tokenizer")
    if not processes.primary:
        tokenizer = run_tokenizer(data.tokenizer, data.vocab_size, run, source=source)
    return tokenizer


def _split(data: DataConfig, task: ExampleTask) -> _Examples:
    """The corpus's train, validation and test examples, as text (`read_splits`: held out
    by hash, or read from the user's own files).

    Raises:
        ValueError: the train or the validation split is empty.
    """
    splits = read_splits(data, task.file_corpus)
    if not splits.train or not splits.valid:
        raise ValueError(
            f"The corpus split into {len(splits.train)} train and {len(splits.valid)} "
            f"validation examples; both must be non-empty: use a larger corpus or raise "
            f"--config.valid_fraction={data.valid_fraction}."
        )
    return _Examples(splits.train, [], splits.valid, list(splits.valid), len(splits.test))


def _tokenize(
    data: DataConfig,
    task: ExampleTask,
    tokenizer: Tokenizer,
    texts: _Examples,
    source: Source | os.PathLike,
) -> _Examples:
    """The examples as token ids (`Task.encode_split`: the examples a task drops, and the
    validation texts of those kept); `source`: the pretrained source, open, or the run's
    copy of it (`Task.encode_split`'s `source_dir`).

    Raises:
        ValueError: an id outside the tokenizer's vocabulary, or what the task refuses.
    """
    train = task.encode_split(data, tokenizer, source, texts.train, "train")
    valid = task.encode_split(data, tokenizer, source, texts.valid, "valid")
    for name, examples in (("train", train.examples), ("validation", valid.examples)):
        flat = itertools.chain.from_iterable(task.sentences(examples))
        ids = np.fromiter(flat, dtype=np.int64)
        check_token_range(ids, tokenizer.vocab_size, f"{name} split token ids")
    return dataclasses.replace(
        texts,
        train=train.examples,
        valid=valid.examples,
        valid_texts=valid.texts,
        counted={**train.sizes, **valid.sizes},
    )


def _with_copies(share: float, seed: int, ids: _Examples) -> _Examples:
    """The examples with copies of a `share` of the training targets (`copied_targets`),
    chosen among all training pairs (before filtering, as a resumed run must choose them
    again)."""
    if not share:  # translation only (DataConfig checks it)
        return ids
    copies = copied_target_pairs(ids.train, share, seed)
    return dataclasses.replace(ids, copies=copies)


def _filter(max_len: int, task: ExampleTask, ids: _Examples) -> _Examples:
    """The examples that fit `max_len`, the validation texts kept in step with theirs.

    Raises:
        ValueError: no training or no validation example fits.
    """
    train, dropped = filter_by_length(ids.train, max_len, task.example_length)
    copies, dropped_copies = filter_by_length(ids.copies, max_len, task.example_length)
    fits = [task.example_length(example) <= max_len for example in ids.valid]
    valid = list(itertools.compress(ids.valid, fits))
    valid_texts = list(itertools.compress(ids.valid_texts, fits))
    dropped += dropped_copies + fits.count(False)
    if dropped:
        logging.warning("Dropped %d examples longer than max_len=%d tokens.", dropped, max_len)
    if not train or not valid:
        raise ValueError(
            f"No train or validation example fits --config.max_len={max_len}; raise it."
        )
    return _Examples(train, copies, valid, valid_texts, ids.num_test, dropped, ids.counted)


def _warn_if_few(train: list) -> None:
    if len(train) < MIN_TRAIN_EXAMPLES:
        logging.warning(
            "Only %d training examples (fewer than %d): too few to train a model that "
            "generalises; use a larger corpus for meaningful results.",
            len(train),
            MIN_TRAIN_EXAMPLES,
        )


def _batch(
    data: DataConfig,
    task: ExampleTask,
    packer: Packer,
    ids: _Examples,
    num_devices: int,
    share: RowShare,
    specials: SpecialIds,
) -> tuple[Callable[[np.random.Generator], list], list]:
    """(rng -> one epoch's training batches, the validation batches), marked and padded
    with the tokenizer's `specials`."""
    train = [task.to_sides(example, specials) for example in ids.train + ids.copies]
    valid = [task.to_sides(example, specials) for example in ids.valid]
    eval_batches = packer.batches(
        data, task.sides, valid, None, num_devices, share, evaluation=True, pad_id=specials.pad
    )

    def build_epoch(rng: np.random.Generator) -> list:
        return packer.batches(data, task.sides, train, rng, num_devices, share, pad_id=specials.pad)

    return build_epoch, eval_batches


def _chars_per_label(
    task: ExampleTask, packer: Packer, ids: _Examples, specials: SpecialIds
) -> float:
    """Characters of the validation texts (as read, nothing added) per validation label:
    every token of each example's labelled side but the first (its target ids and EOS, and
    the BOS where there is one), or in a stream every token but the stream's first.

    Validation over every batch sums the nats of exactly these labels, so its mean nats per
    label / ln 2 / this ratio is the nats of the whole validation text / ln 2 / its
    characters: bits per character of the original text, exactly.
    """
    lengths = [
        len(tokens)
        for example in ids.valid
        for side, tokens in zip(task.sides, task.to_sides(example, specials), strict=True)
        if side.labels_key is not None
    ]
    num_labels = sum(lengths) - (1 if packer.streams else len(lengths))
    num_chars = sum(len(t) for t in task.targets(ids.valid_texts))
    return num_chars / max(num_labels, 1)
