"""The experiment config (ml_collections, `configs/*.py`): its one check-and-convert into
sections (`validate_config` -> `train.config.sections.Experiment`), what a resumed run must keep of
it, and the config a run directory recorded (`read_saved`, for the tools that read a trained
run).

Each section checks its own fields (`train.config.sections`); `validate_config` adds what needs the
config as a whole (finite numbers, renamed fields) or the task registry (the corpora,
packings and fields each task accepts). Every check names the field as it is written on the
command line (`--config.field=value`), so a bad override is fixed where it was made.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import ml_collections

from flax_transformer import TransformerConfig
from train.config import freeze
from train.config.config_checks import as_json, check_finite, check_renamed, check_task
from train.config.dtype_choice import with_chosen_dtype
from train.config.sections import (
    PACKINGS,
    DataConfig,
    EvalConfig,
    Experiment,
    OptimizerConfig,
    RunConfig,
    ScheduleConfig,
    StepConfig,
    fail,
)
from train.config.tasks import CONFIG_FIELD as TASKS_FIELD
from train.config.tasks import option_types, registered_tasks, task_facts
from train.core.cli import RENAMED_FIELDS
from train.core.failures import DamagedFileError, model_field_error
from train.core.option_sections import changed_options
from train.core.rundir import RunDir, read_json
from train.core.special_ids import PAD_ID, model_vocab_size
from train.formats import corpora, sources

__all__ = [
    "IDENTITY_FIELDS",
    "PACKINGS",
    "changed_identity_fields",
    "model_config",
    "read_saved",
    "validate_config",
]

# Fields that decide the data, vocabulary or parameter shapes: a resumed run must not change
# them (the checkpoint would not fit, or would silently continue a different experiment).
# They are the data section's (less its batch shapes), the model section, and the run's seed
# and PRNG.
IDENTITY_FIELDS = (*DataConfig.identity_fields(), *RunConfig.IDENTITY, "model")
# The config's nested sections, which a config.json older than one of their fields lacks.
NESTED_SECTIONS = ("optimizer", corpora.CONFIG_FIELD, TASKS_FIELD)


def validate_config(
    config: ml_collections.ConfigDict, workdir: str | os.PathLike | None = None
) -> Experiment:
    """The config's sections, or ValueError for the first field out of range or inconsistent.

    The one checked path from a config to its sections: training, `train.compile`,
    `train.prepare` and the tools that read a trained run all come through it.

    Args:
        config: an experiment config (see `configs/default.py` for every field).
        workdir: the run directory, where a run from pretrained weights keeps its copy of
            the model's config and tokenizer (`train.formats.sources.open_source`); None reads
            `--config.init_from` itself.

    Returns:
        The `Experiment` (frozen sections) the run reads.

    Raises:
        ValueError: names the field as `--config.<field>=<value>` and what it must be.
    """
    check_finite(config)
    if "packed" in config:
        raise fail(
            "packed",
            config.packed,
            "was renamed --config.packing: packed=True is packing='stream' (lines cut into "
            "max_len windows), packed=False is packing='none'; packing='segments' packs "
            "whole examples with attention kept within each. Set packing instead and "
            "delete packed",
        )
    check_renamed(config)
    check_task(config)
    data = DataConfig.from_config(config)
    if (check := corpora.CORPORA[data.corpus].check) is not None:
        check(data, task_facts(data.task))  # options that must suit the task
    if data.init_from:
        model = _pretrained_model(config, data, workdir)
    else:
        model = model_config(config, model_vocab_size(data.tokenizer, data.vocab_size))
    optimizer = OptimizerConfig.from_config(config)
    if optimizer.freeze or optimizer.pretrained_lr_scale != 1.0:
        freeze.check_freeze(optimizer, model, bool(data.init_from))
    run = RunConfig.from_config(config)  # before the schedule, which counts its updates
    schedule = ScheduleConfig.from_config(config, optimizer, run)
    optimizer.check_run(schedule, fine_tuning=bool(data.init_from))
    evaluation = EvalConfig.from_config(config)
    if run.target_bleu and not (run.bleu_every_steps and evaluation.bleu_examples):
        raise fail(
            "target_bleu",
            run.target_bleu,
            "is checked at each BLEU evaluation during training: set --config.bleu_every_steps "
            f"> 0 (now {run.bleu_every_steps}) and --config.bleu_examples > 0 (now "
            f"{evaluation.bleu_examples})",
        )
    return Experiment(
        data=data,
        model=model,
        optimizer=optimizer,
        schedule=schedule,
        step=StepConfig.from_config(config),
        eval=evaluation,
        run=run,
    )


def _pretrained_model(
    config: ml_collections.ConfigDict, data: DataConfig, workdir: str | os.PathLike | None
) -> TransformerConfig:
    """The model of `--config.init_from`'s source with the run's own model choices
    (`merge_model_config`), checked against the data fields."""
    if not task_facts(data.task).fine_tunes:
        tasks = tuple(name for name, task in registered_tasks().items() if task.fine_tunes)
        raise fail("task", data.task, f"init_from starts a decoder-only model: use one of {tasks}")
    source = sources.open_source(data.init_from, workdir)
    model = merge_model_config(source.config_origin, source_model(source), dict(config.model))
    if data.max_len > model.max_len:
        raise fail(
            "max_len",
            data.max_len,
            f"the pretrained model at {data.init_from} holds sequences of at most "
            f"{model.max_len} tokens; choose max_len <= {model.max_len}",
        )
    return model


def source_model(source: sources.Source) -> TransformerConfig:
    """The model config of a pretrained source: a Hugging Face directory's or a GGUF file's
    (converted by the library's importer), or a `train.main` run's, read with its whole
    checked config (a kind that says `trained_here`)."""
    if source.trained_here:
        try:
            experiment = read_saved(source.path)[1]
        except (FileNotFoundError, ValueError) as err:
            raise ValueError(
                f"--config.init_from={str(source.path)!r}: a train.main run whose config "
                f"does not read ({err})."
            ) from None
        # A run of any task that trains a decoder-only model ('lm', 'chat', 'dpo': SFT then
        # DPO) starts another; a translation run's encoder-decoder does not.
        if not task_facts(experiment.data.task).fine_tunes:
            starts = tuple(name for name, t in registered_tasks().items() if t.fine_tunes)
            raise ValueError(
                f"--config.init_from={str(source.path)!r}: the run trained "
                f"task={experiment.data.task!r}, an encoder-decoder model; init_from starts "
                f"from a decoder-only model's run (a run of task {' / '.join(starts)})."
            )
        return experiment.model
    return source.model


def merge_model_config(
    origin: os.PathLike, base: TransformerConfig, model_fields: Mapping[str, Any]
) -> TransformerConfig:
    """The run's model config: a pretrained source's architecture (`base`), with the run's
    own choices.

    Args:
        origin: where `base` was read (named in errors).
        base: the source's model config (`source_model`).
        model_fields: `config.model` as a dict; an architecture field
            (`train.formats.sources.ARCHITECTURE_FIELDS`) must be None or the source's value, any
            other field is applied.

    Raises:
        ValueError: an architecture field that contradicts the source (both values named),
            or an invalid field.
    """
    fields = dataclasses.asdict(base)
    for name, value in model_fields.items():
        if value is None:
            continue
        if name in sources.ARCHITECTURE_FIELDS:
            if value != fields[name]:
                raise ValueError(
                    f"--config.model.{name}={value!r} contradicts {origin}, whose model has "
                    f"{name}={fields[name]!r}: leave it None (as configs/finetune_gpt2.py "
                    "does) or set the source's value."
                )
            continue
        if name not in fields:
            raise ValueError(f"--config.model.{name}: not a TransformerConfig field.")
        fields[name] = value
    try:
        return TransformerConfig(**with_chosen_dtype(fields))
    except ValueError as err:
        raise model_field_error(err) from err


def model_config(
    config: ml_collections.ConfigDict, vocab_size: int, pad_id: int = PAD_ID
) -> TransformerConfig:
    """The one conversion of `config.model` (+ data fields) into a TransformerConfig.

    Args:
        config: an experiment config.
        vocab_size: the tokenizer's vocabulary size (shared by source and target).
        pad_id: the tokenizer's pad id.

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
            vocab_size=vocab_size,
            max_len=config.max_len,
            pad_id=pad_id,
            **with_chosen_dtype(fields),
        )
    except ValueError as err:
        raise model_field_error(err, ("vocab_size", "max_len")) from err


