"""Chat fine-tuning through a token store (`--config.task=chat --config.store_dir=DIR`),
offline, with the tiny ChatML Llama of `train.tiny_pretrained`:

- the store holds each kept conversation's ids and its loss mask, and the counts the
  in-memory run logs;
- a run through the store reads the in-memory run's batches (the same rows: conversations
  packed whole with segment ids, masked labels) and ends with its validation loss, trained
  tokens and data counts;
- a store prepared for another chat template, train_on, max_len or tokenizer is refused,
  naming the setting; a language model's store stays as it was (tests/test_token_store.py).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from configs import default, sft_smollm2
from train.config import config_lib
from train.core.rundir import RunDir
from train.data.chat.rows import open_chat_store_dataset
from train.data.chat.store import prepare_chat_store
from train.data.pipeline.in_memory import build_dataset
from train.data.store.token_store import StoreError, TokenStore
from train.data.tokenizers import vocabulary
from train.formats.corpora.bibles import load_kjv_web_pairs
from train.program import loop as train_lib
from train.tasks import get_task
from train.tiny_pretrained import write_tiny_model

# The tiny model's weights are written with torch (requirements-torch.txt); skipped without it.
pytest.importorskip("torch")

STEPS = 6  # past the first epoch (about 4 batches of 4 rows)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    pairs = [(k, w) for k, w in load_kjv_web_pairs()[:2000] if len(k) + len(w) < 120][:60]
    texts = [text for pair in pairs for text in pair]
    root = tmp_path_factory.mktemp("chat_model")
    model = write_tiny_model(root, "llama", texts=texts, vocab_size=400, max_len=256, chat=True)
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
    nothing = {"messages": [{"role": "user", "content": "Hi"}]}  # dropped: no assistant
    lines = [*records[:40], nothing]
    (model / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (model / "valid.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records[44:52]))
    return model


def _config(model_dir, **overrides):
    config = sft_smollm2.get_config()
    config.init_from = str(model_dir)
    config.corpus = "chat"
    config.corpus_path = str(model_dir / "train.jsonl")
    config.valid_path = str(model_dir / "valid.jsonl")
    config.valid_fraction = config.test_fraction = 0.0
    config.max_len = 192
    config.batch_size = 4
    config.num_train_steps = STEPS
    config.learning_rate = 1e-3
    config.warmup_steps = 0
    config.schedule = "constant"
    config.eval_every_steps = config.checkpoint_every_steps = 1000
    config.async_checkpoints = False
    config.bleu_examples = 2
    config.num_samples = 1
    config.decode_batch_size = 2
    config.max_decode_len = 4
    config.loader_threads = 2
    config.update(overrides)
    return config


@pytest.fixture(scope="module")
def runs(tmp_path_factory, model_dir):
    """(workdir, results) of the run in memory and of the same run through a store."""
    root = tmp_path_factory.mktemp("chat_runs")
    memory = train_lib.train_and_evaluate(_config(model_dir), root / "memory")
    store = str(root / "store")
    stored = train_lib.train_and_evaluate(_config(model_dir, store_dir=store), root / "stored")
    return (root / "memory", memory), (root / "stored", stored), root / "store"


def _datasets(config, workdir):
    experiment = config_lib.validate_config(config)
    run = RunDir(workdir)
    ids = vocabulary(experiment.data, experiment.model.vocab_size, run.pretrained)
    return experiment, run, ids


def test_a_store_run_ends_with_the_in_memory_runs_loss_and_counts(runs):
    (_, memory), (_, stored), _ = runs
    assert stored["valid"]["tokens"] == memory["valid"]["tokens"]  # the mask survived
    assert stored["valid"]["nll"] == pytest.approx(memory["valid"]["nll"], rel=1e-6)
    assert stored["data"] == memory["data"]
    assert stored["data"]["train_dropped_no_assistant"] == 1
    assert stored["data"]["valid_trained_tokens"] == stored["valid"]["tokens"]
    assert [s["prompt"] for s in stored["samples"]] == [s["prompt"] for s in memory["samples"]]
    assert stored["bleu"]["examples"] == memory["bleu"]["examples"] == 2


def test_the_store_reads_the_in_memory_runs_batches(runs, model_dir):
    (memory_dir, _), (stored_dir, _), store_dir = runs
    config = _config(model_dir)
    experiment, run, ids = _datasets(config, memory_dir)
    memory = build_dataset(experiment.data, run, task=get_task("chat"), seed=experiment.run.seed)
    experiment, _, ids = _datasets(_config(model_dir, store_dir=str(store_dir)), stored_dir)
    stored = open_chat_store_dataset(
        experiment.data, ids, task=get_task("chat"), seed=experiment.run.seed, num_steps=STEPS + 4
    )
    ours = list(stored.stream(experiment.run.seed, None, 0))
    theirs = memory.stream(experiment.run.seed, None, 0)
    for batch in ours:
        expected = next(theirs)
        assert sorted(batch) == sorted(expected) == ["inputs", "segment_ids", "targets"]
        for key in batch:
            np.testing.assert_array_equal(batch[key], expected[key], err_msg=key)
    assert len(stored.eval_batches) == len(memory.eval_batches)
    for batch, expected in zip(stored.eval_batches, memory.eval_batches, strict=True):
        for key in expected:
            np.testing.assert_array_equal(batch[key], expected[key], err_msg=key)
    # Rows hold whole conversations: each segment's labels are its masked ids shifted by one.
    first = ours[0]
    assert first["segment_ids"].max() > 1  # packed: several conversations in a row
    trained = (first["targets"] != stored.tokenizer.pad_id).sum()
    assert 0 < trained < (first["segment_ids"] > 0).sum()  # the prompts are not trained
    # A resumed run reads from its step on.
    resumed = next(stored.stream(experiment.run.seed, {"step": 5}, 5))
    np.testing.assert_array_equal(resumed["inputs"], ours[5]["inputs"])


def test_the_store_keeps_the_mask_and_the_counts(runs):
    _, (_, stored), store_dir = runs
    store = TokenStore.open(store_dir)
    assert store.has_masks
    chat = store.manifest["chat"]
    assert chat["sizes"] == stored["data"]
    assert chat["log"][0].startswith("Conversations (train): 40 kept (0 cut")
    starts = store.document_starts("valid")
    mask = store.read_mask("valid", 0, store.num_tokens("valid"))
    trained = sum(int(part[1:].sum()) for part in np.split(mask, starts[1:]))
    assert trained == stored["valid"]["tokens"]


@pytest.mark.parametrize(
    "field, value",
    [("train_on", "all"), ("max_len", 128), ("chat_template", "mine.jinja")],
)
def test_a_store_of_other_chat_settings_is_refused(runs, model_dir, field, value):
    _, (stored_dir, _), store_dir = runs
    if field == "chat_template":
        template = model_dir / value
        template.write_text(
            "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
        )
        value = str(template)
    config = _config(model_dir, store_dir=str(store_dir), **{field: value})
    experiment, _, ids = _datasets(config, stored_dir)
    expected = "another chat template" if field == "chat_template" else f"{field}="
    with pytest.raises(StoreError, match=f"prepared with {expected}"):
        prepare_chat_store(experiment.data, ids)


def test_a_store_of_another_tokenizer_is_refused(runs, model_dir, tmp_path):
    _, (stored_dir, _), store_dir = runs
    other = write_tiny_model(tmp_path, "llama", texts=["other words"] * 4, vocab_size=300,
                             max_len=256, chat=True)  # fmt: skip
    config = _config(model_dir, store_dir=str(store_dir), init_from=str(other))
    experiment, _, ids = _datasets(config, stored_dir)
    ids = vocabulary(experiment.data, experiment.model.vocab_size, other)
    with pytest.raises(StoreError, match="holds the ids of another tokenizer"):
        prepare_chat_store(experiment.data, ids)


def test_a_language_model_store_is_refused_to_a_chat_run_and_translation_to_any(model_dir):
    with pytest.raises(ValueError, match="packing='none'.*whole conversations packed"):
        config_lib.validate_config(_config(model_dir, store_dir="s", packing="none"))
    translation = default.get_config()
    translation.store_dir = "s"
    with pytest.raises(ValueError, match="store_dir='s'.*not task='translation'"):
        config_lib.validate_config(translation)
