"""The optimizer table (train/formats/optimizers/): one entry per optimizer owning its
options, the old flat flags and config.json keys read as today's nested ones, Lion as the
worked example of a new entry, and Muon on LoRA adapters."""

import ast
import dataclasses
import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn
from optax.contrib._muon import MuonState
from train_helpers import tiny_config, write_tiny_tsv

from configs import default
from flax_transformer import DecoderOnlyTransformer, TransformerConfig, lora_mask
from train.config import config_lib
from train.core import cli
from train.core.rundir import RunDir
from train.formats import optimizers as optim
from train.formats.optimizers.lion import LionOptions
from train.formats.optimizers.muon import MuonOptions
from train.program import loop as train_lib
from train.program import metrics

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_the_default_config_holds_every_entrys_options_at_their_defaults():
    section = default.get_config().optimizer
    with_options = {n for n, e in optim.OPTIMIZERS.items() if e.options is not None}
    assert set(section) - {"name"} == with_options
    for name in with_options:
        entry = optim.OPTIMIZERS[name]
        assert section[name].to_dict() == dataclasses.asdict(entry.options()), name


@dataclasses.dataclass(frozen=True)
class _SignOptions:
    scale: float = 1.0


def test_a_new_entry_needs_no_line_in_the_config_file(monkeypatch):
    # A registered entry's options reach the config section and its overrides without a
    # line in configs/default.py (the second of the two files a new optimizer touches is
    # the import line; registering by hand stands in for it here).
    build = lambda section, options, rate: optax.sign_sgd(rate(None))  # noqa: E731
    monkeypatch.setitem(optim.OPTIMIZERS, "sign", optim.Entry("sign", build, options=_SignOptions))
    config = default.get_config()
    assert config.optimizer.sign.to_dict() == {"scale": 1.0}
    config.update_from_flattened_dict({"optimizer.name": "sign", "optimizer.sign.scale": 2.0})
    section = optim.OptimizerConfig.from_config(config)
    assert section.entry.name == "sign" and section.options == _SignOptions(scale=2.0)


def test_no_module_of_train_names_an_optimizer_but_its_entry():
    """Every branch on an optimizer asks its entry: no string constant equal to a registered
    name anywhere in train/ outside train/formats/optimizers/."""
    names = set(optim.OPTIMIZERS)
    found = []
    for path in sorted((ROOT / "train").rglob("*.py")):
        if "formats/optimizers" in path.as_posix():
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}")
    assert not found, found


@pytest.mark.parametrize(
    "argv, today",
    [
        (["--config.optimizer=muon"], ["--config.optimizer.name=muon"]),
        (["--config.muon_learning_rate=0.03"], ["--config.optimizer.muon.learning_rate=0.03"]),
        (["-config.muon_momentum", "0.9"], ["-config.optimizer.muon.momentum", "0.9"]),
        (["--config.muon_weight_decay=0"], ["--config.optimizer.muon.weight_decay=0"]),
        (["--config.optimizer.name=adam"], ["--config.optimizer.name=adam"]),  # today's
        (["--workdir=optimizer"], ["--workdir=optimizer"]),
    ],
)
def test_old_flags_are_read_as_todays(argv, today):
    assert cli.renamed_overrides(list(argv)) == today


@pytest.mark.parametrize(
    "flag",
    ["--config.muon_learning_rate=-1.0", "--config.optimizer.muon.learning_rate=-1.0"],
)
def test_an_old_flag_and_its_new_name_reach_the_same_option(flag, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "train.main", "--config.optimizer=muon", flag],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 2, result.stderr
    assert "--config.optimizer.muon.learning_rate=-1.0: must be a number > 0" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_config_file_setting_the_old_optimizer_field_gets_one_line(tmp_path):
    path = tmp_path / "old.py"
    path.write_text(
        "from configs import default\n\n\ndef get_config():\n"
        "    config = default.get_config()\n    config.optimizer = 'adam'\n    return config\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "train.main", "--config", str(path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"error: --config {path}: sets config.optimizer, which is now config.optimizer.name "
        "; write config.optimizer.name = ... in the file"
    )


def test_an_old_config_json_reads_with_its_flat_optimizer_fields(tmp_path):
    """A config.json of the flat fields (`optimizer` a name, `muon_*`) reads as the nested
    section; the sub-sections it lacks (lion) take their defaults."""
    saved = default.get_config().to_dict()
    del saved["optimizer"]
    saved |= dict(optimizer="muon", muon_learning_rate=0.05, muon_momentum=0.9)
    (tmp_path / "config.json").write_text(json.dumps(saved))
    config, experiment = config_lib.read_saved(tmp_path)
    assert config.optimizer.name == "muon"
    assert experiment.optimizer.options == MuonOptions(learning_rate=0.05, momentum=0.9)
    assert config.optimizer.lion.to_dict() == dataclasses.asdict(LionOptions())
    assert "muon_learning_rate" not in config


