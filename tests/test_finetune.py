"""Fine-tuning from a Hugging Face directory (`--config.init_from`), offline: tiny random
GPT-2 and Llama models with a byte-level BPE tokenizer, written by `train.tiny_pretrained`
with transformers and `tokenizers`, checked against transformers itself."""

import dataclasses
import json
import pathlib
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import traverse_util

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from configs import finetune_gpt2  # noqa: E402
from flax_transformer import muon_partition  # noqa: E402
from train.config import config_lib  # noqa: E402
from train.core.rundir import RunDir, prepare_workdir  # noqa: E402
from train.data.tokenizers import source_tokenizer  # noqa: E402
from train.export import export_adapters, export_run  # noqa: E402
from train.formats import sources  # noqa: E402
from train.formats.corpora.bibles import load_kjv_lines  # noqa: E402
from train.formats.sources import hf  # noqa: E402
from train.program import finetune, weights  # noqa: E402
from train.program import loop as train_lib  # noqa: E402
from train.program.checkpoint import Checkpointer  # noqa: E402
from train.program.trained import load_trained  # noqa: E402
from train.tasks.common.inference import sample_text  # noqa: E402
from train.tiny_pretrained import write_tiny_model  # noqa: E402

FAMILIES = ("gpt2", "llama")
PROMPTS = ("In the beginning", "And God said", "Blessed are\tthe")
ATOL = 1e-5


@pytest.fixture(scope="module")
def kjv_text():
    return load_kjv_lines()[:1200]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory, kjv_text):
    """family -> a tiny save_pretrained directory (vocabulary 320, 2 layers, width 32)."""
    root = tmp_path_factory.mktemp("hf")
    return {
        family: write_tiny_model(root / family, family, texts=kjv_text, vocab_size=320)
        for family in FAMILIES
    }


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, kjv_text):
    path = tmp_path_factory.mktemp("corpus") / "kjv.txt"
    path.write_text("\n".join(kjv_text[:600]) + "\n", encoding="utf-8")
    return path


def _config(model_dir, corpus, **overrides):
    config = finetune_gpt2.get_config()
    config.init_from = str(model_dir)
    config.corpus = "text"
    config.corpus_path = str(corpus)
    config.max_len = 32
    config.batch_size = 4
    config.valid_fraction = 0.1
    config.test_fraction = 0.0
    config.model.dropout_rate = 0.0  # the train step's loss is compared with a forward pass
    config.model.attention_dropout_rate = 0.0
    config.num_train_steps = 1
    config.warmup_steps = 0
    config.schedule = "constant"
    config.eval_every_steps = 1000
    config.checkpoint_every_steps = 1000
    config.num_eval_batches = 4
    config.async_checkpoints = False
    config.sample_prompts = PROMPTS
    config.max_decode_len = 8
    config.temperature = 0.0
    config.top_k = 0
    for key, value in overrides.items():
        *parents, leaf = key.split(".")
        target = config
        for parent in parents:
            target = target[parent]
        target[leaf] = value
    return config


def _hf_model(model_dir):
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    return model.eval()


def _hf_logits(model, ids: np.ndarray, vocab: int) -> np.ndarray:
    with torch.no_grad():
        return model(torch.as_tensor(ids, dtype=torch.long)).logits[..., :vocab].numpy()


def test_hf_defaults_are_transformers_defaults():
    for model_type, cls in (
        ("gpt2", transformers.GPT2Config),
        ("llama", transformers.LlamaConfig),
        ("mistral", transformers.MistralConfig),
    ):
        theirs = cls()
        for key, ours in hf.HF_DEFAULTS[model_type].items():
            value = getattr(theirs, key, None)
            if key == "num_key_value_heads" and ours is None:  # None: as many as heads
                value = None if value == theirs.num_attention_heads else value
            if key == "head_dim" and ours is None:  # None: hidden_size / heads
                value = None if value == theirs.hidden_size // theirs.num_attention_heads else value
            assert value == ours, (model_type, key, value, ours)


