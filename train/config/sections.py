"""The experiment config in sections: what each part of a run reads, frozen and checked.

The ConfigDict of `configs/*.py` stays the user's interface (files, `--config.field=value`
overrides, `config.json` in the run directory). `train.config.config_lib.validate_config` turns it,
once, at the top of a run, into one frozen section per job:

    data       DataConfig            corpus, split, tokenizer, lengths, packing, batch sizes
    model      TransformerConfig     `config.model` + vocab_size, max_len and pad_id
    optimizer  OptimizerConfig       the named optimizer with its options, clipping, gradient
                                     accumulation, fine-tuning groups
    schedule   ScheduleConfig        the learning rate over updates
    step       StepConfig            the train step's loss and input noise
    eval       EvalConfig            validation, BLEU and samples; `decode` is a DecodeOptions
                                     (both in `train.config.evaluation`, re-exported here)
    run        RunConfig             how long, how often, where: seed, PRNG, mesh, checkpoints

Each section checks its own fields when it is made (`train.config.checks`), and names a bad
one as it is written on the command line (`--config.field=value`), so an override is fixed
where it was made. What depends on the task registry (the corpora, packings and fields a
task accepts) is checked by `validate_config`, above the registry. The corpora come from
their table (`train.formats.corpora`), a leaf that imports nothing of the program, so that
the tasks and the decoding may read the sections without a circle; the names of the chat
loss masks from `train.formats.corpora.conversations`, plain Python that the table's
conversations read too. Every function of the program receives the section it reads, never
the whole config.

The optimizer and schedule sections belong to their table (`train.formats.optimizers`, a
leaf like the corpora): each registered optimizer owns its options (`--config.optimizer.<name>`),
and these sections are re-exported here. The sections are data: what is built from them
lives in `train.formats.optimizers` (the schedule and the optax optimizer) and
`train.tasks.common.inference` (the decoding strategies).
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

from flax_transformer import TransformerConfig
from train.config.checks import (
    ReadByName,
    check_choice,
    check_fraction,
    check_non_negative_ints,
    check_positive_ints,
    is_int,
    is_real,
)

# The evaluation's sections, read from here as before they had their own module.
from train.config.evaluation import DecodeOptionError, DecodeOptions, EvalConfig  # noqa: F401
from train.config.tasks import TaskOptions, read_task_options, registered_tasks
from train.core.failures import fail
from train.formats import corpora
from train.formats.corpora import CorpusOptions, read_options
from train.formats.corpora.conversations import TRAIN_ON
from train.formats.optimizers import OptimizerConfig, ScheduleConfig

TOKENIZERS = ("sentencepiece", "byte", "pretrained")
RNG_IMPLS = ("threefry2x32", "rbg", "unsafe_rbg")
PACKINGS = ("none", "segments", "stream")
# A lossless SentencePiece vocabulary holds the 4 special ids and 256 byte pieces, then
# one piece per character kept (train.data.tokenizer.LOSSLESS_TRAINER_OPTIONS).
LOSSLESS_SPM_MIN_VOCAB = 4 + 256


@dataclasses.dataclass(frozen=True)
class DataConfig(ReadByName):
    """What the examples are and how they become batches
    (`train.data.pipeline.input_pipeline.open_dataset`).

    Attributes: the config fields of the same names (`configs/default.py` documents each).
    `bucket_lengths`, `tokens_per_batch` and `batch_size` only shape the batches, so a resumed
    run may change them; every other field decides the examples or the vocabulary, and a
    resumed run must keep it (`identity_fields`).
    """

    task: str
    corpus: str
    corpus_path: str
    valid_fraction: float
    test_fraction: float
    copied_targets: float
    tokenizer: str
    vocab_size: int
    max_len: int
    packing: str
    bucket_lengths: tuple[int, ...]
    tokens_per_batch: int
    batch_size: int
    # How documents are read (None: the task's default, see `collapses_whitespace`), and the
    # user's own validation and test files ('' : held out from the corpus by hash).
    collapse_whitespace: bool | None = None
    valid_path: str = ""
    test_path: str = ""
    # The token store (train.data.store.token_store); '' reads the corpus in memory at every start.
    store_dir: str = ""
    store_sample_chars: int = 10_000_000
    store_shard_bytes: int = 64 << 20
    prepare_workers: int = 0
    loader_threads: int = 4
    # A pretrained model's source (train.formats.sources): its weights start the run and its
    # tokenizer is the run's (tokenizer='pretrained').
    init_from: str = ""
    # task 'chat': which tokens are trained ('assistant', 'last', 'all'), and a Jinja chat
    # template file that replaces the model's ('' = the model's own).
    train_on: str = "assistant"
    chat_template: str = ""
    # The corpora's own options (`train.formats.corpora.options`: `--config.corpora.<s>.<f>`,
    # a reader reads its section, e.g. `data.corpora.hf.dataset`); a mapping is read as such.
    corpora: CorpusOptions = dataclasses.field(default_factory=lambda: read_options(None))
    # The tasks' own options (`train.config.tasks`: `--config.tasks.<task>.<field>`, e.g.
    # `data.tasks.dpo.beta`, read by the task itself, `Task.configured`).
    tasks: TaskOptions = dataclasses.field(default_factory=lambda: read_task_options(None))

    BATCHING: ClassVar[tuple[str, ...]] = ("bucket_lengths", "tokens_per_batch", "batch_size")
    # Where the data is and how it is read: a resumed run may change them (the store's own
    # content fingerprint, not its path, tells whether the data is the same).
    STORE: ClassVar[tuple[str, ...]] = (
        "store_dir",
        "store_sample_chars",
        "store_shard_bytes",
        "prepare_workers",
        "loader_threads",
    )

    @classmethod
    def identity_fields(cls) -> tuple[str, ...]:
        """The fields a resumed run must keep: all but the batch shapes and the store's."""
        return tuple(
            f.name
            for f in dataclasses.fields(cls)
            if f.name not in cls.BATCHING and f.name not in cls.STORE
        )

    @property
    def collapses_whitespace(self) -> bool:
        """Whether each document's whitespace runs are collapsed to one space:
        `collapse_whitespace`, or where it is None the task's default (`TaskFacts.verbatim`:
        a language model learns the text as given; translation collapses whitespace, as its
        shipped corpora and scores were made)."""
        if self.collapse_whitespace is None:
            facts = registered_tasks().get(
                self.task
            )  # an unknown task is validate_config's to name
            return not (facts and facts.verbatim)
        return self.collapse_whitespace

    @property
    def hash_fractions(self) -> tuple[float, float]:
        """(validation, test) shares the hash split holds out of the corpus: 0 for a part
        read from its own file (`valid_path`, `test_path`)."""
        return (
            0.0 if self.valid_path else self.valid_fraction,
            0.0 if self.test_path else self.test_fraction,
        )

    def __post_init__(self):
        object.__setattr__(self, "bucket_lengths", tuple(self.bucket_lengths))
        if not isinstance(self.corpora, CorpusOptions):
            given = self.corpora.to_dict() if hasattr(self.corpora, "to_dict") else self.corpora
            object.__setattr__(self, "corpora", read_options(given))
        if not isinstance(self.tasks, TaskOptions):
            given = self.tasks.to_dict() if hasattr(self.tasks, "to_dict") else self.tasks
            object.__setattr__(self, "tasks", read_task_options(given))
        for name, allowed in (
            ("corpus", tuple(corpora.CORPORA)),  # the table as it is now
            ("tokenizer", TOKENIZERS),
            ("packing", PACKINGS),
            ("train_on", TRAIN_ON),
        ):
            check_choice(self, name, allowed)
        check_positive_ints(self, "vocab_size", "max_len")
        check_non_negative_ints(self, "batch_size", "tokens_per_batch")
        self._check_corpus()
        self._check_batching()
        for name in ("valid_fraction", "test_fraction"):
            check_fraction(self, name)
        if self.valid_fraction <= 0 and not self.valid_path:
            raise fail(
                "valid_fraction",
                self.valid_fraction,
                "must be > 0 (validation is needed), or name a --config.valid_path",
            )
        self._check_documents()
        if not 0.0 <= self.copied_targets <= 1.0:
            raise fail("copied_targets", self.copied_targets, "must be in [0, 1]")
        if self.tokenizer == "sentencepiece" and self.vocab_size <= 4:
            raise fail("vocab_size", self.vocab_size, "must exceed the 4 special ids")
        if self.tokenizer == "pretrained" and not self.init_from:
            raise fail(
                "init_from",
                self.init_from,
                "tokenizer='pretrained' reads the tokenizer of a pretrained model: give its "
                "Hugging Face directory (config.json, model.safetensors, tokenizer.json)",
            )
        if self.init_from and self.tokenizer != "pretrained":
            raise fail(
                "tokenizer",
                self.tokenizer,
                "a pretrained model reads text with its own tokenizer: set "
                "--config.tokenizer='pretrained' with --config.init_from",
            )
        if (
            self.tokenizer == "sentencepiece"
            and not self.collapses_whitespace
            and self.vocab_size <= LOSSLESS_SPM_MIN_VOCAB
        ):
            raise fail(
                "vocab_size",
                self.vocab_size,
                f"must exceed {LOSSLESS_SPM_MIN_VOCAB} for task={self.task!r}: its documents "
                "are kept verbatim, so SentencePiece is lossless and holds 4 special ids and "
                "256 byte pieces besides one piece per character; raise it, or set "
                "--config.tokenizer=byte (or --config.collapse_whitespace=True for the old, "
                "normalising tokenizer)",
            )
        if self.store_dir:
            self._check_store()

    def _check_store(self) -> None:
        """A token store holds one-sided documents read as max_len windows, or (task 'chat')
        conversations with their loss mask, packed whole into rows with segment ids."""
        task = registered_tasks().get(self.task)
        if task is None:  # validate_config names an unknown task
            return
        if not task.reads_stores:
            feeds = " or ".join(
                f"task={n!r}" for n, facts in registered_tasks().items() if facts.reads_stores
            )
            raise fail(
                "store_dir",
                self.store_dir,
                f"a token store feeds {feeds} (documents' token ids, or conversations with "
                f"their loss mask), not task={self.task!r}'s examples ; set "
                "--config.store_dir='' to read the corpus in memory",
            )
        if task.conversations:  # any chat corpus: the store reads it as the run would
            if self.packing != "segments":
                raise fail(
                    "packing",
                    self.packing,
                    "a chat store is read as whole conversations packed into rows: "
                    "'segments' (attention and positions kept within each conversation)",
                )
            check_positive_ints(self, "loader_threads", "batch_size")
            return
        if not corpora.CORPORA[self.corpus].storable:
            raise fail(
                "corpus",
                self.corpus,
                f"a token store is prepared from one of {corpora.storable()} ; set "
                "--config.store_dir='' to read this corpus in memory",
            )
        if self.packing not in ("stream", "segments"):
            raise fail(
                "packing",
                self.packing,
                "a token store is read as max_len windows: 'stream', or 'segments' (the same "
                "windows, attention kept within each document)",
            )
        check_positive_ints(
            self, "store_sample_chars", "store_shard_bytes", "loader_threads", "batch_size"
        )
        check_non_negative_ints(self, "prepare_workers")

    def _check_documents(self) -> None:
        if not (self.collapse_whitespace is None or isinstance(self.collapse_whitespace, bool)):
            raise fail(
                "collapse_whitespace",
                self.collapse_whitespace,
                "must be True, False, or None (the task's default)",
            )
        for name in ("valid_path", "test_path", "chat_template"):
            if not isinstance(getattr(self, name), str):
                raise fail(name, getattr(self, name), "must be a file path (or '' for none)")
        if self.valid_path and self.valid_path == self.test_path:
            raise fail(
                "test_path", self.test_path, "is also --config.valid_path; name another file"
            )

    def _check_corpus(self) -> None:
        """The data fields the corpus's entry needs (`train.formats.corpora.Corpus.needs`)."""
        for field, what in corpora.CORPORA[self.corpus].needs:
            value = self
            for part in field.split("."):
                value = getattr(value, part)
            if not value:
                raise fail(field, value, f"corpus={self.corpus!r} needs {what}")

    def _check_batching(self) -> None:
        if (self.batch_size == 0) == (self.tokens_per_batch == 0):
            raise ValueError(
                f"--config.batch_size={self.batch_size} and "
                f"--config.tokens_per_batch={self.tokens_per_batch}: set exactly one of them > 0."
            )
        if self.packing == "stream" and self.batch_size == 0:
            raise fail("batch_size", self.batch_size, "packing='stream' needs batch_size > 0")
        lengths = self.bucket_lengths
        if lengths and (
            not all(is_int(n) and n > 0 for n in lengths)
            or list(lengths) != sorted(set(lengths))
            or lengths[-1] != self.max_len
        ):
            raise fail(
                "bucket_lengths",
                lengths,
                f"must be increasing positive ints ending with max_len={self.max_len}, or ()",
            )


