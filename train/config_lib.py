"""The experiment config (ml_collections, `configs/*.py`): checks, and the one conversion into
`flax_transformer.TransformerConfig`.

Every check names the field as it is written on the command line (`--config.field=value`),
so a bad override is fixed where it was made.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import ml_collections

from flax_transformer import TransformerConfig
from train.tasks import TASKS, get_task, owners
from train.tokenizer import PAD_ID

CORPORA = ("bible", "kjv-web", "kjv", "tsv", "text", "hf")
TOKENIZERS = ("sentencepiece", "byte")
OPTIMIZERS = ("adam", "adamw")
SCHEDULES = ("rsqrt", "cosine", "constant")
RNG_IMPLS = ("threefry2x32", "rbg", "unsafe_rbg")
DIRECTIONS = ("ja-en", "en-ja")
PACKINGS = ("none", "segments", "stream")

# Fields that decide the data, vocabulary or parameter shapes: a resumed run must not change
# them (the checkpoint would not fit, or would silently continue a different experiment).
IDENTITY_FIELDS = (
    "task",
    "corpus",
    "corpus_path",
    "hf_dataset",
    "hf_config",
    "hf_split",
    "hf_fields",
    "direction",
    "valid_fraction",
    "test_fraction",
    "copied_targets",
    "packing",
    "tokenizer",
    "vocab_size",
    "max_len",
    "seed",
    "rng_impl",
    "model",
)

_POSITIVE_INTS = (
    "vocab_size",
    "max_len",
    "num_train_steps",
    "log_every_steps",
    "eval_every_steps",
    "checkpoint_every_steps",
    "keep_checkpoints",
    "grad_accum_steps",
    "decode_batch_size",
    "beam_size",
    "report_beam_size",
)
_NON_NEGATIVE_INTS = (
    "batch_size",
    "tokens_per_batch",
    "warmup_steps",
    "num_eval_batches",
    "bleu_every_steps",
    "bleu_examples",
    "max_decode_len",
    "num_samples",
    "top_k",
    "seed",
)
_CHOICES = {
    "task": tuple(TASKS),
    "corpus": CORPORA,
    "tokenizer": TOKENIZERS,
    "optimizer": OPTIMIZERS,
    "schedule": SCHEDULES,
    "rng_impl": RNG_IMPLS,
    "direction": DIRECTIONS,
    "packing": PACKINGS,
}


def _fail(field: str, value: Any, expected: str) -> ValueError:
    return ValueError(f"--config.{field}={value!r}: {expected}.")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_finite(config: ml_collections.ConfigDict, prefix: str = "") -> None:
    """Raises ValueError for a NaN or infinite float anywhere in `config` (nested included).

    Range checks below cannot catch these: every comparison with NaN is False.
    """
    for field, value in config.items():
        if isinstance(value, ml_collections.ConfigDict):
            _check_finite(value, f"{prefix}{field}.")
        elif isinstance(value, float) and not math.isfinite(value):
            raise _fail(f"{prefix}{field}", value, "must be a finite number")


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Raises ValueError for the first field that is out of range or inconsistent.

    Args:
        config: an experiment config (see `configs/default.py` for every field).

    Raises:
        ValueError: names the field as `--config.<field>=<value>` and what it must be.
    """
    _check_finite(config)
    if "packed" in config:
        raise _fail(
            "packed",
            config.packed,
            "was renamed --config.packing: packed=True is packing='stream' (lines cut into "
            "max_len windows), packed=False is packing='none'; packing='segments' packs whole "
            "examples with attention kept within each. Set packing instead and delete packed",
        )
    for field, allowed in _CHOICES.items():
        if config[field] not in allowed:
            raise _fail(field, config[field], f"must be one of {allowed}")
    for field in _POSITIVE_INTS:
        if not _is_int(config[field]) or config[field] < 1:
            raise _fail(field, config[field], "must be a positive integer")
    for field in _NON_NEGATIVE_INTS:
        if not _is_int(config[field]) or config[field] < 0:
            raise _fail(field, config[field], "must be a non-negative integer")
    task = get_task(config.task)
    if config.corpus not in task.corpora:
        raise _fail("corpus", config.corpus, f"task={task.name!r} reads one of {task.corpora}")
    if config.corpus in ("tsv", "text") and not config.corpus_path:
        raise _fail(
            "corpus_path", config.corpus_path, f"corpus={config.corpus!r} needs a file path"
        )
    if config.corpus == "hf":
        wanted = task.hf_fields
        fields = [f for f in config.hf_fields.split(",") if f]
        if not config.hf_dataset:
            raise _fail("hf_dataset", config.hf_dataset, "corpus='hf' needs a dataset name")
        if len(fields) != wanted:
            raise _fail(
                "hf_fields",
                config.hf_fields,
                f"task={config.task!r} needs {wanted} comma-separated field path(s)",
            )
    if (config.batch_size == 0) == (config.tokens_per_batch == 0):
        raise ValueError(
            f"--config.batch_size={config.batch_size} and "
            f"--config.tokens_per_batch={config.tokens_per_batch}: set exactly one of them > 0."
        )
    if config.packing not in task.packings:
        raise _fail(
            "packing", config.packing, f"task={task.name!r} packs with one of {task.packings}"
        )
    if config.packing == "stream" and config.batch_size == 0:
        raise _fail("batch_size", config.batch_size, "packing='stream' needs batch_size > 0")
    lengths = tuple(config.bucket_lengths)
    if lengths and (
        not all(_is_int(n) and n > 0 for n in lengths)
        or list(lengths) != sorted(set(lengths))
        or lengths[-1] != config.max_len
    ):
        raise _fail(
            "bucket_lengths",
            lengths,
            f"must be increasing positive ints ending with max_len={config.max_len}, or ()",
        )
    for field in ("valid_fraction", "test_fraction"):
        if not 0.0 <= config[field] < 1.0:
            raise _fail(field, config[field], "must be in [0, 1)")
    if config.valid_fraction <= 0:
        raise _fail("valid_fraction", config.valid_fraction, "must be > 0 (validation is needed)")
    for field in ("learning_rate", "b1", "b2", "eps", "weight_decay", "grad_clip_norm"):
        if config[field] < 0:
            raise _fail(field, config[field], "must be non-negative")
    if config.learning_rate == 0:
        raise _fail("learning_rate", config.learning_rate, "must be > 0")
    for field in ("copied_targets", "target_token_dropout"):
        if config[field] and field not in task.own_fields:
            raise _fail(field, config[field], f"applies to task={owners(field)} only; set it to 0")
    if not 0.0 <= config.copied_targets <= 1.0:
        raise _fail("copied_targets", config.copied_targets, "must be in [0, 1]")
    for field in ("label_smoothing", "target_token_dropout"):
        if not 0.0 <= config[field] < 1.0:
            raise _fail(field, config[field], "must be in [0, 1)")
    if not 0.0 < config.top_p <= 1.0:
        raise _fail("top_p", config.top_p, "must be in (0, 1]")
    if config.temperature < 0:
        raise _fail("temperature", config.temperature, "must be >= 0 (0 = greedy)")
    if config.tokenizer == "sentencepiece" and config.vocab_size <= 4:
        raise _fail("vocab_size", config.vocab_size, "must exceed the 4 special ids")
    if config.max_decode_len >= config.max_len:
        raise _fail(
            "max_decode_len", config.max_decode_len, f"must be < max_len={config.max_len} or 0"
        )


