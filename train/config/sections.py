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
    run        RunConfig             how long, how often, where: seed, PRNG, mesh, checkpoints

Each section checks its own fields when it is made, and names a bad one as it is written on
the command line (`--config.field=value`), so an override is fixed where it was made. What
depends on the task registry (the corpora, packings and fields a task accepts) is checked
by `validate_config`, above the registry. The corpora come from their table
(`train.formats.corpora`), a leaf that imports nothing of the program, so that the tasks and the
decoding may read the sections without a circle; the names of the chat loss masks from
`train.formats.corpora.conversations`, plain Python that the table's conversations read too. Every
function of the program receives the section it reads, never the whole config.

The optimizer and schedule sections belong to their table (`train.formats.optimizers`, a
leaf like the corpora): each registered optimizer owns its options (`--config.optimizer.<name>`),
and these sections are re-exported here. The sections are data: what is built from them
lives in `train.formats.optimizers` (the schedule and the optax optimizer) and
`train.tasks.common.inference` (the decoding strategies).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, ClassVar

import ml_collections

from flax_transformer import TransformerConfig
from train.config.tasks import registered_tasks
from train.core.failures import fail
from train.formats import corpora
from train.formats.corpora.conversations import TRAIN_ON
from train.formats.corpora.files import TEXT_DOCUMENTS
from train.formats.optimizers import OptimizerConfig, ScheduleConfig

# Every --config.corpus value, in the order of the corpus table (`train.formats.corpora`).
CORPORA = tuple(corpora.CORPORA)
TOKENIZERS = ("sentencepiece", "byte", "pretrained")
RNG_IMPLS = ("threefry2x32", "rbg", "unsafe_rbg")
DIRECTIONS = ("ja-en", "en-ja")
PACKINGS = ("none", "segments", "stream")
# A lossless SentencePiece vocabulary holds the 4 special ids and 256 byte pieces, then
# one piece per character kept (train.data.tokenizer.LOSSLESS_TRAINER_OPTIONS).
LOSSLESS_SPM_MIN_VOCAB = 4 + 256


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_positive_ints(section, *names: str) -> None:
    for name in names:
        value = getattr(section, name)
        if not _is_int(value) or value < 1:
            raise fail(name, value, "must be a positive integer")


def _check_non_negative_ints(section, *names: str) -> None:
    for name in names:
        value = getattr(section, name)
        if not _is_int(value) or value < 0:
            raise fail(name, value, "must be a non-negative integer")


def _check_choice(section, name: str, allowed: tuple) -> None:
    if getattr(section, name) not in allowed:
        raise fail(name, getattr(section, name), f"must be one of {allowed}")


def _check_non_negative(section, *names: str) -> None:
    for name in names:
        if getattr(section, name) < 0:
            raise fail(name, getattr(section, name), "must be non-negative")


def _check_fraction(section, name: str) -> None:
    """A share in [0, 1)."""
    if not 0.0 <= getattr(section, name) < 1.0:
        raise fail(name, getattr(section, name), "must be in [0, 1)")


class _ReadByName:
    """A section whose fields are config fields of the same names."""

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict):
        """The section made from the config's fields of the same names (checked when made); a
        field with a default that the config lacks (a config.json older than the field) takes
        the default."""
        return cls(
            **{
                f.name: config[f.name]
                if f.name in config or f.default is dataclasses.MISSING
                else f.default
                for f in dataclasses.fields(cls)
            }
        )


