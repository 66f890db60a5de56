"""From an experiment config to token batches: corpus, split, tokenizer, batch stream.

The corpora and splits live in `train.corpora`, the tokenizers in `train.tokenizer`, the
batching in `train.batching` (through the run's `train.tasks` Task); this module wires them
together as the config says, so that `train_lib` sees one `Dataset`, checks the ids that
enter the program, and streams the batches resumably (`EpochStream`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Generic, TypeVar

import ml_collections
import numpy as np

from flax_transformer.inputs import check_token_range
from train import batching, corpora
from train.batching import WHOLE_BATCH, RowShare
from train.rundir import RunDir
from train.tasks import Task, get_task
from train.tokenizer import ByteTokenizer, SentencePieceTokenizer, Tokenizer

# Below this many training examples (real ones, copies not counted) a run still works but
# learns little that generalises, and its validation scores are noise: worth a warning.
MIN_TRAIN_EXAMPLES = 100

T = TypeVar("T")


@dataclasses.dataclass
class Dataset:
    """Everything the training loop needs from the data.

    Attributes:
        task: the run's task.
        tokenizer: encodes and decodes text; its special ids are the batching's.
        build_epoch: rng -> one epoch of training batches (for `EpochStream`).
        eval_batches: validation batches in a fixed order (at most num_eval_batches).
        valid_examples: validation texts: (source, target) pairs or lines.
        chars_per_token: validation characters per target token (EOS counted as one
            character, the line break), to turn nats per token into bits per character.
        sizes: example counts: train (real pairs kept), copied ((target, target) pairs added),
            valid/test, and how many were dropped as too long.
        fingerprint: `data_fingerprint` of the train and validation splits, before
            tokenization: a resumed run checks that it still trains on the same data.
    """

    task: Task
    tokenizer: Tokenizer
    build_epoch: Callable[[np.random.Generator], list[dict[str, np.ndarray]]]
    eval_batches: list[dict[str, np.ndarray]]
    valid_examples: list
    chars_per_token: float
    sizes: dict[str, int]
    fingerprint: dict[str, int | str]


def load_examples(config: ml_collections.ConfigDict) -> list:
    """The whole corpus the config names: (source, target) pairs or text lines.

    Raises:
        CorpusNotFoundError: a corpus package is not installed.
        FileNotFoundError, ValueError: a user file is missing, unreadable or malformed.
    """
    if config.corpus == "bible":
        return corpora.load_bible_parallel(config.direction)
    if config.corpus == "kjv":
        return corpora.load_kjv_lines()
    if config.corpus == "kjv-web":
        return corpora.load_kjv_web_pairs()
    if config.corpus == "tsv":
        return corpora.read_parallel_tsv(config.corpus_path)
    if config.corpus == "hf":
        fields = [f for f in config.hf_fields.split(",") if f]
        return corpora.load_hf_examples(
            config.hf_dataset, config.hf_config, config.hf_split, fields
        )
    return corpora.read_text_lines(config.corpus_path)


def data_fingerprint(train: Sequence, valid: Sequence) -> dict[str, int | str]:
    """Sizes and a SHA-256 of the train and validation texts, in order.

    The hash covers the examples themselves, not the file they came from, so a corpus edited
    in place (a TSV with its columns swapped, lines added) is caught as well as a different
    path or corpus name, and a shipped corpus is covered like a user's file.

    Args:
        train, valid: the splits, (source, target) pairs or text lines.

    Returns:
        {'train': count, 'valid': count, 'sha256': hex digest}.
    """
    digest = hashlib.sha256()
    for name, examples in (("train", train), ("valid", valid)):
        digest.update(f"[{name} {len(examples)}]\n".encode())
        for example in examples:
            fields = example if isinstance(example, tuple) else (example,)
            # Tab and newline cannot occur inside a field of a TSV line or a text line.
            digest.update(("\t".join(fields) + "\n").encode("utf-8", "surrogatepass"))
    return {"train": len(train), "valid": len(valid), "sha256": digest.hexdigest()}


def _texts(examples: Sequence) -> list[str]:
    """All sentences of the examples: both sides of pairs, or the lines."""
    if examples and isinstance(examples[0], tuple):
        return list(itertools.chain.from_iterable(examples))
    return list(examples)


def make_tokenizer(
    config: ml_collections.ConfigDict,
    run: RunDir,
    train_examples: Sequence | None = None,
) -> Tokenizer:
    """The config's tokenizer; SentencePiece is trained on the train split on first use and
    cached in the run directory.

    Args:
        config: the experiment config (tokenizer, vocab_size).
        run: the run directory, where the SentencePiece model is cached.
        train_examples: the training split, needed only when the model must be trained.

    Raises:
        FileNotFoundError: SentencePiece model missing and no training text given.
    """
    if config.tokenizer == "byte":
        return ByteTokenizer()
    model_path = run.tokenizer_model(config.vocab_size)
    if train_examples is None:
        return SentencePieceTokenizer(model_path)
    if not model_path.exists():
        logging.info("Training SentencePiece (vocab %d) on the train split...", config.vocab_size)
    return SentencePieceTokenizer.train_or_load(
        _texts(train_examples), model_path, config.vocab_size
    )


def _encode(tokenizer: Tokenizer, examples: Sequence) -> list:
    if examples and isinstance(examples[0], tuple):
        return [(tokenizer.encode(src), tokenizer.encode(tgt)) for src, tgt in examples]
    return [tokenizer.encode(line) for line in examples]


def _flat(examples: Sequence) -> np.ndarray:
    """All token ids of tokenized examples (pairs or single sequences) as one int array."""
    sequences = _texts(examples) if examples and isinstance(examples[0], tuple) else examples
    return np.fromiter(itertools.chain.from_iterable(sequences), dtype=np.int64)


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
    config: ml_collections.ConfigDict,
    run: RunDir,
    num_devices: int = 1,
    share: RowShare = WHOLE_BATCH,
    make_tokenizer: Callable = make_tokenizer,
) -> Dataset:
    """Loads, splits, tokenizes and batches the config's corpus.

    In a run of several processes every process reads and tokenizes the whole corpus (the
    length buckets and the shuffled order need every example's length, and are then the same
    everywhere), but fills only its `share` of each batch's rows.

    Args:
        config: a validated experiment config.
        run: the run directory (SentencePiece model cache).
        num_devices: data-parallel devices; every batch's row count is a multiple of it.
        share: the rows of every batch this process builds (all of them for one process).
        make_tokenizer: (config, run, train examples) -> tokenizer; e.g. one that lets
            one process train SentencePiece while the others wait for its file.

    Returns:
        The Dataset; its batches hold `share`'s rows only.

    Raises:
        ValueError: an empty split, or an id outside the vocabulary.
    """
    task = get_task(config.task)
    stream = config.packing == "stream"  # lines cut into windows: any length fits
    if stream and config.batch_size % num_devices:
        raise ValueError(
            f"--config.batch_size={config.batch_size} must be a multiple of the {num_devices} "
            "devices the batch is split over."
        )
    if config.batch_size and config.batch_size % share.count:
        raise ValueError(
            f"--config.batch_size={config.batch_size} must be a multiple of the {share.count} "
            "processes the batch is split over."
        )
    splits = corpora.split_examples(
        load_examples(config), config.valid_fraction, config.test_fraction
    )
    if not splits.train or not splits.valid:
        raise ValueError(
            f"The corpus split into {len(splits.train)} train and {len(splits.valid)} "
            f"validation examples; both must be non-empty: use a larger corpus or raise "
            f"--config.valid_fraction={config.valid_fraction}."
        )
    fingerprint = data_fingerprint(splits.train, splits.valid)
    tokenizer = make_tokenizer(config, run, splits.train)
    train_ids = _encode(tokenizer, splits.train)
    copies = []  # (target, target) pairs, chosen among all training pairs before filtering
    if config.copied_targets:  # translation only (validate_config)
        copies = copied_target_pairs(train_ids, config.copied_targets, config.seed)
    valid_ids = _encode(tokenizer, splits.valid)
    for name, ids in (("train", train_ids + copies), ("validation", valid_ids)):
        check_token_range(_flat(ids), tokenizer.vocab_size, f"{name} split token ids")
    valid_texts = list(splits.valid)
    dropped = 0
    if not stream:
        train_ids, dropped = batching.filter_by_length(
            train_ids, config.max_len, task.example_length
        )
        copies, dropped_copies = batching.filter_by_length(
            copies, config.max_len, task.example_length
        )
        dropped += dropped_copies
        fits = [task.example_length(ids) <= config.max_len for ids in valid_ids]
        valid_ids = [ids for ids, keep in zip(valid_ids, fits, strict=True) if keep]
        valid_texts = [text for text, keep in zip(valid_texts, fits, strict=True) if keep]
        dropped += fits.count(False)
        if dropped:
            logging.warning(
                "Dropped %d examples longer than max_len=%d tokens.", dropped, config.max_len
            )
        if not train_ids or not valid_ids:
            raise ValueError(
                f"No train or validation example fits --config.max_len={config.max_len}; raise it."
            )
    if len(train_ids) < MIN_TRAIN_EXAMPLES:
        logging.warning(
            "Only %d training examples (fewer than %d): too few to train a model that "
            "generalises; use a larger corpus for meaningful results.",
            len(train_ids),
            MIN_TRAIN_EXAMPLES,
        )
    eval_batches = task.batches(config, valid_ids, None, num_devices, share, evaluation=True)
    if config.num_eval_batches:
        eval_batches = eval_batches[: config.num_eval_batches]
    target_ids, target_texts = task.targets(valid_ids), task.targets(valid_texts)
    # Target tokens per example: + EOS; packed streams also predict the next line's BOS.
    extra_targets = 2 if stream else 1
    num_tokens = sum(len(ids) + extra_targets for ids in target_ids)
    num_chars = sum(len(text) + 1 for text in target_texts)  # + line break
    return Dataset(
        task=task,
        tokenizer=tokenizer,
        build_epoch=lambda rng: task.batches(config, train_ids + copies, rng, num_devices, share),
        eval_batches=eval_batches,
        valid_examples=valid_texts,
        chars_per_token=num_chars / num_tokens,
        sizes={
            "train": len(train_ids),
            "copied": len(copies),
            "valid": len(valid_ids),
            "test": len(splits.test),
            "dropped_too_long": dropped,
        },
        fingerprint=fingerprint,
    )


def epoch_rng(seed: int, epoch: int) -> np.random.Generator:
    """The random generator for one epoch: a function of (seed, epoch) only.

    Args:
        seed: non-negative run seed.
        epoch: non-negative epoch number.

    Returns:
        A fresh numpy Generator seeded with [seed, epoch].
    """
    if seed < 0 or epoch < 0:
        raise ValueError(f"seed={seed} and epoch={epoch} must be non-negative.")
    return np.random.default_rng([seed, epoch])


class EpochStream(Generic[T]):
    """An endless stream of items (batches), reshuffled every epoch, resumable exactly.

    Epoch e's items are `build_epoch(epoch_rng(seed, e))`, so they depend only on the seed
    and the epoch. The state is {'epoch': e, 'position': p}: the next item is item p of epoch
    e. Restoring a saved state (e.g. from JSON) continues the stream exactly where it stopped.
    """

    def __init__(
        self,
        build_epoch: Callable[[np.random.Generator], Sequence[T]],
        *,
        seed: int,
        state: Mapping[str, int] | None = None,
    ):
        """Creates the stream.

        Args:
            build_epoch: makes one epoch's items from its generator; must be deterministic.
            seed: non-negative run seed.
            state: a `state_dict()` saved earlier; None starts at epoch 0, position 0.
        """
        self._build_epoch = build_epoch
        self._seed = seed
        self._epoch = 0
        self._position = 0
        self._items: Sequence[T] | None = None
        if state is not None:
            self.load_state_dict(state)

    def state_dict(self) -> dict[str, int]:
        """The position of the next item: {'epoch': int, 'position': int}."""
        return {"epoch": self._epoch, "position": self._position}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Moves the stream to a saved position.

        Args:
            state: {'epoch': e, 'position': p} with e, p non-negative integers.

        Raises:
            ValueError: the state is malformed.
        """
        epoch, position = state.get("epoch"), state.get("position")
        if set(state) != {"epoch", "position"} or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (epoch, position)
        ):
            raise ValueError(
                f"Stream state {dict(state)} must be {{'epoch': int >= 0, 'position': int >= 0}} "
                "as written by EpochStream.state_dict(); delete the saved state to start over."
            )
        self._epoch, self._position, self._items = epoch, position, None

    @property
    def epoch(self) -> int:
        """The epoch the next item comes from."""
        return self._epoch

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        if self._items is None:
            self._items = self._build_epoch(epoch_rng(self._seed, self._epoch))
            if not self._items:
                raise ValueError(
                    f"Epoch {self._epoch} has no items: the data set is empty or every batch "
                    "was dropped (check drop_remainder and the batch size)."
                )
        if self._position >= len(self._items):
            if self._position > len(self._items):
                raise ValueError(
                    f"Stream state position={self._position} is past the end of epoch "
                    f"{self._epoch} ({len(self._items)} items): the data or batching changed "
                    "since the state was saved; delete the saved state to start over."
                )
            self._epoch, self._position = self._epoch + 1, 0
            self._items = None
            return next(self)
        item = self._items[self._position]
        self._position += 1
        return item
