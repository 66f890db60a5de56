"""The experiment config in sections: what each part of a run reads, frozen and checked.

The ConfigDict of `configs/*.py` stays the user's interface (files, `--config.field=value`
overrides, `config.json` in the run directory). `Experiment.from_config` turns it, once, at
the top of a run, into one frozen section per job:

    data       DataConfig            corpus, split, tokenizer, lengths, packing, batch sizes
    model      TransformerConfig     `config.model` + vocab_size, max_len and pad_id
    optimizer  OptimizerConfig       Adam(W), clipping, gradient accumulation: `build(schedule)`
    schedule   ScheduleConfig        the learning rate over updates: `build()`
    step       StepConfig            the train step's loss and input noise
    eval       EvalConfig            validation, BLEU and samples; `decode` is a DecodeOptions
    run        RunConfig             how long, how often, where: seed, PRNG, mesh, checkpoints

Each section checks its own fields when it is made, and names a bad one as it is written on
the command line (`--config.field=value`), so an override is fixed where it was made. Every
function of the program receives the section it reads, never the whole config.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import jax.numpy as jnp
import ml_collections
import optax

from flax_transformer import TransformerConfig
from train.decoding import DecodeOptions
from train.tasks import TASKS, get_task, owners
from train.tokenizer import PAD_ID, ByteTokenizer

CORPORA = ("bible", "kjv-web", "kjv", "tsv", "text", "hf")
TOKENIZERS = ("sentencepiece", "byte")
OPTIMIZERS = ("adam", "adamw")
SCHEDULES = ("rsqrt", "cosine", "constant")
RNG_IMPLS = ("threefry2x32", "rbg", "unsafe_rbg")
DIRECTIONS = ("ja-en", "en-ja")
PACKINGS = ("none", "segments", "stream")


def fail(field: str, value: Any, expected: str) -> ValueError:
    """The error for a bad config value: `--config.<field>=<value>: <expected>.`"""
    return ValueError(f"--config.{field}={value!r}: {expected}.")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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
    """What the examples are and how they become batches (`train.input_pipeline`).

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
    # The token store (train.token_store); '' reads the corpus in memory at every start.
    store_dir: str = ""
    text_field: str = "text"
    store_sample_chars: int = 10_000_000
    store_shard_bytes: int = 64 << 20
    prepare_workers: int = 0
    loader_threads: int = 4

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
    def hf_field_paths(self) -> list[str]:
        """`hf_fields` split at its commas: one dotted path per example field."""
        return [f for f in self.hf_fields.split(",") if f]

    @property
    def model_vocab_size(self) -> int:
        """The vocabulary the model is built for: the byte tokenizer's, or `vocab_size`."""
        return ByteTokenizer().vocab_size if self.tokenizer == "byte" else self.vocab_size

    def __post_init__(self):
        object.__setattr__(self, "bucket_lengths", tuple(self.bucket_lengths))
        for name, allowed in (
            ("task", tuple(TASKS)),
            ("corpus", CORPORA),
            ("tokenizer", TOKENIZERS),
            ("direction", DIRECTIONS),
            ("packing", PACKINGS),
        ):
            _check_choice(self, name, allowed)
        _check_positive_ints(self, "vocab_size", "max_len")
        _check_non_negative_ints(self, "batch_size", "tokens_per_batch")
        self._check_corpus()
        self._check_batching()
        for name in ("valid_fraction", "test_fraction"):
            _check_fraction(self, name)
        if self.valid_fraction <= 0:
            raise fail("valid_fraction", self.valid_fraction, "must be > 0 (validation is needed)")
        if self.copied_targets and "copied_targets" not in get_task(self.task).own_fields:
            raise fail(
                "copied_targets",
                self.copied_targets,
                f"applies to task={owners('copied_targets')} only; set it to 0",
            )
        if not 0.0 <= self.copied_targets <= 1.0:
            raise fail("copied_targets", self.copied_targets, "must be in [0, 1]")
        if self.tokenizer == "sentencepiece" and self.vocab_size <= 4:
            raise fail("vocab_size", self.vocab_size, "must exceed the 4 special ids")
        if self.store_dir:
            self._check_store()

    def _check_store(self) -> None:
        """A token store holds one-sided documents read as max_len windows."""
        _check_positive_ints(
            self, "store_sample_chars", "store_shard_bytes", "loader_threads", "batch_size"
        )
        _check_non_negative_ints(self, "prepare_workers")
        if not isinstance(self.text_field, str) or not self.text_field:
            raise fail("text_field", self.text_field, "must name the JSON field of the text")
        if self.task != "lm":
            raise fail(
                "store_dir",
                self.store_dir,
                "a token store feeds task='lm' ; set --config.store_dir='' for translation",
            )
        if self.corpus not in ("text", "kjv"):
            raise fail(
                "corpus",
                self.corpus,
                "a token store is prepared from 'text' (files, a glob) or 'kjv' ; set "
                "--config.store_dir='' to read this corpus in memory",
            )
        if self.packing not in ("stream", "segments"):
            raise fail(
                "packing",
                self.packing,
                "a token store is read as max_len windows: 'stream', or 'segments' (the same "
                "windows, attention kept within each document)",
            )

    def _check_corpus(self) -> None:
        task = get_task(self.task)
        if self.corpus not in task.corpora:
            raise fail("corpus", self.corpus, f"task={task.name!r} reads one of {task.corpora}")
        if self.corpus in ("tsv", "text") and not self.corpus_path:
            raise fail("corpus_path", self.corpus_path, f"corpus={self.corpus!r} needs a file path")
        if self.corpus == "hf":
            if not self.hf_dataset:
                raise fail("hf_dataset", self.hf_dataset, "corpus='hf' needs a dataset name")
            if len(self.hf_field_paths) != task.hf_fields:
                raise fail(
                    "hf_fields",
                    self.hf_fields,
                    f"task={self.task!r} needs {task.hf_fields} comma-separated field path(s)",
                )

    def _check_batching(self) -> None:
        if (self.batch_size == 0) == (self.tokens_per_batch == 0):
            raise ValueError(
                f"--config.batch_size={self.batch_size} and "
                f"--config.tokens_per_batch={self.tokens_per_batch}: set exactly one of them > 0."
            )
        task = get_task(self.task)
        if self.packing not in task.packings:
            raise fail(
                "packing", self.packing, f"task={task.name!r} packs with one of {task.packings}"
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
class ScheduleConfig:
    """The learning rate as a function of the optimizer update count.

    Attributes:
        schedule: 'rsqrt', 'cosine' or 'constant' (see `build`).
        learning_rate: the peak rate, reached at the end of warm-up.
        warmup_steps: linear warm-up, in updates.
        num_updates: updates in the whole run (`num_train_steps // grad_accum_steps`, at least
            1): where the cosine reaches 0.
    """

    schedule: str
    learning_rate: float
    warmup_steps: int
    num_updates: int

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict) -> ScheduleConfig:
        accum = config.grad_accum_steps
        if not _is_int(accum) or accum < 1:
            raise fail("grad_accum_steps", accum, "must be a positive integer")
        steps = config.num_train_steps
        if not _is_int(steps) or steps < 1:
            raise fail("num_train_steps", steps, "must be a positive integer")
        return cls(
            schedule=config.schedule,
            learning_rate=config.learning_rate,
            warmup_steps=config.warmup_steps,
            num_updates=max(steps // accum, 1),
        )

    def __post_init__(self):
        _check_choice(self, "schedule", SCHEDULES)
        _check_non_negative_ints(self, "warmup_steps")
        _check_non_negative(self, "learning_rate")
        if self.learning_rate == 0:
            raise fail("learning_rate", self.learning_rate, "must be > 0")

    def build(self) -> optax.Schedule:
        """Learning rate as a function of the optimizer update count (from 0).

        - 'rsqrt' (Vaswani et al. 2017, eq. 3, with the peak as a parameter): linear warm-up
          to `learning_rate` over `warmup_steps`, then `learning_rate * sqrt(warmup_steps / t)`.
          The paper's `d_model**-0.5 * min(t**-0.5, t * warmup**-1.5)` is this schedule with
          `learning_rate = (d_model * warmup_steps) ** -0.5`.
        - 'cosine': linear warm-up, then cosine decay to 0 at the last update.
        - 'constant': linear warm-up, then constant.
        The first update (count 0) already gets `learning_rate / warmup_steps`, not 0.

        Returns:
            An optax schedule (update count -> learning rate).
        """
        peak, warmup, kind, total = (
            self.learning_rate,
            self.warmup_steps,
            self.schedule,
            self.num_updates,
        )

        def schedule(count):
            t = jnp.asarray(count, jnp.float32) + 1.0  # the update being made, from 1
            warm = jnp.minimum(t / warmup, 1.0) if warmup else 1.0
            if kind == "constant":
                return peak * warm
            if kind == "cosine":
                progress = jnp.clip((t - warmup) / max(total - warmup, 1), 0.0, 1.0)
                return peak * warm * 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
            decay = jnp.sqrt(max(warmup, 1) / jnp.maximum(t, max(warmup, 1)))
            return peak * warm * decay

        return schedule


@dataclasses.dataclass(frozen=True)
class OptimizerConfig(_ReadByName):
    """Global-norm clipping, then Adam or AdamW; gradient accumulation (`build`).

    Attributes: the config fields of the same names.
    """

    optimizer: str
    b1: float
    b2: float
    eps: float
    weight_decay: float
    grad_clip_norm: float
    grad_accum_steps: int

    def __post_init__(self):
        _check_choice(self, "optimizer", OPTIMIZERS)
        _check_positive_ints(self, "grad_accum_steps")
        _check_non_negative(self, "b1", "b2", "eps", "weight_decay", "grad_clip_norm")

    def build(self, schedule: optax.Schedule) -> optax.GradientTransformation:
        """The optax transformation on `schedule` (`ScheduleConfig.build`).

        With `grad_accum_steps = k > 1`, `optax.MultiSteps` averages k micro-batch gradients
        and updates the parameters on every k-th call (the schedule counts updates, not calls).
        """
        if self.optimizer == "adamw":
            opt = optax.adamw(
                schedule, b1=self.b1, b2=self.b2, eps=self.eps, weight_decay=self.weight_decay
            )
        else:
            opt = optax.adam(schedule, b1=self.b1, b2=self.b2, eps=self.eps)
        if self.grad_clip_norm:
            opt = optax.chain(optax.clip_by_global_norm(self.grad_clip_norm), opt)
        if self.grad_accum_steps > 1:
            opt = optax.MultiSteps(opt, every_k_schedule=self.grad_accum_steps)
        return opt


@dataclasses.dataclass(frozen=True)
class StepConfig(_ReadByName):
    """What the train step does besides the update (`train.steps.train_step`).

    Attributes:
        label_smoothing: paper 5.4; validation is reported without it.
        target_token_dropout: the rate of decoder inputs replaced by <unk> (translation only).
    """

    label_smoothing: float
    target_token_dropout: float

    def __post_init__(self):
        _check_fraction(self, "label_smoothing")
        _check_fraction(self, "target_token_dropout")


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """Validation, BLEU and the samples of the final report (`train.tasks`, `train.decoding`).

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
        log_every_steps, eval_every_steps, bleu_every_steps, checkpoint_every_steps,
            keep_checkpoints, async_checkpoints: the config fields of the same names.
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
        _check_non_negative_ints(self, "bleu_every_steps", "seed")
        if not isinstance(self.async_checkpoints, bool):
            raise fail("async_checkpoints", self.async_checkpoints, "must be True or False")


def model_config(config: ml_collections.ConfigDict, vocab_size: int) -> TransformerConfig:
    """The one conversion of `config.model` (+ data fields) into a TransformerConfig.

    Args:
        config: an experiment config.
        vocab_size: the tokenizer's vocabulary size (shared by source and target).

    Returns:
        The frozen model config, with max_len = config.max_len and pad_id = the tokenizer's.

    Raises:
        ValueError: an unknown or invalid model field, named as `--config.model.<field>`.
    """
    fields = dict(config.model)
    known = set(TransformerConfig.__dataclass_fields__)
    for name in fields:
        if name not in known or name in ("vocab_size", "max_len", "pad_id"):
            raise ValueError(
                f"--config.model.{name}: not a TransformerConfig field settable here; "
                f"vocab_size, max_len and pad_id come from the data fields (--config.vocab_size, "
                f"--config.max_len)."
            )
    try:
        return TransformerConfig(
            vocab_size=vocab_size, max_len=config.max_len, pad_id=PAD_ID, **fields
        )
    except ValueError as err:
        raise ValueError(f"{err} (set it with --config.model.<field>=...)") from err


def _check_finite(config: ml_collections.ConfigDict, prefix: str = "") -> None:
    """Raises ValueError for a NaN or infinite float anywhere in `config` (nested included).

    Range checks cannot catch these: every comparison with NaN is False.
    """
    for field, value in config.items():
        if isinstance(value, ml_collections.ConfigDict):
            _check_finite(value, f"{prefix}{field}.")
        elif isinstance(value, float) and not math.isfinite(value):
            raise fail(f"{prefix}{field}", value, "must be a finite number")


@dataclasses.dataclass(frozen=True)
class Experiment:
    """A whole run's config, one section per job (see the module docstring)."""

    data: DataConfig
    model: TransformerConfig
    optimizer: OptimizerConfig
    schedule: ScheduleConfig
    step: StepConfig
    eval: EvalConfig
    run: RunConfig

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict) -> Experiment:
        """The sections of an experiment config (`configs/*.py`, overrides applied).

        Raises:
            ValueError: the first field out of range or inconsistent, named as
                `--config.<field>=<value>` with what it must be.
        """
        _check_finite(config)
        if "packed" in config:
            raise fail(
                "packed",
                config.packed,
                "was renamed --config.packing: packed=True is packing='stream' (lines cut into "
                "max_len windows), packed=False is packing='none'; packing='segments' packs "
                "whole examples with attention kept within each. Set packing instead and "
                "delete packed",
            )
        data = DataConfig.from_config(config)
        step = StepConfig.from_config(config)
        if (
            step.target_token_dropout
            and "target_token_dropout" not in get_task(data.task).own_fields
        ):
            raise fail(
                "target_token_dropout",
                step.target_token_dropout,
                f"applies to task={owners('target_token_dropout')} only; set it to 0",
            )
        return cls(
            data=data,
            model=model_config(config, data.model_vocab_size),
            optimizer=OptimizerConfig.from_config(config),
            schedule=ScheduleConfig.from_config(config),
            step=step,
            eval=EvalConfig.from_config(config),
            run=RunConfig.from_config(config),
        )
