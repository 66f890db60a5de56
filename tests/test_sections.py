"""train.config.sections: the config turned once into frozen, self-checking sections."""

import ast
import dataclasses
import subprocess
import sys

import jax
import numpy as np
import pytest

from configs import default
from flax_transformer import TransformerConfig, sharding
from train import tasks
from train.config import config_lib
from train.config.sections import (
    DataConfig,
    DecodeOptions,
    EvalConfig,
    Experiment,
    OptimizerConfig,
    RunConfig,
    ScheduleConfig,
    StepConfig,
)
from train.core import failures
from train.data.tokenizer import ByteTokenizer
from train.formats import optimizers as optim
from train.formats.optimizers.muon import MuonOptions
from train.program import loop as train_lib
from train.program import steps


@pytest.fixture
def experiment() -> Experiment:
    return config_lib.validate_config(default.get_config())


def test_each_section_holds_its_config_fields(experiment):
    config = default.get_config()
    sections = {
        "data": DataConfig,
        "optimizer": OptimizerConfig,
        "step": StepConfig,
        "run": RunConfig,
    }
    for name, cls in sections.items():
        section = getattr(experiment, name)
        assert isinstance(section, cls)
        for field in dataclasses.fields(cls):
            if cls is OptimizerConfig and field.name in ("name", "options"):
                continue  # config.optimizer's, below
            value = config[field.name]
            if field.name in ("corpora", "tasks"):  # a section of sections, read as one value
                assert getattr(section, field.name).to_dict() == value.to_dict()
                continue
            expected = tuple(value) if isinstance(value, list | tuple) else value
            assert getattr(section, field.name) == expected, (name, field.name)
    assert experiment.optimizer.name == config.optimizer.name
    assert experiment.optimizer.options == MuonOptions(**config.optimizer.muon)
    assert experiment.schedule == ScheduleConfig(
        schedule=config.schedule,
        learning_rate=config.learning_rate,
        warmup_steps=config.warmup_steps,
        num_updates=config.num_train_steps // config.grad_accum_steps,
    )
    assert experiment.eval.decode == DecodeOptions.from_config(config)
    assert experiment.eval.sample_prompts == tuple(config.sample_prompts)
    assert experiment.model == config_lib.model_config(config, config.vocab_size)


def test_the_byte_tokenizer_sizes_the_model():
    config = default.get_config()
    config.tokenizer = "byte"
    model = config_lib.validate_config(config).model
    assert isinstance(model, TransformerConfig)
    assert model.vocab_size == ByteTokenizer().vocab_size


@pytest.mark.parametrize("name", ["data", "model", "optimizer", "schedule", "step", "eval", "run"])
def test_sections_are_frozen(experiment, name):
    section = getattr(experiment, name)
    field = dataclasses.fields(section)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(section, field, None)


@pytest.mark.parametrize(
    "section, field, value, message",
    [
        ("data", "packing", "zip", r"--config.packing='zip': must be one of"),
        ("data", "max_len", 0, r"--config.max_len=0: must be a positive integer"),
        ("data", "bucket_lengths", (8, 4), r"--config.bucket_lengths=\(8, 4\): must be increasing"),
        ("data", "batch_size", 8, r"set exactly one of them > 0"),
        (
            "data",
            "corpora",
            {"text": {"documents": "pages"}},
            r"--config.corpora.text.documents='pages': must be one of",
        ),
        ("data", "corpora", {"text": {"lines": 1}}, r"corpora.text.lines=1: is not an option"),
        ("data", "corpora", {"csv": {}}, r"--config.corpora.csv={}: no corpus has options 'csv'"),
        ("data", "collapse_whitespace", 1, r"--config.collapse_whitespace=1: must be True"),
        ("optimizer", "name", "sgd", r"--config.optimizer.name='sgd': must be one of"),
        ("optimizer", "grad_accum_steps", 0, r"--config.grad_accum_steps=0: must be a positive"),
        ("optimizer", "eps", -1.0, r"--config.eps=-1.0: must be non-negative"),
        ("schedule", "learning_rate", 0.0, r"--config.learning_rate=0.0: must be > 0"),
        ("schedule", "schedule", "linear", r"--config.schedule='linear': must be one of"),
        ("step", "label_smoothing", 1.0, r"--config.label_smoothing=1.0: must be in \[0, 1\)"),
        ("eval", "report_beam_size", 0, r"--config.report_beam_size=0: must be a positive"),
        ("run", "rng_impl", "md5", r"--config.rng_impl='md5': must be one of"),
        ("run", "keep_checkpoints", 0, r"--config.keep_checkpoints=0: must be a positive"),
    ],
)
def test_a_section_checks_itself_when_made(experiment, section, field, value, message):
    # Made by hand (as research code may), not only through validate_config.
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(getattr(experiment, section), **{field: value})


def test_a_bad_override_is_named_as_on_the_command_line():
    config = default.get_config()
    config.top_p = 0.0
    with pytest.raises(ValueError, match=r"--config.top_p=0.0: must be in \(0, 1\]"):
        config_lib.validate_config(config)
    config = default.get_config()
    config.model.num_heads = 3
    with pytest.raises(ValueError, match=r"^--config\.model\.num_heads=3 does not divide"):
        config_lib.validate_config(config)


