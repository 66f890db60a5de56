"""Exporting chat and preference runs (`--config.task=chat` / `dpo`), the fine-tuning user's
path SFT -> DPO -> llama.cpp, offline: a tiny random Llama with ChatML's tokens and template
(`write_tiny_model(chat=True)`) tuned on a few verse conversations with LoRA and a chat
template file of its own, and preference-tuned (every weight), each exported as a GGUF file
and a Hugging Face directory.

- the exports' logits are the run's (read back by `read_gguf` and by transformers);
- the chat template in the files is the one the run trained with: the SFT run's own file, and
  for the DPO run started from it (which gave none) the same, inherited, as its training
  rendered the pairs;
- a translation run (an encoder-decoder) is refused in one line naming its task.
"""

from __future__ import annotations

import json
import pathlib
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")

from flax_transformer import DecoderOnlyTransformer, Transformer, read_gguf  # noqa: E402
from train.export import write_trained, write_trained_gguf  # noqa: E402
from train.formats.corpora.bibles import load_kjv_web_pairs  # noqa: E402
from train.program import loop as train_lib  # noqa: E402
from train.program.trained import load_trained  # noqa: E402
from train.tiny_pretrained import CHATML_TEMPLATE, write_tiny_model  # noqa: E402

# Exported logits against the run's, in float32 (as tests/test_gguf_export.py): the same
# products summed in other orders, so equal to float32 rounding relative to the largest logit.
RELATIVE = 1e-5
# The SFT run's own template: ChatML's tokens with "role:" headers, so that a file carrying
# the model's template instead shows.
OWN_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}:{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant:{% endif %}"
)
QUESTION = "Modernize: And God said, Let there be light."


@pytest.fixture(scope="module")
def verses():
    return [(k, w) for k, w in load_kjv_web_pairs()[:2000] if len(k) + len(w) < 120][:40]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, verses):
    texts = [text for pair in verses for text in pair]
    root = tmp_path_factory.mktemp("chat_model")
    return write_tiny_model(root, "llama", texts=texts, vocab_size=400, max_len=256, chat=True)


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _short_run(config, **overrides):
    """`config` as a 2-step run of 4 rows at a rate that moves a tiny model's weights."""
    config.valid_fraction = config.test_fraction = 0.0
    config.max_len = 160
    config.batch_size = 4
    config.num_train_steps = 2
    config.learning_rate = 1e-2
    config.warmup_steps = 0
    config.schedule = "constant"
    config.eval_every_steps = config.checkpoint_every_steps = 1000
    config.num_eval_batches = 1
    config.async_checkpoints = False
    config.bleu_examples = 0
    config.num_samples = 0
    config.update(overrides)
    return config


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory, model_dir, verses):
    """A LoRA chat run (q and v) with its own template file."""
    from configs import sft_smollm2

    root = tmp_path_factory.mktemp("sft")
    chats = [
        {
            "messages": [
                {"role": "user", "content": "Modernize: " + k},
                {"role": "assistant", "content": w},
            ]
        }
        for k, w in verses
    ]
    template = root / "own.jinja"
    template.write_text(OWN_TEMPLATE, encoding="utf-8")
    config = _short_run(
        sft_smollm2.get_config(),
        init_from=str(model_dir),
        corpus="chat",
        corpus_path=str(_write(root / "train.jsonl", chats[:32])),
        valid_path=str(_write(root / "valid.jsonl", chats[32:])),
        chat_template=str(template),
    )
    config.model.lora_rank = 2
    config.model.lora_targets = ("q", "v")
    train_lib.train_and_evaluate(config, root / "run")
    return root / "run"


@pytest.fixture(scope="module")
def dpo_run(tmp_path_factory, sft_run, verses):
    """A preference run started from the SFT run (the user's path SFT -> DPO; every weight
    trained), with no template of its own: it renders its pairs with the template the SFT
    run trained with (`inherited_template`), not the model's ChatML."""
    from configs import dpo_smollm2

    root = tmp_path_factory.mktemp("dpo")
    pairs = [{"prompt": "Modernize: " + k, "chosen": w, "rejected": k} for k, w in verses]
    config = _short_run(
        dpo_smollm2.get_config(),
        init_from=str(sft_run),
        corpus="preference",
        corpus_path=str(_write(root / "train.jsonl", pairs[:32])),
        valid_path=str(_write(root / "valid.jsonl", pairs[32:])),
        learning_rate=1e-3,
    )
    train_lib.train_and_evaluate(config, root / "run")
    return root / "run"