def test_the_recorded_old_runs_read_as_adam():
    for kind in ("lm-stream", "translation-segments"):
        saved = json.loads((ROOT / "tests/data/old_runs" / kind / "config.json").read_text())
        assert config_lib.with_nested_optimizer(saved)["optimizer"] == {"name": "adam"}


# --------------------------------------------------------------------------- Lion


def _constant(rate):
    return optim.ScheduleConfig("constant", rate, warmup_steps=0, num_updates=10)


def test_lion_is_optax_lion_with_its_own_betas_and_the_generic_weight_decay():
    section = optim.OptimizerConfig(
        name="lion", b1=0.9, b2=0.98, eps=1e-9, weight_decay=0.1, grad_clip_norm=0.0,
        grad_accum_steps=1, options=LionOptions(b1=0.95, b2=0.98),
    )  # fmt: skip
    params = {"w": jnp.arange(6.0).reshape(2, 3)}
    grads = {"w": jnp.array([[1.0, -2.0, 0.5], [0.0, 3.0, -1.0]])}
    tx = optim.make_optimizer(section, _constant(1e-3))
    want = optax.lion(1e-3, b1=0.95, b2=0.98, weight_decay=0.1)
    got, _ = tx.update(grads, tx.init(params), params)
    expected, _ = want.update(grads, want.init(params), params)
    np.testing.assert_array_equal(got["w"], expected["w"])
    with pytest.raises(ValueError, match=r"--config.optimizer.lion.b2=1.0: must be in \[0, 1\)"):
        LionOptions(b2=1.0)


def test_a_tiny_run_trains_with_lion(tmp_path):
    config = tiny_config(
        write_tiny_tsv(tmp_path),
        learning_rate=1e-3,  # a third of the tiny runs' AdamW rate
        bleu_examples=0,
        **{"optimizer.name": "lion", "optimizer.lion.b2": 0.98},
    )
    results = train_lib.train_and_evaluate(config, str(tmp_path / "run"))
    records = metrics.read_metrics(RunDir(tmp_path / "run").metrics)
    train = [r for r in records if r["split"] == "train"]
    assert train[-1]["loss"] < train[0]["loss"]
    assert np.isfinite(results["valid"]["nll"])


# --------------------------------------------------------------------------- Muon on LoRA


def _lora_run(name: str, steps: int = 1):
    """A LoRA fine-tune of a tiny decoder on one fixed batch with `name`'s rule (the
    program's groups: adapters 'train', the rest 'frozen'): losses, last state, params."""
    config = TransformerConfig(
        vocab_size=40, d_model=32, num_heads=4, d_ff=64, num_layers=2, max_len=16,
        lora_rank=4, lora_targets=("q", "v", "o", "up", "down"), dropout_rate=0.0,
        attention_dropout_rate=0.0,
    )  # fmt: skip
    model = DecoderOnlyTransformer(config)
    tokens = jax.random.randint(jax.random.key(1), (8, 16), 1, 40)
    params = nn.unbox(model.init(jax.random.key(0), tokens))["params"]
    # A base that is not at init, and adapters whose B is not zero, as after some steps.
    params = jax.tree_util.tree_map_with_path(
        lambda path, x: x + 0.01 * jax.random.normal(jax.random.key(len(path)), x.shape), params
    )
    labels = jax.tree.map(lambda m: "train" if m else "frozen", lora_mask(params))
    section = optim.OptimizerConfig(
        name=name, b1=0.9, b2=0.98, eps=1e-9, weight_decay=0.0, grad_clip_norm=1.0,
        grad_accum_steps=1, options=MuonOptions() if name == "muon" else None,
    )  # fmt: skip
    tx = optim.make_optimizer(section, _constant(2e-3), lambda p: labels)

    def loss_fn(p):
        logits = model.apply({"params": p}, tokens[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    state, losses, first = tx.init(params), [], None
    for _ in range(steps):
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, state = tx.update(grads, state, params)
        first = updates if first is None else first
        params = optax.apply_updates(params, updates)
        losses.append(float(loss))
    return losses, state, first


def test_muon_updates_the_lora_adapters():
    """With LoRA every trained leaf is an adapter: Muon orthogonalises them (its momentum
    holds every adapter), and their update is not AdamW's."""
    _, state, muon_update = _lora_run("muon")
    _, _, adamw_update = _lora_run("adamw")
    momenta = [
        leaf
        for s in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, MuonState))
        if isinstance(s, MuonState)
        for leaf in jax.tree.leaves(s.mu)
    ]
    leaves, adapter = jax.tree.leaves(muon_update), jax.tree.leaves(lora_mask(muon_update))
    adapters = [x for x, is_adapter in zip(leaves, adapter, strict=True) if is_adapter]
    assert sum(x.size for x in momenta) == sum(x.size for x in adapters) > 0
    flat = jax.tree_util.tree_leaves_with_path(muon_update)
    other = dict(jax.tree_util.tree_leaves_with_path(adamw_update))
    for path, update in flat:
        if path[-1].key in ("lora_a", "lora_b"):
            assert not np.allclose(update, other[path]), jax.tree_util.keystr(path)