@dataclasses.dataclass(frozen=True)
class StepConfig(ReadByName):
    """What the train step does besides the update (`train.program.steps.train_step`).

    Attributes:
        label_smoothing: paper 5.4; validation is reported without it.
        target_token_dropout: the rate of decoder inputs replaced by <unk> (translation only).
    """

    label_smoothing: float
    target_token_dropout: float

    def __post_init__(self):
        check_fraction(self, "label_smoothing")
        check_fraction(self, "target_token_dropout")


@dataclasses.dataclass(frozen=True)
class RunConfig(ReadByName):
    """How long the run is, what it does when, and where: the training loop's section.

    Attributes:
        num_train_steps: micro-batch steps in total.
        seed: parameters, dropout and data order all derive from it.
        rng_impl: the dropout PRNG ('threefry2x32', 'rbg', 'unsafe_rbg').
        mesh_shape: the (data, fsdp, tensor) device mesh; -1 = the devices left.
        cpu_devices: the devices `train.main` makes of a CPU's cores (0 = auto;
            `train.core.distributed.split_cpu`).
        log_every_steps, eval_every_steps, bleu_every_steps, checkpoint_every_steps,
            keep_checkpoints, async_checkpoints: the config fields of the same names.
        target_valid_loss: stop once a validation loss (nll, every `eval_every_steps`) is
            at most this; 0 = no target.
        target_bleu: translation: stop once an interim BLEU (every `bleu_every_steps`) is at
            least this; 0 = no target. Reaching either target saves a checkpoint and ends
            the run with its report (`train.program.loop`).
    """

    num_train_steps: int
    seed: int
    rng_impl: str
    mesh_shape: tuple[int, ...]
    log_every_steps: int
    eval_every_steps: int
    bleu_every_steps: int
    checkpoint_every_steps: int
    keep_checkpoints: int
    async_checkpoints: bool
    cpu_devices: int = 0
    target_valid_loss: float = 0.0
    target_bleu: float = 0.0

    # A resumed run must keep these: the seed orders the data, the PRNG shapes the state.
    IDENTITY: ClassVar[tuple[str, ...]] = ("seed", "rng_impl")

    def __post_init__(self):
        object.__setattr__(self, "mesh_shape", tuple(self.mesh_shape))
        check_choice(self, "rng_impl", RNG_IMPLS)
        check_positive_ints(
            self,
            "num_train_steps",
            "log_every_steps",
            "eval_every_steps",
            "checkpoint_every_steps",
            "keep_checkpoints",
        )
        check_non_negative_ints(self, "bleu_every_steps", "seed", "cpu_devices")
        if not isinstance(self.async_checkpoints, bool):
            raise fail("async_checkpoints", self.async_checkpoints, "must be True or False")
        for name, high in (("target_valid_loss", math.inf), ("target_bleu", 100.0)):
            value = getattr(self, name)
            if not is_real(value) or not 0 <= value <= high:
                bounds = "in [0, 100]" if high == 100.0 else ">= 0"
                raise fail(name, value, f"must be a number {bounds} (0 = no target)")

    @property
    def has_target(self) -> bool:
        """Whether the run stops at a target (`target_valid_loss` or `target_bleu`)."""
        return bool(self.target_valid_loss or self.target_bleu)


@dataclasses.dataclass(frozen=True)
class Experiment:
    """A whole run's config, one section per job (see the module docstring); made from a
    config by `train.config.config_lib.validate_config`, which also checks the sections against the
    task they train."""

    data: DataConfig
    model: TransformerConfig
    optimizer: OptimizerConfig
    schedule: ScheduleConfig
    step: StepConfig
    eval: EvalConfig
    run: RunConfig