def model_config(config: ml_collections.ConfigDict, vocab_size: int) -> TransformerConfig:
    """The one conversion of `config.model` (+ data fields) into a TransformerConfig.

    Args:
        config: a validated experiment config.
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


def changed_identity_fields(
    saved: Mapping[str, Any], current: ml_collections.ConfigDict
) -> list[str]:
    """Fields in IDENTITY_FIELDS whose value differs between a saved config and this one.

    Args:
        saved: the config of an earlier run as a dict (`config.to_dict()`, via JSON).
        current: this run's config.

    Returns:
        Names like 'model.d_model' or 'vocab_size', empty when the run may resume.
    """
    now = current.to_dict()
    if "packing" not in saved:  # a config.json from before `packing` replaced `packed`
        saved = {**saved, "packing": "stream" if saved.get("packed") else "none"}
    # A model field that an older config.json lacks had the model's default then.
    model_defaults = {
        f.name: f.default
        for f in dataclasses.fields(TransformerConfig)
        if f.default is not dataclasses.MISSING
    }
    changed = []
    for field in IDENTITY_FIELDS:
        old, new = saved.get(field), now.get(field)
        if isinstance(new, dict):
            old = old or {}
            defaults = model_defaults if field == "model" else {}
            changed += [
                f"{field}.{k}"
                for k in sorted(set(old) | set(new))
                if old.get(k, defaults.get(k)) != new.get(k, defaults.get(k))
            ]
        elif old != new:
            changed.append(field)
    return changed
