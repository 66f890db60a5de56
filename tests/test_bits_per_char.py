"""Validation bits per character of a language model are exact (issue 41, item 6): the nats
of every validation label / ln 2 / the characters of the validation documents' text, in
memory and from a token store, for every packing.

The byte tokenizer on ASCII text makes the counts checkable by hand: a document of n
characters is n ids, scored as n labels + its EOS (+ the next BOS in a stream).
"""

import math

import pytest
from train_helpers import tiny_config, write_tiny_text

from train.core.rundir import RunDir
from train.formats.corpora import splits
from train.program import loop as train_lib
from train.program import metrics

_LINES = 300


def _config(tmp_path, **overrides):
    corpus = write_tiny_text(tmp_path, num_lines=_LINES)
    fields = dict(
        task="lm",
        corpus="text",
        max_len=32,  # every tiny line fits: none is dropped from validation
        bucket_lengths=(),
        batch_size=8,
        num_train_steps=2,
        sample_prompts=(),
        prepare_workers=1,
    )
    return tiny_config(corpus, **{**fields, **overrides}), corpus


def _validation_documents(corpus, config) -> list[str]:
    lines = [line for line in corpus.read_text().splitlines() if line.strip()]
    return splits.split_examples(lines, config.valid_fraction, config.test_fraction).valid


@pytest.mark.parametrize(
    "packing, store",
    [("stream", False), ("segments", False), ("none", False), ("stream", True), ("segments", True)],
)
def test_bits_per_char_are_the_validation_nats_over_its_characters(tmp_path, packing, store):
    config, corpus = _config(
        tmp_path, packing=packing, store_dir=str(tmp_path / "store") if store else ""
    )
    results = train_lib.train_and_evaluate(config, str(tmp_path / "run"))
    valid = results["valid"]
    docs = _validation_documents(corpus, config)
    chars = sum(map(len, docs))
    # Every label is scored: each document's ids and EOS; in a stream the next BOS too
    # (all but the first document's), and with segments no label crosses a boundary.
    labels = chars + len(docs) + (len(docs) - 1 if packing == "stream" else 0)
    assert valid["tokens"] == labels
    nats = valid["nll"] * valid["tokens"]
    assert valid["bits_per_char"] == pytest.approx(nats / math.log(2) / chars, rel=1e-9)
    logged = [r for r in _records(tmp_path / "run") if r["split"] == "valid"]
    assert logged[-1]["bits_per_char"] == pytest.approx(valid["bits_per_char"])


def _records(workdir):
    return metrics.read_metrics(RunDir(workdir).metrics)