@pytest.mark.parametrize("family", FAMILIES)
def test_pretrained_tokenizer_round_trips_any_text(model_dirs, family):
    tokenizer = source_tokenizer(sources.read_source(model_dirs[family]))
    texts = [
        "def f(x):\n\tif x:\n        return  x  # two spaces\n\n",
        "emoji 😀👍🏽, CJK 中文字, combining e\u0301, ZWJ 👩\u200d💻, \x00 control",
        "   leading and trailing   ",
        "",
    ]
    for text in texts:
        ids = tokenizer.encode(text)
        assert all(0 <= i < tokenizer.vocab_size - 1 for i in ids)  # never the added pad
        framed = [tokenizer.bos_id, *ids, tokenizer.eos_id, tokenizer.pad_id]
        assert tokenizer.decode(framed) == text
    # The pad id is the added one, after the checkpoint's vocabulary.
    hf = json.loads((model_dirs[family] / "config.json").read_text())
    assert tokenizer.pad_id == hf["vocab_size"] == tokenizer.vocab_size - 1
    assert (tokenizer.bos_id, tokenizer.eos_id) == (hf["bos_token_id"], hf["eos_token_id"])


def _start(config, workdir):
    experiment = config_lib.validate_config(config)
    run = RunDir(prepare_workdir(str(workdir)))
    checkpointer = Checkpointer(run.path, keep=1, asynchronous=False)
    try:
        return experiment, train_lib._start(experiment, run, checkpointer)
    finally:
        checkpointer.close()


@pytest.mark.parametrize("family", FAMILIES)
def test_first_batch_loss_equals_transformers(model_dirs, corpus, tmp_path, family):
    experiment, start = _start(_config(model_dirs[family], corpus), tmp_path / "run")
    batch = next(iter(start.stream))
    _, metrics = start.program.train_step(start.state, start.program.put_batch(batch))
    ours = float(metrics["loss"] / metrics["tokens"])
    vocab = experiment.model.pad_id  # the checkpoint's V
    inputs, targets = np.asarray(batch["inputs"]), np.asarray(batch["targets"])
    real = targets != vocab
    logits = _hf_logits(_hf_model(model_dirs[family]), np.where(inputs == vocab, 0, inputs), vocab)
    logp = torch.log_softmax(torch.as_tensor(logits), -1).numpy()
    nll = -np.take_along_axis(logp, np.where(real, targets, 0)[..., None], -1)[..., 0]
    theirs = float(nll[real].mean())
    assert real.sum() == int(metrics["tokens"]) > 0
    assert abs(ours - theirs) < ATOL, (ours, theirs)


@pytest.fixture(scope="module")
def lr0_runs(model_dirs, corpus, tmp_path_factory):
    """family -> a finished run of one step at learning rate 0: the pretrained model as is."""
    runs = {}
    for family in FAMILIES:
        workdir = tmp_path_factory.mktemp(f"lr0-{family}")
        config = _config(model_dirs[family], corpus, learning_rate=0.0)
        results = train_lib.train_and_evaluate(config, str(workdir))
        runs[family] = (workdir, results)
    return runs


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_samples_equal_transformers_generate(model_dirs, lr0_runs, family):
    workdir, _ = lr0_runs[family]
    trained = load_trained(workdir)
    tokenizer = trained.tokenizer
    options = dataclasses.replace(trained.experiment.eval.decode, temperature=0.0)
    ours = sample_text(trained.model, trained.params, tokenizer, PROMPTS, options)
    hf = _hf_model(model_dirs[family])
    # The prompt as transformers' users encode it: the model's own tokenizer, its
    # post-processor deciding the BOS (Llama's adds one, GPT-2's none).
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dirs[family]))
    for prompt, text in zip(PROMPTS, ours, strict=True):
        ids = hf_tokenizer(prompt)["input_ids"]
        assert ids == tokenizer.specials.prompt(tokenizer.encode(prompt))
        with torch.no_grad():
            out = hf.generate(
                torch.tensor([ids]),
                max_new_tokens=8,
                do_sample=False,
                eos_token_id=tokenizer.eos_id,
                pad_token_id=tokenizer.eos_id,
            )[0, len(ids) :].tolist()
        if tokenizer.eos_id in out:
            out = out[: out.index(tokenizer.eos_id)]
        assert text == tokenizer.decode(ids + out), (prompt, text)
    # The run wrote the model's own tokenizer beside its checkpoints.
    assert (workdir / "pretrained" / "tokenizer.json").is_file()