def test_a_model_refusal_names_the_flag_that_sets_the_field():
    refusal = ValueError("TransformerConfig.max_len=0 must be a positive integer.")
    data_fields = ("vocab_size", "max_len")  # filled from the data section's flags
    message = "--config.max_len=0 must be a positive integer."
    assert str(failures.model_field_error(refusal, data_fields)) == message
    assert str(failures.model_field_error(refusal)).startswith("--config.model.max_len=0 must")
    unnamed = failures.model_field_error(ValueError("a message naming no field"))
    assert str(unnamed) == "a message naming no field (set it with --config.model.<field>=...)"


def test_resume_identity_is_the_data_and_model_sections():
    data_fields = {f.name for f in dataclasses.fields(DataConfig)}
    movable = set(DataConfig.BATCHING) | set(DataConfig.STORE)
    assert set(config_lib.IDENTITY_FIELDS) == (data_fields - movable) | {
        "model",
        "seed",
        "rng_impl",
    }
    saved = default.get_config().to_dict()
    current = default.get_config()
    current.update(batch_size=32, tokens_per_batch=0, bucket_lengths=(96,), learning_rate=1e-3)
    current.update(store_dir="elsewhere", loader_threads=1)  # the data is the store's content
    assert config_lib.changed_identity_fields(saved, current) == []
    current.max_len, current.model.d_model = 64, 64
    assert config_lib.changed_identity_fields(saved, current) == ["max_len", "model.d_model"]


def test_the_train_step_reports_the_rate_of_its_update():
    config = default.get_config()
    config.update(tokenizer="byte", max_len=16, bucket_lengths=(), max_decode_len=0)
    config.update(grad_accum_steps=2, warmup_steps=3, num_train_steps=8, schedule="cosine")
    config.model.update(d_model=16, num_heads=2, d_ff=32, num_layers=1)
    experiment = config_lib.validate_config(config)
    task = tasks.get_task(config.task)
    mesh = sharding.make_mesh(data=-1)
    program = train_lib.build_program(experiment, task, mesh, 50, unk_id=3)
    state = steps.create_train_state(program.model, task, program.tx, mesh, 0, config.rng_impl)
    rng = np.random.default_rng(0)
    batch = {k: rng.integers(1, 50, (4, 8), dtype=np.int32) for k in ("src", "tgt_in", "tgt_out")}
    reported = []
    for _ in range(6):
        state, metrics = program.train_step(state, program.put_batch(batch))
        reported.append(float(jax.device_get(metrics["learning_rate"])))
    # Two micro-batches per update: steps 0, 1 make update 0, steps 2, 3 update 1, ...
    schedule = optim.make_schedule(experiment.schedule)
    expected = [float(schedule(step // 2)) for step in range(6)]
    np.testing.assert_allclose(reported, expected, rtol=1e-6)
    assert reported[0] < reported[2] < reported[4]  # still warming up over three updates


def test_validate_config_returns_the_sections():
    config = default.get_config()
    experiment = config_lib.validate_config(config)
    assert isinstance(experiment, Experiment)
    assert experiment.eval == EvalConfig.from_config(config)
    assert isinstance(experiment.eval.decode, DecodeOptions)


def test_the_sections_load_alone():
    # Nothing of train/ comes with them but the leaves below config: the corpus table and
    # the plain conversations it reads (no template engine, no tokenizer), the optimizer
    # table, the failures of core, and the registry of task facts (filled by train.tasks,
    # never imported by it): the tasks and the decoding may read them freely.
    code = (
        "import sys, train.config.sections; "
        "print(sorted(m for m in sys.modules if m.startswith('train.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(ast.literal_eval(out.stdout.strip()))
    tables = {"train.formats.corpora", "train.formats.corpora.conversations"}
    tables |= {"train.formats.optimizers", "train.formats.optimizers.registry"}
    assert {"train.config", "train.config.sections", *tables} <= loaded
    leaves = ("train.formats.corpora.", "train.formats.optimizers.")
    others = {m for m in loaded - tables if not m.startswith(leaves)}
    assert others == {
        "train.config",
        "train.config.checks",
        "train.config.evaluation",
        "train.config.sections",
        "train.config.tasks",
        "train.core",
        "train.core.failures",
        "train.core.option_sections",
        "train.formats",
    }


@pytest.mark.parametrize(
    "updates, message",
    [
        (
            {"task": "sft"},
            r"--config.task='sft': must be one of \('translation', 'lm', 'chat', 'dpo'\)",
        ),
        ({"corpus": "kjv"}, r"--config.corpus='kjv': task='translation' reads one of"),
        (
            {"packing": "stream", "batch_size": 32, "tokens_per_batch": 0},
            r"--config.packing='stream': task='translation' packs with one of",
        ),
    ],
)
def test_the_task_registry_is_checked_by_validate_config(updates, message):
    config = default.get_config()
    config.update(updates)
    DataConfig.from_config(config)  # the section alone knows no task
    with pytest.raises(ValueError, match=message):
        config_lib.validate_config(config)


def test_a_field_of_another_task_is_refused():
    config = default.get_config()
    config.update(task="lm", corpus="kjv", copied_targets=0.0, target_token_dropout=0.1)
    with pytest.raises(
        ValueError, match=r"target_token_dropout=0.1: applies to task='translation'"
    ):
        config_lib.validate_config(config)
    config.update(target_token_dropout=0.0, copied_targets=0.5)
    with pytest.raises(ValueError, match=r"copied_targets=0.5: applies to task='translation' only"):
        config_lib.validate_config(config)
