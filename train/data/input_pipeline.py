"""From the data section to token batches: load -> split -> tokenize -> filter -> batch.

The corpora and splits live in `train.data.corpora`, the tokenizers in `train.data.tokenizer`,
what an example is made of in the run's `train.program.tasks` Task, and how examples become
batches in the run's `train.data.packing` packer; this module wires them together as the data
section (`train.config.sections.DataConfig`) says, so that `train_lib` sees one `Dataset`,
checks the ids that enter the program, and streams the batches resumably (`EpochStream`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Generic, TypeVar

import numpy as np

from flax_transformer.checks.tokens import check_token_range
from train.config.sections import DataConfig
from train.data import corpora
from train.data.batching import WHOLE_BATCH, RowShare, filter_by_length
from train.data.packing import Packer, get_packer
from train.data.tokenizer import ByteTokenizer, SentencePieceTokenizer, SpecialIds, Tokenizer
from train.program import pretrained
from train.program.tasks import Task, get_task
from train.run.rundir import RunDir, read_json
from train.store import store_pipeline

# Below this many training examples (real ones, copies not counted) a run still works but
# learns little that generalises, and its validation scores are noise: worth a warning.
MIN_TRAIN_EXAMPLES = 100

T = TypeVar("T")
# Marks an example hashed as JSON in `data_fingerprint` (no text field starts with it).
_ESCAPED = "\x00json"


@dataclasses.dataclass
class Dataset:
    """Everything the training loop needs from the data, whichever path read it (a token
    store or the corpus in memory: `open_dataset`).

    Attributes:
        task: the run's task.
        tokenizer: encodes and decodes text; its special ids are the batching's.
        eval_batches: all the validation batches, in a fixed order.
        valid_examples: validation texts: (source, target) pairs or lines (empty for a
            token store, which keeps token ids only).
        chars_per_token: characters of the validation texts per validation label (EOS
            and BOS labels count no character), to turn nats per label into bits per
            character of the original text (exact over all the validation batches).
        sizes: example counts: train (real pairs kept), copied ((target, target) pairs added),
            valid/test, and how many were dropped as too long (a store: documents, tokens).
        fingerprint: `data_fingerprint` of the train and validation splits, before
            tokenization (or the token store's `fingerprint`): a resumed run checks that it
            still trains on the same data.
        make_stream: (seed, saved stream state, start step) -> the training batches from
            that step on; see `stream`.
    """

    task: Task
    tokenizer: Tokenizer
    eval_batches: list[dict[str, np.ndarray]]
    valid_examples: list
    chars_per_token: float
    sizes: dict[str, int]
    fingerprint: dict[str, int | str]
    make_stream: Callable[[int, Mapping | None, int], Iterator]

    def stream(self, seed: int, saved: Mapping | None, start_step: int) -> Iterator:
        """The training batches from `start_step` on: an `EpochStream` restored from `saved`
        (in memory), or a store's `StoreStream`; either has `state_dict()` to checkpoint."""
        return self.make_stream(seed, saved, start_step)


@dataclasses.dataclass
class InMemoryDataset(Dataset):
    """The Dataset of a corpus read in memory (`build_dataset`), whose epochs can also be
    built one by one.

    Attributes:
        build_epoch: rng -> one epoch of training batches (what `EpochStream` iterates).
    """

    build_epoch: Callable[[np.random.Generator], list[dict[str, np.ndarray]]]


@dataclasses.dataclass(frozen=True)
class Processes:
    """This process's part in a run of several (one process: the defaults).

    Attributes:
        primary: process 0, which trains a tokenizer or prepares a store's plan first.
        barrier: waits until every process reaches the barrier of that name.
        part: (process index, process count), to prepare a store's shards together.
    """

    primary: bool = True
    barrier: Callable[[str], None] = lambda name: None
    part: tuple[int, int] = (0, 1)


# The packings a token store is read with (windows of batch_size rows).
_STORE_PACKINGS = ("stream", "segments")


def open_dataset(
    data: DataConfig,
    run: RunDir,
    *,
    seed: int,
    num_steps: int,
    num_devices: int = 1,
    share: RowShare = WHOLE_BATCH,
    max_eval_batches: int = 0,
    processes: Processes = Processes(),
    resuming: bool = False,
) -> Dataset:
    """The run's data, whichever path reads it: the one entry point of the training loop.

    A token store is read where the data section names one, and where a text language
    model names none (`run_data_section`: a store under the work directory); otherwise the
    corpus is read in memory, the tokenizer made by process 0 first where it must be trained
    (the others then read its file).

    Args:
        data: the data section.
        run: the run directory.
        seed, num_steps: the run's seed and train steps.
        num_devices, share: data-parallel devices and this process's rows of every batch.
        max_eval_batches: validation batches kept from a store (0: all).
        processes: this process's part (`Processes`).
        resuming: the run resumes (a run that began in memory goes on in memory).
    """
    data = run_data_section(data, run, resuming)
    if data.store_dir:
        return build_store_dataset(
            data,
            run,
            seed=seed,
            num_steps=num_steps,
            num_devices=num_devices,
            share=share,
            max_eval_batches=max_eval_batches,
            primary=processes.primary,
            barrier=processes.barrier,
            part=processes.part,
        )

    def shared_tokenizer(kind, vocab_size, run, train_texts, **options):
        if processes.primary:
            tokenizer = make_tokenizer(kind, vocab_size, run, train_texts, **options)
        processes.barrier("tokenizer")
        if not processes.primary:
            tokenizer = make_tokenizer(kind, vocab_size, run)
        return tokenizer

    return build_dataset(
        data, run, seed=seed, num_devices=num_devices, share=share, make_tokenizer=shared_tokenizer
    )


def run_data_section(data: DataConfig, run: RunDir, resuming: bool) -> DataConfig:
    """The data section a run reads: a text language model given no `store_dir` reads a
    token store under its work directory (`RunDir.token_store`, prepared on first use), so
    its memory stays flat in corpus size.

    Packed segments sized by `tokens_per_batch` (configs/default.py's) become the store's
    windows of the same size: `tokens_per_batch // max_len` rows of max_len tokens.

    It reads the corpus in memory as before where `text_in_memory` asks so, where its batches
    need whole examples (packing 'none'), or where it resumes a run that started so (its
    data_fingerprint.json holds example counts, not a store's token counts): such a run goes
    on with the batches it began with.
    """
    if data.store_dir or data.task != "lm" or data.corpus != "text" or data.text_in_memory:
        return data
    if resuming and run.data_fingerprint.exists():
        recorded = read_json(run.data_fingerprint, "delete it and rerun: it is rewritten")
        if "store_train_tokens" not in recorded:
            logging.info("Resuming a run that read its text corpus in memory: it still does.")
            return data
    rows = data.batch_size or data.tokens_per_batch // data.max_len
    if data.packing not in _STORE_PACKINGS or not rows:
        logging.warning(
            "--config.packing=%r reads the text corpus in memory (memory grows with the "
            "corpus); packing 'stream' or 'segments' reads it from a token store under the "
            "work directory.",
            data.packing,
        )
        return data
    if not data.batch_size:
        logging.info(
            "Token store windows: %d rows of --config.max_len=%d tokens "
            "(--config.tokens_per_batch=%d).", rows, data.max_len, data.tokens_per_batch,
        )  # fmt: skip
    return dataclasses.replace(
        data, store_dir=str(run.token_store), batch_size=rows, tokens_per_batch=0
    )


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
    """

    train: list
    copies: list
    valid: list
    valid_texts: list
    num_test: int
    dropped: int = 0

    def sizes(self) -> dict[str, int]:
        """The counts a `Dataset` reports (see there)."""
        return {
            "train": len(self.train),
            "copied": len(self.copies),
            "valid": len(self.valid),
            "test": self.num_test,
            "dropped_too_long": self.dropped,
        }


def load_examples(data: DataConfig) -> list:
    """The whole corpus the data section names: (source, target) pairs or text documents,
    whitespace-normalised or verbatim as `data.collapses_whitespace` says (the shipped
    parallel Bibles are always normalised: their markup removal leaves runs of spaces).

    Raises:
        CorpusNotFoundError: a corpus package is not installed.
        FileNotFoundError, ValueError: a user file is missing, unreadable or malformed.
    """
    collapse = data.collapses_whitespace
    if data.corpus == "bible":
        return corpora.load_bible_parallel(data.direction)
    if data.corpus == "kjv":
        return corpora.load_kjv_lines(collapse)
    if data.corpus == "kjv-web":
        return corpora.load_kjv_web_pairs()
    if data.corpus == "tsv":
        return corpora.read_parallel_tsv(data.corpus_path, collapse)
    if data.corpus == "hf":
        return corpora.load_hf_examples(
            data.hf_dataset, data.hf_config, data.hf_split, data.hf_field_paths, collapse
        )
    return corpora.read_text_documents(data.corpus_path, data.text_documents, collapse)


def load_file_examples(data: DataConfig, path: str) -> list:
    """The examples of the user's own validation or test file (`valid_path`, `test_path`),
    read as the task's own kind of file (`Task.file_corpus`: TSV pairs, or text documents)
    with the corpus's settings.

    Raises:
        FileNotFoundError, ValueError: the file is missing, unreadable or malformed.
    """
    corpus = get_task(data.task).file_corpus
    return load_examples(dataclasses.replace(data, corpus=corpus, corpus_path=path))


def data_fingerprint(task: Task, train: Sequence, valid: Sequence) -> dict[str, int | str]:
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


def make_tokenizer(
    kind: str,
    vocab_size: int,
    run: RunDir,
    train_texts: Sequence[str] | None = None,
    *,
    lossless: bool = False,
) -> Tokenizer:
    """The run's tokenizer; SentencePiece is trained on the train split on first use and
    cached in the run directory.

    Args:
        kind: 'byte', 'sentencepiece' or 'pretrained' (`--config.tokenizer`; the last reads
            the run's copy of the pretrained model's tokenizer,
            `train.program.pretrained.snapshot`).
        vocab_size: SentencePiece pieces (`--config.vocab_size`; unused for 'byte').
        run: the run directory, where the SentencePiece model is cached.
        train_texts: every sentence of the training split (`Task.sentences`), needed only
            when the model must be trained.
        lossless: train a lossless SentencePiece model (the documents are verbatim); a
            cached model is read as it is (`SentencePieceTokenizer.lossless` says which).

    Raises:
        FileNotFoundError: SentencePiece model missing and no training text given.
    """
    if kind == "byte":
        return ByteTokenizer()
    if kind == "pretrained":
        return pretrained.read_source(
            run.path / pretrained.SNAPSHOT_DIR, need_weights=False
        ).tokenizer()
    model_path = run.tokenizer_model(vocab_size)
    if train_texts is None:
        return SentencePieceTokenizer(model_path)
    if not model_path.exists():
        logging.info("Training SentencePiece (vocab %d) on the train split...", vocab_size)
    tokenizer = SentencePieceTokenizer.train_or_load(
        list(train_texts), model_path, vocab_size, lossless=lossless
    )
    if lossless and not tokenizer.lossless:
        logging.warning(
            "%s normalises text (trained before lossless tokenizers, or for collapsed "
            "whitespace) while this run keeps documents verbatim: their line breaks and "
            "runs of spaces are lost in tokens. Delete it (in a fresh --workdir) to train a "
            "lossless one.",
            model_path,
        )
    return tokenizer


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
    seed: int,
    num_devices: int = 1,
    share: RowShare = WHOLE_BATCH,
    make_tokenizer: Callable = make_tokenizer,
) -> InMemoryDataset:
    """Loads, splits, tokenizes, filters and batches the data section's corpus.

    In a run of several processes every process reads and tokenizes the whole corpus (the
    length buckets and the shuffled order need every example's length, and are then the same
    everywhere), but fills only its `share` of each batch's rows.

    Args:
        data: the data section (`train.config.sections.DataConfig`).
        run: the run directory (SentencePiece model cache).
        seed: the run's seed (which training targets are copied).
        num_devices: data-parallel devices; every batch's row count is a multiple of it.
        share: the rows of every batch this process builds (all of them for one process).
        make_tokenizer: (kind, vocab_size, run, train texts, lossless=) -> tokenizer, as
            `make_tokenizer`; e.g. one that lets one process train SentencePiece while the
            others wait for its file.

    Returns:
        The Dataset; its batches hold `share`'s rows only.

    Raises:
        ValueError: an empty split, or an id outside the vocabulary.
    """
    task, packer = get_task(data.task), get_packer(data.packing)
    packer.check(data, num_devices, share)
    texts = _split(data, load_examples(data))
    tokenizer = make_tokenizer(
        data.tokenizer,
        data.vocab_size,
        run,
        task.sentences(texts.train),
        lossless=not data.collapses_whitespace,
    )
    ids = _with_copies(data.copied_targets, seed, _tokenize(task, tokenizer, texts))
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
        chars_per_token=_chars_per_label(task, packer, ids),
        sizes=ids.sizes(),
        fingerprint=data_fingerprint(task, texts.train, texts.valid),
        make_stream=lambda seed, saved, start_step: EpochStream(
            build_epoch, seed=seed, state=saved
        ),
        build_epoch=build_epoch,
    )


def build_store_dataset(
    data: DataConfig,
    run: RunDir,
    *,
    seed: int,
    num_steps: int,
    num_devices: int = 1,
    share: RowShare = WHOLE_BATCH,
    max_eval_batches: int = 0,
    primary: bool = True,
    barrier: Callable[[str], None] = lambda name: None,
    part: tuple[int, int] = (0, 1),
) -> Dataset:
    """The Dataset of a run that reads the token store `data.store_dir` (prepared first where
    it is missing; `train.store.store_pipeline`).

    Args:
        data: the data section (its store fields set).
        run: the run directory (process 0 copies the store's tokenizer there, for the tools).
        seed: the run's seed (the window order).
        num_steps: the run's train steps (batches).
        num_devices: data-parallel devices; the batch size must be a multiple of it.
        share: this process's rows of each batch.
        max_eval_batches: validation batches kept (0: all).
        primary, barrier, part: this process's role, a barrier between processes, and
            (process index, process count), to prepare a missing store together.

    Raises:
        FileNotFoundError, ValueError (StoreError): bad inputs, a store of other settings
            or a damaged shard.
    """
    task = get_task(data.task)
    get_packer("stream").check(data, num_devices, share)  # windows: batch_size rows
    store = store_pipeline.prepare_and_open(data, primary=primary, barrier=barrier, part=part)
    opened, eval_batches = store_pipeline.open_store_data(
        data, store, share=share, max_eval_batches=max_eval_batches
    )
    if primary and data.tokenizer == "sentencepiece":
        store_pipeline.copy_tokenizer(store, run.tokenizer_model(data.vocab_size))
    make = store_pipeline.stream_factory(
        data, opened.train, seed=seed, share=share, num_steps=num_steps
    )
    return Dataset(
        task=task,
        tokenizer=opened.tokenizer,
        eval_batches=eval_batches,
        valid_examples=[],
        chars_per_token=opened.chars_per_label,
        sizes=opened.sizes,
        fingerprint=store.fingerprint,
        # The store's window order comes from the run's seed, given above.
        make_stream=lambda _seed, saved, start_step: make(saved, start_step),
    )


def _split(data: DataConfig, examples: list) -> _Examples:
    """The corpus's train, validation and test examples, as text: held out by hash, or
    read from the user's own files (`valid_path`, `test_path`).

    Raises:
        ValueError: the train or the validation split is empty.
    """
    splits = corpora.split_examples(examples, *data.hash_fractions)
    valid = load_file_examples(data, data.valid_path) if data.valid_path else splits.valid
    num_test = len(load_file_examples(data, data.test_path)) if data.test_path else None
    if not splits.train or not valid:
        raise ValueError(
            f"The corpus split into {len(splits.train)} train and {len(valid)} "
            f"validation examples; both must be non-empty: use a larger corpus or raise "
            f"--config.valid_fraction={data.valid_fraction}."
        )
    num_test = len(splits.test) if num_test is None else num_test
    return _Examples(splits.train, [], valid, list(valid), num_test)


def _tokenize(task: Task, tokenizer: Tokenizer, texts: _Examples) -> _Examples:
    """The examples as token ids.

    Raises:
        ValueError: an id outside the tokenizer's vocabulary.
    """
    train = [task.encode(tokenizer, example) for example in texts.train]
    valid = [task.encode(tokenizer, example) for example in texts.valid]
    for name, examples in (("train", train), ("validation", valid)):
        flat = itertools.chain.from_iterable(task.sentences(examples))
        ids = np.fromiter(flat, dtype=np.int64)
        check_token_range(ids, tokenizer.vocab_size, f"{name} split token ids")
    return dataclasses.replace(texts, train=train, valid=valid)


def _with_copies(share: float, seed: int, ids: _Examples) -> _Examples:
    """The examples with copies of a `share` of the training targets (`copied_targets`),
    chosen among all training pairs (before filtering, as a resumed run must choose them
    again)."""
    if not share:  # translation only (DataConfig checks it)
        return ids
    copies = copied_target_pairs(ids.train, share, seed)
    return dataclasses.replace(ids, copies=copies)


def _filter(max_len: int, task: Task, ids: _Examples) -> _Examples:
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
    return _Examples(train, copies, valid, valid_texts, ids.num_test, dropped)


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
    task: Task,
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


def _chars_per_label(task: Task, packer: Packer, ids: _Examples) -> float:
    """Characters of the validation texts (as read, nothing added) per validation label: the
    target ids of each example and the labels the packer adds to them (EOS, and in a stream
    the next BOS; the stream's first BOS is no label).

    Validation over every batch sums the nats of exactly these labels, so its mean nats per
    label / ln 2 / this ratio is the nats of the whole validation text / ln 2 / its
    characters: bits per character of the original text, exactly.
    """
    targets = task.targets(ids.valid)
    num_labels = sum(len(t) + packer.extra_labels for t in targets) - (packer.extra_labels - 1)
    num_chars = sum(len(t) for t in task.targets(ids.valid_texts))
    return num_chars / max(num_labels, 1)


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