@pytest.mark.parametrize("family", FAMILIES)
def test_finetune_lowers_validation_loss_and_exports_to_transformers(
    model_dirs, corpus, lr0_runs, tmp_path, family
):
    before = lr0_runs[family][1]["valid"]["loss"]
    config = _config(model_dirs[family], corpus, learning_rate=3e-3, num_train_steps=30)
    valid = train_lib.train_and_evaluate(config, str(tmp_path / "run"))["valid"]
    after = valid["loss"]
    assert after < before - 0.3, (before, after)
    # Every figure is over the model's own ids (none counts the added pad id).
    assert valid["nll"] == pytest.approx(after) and np.isfinite(valid["bits_per_char"])
    out = export_run(tmp_path / "run", tmp_path / "hf")
    trained = load_trained(tmp_path / "run")
    vocab = trained.model.config.pad_id
    ids = np.asarray([trained.tokenizer.encode("And the earth was without form")])
    ours = trained.model.apply({"params": trained.params}, ids)[..., :vocab]
    theirs = _hf_logits(_hf_model(out), ids, vocab)
    np.testing.assert_allclose(np.asarray(ours), theirs, atol=ATOL, rtol=0)
    # The exported directory has the source's vocabulary (no added pad id) and tokenizer.
    assert json.loads((out / "config.json").read_text())["vocab_size"] == vocab
    assert (out / "tokenizer.json").read_bytes() == (
        model_dirs[family] / "tokenizer.json"
    ).read_bytes()


def test_freezing_embeddings_keeps_them_and_gives_them_no_optimizer_state(
    model_dirs, corpus, tmp_path
):
    config = _config(model_dirs["gpt2"], corpus, learning_rate=1e-2, freeze="embeddings")
    experiment, start = _start(config, tmp_path / "run")
    labels = finetune.param_labels(experiment.optimizer, experiment.model)(start.state.params)
    assert labels["embed"]["embedding"] == "frozen"
    assert labels["decoder"]["layers_0"]["ffn"]["wi_kernel"] == "pretrained"
    before = jax.tree.map(np.asarray, start.state.params)
    state, _ = start.program.train_step(start.state, start.program.put_batch(next(start.stream)))
    after = jax.tree.map(np.asarray, state.params)
    np.testing.assert_array_equal(after["embed"]["embedding"], before["embed"]["embedding"])
    np.testing.assert_array_equal(
        after["decoder"]["positions"]["pos_embedding"],
        before["decoder"]["positions"]["pos_embedding"],
    )
    assert not np.array_equal(
        after["decoder"]["layers_0"]["ffn"]["wi_kernel"],
        before["decoder"]["layers_0"]["ffn"]["wi_kernel"],
    )
    # Adam's moments exist for the trained parameters only.
    moments = sum(x.size for x in jax.tree.leaves(state.opt_state))
    trained = sum(x.size for x in jax.tree.leaves(before)) - before["embed"]["embedding"].size
    trained -= before["decoder"]["positions"]["pos_embedding"].size
    assert 2 * trained <= moments < 2 * trained + 16  # mu and nu, plus counters


def test_muon_fine_tunes_within_the_groups(model_dirs, corpus, tmp_path):
    """--config.optimizer=muon with frozen embeddings: they stay and hold no state; the
    layers' matrices take Muon (one moment), the other trained parameters AdamW (two)."""
    config = _config(
        model_dirs["gpt2"],
        corpus,
        learning_rate=1e-2,
        freeze="embeddings",
        **{"optimizer.name": "muon"},
    )
    experiment, start = _start(config, tmp_path / "run")
    before = jax.tree.map(np.asarray, start.state.params)
    state, _ = start.program.train_step(start.state, start.program.put_batch(next(start.stream)))
    after = jax.tree.map(np.asarray, state.params)
    np.testing.assert_array_equal(after["embed"]["embedding"], before["embed"]["embedding"])
    for name in ("wi_kernel", "wi_bias"):
        ffn = (after["decoder"]["layers_0"]["ffn"], before["decoder"]["layers_0"]["ffn"])
        assert not np.array_equal(ffn[0][name], ffn[1][name])
    groups = finetune.param_labels(experiment.optimizer, experiment.model)(before)
    kinds = muon_partition(before)
    sizes = {"muon": 0, "adamw": 0}
    for x, group, kind in zip(*map(jax.tree.leaves, (before, groups, kinds)), strict=True):
        if group != "frozen":
            sizes[kind] += x.size
    assert sizes["muon"] and sizes["adamw"]
    moments = sum(x.size for x in jax.tree.leaves(state.opt_state))
    assert sizes["muon"] + 2 * sizes["adamw"] <= moments < sizes["muon"] + 2 * sizes["adamw"] + 32