def _renamed(saved: Mapping[str, Any]) -> dict[str, Any]:
    """A saved config with today's names: `packed` (a bool) became `packing`; the flat
    optimizer fields (`optimizer` a name, `muon_learning_rate`, ...) became
    `optimizer.name` and `optimizer.<name>.<option>`, the corpora's (`hf_dataset`,
    `text_documents`, `direction`, ...) `corpora.<section>.<option>`."""
    saved = dict(saved)
    if "packing" not in saved:  # a config.json from before `packing` replaced `packed`
        saved["packing"] = "stream" if saved.get("packed") else "none"
    return with_nested_fields(saved)


def with_nested_fields(flat: Mapping[str, Any]) -> dict[str, Any]:
    """`flat` (a config as a dict) with the old flat fields moved to their dotted places
    (`train.core.cli.RENAMED_FIELDS`, the table the command line reads too).
    """
    flat = dict(flat)
    for old, new in RENAMED_FIELDS.items():
        if old not in flat or isinstance(flat[old], Mapping):
            continue  # absent, or `optimizer` already the section
        value = flat.pop(old)
        top, *parents, leaf = new.split(".")
        section = flat[top] = _copied(flat.get(top) or {})
        for parent in parents:
            section = section.setdefault(parent, {})
        section[leaf] = value
    return flat


