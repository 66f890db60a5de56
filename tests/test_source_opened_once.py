"""A pretrained source is opened once: a run hands the `Source` it opened to the tokenizer,
the chat template, the token store and the weights, and any other read of the same path in
the process gets the same `Source` while its files are unchanged
(`train.formats.sources.read_source`)."""

import json
import types

import pytest

from configs import finetune_gpt2, sft_smollm2
from train.data.tokenizers import Vocabulary, vocabulary
from train.formats import sources
from train.formats.corpora.bibles import load_kjv_web_pairs
from train.program import loop
from train.tiny_pretrained import write_tiny_model


def _counting(monkeypatch):
    calls = []

    def fake_read(path, directory, need_weights):
        calls.append(need_weights)
        return object()

    monkeypatch.setattr(sources, "_read_source", fake_read)
    monkeypatch.setattr(sources, "_OPENED", {})
    return calls


def test_a_source_is_read_once_while_its_files_are_unchanged(tmp_path, monkeypatch):
    calls = _counting(monkeypatch)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    first = sources.read_source(model, need_weights=False)
    assert sources.read_source(str(model), need_weights=False) is first
    assert sources.read_source(tmp_path / "." / "model", need_weights=False) is first
    assert calls == [False]
    # The weights were not checked: a read that needs them reads again, and then serves both.
    with_weights = sources.read_source(model)
    assert with_weights is not first and calls == [False, True]
    assert sources.read_source(model, need_weights=False) is with_weights


def test_a_changed_file_is_read_again(tmp_path, monkeypatch):
    calls = _counting(monkeypatch)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    first = sources.read_source(model, need_weights=False)
    (model / "config.json").write_text('{"model_type": "llama"}')
    assert sources.read_source(model, need_weights=False) is not first
    (model / "tokenizer.json").write_text("{}")  # a file added
    sources.read_source(model, need_weights=False)
    assert len(calls) == 3


def test_a_missing_path_is_never_cached(tmp_path, monkeypatch):
    calls = _counting(monkeypatch)
    sources.read_source(tmp_path / "nothing", need_weights=False)
    sources.read_source(tmp_path / "nothing", need_weights=False)
    assert len(calls) == 2


# A run from a pretrained source reads that source's files once: validate_config opens it,
# and the loop hands the same `Source` to the tokenizer, the chat template, the token store
# and the weights (none of them reads a path again, the run's snapshot included).


def _recording(monkeypatch):
    """The real reads, with the paths they read (the per-process cache emptied first)."""
    paths = []
    read = sources._read_source

    def recorded(path, directory, need_weights):
        paths.append(str(directory))
        return read(path, directory, need_weights)

    monkeypatch.setattr(sources, "_read_source", recorded)
    monkeypatch.setattr(sources, "_OPENED", {})
    return paths


@pytest.fixture(scope="module")
def texts():
    return [k[:60] for k, _ in load_kjv_web_pairs()[:400]]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, texts):
    # write_tiny_model saves through transformers (requirements-torch.txt).
    pytest.importorskip("torch", reason="requirements-torch.txt makes the tiny model")
    pytest.importorskip("transformers", reason="requirements-torch.txt makes the tiny model")
    root = tmp_path_factory.mktemp("tiny")
    return write_tiny_model(root, "llama", texts=texts, vocab_size=300, max_len=256, chat=True)


def _short(config, model_dir):
    config.init_from = str(model_dir)
    config.max_len = 32
    config.batch_size = 4
    config.valid_fraction = 0.1
    config.test_fraction = 0.0
    config.num_train_steps = 1
    config.warmup_steps = 0
    config.schedule = "constant"
    config.eval_every_steps = config.checkpoint_every_steps = 1000
    config.num_eval_batches = 2
    config.async_checkpoints = False
    config.max_decode_len = 4
    return config


@pytest.mark.parametrize("store", [False, True], ids=["in_memory", "token_store"])
def test_an_lm_fine_tune_reads_its_source_once(tmp_path, monkeypatch, model_dir, texts, store):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(texts[:200]) + "\n", encoding="utf-8")
    config = _short(finetune_gpt2.get_config(), model_dir)
    config.corpus, config.corpus_path = "text", str(corpus)
    config.sample_prompts = ("In the beginning",)
    if not store:  # the text corpus is read in memory, a line a row
        config.packing, config.max_len = "none", 64
    paths = _recording(monkeypatch)
    loop.train_and_evaluate(config, str(tmp_path / "run"))
    assert paths == [str(model_dir)]
    # Resumed, the run reads its snapshot of the source instead, once too.
    paths.clear()
    sources._OPENED.clear()
    config.num_train_steps = 2
    loop.train_and_evaluate(config, str(tmp_path / "run"))
    assert paths == [str(tmp_path / "run" / "pretrained")]


@pytest.mark.parametrize("store", [False, True], ids=["in_memory", "token_store"])
def test_a_chat_run_reads_its_source_once(tmp_path, monkeypatch, model_dir, texts, store):
    records = [
        {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
        for q, a in zip(texts[:60:2], texts[1:60:2], strict=True)
    ]
    train, valid = tmp_path / "train.jsonl", tmp_path / "valid.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in records[:24]), encoding="utf-8")
    valid.write_text("".join(json.dumps(r) + "\n" for r in records[24:]), encoding="utf-8")
    config = _short(sft_smollm2.get_config(), model_dir)
    config.corpus, config.corpus_path, config.valid_path = "chat", str(train), str(valid)
    config.valid_fraction = 0.0
    config.max_len = 128
    config.bleu_examples = config.num_samples = config.decode_batch_size = 2
    if store:
        config.store_dir = str(tmp_path / "store")
        config.packing = "segments"
    paths = _recording(monkeypatch)
    loop.train_and_evaluate(config, str(tmp_path / "run"))
    assert paths == [str(model_dir)]


def test_a_pretrained_vocabulary_carries_its_open_source(model_dir, monkeypatch):
    paths = _recording(monkeypatch)
    source = sources.read_source(model_dir, need_weights=False)
    data = types.SimpleNamespace(tokenizer="pretrained", init_from="elsewhere")
    ids = vocabulary(data, source.model.vocab_size, source)
    assert ids.opened is source and ids.source == str(source.path)
    assert ids.identity == source.tokenizer_sha256()
    assert paths == [str(model_dir)]  # handed in, not read again (init_from is not read)
    with pytest.raises(ValueError, match="no open source: make it with .*vocabulary"):
        Vocabulary("pretrained", ids.size, ids.source, ids.identity)