def _refusal(config) -> str:
    with pytest.raises(ValueError) as info:
        config_lib.validate_config(config)
    return str(info.value)


def test_refusals_name_the_field_and_the_fix(model_dirs, corpus, tmp_path):
    gpt2 = model_dirs["gpt2"]
    assert "d_model=64 contradicts" in _refusal(_config(gpt2, corpus, **{"model.d_model": 64}))
    assert "max_len <= 128" in _refusal(_config(gpt2, corpus, max_len=256))
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text((gpt2 / "config.json").read_text())
    assert "no weights" in _refusal(_config(empty, corpus))
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"model_type": "bert"}))
    assert "model_type='bert' is not supported" in _refusal(_config(bert, corpus))
    config = _config(gpt2, corpus)
    config.tokenizer = "byte"
    assert "tokenizer='pretrained'" in _refusal(config)
    # Options that would do nothing are refused, not ignored.
    lora = {"model.lora_rank": 4}
    assert "does nothing with LoRA" in _refusal(_config(gpt2, corpus, freeze="embeddings", **lora))
    assert "does nothing with LoRA" in _refusal(
        _config(gpt2, corpus, pretrained_lr_scale=0.5, **lora)
    )


def test_the_command_refuses_in_one_line_before_any_step(model_dirs, corpus, tmp_path):
    args = [
        sys.executable,
        "-m",
        "train.main",
        "--config",
        "configs/finetune_gpt2.py",
        f"--config.init_from={model_dirs['gpt2']}",
        "--config.model.num_layers=3",
        f"--workdir={tmp_path / 'run'}",
    ]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith("error: --config.model.num_layers=3 contradicts")
    )
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_sharded_checkpoints_and_the_scanned_layout_load_the_same_weights(model_dirs, tmp_path):
    source = sources.read_source(model_dirs["llama"])
    sharded = tmp_path / "sharded"
    _hf_model(model_dirs["llama"]).save_pretrained(sharded, max_shard_size="50KB")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (sharded / name).write_bytes((model_dirs["llama"] / name).read_bytes())
    assert (sharded / hf.WEIGHTS_INDEX_FILE).is_file()
    flat, _ = weights.load_weights(source, source.model)
    again, _ = weights.load_weights(sources.read_source(sharded), source.model)
    jax.tree.map(np.testing.assert_array_equal, flat, again)
    scanned_config = dataclasses.replace(source.model, scan_layers=True)
    scanned, _ = weights.load_weights(source, scanned_config)
    for i in range(source.model.num_layers):
        layer = jax.tree.map(lambda x, i=i: x[i], scanned["decoder"]["layers"])
        jax.tree.map(np.testing.assert_array_equal, flat["decoder"][f"layers_{i}"], layer)


LORA_TARGETS = ("q", "v", "o", "up", "down")