# The old name of `with_nested_fields`.
with_nested_optimizer = with_nested_fields


def _copied(section: Mapping[str, Any]) -> dict[str, Any]:
    """A nested dict copied down to its leaves (a saved section is never changed in place)."""
    return {k: _copied(v) if isinstance(v, Mapping) else v for k, v in section.items()}


def read_saved(
    workdir: str | os.PathLike,
) -> tuple[ml_collections.ConfigDict, Experiment]:
    """The config a run recorded in `workdir/config.json`, and its checked sections.

    A config.json written by an earlier version of the program lacks the fields added since:
    they take `configs/default.py`'s values, and a model field the model's default (as
    `changed_identity_fields` compares them); `packed` is read as today's `packing`.

    Args:
        workdir: a run directory written by `train.main`.

    Returns:
        (the config as the run wrote it, defaults filled in; `validate_config` of it).

    Raises:
        FileNotFoundError: no config.json in `workdir`.
        DamagedFileError: config.json is empty or not JSON (a RunFailure and a ValueError).
        ValueError: a recorded value fails today's checks; names config.json and the field.
    """
    from configs import default  # the package's own configs, imported only when needed

    run = RunDir(workdir)
    path = run.config
    if not path.exists():
        raise FileNotFoundError(
            f"{path} not found: {run.path} is not a training run directory ; train with "
            f"`python -m train.main --workdir {run.path}` first."
        )
    fix = (
        f"delete it and rerun `python -m train.main --workdir {run.path}` with the run's "
        "--config and overrides: it is rewritten and the run resumes"
    )
    saved = read_json(path, fix)
    if not isinstance(saved, dict):
        raise DamagedFileError(f"{path} holds no JSON object ; {fix}")
    saved = _renamed(saved)
    saved.pop("packed", None)
    defaults = default.get_config().to_dict()
    # The nested sections merged field by field: an older file lacks sub-sections.
    nested = {name: _merged(defaults[name], saved.get(name, {})) for name in NESTED_SECTIONS}
    config = ml_collections.ConfigDict({**defaults, **saved, **nested})
    try:
        return config, validate_config(config, workdir=run.path)
    except ValueError as err:
        raise ValueError(
            f"{path} records {err} ; correct the value in the file (this version of the "
            "program refuses it), or retrain."
        ) from None


def _merged(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `update`'s values, nested dicts merged key by key."""
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            value = _merged(merged[key], value)
        merged[key] = value
    return merged


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
    saved = _renamed(saved)
    # A model field that an older config.json lacks had the model's default then.
    model_defaults = {
        f.name: f.default
        for f in dataclasses.fields(TransformerConfig)
        if f.default is not dataclasses.MISSING
    }
    # A data field that an older config.json lacks had its section default then (as
    # `DataConfig.from_config` reads it).
    data_defaults = {
        f.name: f.default
        for f in dataclasses.fields(DataConfig)
        if f.default is not dataclasses.MISSING
    }
    changed = []
    for field in IDENTITY_FIELDS:
        old, new = saved.get(field, data_defaults.get(field)), now.get(field)
        if field == corpora.CONFIG_FIELD:
            changed += changed_options(field, corpora.OPTIONS, old or {}, new)
        elif field == TASKS_FIELD:
            changed += changed_options(field, option_types(), old or {}, new)
        elif isinstance(new, dict):
            old = old or {}
            defaults = model_defaults if field == "model" else {}
            changed += [
                f"{field}.{k}"
                for k in sorted(set(old) | set(new))
                if as_json(old.get(k, defaults.get(k))) != as_json(new.get(k, defaults.get(k)))
            ]
        elif as_json(old) != as_json(new):
            changed.append(field)
    return changed
