"""docs/training.md's "Add a task" example, run: the z-loss task's code is read from the page,
registered as its one line says, and trained; its objective adds exactly the z-loss term to
the language model's cross-entropy."""

import json
import pathlib
import re
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from train_helpers import tiny_config, write_tiny_text

from train import tasks
from train.config import tasks as task_registry
from train.program import loop as train_lib
from train.tasks.common.objective import LossSetup, token_cross_entropy

PAGE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "training.md"


def _example_module() -> types.ModuleType:
    text = PAGE.read_text(encoding="utf-8")
    (code,) = re.findall(r"```python\n(# train/tasks/lm_zloss/__init__.py\n.*?)```", text, re.S)
    module = types.ModuleType("lm_zloss")
    exec(compile(code, str(PAGE), "exec"), module.__dict__)
    return module


@pytest.fixture
def zloss_task(monkeypatch):
    task = _example_module().ZLossTask()
    # The registration line: the task in TASKS, its facts in the config's registry.
    monkeypatch.setitem(tasks.TASKS, task.name, task)
    monkeypatch.setitem(task_registry._REGISTERED, task.name, task.facts())
    return task


def test_the_example_task_adds_the_z_loss_to_the_objective(zloss_task):
    model = zloss_task.make_model(_tiny_model_config())
    params = model.init(jax.random.key(0), *zloss_task.init_inputs())["params"]
    tokens = jnp.asarray(np.random.default_rng(0).integers(4, 60, (2, 8)), jnp.int32)
    batch = {"inputs": tokens, "targets": jnp.roll(tokens, -1, axis=1)}
    setup = LossSetup(pad_id=0)
    # The example adds its term to the cross-entropy of whole logits (token_cross_entropy);
    # the lm task's own loss computes the same through the head in blocks, to float32
    # rounding (tests/test_blocked_objective.py), so the reference is the former.
    lm_outputs = tasks.get_task("lm").logits_and_labels(model, params, batch, deterministic=True)
    plain, plain_sums = token_cross_entropy(*lm_outputs, setup)
    with_z, sums = zloss_task.loss(model, params, batch, setup, deterministic=True)
    logits = model.apply({"params": params}, tokens)
    z = float(jnp.mean(jax.nn.logsumexp(logits, axis=-1) ** 2))
    np.testing.assert_allclose(float(with_z) - float(plain), 1e-4 * z, rtol=1e-4)
    assert z > 0 and sums.keys() == plain_sums.keys()
    # Its option, read from the config's `tasks.lm_zloss` section, sets the term's weight.
    data = types.SimpleNamespace(
        tasks=task_registry.read_task_options({"lm_zloss": {"weight": 0.5}})
    )
    configured = zloss_task.configured(data)
    with_half, _ = configured.loss(model, params, batch, setup, deterministic=True)
    np.testing.assert_allclose(float(with_half) - float(plain), 0.5 * z, rtol=1e-4)
    with pytest.raises(ValueError, match=r"--config.tasks.lm_zloss.weight=-1.0: must be >= 0"):
        task_registry.read_task_options({"lm_zloss": {"weight": -1.0}})


def _tiny_model_config():
    from flax_transformer import TransformerConfig

    return TransformerConfig(vocab_size=64, d_model=16, num_heads=2, d_ff=32, num_layers=1)


def test_the_example_task_trains(zloss_task, tmp_path):
    config = tiny_config(
        write_tiny_text(tmp_path),
        task=zloss_task.name,
        corpus="text",
        num_train_steps=4,
        sample_prompts=("ab cd",),
    )
    config.max_decode_len = 0
    # The config made after the registration has the task's own section, at its defaults.
    assert config.tasks.lm_zloss.weight == 1e-4
    config.tasks.lm_zloss.weight = 1e-3
    results = train_lib.train_and_evaluate(config, str(tmp_path / "run"))
    assert np.isfinite(results["valid"]["nll"]) and results["step"] == 4
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["tasks"]["lm_zloss"] == {"weight": 1e-3}