def test_lora_trains_only_adapters_and_exports_merged(model_dirs, corpus, tmp_path, monkeypatch):
    from flax_transformer import lora_param_count

    overrides = {"model.lora_rank": 4, "model.lora_targets": LORA_TARGETS}
    config = _config(model_dirs["gpt2"], corpus, learning_rate=1e-2, num_train_steps=5, **overrides)
    experiment, start = _start(config, tmp_path / "probe")
    before = jax.tree.map(np.asarray, start.state.params)
    state = start.state
    for _ in range(3):
        state, _ = start.program.train_step(state, start.program.put_batch(next(start.stream)))
    flat_before = traverse_util.flatten_dict(before)
    flat_after = traverse_util.flatten_dict(jax.tree.map(np.asarray, state.params))
    adapters = {k for k in flat_before if finetune.is_adapter(k)}
    assert adapters and all(
        np.array_equal(flat_before[k], flat_after[k]) != (k in adapters) for k in flat_before
    ), "only the adapters train"
    count = sum(flat_before[k].size for k in adapters)
    assert count == lora_param_count(experiment.model, decoder_only=True)
    # Adam's two moments for the adapters only.
    moments = sum(x.size for x in jax.tree.leaves(state.opt_state))
    assert 2 * count <= moments < 2 * count + 16
    # No weight gradient of a frozen matrix is computed: the step takes fewer FLOPs than
    # the same step differentiated with respect to every parameter.
    batch = start.program.put_batch(next(start.stream))
    lean = start.program.train_step.lower(state, batch).compile().cost_analysis()["flops"]
    monkeypatch.setattr(finetune, "frozen_mask", lambda optimizer, model: None)
    _, every = _start(config, tmp_path / "every")
    whole = every.program.train_step.lower(state, batch).compile().cost_analysis()["flops"]
    monkeypatch.undo()
    assert lean < whole, (lean, whole)
    # A run, then its export with the adapters merged: transformers' logits equal the
    # unmerged model's.
    config.num_train_steps = 5
    train_lib.train_and_evaluate(config, str(tmp_path / "run"))
    out = export_run(tmp_path / "run", tmp_path / "hf")
    trained = load_trained(tmp_path / "run")
    assert trained.model.config.lora_rank == 4
    vocab = trained.model.config.pad_id
    ids = np.asarray([trained.tokenizer.encode("And the earth was without form")])
    ours = trained.model.apply({"params": trained.params}, ids)[..., :vocab]
    theirs = _hf_logits(_hf_model(out), ids, vocab)
    np.testing.assert_allclose(np.asarray(ours), theirs, atol=ATOL, rtol=0)


def test_a_run_directory_is_a_source_too(model_dirs, corpus, lr0_runs, tmp_path):
    # Fine-tune the (unchanged) pretrained model of an earlier run: the same validation loss
    # at learning rate 0, and the tokenizer the run used.
    first, results = lr0_runs["gpt2"]
    config = _config(first, corpus, learning_rate=0.0)
    again = train_lib.train_and_evaluate(config, str(tmp_path / "run"))
    assert again["valid"]["loss"] == pytest.approx(results["valid"]["loss"], abs=1e-6)
    tokenizer = load_trained(tmp_path / "run").tokenizer
    assert tokenizer.encode("In the beginning") == load_trained(first).tokenizer.encode(
        "In the beginning"
    )


def test_adapters_alone_load_into_peft(model_dirs, corpus, tmp_path):
    peft = pytest.importorskip("peft")
    overrides = {"model.lora_rank": 4, "model.lora_targets": ("q", "k", "o", "gate", "down")}
    config = _config(model_dirs["llama"], corpus, learning_rate=1e-2, num_train_steps=4)
    for key, value in overrides.items():
        config.model[key.removeprefix("model.")] = value
    train_lib.train_and_evaluate(config, str(tmp_path / "run"))
    out = export_adapters(tmp_path / "run", tmp_path / "adapters")
    trained = load_trained(tmp_path / "run")
    vocab = trained.model.config.pad_id
    ids = np.asarray([trained.tokenizer.encode("And the earth was without form")])
    ours = trained.model.apply({"params": trained.params}, ids)[..., :vocab]
    model = peft.PeftModel.from_pretrained(_hf_model(model_dirs["llama"]), str(out)).eval()
    with torch.no_grad():
        theirs = model(torch.as_tensor(ids)).logits[..., :vocab].numpy()
    np.testing.assert_allclose(np.asarray(ours), theirs, atol=ATOL, rtol=0)
    # The adapters trained: the model is not the base one.
    base = _hf_logits(_hf_model(model_dirs["llama"]), ids, vocab)
    assert np.abs(theirs - base).max() > 1e-3