def _our_logits(trained, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """A conversation's ids (as the run renders it) and the run's logits over the model's
    own `vocab_size` ids (the program's added pad id left out): (ids (1, T), (1, T, V))."""
    ids = np.asarray([trained.tokenizer.encode(f"<|im_start|>user\n{QUESTION}<|im_end|>\n")])
    ours = trained.model.apply({"params": trained.params}, jnp.asarray(ids))
    return ids, np.asarray(ours)[..., :vocab_size]


def _hf_logits(directory, ids: np.ndarray) -> np.ndarray:
    """transformers' logits of a Hugging Face directory for `ids` (B, T): (B, T, V)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32)
    with torch.no_grad():
        return model.eval()(torch.as_tensor(ids)).logits.numpy()


def _assert_close(exported, ours):
    assert np.abs(ours).max() > 0.1  # logits large enough for the comparison to mean something
    np.testing.assert_allclose(exported, ours, rtol=0, atol=RELATIVE * np.abs(ours).max())


@pytest.mark.parametrize(
    "run, template",
    [("sft_run", OWN_TEMPLATE), ("dpo_run", OWN_TEMPLATE)],
    ids=["sft", "dpo"],
)
def test_gguf_export_has_the_runs_logits_and_chat_template(request, tmp_path, run, template):
    workdir = request.getfixturevalue(run)
    trained = load_trained(workdir)
    out = write_trained_gguf(trained, workdir, tmp_path / "run.gguf", "f32")
    config, variables, vocab, written_template = read_gguf(out)
    assert written_template == template
    assert config.lora_rank == 0 and config.vocab_size == len(vocab)  # merged, pad id dropped
    ids, ours = _our_logits(trained, config.vocab_size)
    _assert_close(np.asarray(DecoderOnlyTransformer(config).apply(variables, ids)), ours)


@pytest.mark.parametrize(
    "run, template",
    [("sft_run", OWN_TEMPLATE), ("dpo_run", OWN_TEMPLATE)],
    ids=["sft", "dpo"],
)
def test_hf_export_loads_in_transformers_with_the_runs_logits_and_template(
    request, tmp_path, run, template
):
    workdir = request.getfixturevalue(run)
    trained = load_trained(workdir)
    out = write_trained(trained, workdir, tmp_path / "hf")
    assert not (out / "chat_template.jinja").exists()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    assert tokenizer.chat_template == template
    vocab_size = json.loads((out / "config.json").read_text())["vocab_size"]
    ids, ours = _our_logits(trained, vocab_size)
    _assert_close(_hf_logits(out, ids), ours)
    # Training moved the model (LoRA merged, for the SFT run): the export is not the start.
    start = _hf_logits(request.getfixturevalue("model_dir"), ids)
    assert not np.allclose(start, ours, rtol=0, atol=1e-3)
    # transformers renders a conversation through the file's template as the run did.
    messages = [{"role": "user", "content": QUESTION}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered.startswith("<|im_start|>user:" + QUESTION)


def test_a_translation_run_is_refused_naming_its_task(tmp_path, tiny_config):
    """An encoder-decoder has no decoder-only export: one line, before anything is written."""
    variables = Transformer(tiny_config).init(
        jax.random.key(0), jnp.ones((1, 4), jnp.int32), jnp.ones((1, 4), jnp.int32)
    )
    trained = types.SimpleNamespace(
        model=Transformer(tiny_config),
        params=variables["params"],
        experiment=types.SimpleNamespace(data=types.SimpleNamespace(task="translation")),
    )
    for write, what in (
        (write_trained, "a Hugging Face directory"),
        (write_trained_gguf, "a GGUF file"),
    ):
        with pytest.raises(ValueError) as err:
            write(trained, tmp_path, tmp_path / "out")
        message = str(err.value)
        assert message.startswith(f"{tmp_path} trained task='translation', a Transformer; ")
        assert f"writes {what} of a decoder-only language model" in message
        assert "'lm', 'chat', 'dpo'" in message and "\n" not in message
    assert not (tmp_path / "out").exists()


def test_the_run_keeps_its_template_so_a_moved_or_edited_file_does_not_matter(sft_run, tmp_path):
    """The run copied its template file at its start (W/chat_template.jinja): with the
    user's file edited and then gone, the export and `train.sample --chat` still use the
    template it trained with; a run without the copy (made before it was kept) reads the
    user's path, and with the file gone is refused in one line, nothing written."""
    from train.sample import chat_replies

    trained = load_trained(sft_run)
    user_file = pathlib.Path(trained.experiment.data.chat_template)
    copy = sft_run / "chat_template.jinja"
    assert copy.read_text(encoding="utf-8") == OWN_TEMPLATE
    moved, kept = tmp_path / "moved.jinja", tmp_path / "kept.jinja"
    user_file.rename(moved)
    try:
        user_file.write_text("{{ messages[0]['content'] }}", encoding="utf-8")  # edited
        out = write_trained(trained, sft_run, tmp_path / "edited")
        config = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
        assert config["chat_template"] == OWN_TEMPLATE
        user_file.unlink()  # gone
        assert read_gguf(write_trained_gguf(trained, sft_run, tmp_path / "a.gguf"))[3] == (
            OWN_TEMPLATE
        )
        (reply,) = chat_replies(sft_run, [QUESTION], max_new_tokens=2)
        assert isinstance(reply, str)
        copy.rename(kept)  # a run from before the copy
        for write in (write_trained_gguf, write_trained):
            with pytest.raises(ValueError, match=r"--config.chat_template='.*own\.jinja': cannot"):
                write(trained, sft_run, tmp_path / "out")
        assert not (tmp_path / "out").exists()
    finally:
        user_file.unlink(missing_ok=True)
        moved.rename(user_file)
        if kept.exists():
            kept.rename(copy)


def test_a_run_started_from_a_chat_run_trains_with_its_template(sft_run, dpo_run):
    """What the DPO run rendered its pairs with: the SFT run's own template, read from the SFT
    run and from the DPO run's snapshot of it (what a resumed DPO run reads); a run from the
    model itself, and a template given on the command line, are unchanged."""
    from train.data.chat.template import source_chat_template
    from train.formats.sources import read_source

    for path in (sft_run, dpo_run / "pretrained"):
        source = read_source(path, need_weights=False)
        assert source.trained_here
        assert source_chat_template(source).source == OWN_TEMPLATE
        given = dpo_run.parent / "given.jinja"
        given.write_text(CHATML_TEMPLATE, encoding="utf-8")
        assert source_chat_template(source, template_file=given).source == CHATML_TEMPLATE
    model = read_source(sft_run / "pretrained", need_weights=False)
    assert source_chat_template(model).source == CHATML_TEMPLATE