@dataclasses.dataclass(frozen=True)
class DataConfig(_ReadByName):
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
    direction: str
    hf_dataset: str
    hf_config: str
    hf_split: str
    hf_fields: str
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
    text_documents: str = "lines"
    valid_path: str = ""
    test_path: str = ""
    # The token store (train.data.store.token_store); '' reads the corpus in memory at every start.
    store_dir: str = ""
    text_field: str = "text"
    store_sample_chars: int = 10_000_000
    store_shard_bytes: int = 64 << 20
    prepare_workers: int = 0
    loader_threads: int = 4
    # A pretrained model's source (train.formats.sources): its weights start the run and its
    # tokenizer is the run's (tokenizer='pretrained').
    init_from: str = ""
    # task 'lm', corpus 'text', no store_dir: read in memory instead of a store in the workdir.
    text_in_memory: bool = False
    # task 'chat': which tokens are trained ('assistant', 'last', 'all'), and a Jinja chat
    # template file that replaces the model's ('' = the model's own).
    train_on: str = "assistant"
    chat_template: str = ""
    # task 'dpo': the preference objective and its reference (`train.tasks.dpo`); the other
    # tasks leave them at 0 / '' (the task checks them: `Task.configured`).
    dpo_loss: str = ""
    dpo_beta: float = 0.0
    dpo_label_smoothing: float = 0.0
    dpo_simpo_gamma: float = 0.0
    dpo_reference: str = ""

    BATCHING: ClassVar[tuple[str, ...]] = ("bucket_lengths", "tokens_per_batch", "batch_size")
    # Where the data is and how it is read: a resumed run may change them (the store's own
    # content fingerprint, not its path, tells whether the data is the same).
    STORE: ClassVar[tuple[str, ...]] = (
        "store_dir",
        "text_field",
        "store_sample_chars",
        "store_shard_bytes",
        "prepare_workers",
        "loader_threads",
        "text_in_memory",
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

    @property
    def hf_field_paths(self) -> list[str]:
        """`hf_fields` split at its commas: one dotted path per example field."""
        return [f for f in self.hf_fields.split(",") if f]

    def __post_init__(self):
        object.__setattr__(self, "bucket_lengths", tuple(self.bucket_lengths))
        for name, allowed in (
            ("corpus", CORPORA),
            ("tokenizer", TOKENIZERS),
            ("direction", DIRECTIONS),
            ("packing", PACKINGS),
            ("train_on", TRAIN_ON),
        ):
            _check_choice(self, name, allowed)
        _check_positive_ints(self, "vocab_size", "max_len")
        _check_non_negative_ints(self, "batch_size", "tokens_per_batch")
        self._check_corpus()
        self._check_batching()
        for name in ("valid_fraction", "test_fraction"):
            _check_fraction(self, name)
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
        if not isinstance(self.text_in_memory, bool):
            raise fail("text_in_memory", self.text_in_memory, "must be True or False")
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
            _check_positive_ints(self, "loader_threads", "batch_size")
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
        _check_positive_ints(
            self, "store_sample_chars", "store_shard_bytes", "loader_threads", "batch_size"
        )
        _check_non_negative_ints(self, "prepare_workers")
        if not isinstance(self.text_field, str) or not self.text_field:
            raise fail("text_field", self.text_field, "must name the JSON field of the text")

    def _check_documents(self) -> None:
        if not (self.collapse_whitespace is None or isinstance(self.collapse_whitespace, bool)):
            raise fail(
                "collapse_whitespace",
                self.collapse_whitespace,
                "must be True, False, or None (the task's default)",
            )
        _check_choice(self, "text_documents", TEXT_DOCUMENTS)
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
            if not getattr(self, field):
                raise fail(field, getattr(self, field), f"corpus={self.corpus!r} needs {what}")

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
            not all(_is_int(n) and n > 0 for n in lengths)
            or list(lengths) != sorted(set(lengths))
            or lengths[-1] != self.max_len
        ):
            raise fail(
                "bucket_lengths",
                lengths,
                f"must be increasing positive ints ending with max_len={self.max_len}, or ()",
            )


@dataclasses.dataclass(frozen=True)
class StepConfig(_ReadByName):
    """What the train step does besides the update (`train.program.steps.train_step`).

    Attributes:
        label_smoothing: paper 5.4; validation is reported without it.
        target_token_dropout: the rate of decoder inputs replaced by <unk> (translation only).
    """

    label_smoothing: float
    target_token_dropout: float

    def __post_init__(self):
        _check_fraction(self, "label_smoothing")
        _check_fraction(self, "target_token_dropout")


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


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """Validation, BLEU and the samples of the final report (`train.tasks`,
    `train.tasks.common.inference`).

    Attributes:
        num_eval_batches: validation batches per evaluation; 0 = all.
        bleu_examples, bleu_tokenize, report_beam_size, copy_baseline, num_samples,
            sample_prompts: the config fields of the same names.
        decode: how to decode (beam size, length penalty, sampling, batch size...).
    """

    num_eval_batches: int
    bleu_examples: int
    bleu_tokenize: str
    report_beam_size: int
    copy_baseline: bool
    num_samples: int
    sample_prompts: tuple[str, ...]
    decode: DecodeOptions

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict) -> EvalConfig:
        """The eval section; the decoding options check themselves (`DecodeOptions`) and
        are named as the config fields they come from."""
        return cls(
            num_eval_batches=config.num_eval_batches,
            bleu_examples=config.bleu_examples,
            bleu_tokenize=config.bleu_tokenize,
            report_beam_size=config.report_beam_size,
            copy_baseline=config.copy_baseline,
            num_samples=config.num_samples,
            sample_prompts=tuple(config.sample_prompts),
            decode=DecodeOptions.from_config(config),
        )

    def __post_init__(self):
        _check_positive_ints(self, "report_beam_size")
        _check_non_negative_ints(self, "num_eval_batches", "bleu_examples", "num_samples")


@dataclasses.dataclass(frozen=True)
class RunConfig(_ReadByName):
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
        _check_choice(self, "rng_impl", RNG_IMPLS)
        _check_positive_ints(
            self,
            "num_train_steps",
            "log_every_steps",
            "eval_every_steps",
            "checkpoint_every_steps",
            "keep_checkpoints",
        )
        _check_non_negative_ints(self, "bleu_every_steps", "seed", "cpu_devices")
        if not isinstance(self.async_checkpoints, bool):
            raise fail("async_checkpoints", self.async_checkpoints, "must be True or False")
        for name, high in (("target_valid_loss", math.inf), ("target_bleu", 100.0)):
            value = getattr(self, name)
            if not _is_real(value) or not 0 <= value <= high:
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