_SHARDED_SCRIPT = """
import json, os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
import jax
sys.path.insert(0, {tests!r})
from test_finetune import _config
from train.program import loop as train_lib
from train.config import config_lib  # noqa: E402
from train.program.checkpoint import Checkpointer
from train.core.rundir import RunDir, prepare_workdir
config = _config({model!r}, {corpus!r}, learning_rate=0.0, mesh_shape=(1, 2, 2))
results = train_lib.train_and_evaluate(config, {workdir!r})
experiment = config_lib.validate_config(config)
run = RunDir(prepare_workdir({probe!r}))
start = train_lib._start(experiment, run, Checkpointer(run.path, keep=1, asynchronous=False))
embedding = start.state.params["embed"]["embedding"]
shard = embedding.addressable_shards[0].data.shape
print(json.dumps({{"loss": results["valid"]["loss"], "shape": embedding.shape, "shard": shard}}))
"""


@pytest.mark.slow
def test_weights_load_onto_an_fsdp_and_tensor_mesh(model_dirs, corpus, lr0_runs, tmp_path):
    # 4 simulated devices, mesh (data 1, fsdp 2, tensor 2): each parameter is placed in its
    # shards as it is read; the model is the same as on one device.
    script = _SHARDED_SCRIPT.format(
        tests=str(pathlib.Path(__file__).parent),
        model=str(model_dirs["llama"]),
        corpus=str(corpus),
        workdir=str(tmp_path / "run"),
        probe=str(tmp_path / "probe"),
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["loss"] == pytest.approx(lr0_runs["llama"][1]["valid"]["loss"], rel=1e-5)
    assert np.prod(report["shard"]) < np.prod(report["shape"])  # split, not replicated


def test_a_store_of_another_models_tokenizer_is_refused_before_any_step(
    model_dirs, corpus, tmp_path
):
    store = tmp_path / "store"
    config = _config(model_dirs["gpt2"], corpus, store_dir=str(store), num_train_steps=1)
    train_lib.train_and_evaluate(config, str(tmp_path / "gpt2"))
    assert (store / "pretrained" / "tokenizer.json").is_file()
    other = _config(model_dirs["llama"], corpus, store_dir=str(store), num_train_steps=1)
    with pytest.raises(ValueError, match="holds the ids of another tokenizer"):
        train_lib.train_and_evaluate(other, str(tmp_path / "llama"))
    assert not any((tmp_path / "llama" / "checkpoints").glob("*"))  # no step was saved


def test_a_checkpoint_missing_a_weight_is_named(model_dirs, tmp_path):
    from safetensors.numpy import load_file, save_file

    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (broken / name).write_bytes((model_dirs["gpt2"] / name).read_bytes())
    tensors = load_file(str(model_dirs["gpt2"] / "model.safetensors"))
    del tensors["transformer.h.1.mlp.c_fc.weight"]
    save_file(tensors, str(broken / "model.safetensors"))
    source = sources.read_source(broken)
    with pytest.raises(ValueError, match=r"missing .*transformer\.h\.1\.mlp\.c_fc\.weight"):
        weights.load_weights(source, source.model)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("post_processor", ["saved", "bos", "none"])
def test_text_is_framed_as_the_models_own_tokenizer_frames_it(
    model_dirs, tmp_path, family, post_processor
):
    """A prompt starts with the BOS exactly where transformers' tokenizer of the same
    directory puts one: tokenizer.json's post-processor decides (transformers 5 ignores
    tokenizer_config.json's add_bos_token beside a tokenizer.json, and so do we)."""
    directory = tmp_path / family
    shutil.copytree(model_dirs[family], directory)
    rust = tokenizers.Tokenizer.from_file(str(directory / hf.TOKENIZER_FILE))
    bos = json.loads((directory / "config.json").read_text())["bos_token_id"]
    if post_processor == "bos":
        token = rust.id_to_token(bos)
        rust.post_processor = tokenizers.processors.TemplateProcessing(
            single=f"{token} $A", special_tokens=[(token, bos)]
        )
    elif post_processor == "none":
        rust.post_processor = None
    rust.save(str(directory / hf.TOKENIZER_FILE))
    config_path = directory / hf.TOKENIZER_CONFIG_FILE
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config_path.write_text(json.dumps({**config, "add_bos_token": True}), encoding="utf-8")
    ours = source_tokenizer(sources.read_source(directory))
    theirs = transformers.AutoTokenizer.from_pretrained(str(directory))
    for text in ("And God said", "x\n  y", "In the beginning God created"):
        assert ours.specials.prompt(ours.encode(text)) == theirs(text)["input_ids"]
    assert ours.specials.starts_with_bos == (post_processor == "bos")
    framed = ours.specials.document(ours.encode("Amen."))
    assert framed[-1] == ours.eos_id
    assert (framed[0] == ours.bos_id) == (post_processor == "bos")


def test_the_checkpoints_dropout_unless_the_config_sets_one(model_dirs, corpus):
    """GPT-2's config.json says resid_pdrop = attn_pdrop = 0.1, Llama's attention_dropout 0 and
    no residual dropout; configs/finetune_gpt2.py leaves the rates None, so each run keeps its
    checkpoint's, and a rate given on the command line wins."""

    def rates(family, **model):
        config = finetune_gpt2.get_config()
        config.update(init_from=str(model_dirs[family]), corpus="text", corpus_path=str(corpus))
        config.model.update(model)
        model = config_lib.validate_config(config).model
        return model.dropout_rate, model.attention_dropout_rate

    assert rates("gpt2") == (0.1, 0.1)
    assert rates("llama") == (0.0, 0.0)
    assert rates("gpt2", dropout_rate=0.0) == (0.0, 0.1)
    assert rates("llama", dropout_rate=0.2, attention_dropout_rate=0.05) == (0.2, 0.05)


def test_init_from_a_translation_run_is_refused_naming_its_task(tmp_path):
    """A run directory starts another run when it trained a decoder-only model; a translation
    run's encoder-decoder is refused in one line naming its task, before any weight is read."""
    from configs import default

    run = tmp_path / "translation_run"
    (run / "checkpoints" / "1").mkdir(parents=True)
    (run / "config.json").write_text(default.get_config().to_json(), encoding="utf-8")
    config = finetune_gpt2.get_config()
    config.init_from = str(run)
    with pytest.raises(ValueError, match=r"the run trained task='translation', an encoder-deco"):
        config_lib.validate_config(config)


def test_a_run_directory_loads_into_the_other_layer_layout(model_dirs, corpus, lr0_runs, tmp_path):
    # An unrolled run's layers stacked for a scanned model, and back: the same validation
    # loss at learning rate 0 each way (the weights moved, not changed).
    first, results = lr0_runs["gpt2"]
    scanned = _config(first, corpus, learning_rate=0.0)
    scanned.model.scan_layers = True
    again = train_lib.train_and_evaluate(scanned, str(tmp_path / "scanned"))
    assert again["valid"]["loss"] == pytest.approx(results["valid"]["loss"], abs=1e-5)
    assert _layer_keys(tmp_path / "scanned") == {"layers"}
    back = _config(str(tmp_path / "scanned"), corpus, learning_rate=0.0)
    once_more = train_lib.train_and_evaluate(back, str(tmp_path / "back"))
    assert once_more["valid"]["loss"] == pytest.approx(results["valid"]["loss"], abs=1e-5)
    assert "layers_0" in _layer_keys(tmp_path / "back")


def _layer_keys(workdir) -> set[str]:
    """The names of a trained run's layer subtrees ('layers', or 'layers_0', ...)."""
    paths = traverse_util.flatten_dict(load_trained(workdir).params)
    return {part for path in paths for part in path if part.startswith("layers")}


def test_relayout_layers_stacks_and_splits_at_any_depth():
    from train.program.weights import relayout_layers

    unrolled = {
        "embed": {"embedding": np.ones((3, 2))},
        "decoder": {f"layers_{i}": {"w": np.full((2,), i)} for i in range(12)},
    }
    stacked = relayout_layers(unrolled, True)
    assert set(stacked["decoder"]) == {"layers"}
    np.testing.assert_array_equal(stacked["decoder"]["layers"]["w"][:, 0], np.arange(12))
    back = relayout_layers(stacked, False)
    assert jax.tree.map(np.shape, back) == jax.tree.map(np.shape, unrolled)
    jax.tree.map(np.testing.assert_array_equal, back, unrolled)
