"""Token stores: prepared once (deterministic, resumable, atomic, bad input refused) and read
back through grain by step (the global batch a function of store, seed and step alone)."""

import dataclasses
import errno
import gzip
import json
import pathlib

import numpy as np
import pytest
import zstandard
from train_helpers import tiny_config, vocabulary_of

from train.config.sections import DataConfig
from train.data.batching import RowShare
from train.data.store import store_pipeline, store_prepare
from train.data.store.token_store import MANIFEST, SHARDS, StoreError, TokenStore, store_settings
from train.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, ByteTokenizer
from train.formats.corpora import splits


def _lines(count: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    words = ["in", "the", "beginning", "god", "created", "heaven", "and", "earth", "light"]
    return [" ".join(rng.choice(words, size=rng.integers(2, 9))) for _ in range(count)]


def _data(path, store, **fields) -> DataConfig:
    config = tiny_config(path, task="lm", corpus="text", packing="stream", max_len=8)
    config.bucket_lengths = ()
    config.update(store_dir=str(store), batch_size=4, prepare_workers=1, **fields)
    return DataConfig.from_config(config)


def _corpus(directory: pathlib.Path, lines: list[str]) -> pathlib.Path:
    """The lines as three files: plain text, JSON lines (gzip), JSON lines (zstd)."""
    directory.mkdir(exist_ok=True)
    third = len(lines) // 3
    (directory / "a.txt").write_text("\n".join(lines[:third]) + "\n", encoding="utf-8")
    records = "".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(lines))
    with gzip.open(directory / "b.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write("".join(records.splitlines(keepends=True)[third : 2 * third]))
    (directory / "c.jsonl.zst").write_bytes(
        zstandard.ZstdCompressor().compress(
            "".join(records.splitlines(keepends=True)[2 * third :]).encode()
        )
    )
    return directory / "*"


def _store_bytes(store: pathlib.Path) -> dict:
    return {
        str(p.relative_to(store)): p.read_bytes()
        for p in sorted(store.rglob("*"))
        if p.is_file() and not p.name.startswith(".")
    }


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    lines = _lines(600)
    return lines, _corpus(tmp_path_factory.mktemp("corpus"), lines)


def test_a_store_holds_every_document_once_in_its_split(tmp_path, corpus):
    lines, pattern = corpus
    data = _data(pattern, tmp_path / "store", store_shard_bytes=500)
    store = store_prepare.prepare_store(data, vocabulary_of(data), progress=False)
    assert len(store.manifest["shards"]) > 3  # the text file is cut into byte ranges
    byte = ByteTokenizer()
    for split in ("train", "valid"):
        stream = store.read(split, 0, store.num_tokens(split))
        starts = list(store._splits[split].doc_starts) + [len(stream)]
        texts = []
        for a, b in zip(starts[:-1], starts[1:], strict=True):
            assert stream[a] == BOS_ID and stream[b - 1] == EOS_ID
            texts.append(byte.decode(stream[a + 1 : b - 1].tolist()))
        wanted = splits.split_examples(lines, data.valid_fraction, data.test_fraction)
        assert texts == getattr(wanted, split)  # in corpus order, whatever the shard


def test_the_same_inputs_give_the_same_bytes_with_any_worker_count(tmp_path, corpus):
    _, pattern = corpus
    one = _data(pattern, tmp_path / "one", store_shard_bytes=700)
    two = dataclasses.replace(one, store_dir=str(tmp_path / "two"))
    store_prepare.prepare_store(one, vocabulary_of(one), workers=1, progress=False)
    store_prepare.prepare_store(two, vocabulary_of(two), workers=2, progress=False)
    assert _store_bytes(tmp_path / "one") == _store_bytes(tmp_path / "two")


def test_sentencepiece_learns_from_the_same_sample_anywhere(tmp_path):
    lines = _lines(3000, seed=1)
    pattern = _corpus(tmp_path / "corpus", lines)
    data = [
        _data(
            pattern,
            tmp_path / name,
            tokenizer="sentencepiece",
            vocab_size=290,  # lossless: 260 special and byte pieces, then the pieces
            store_sample_chars=20_000,  # a sample: the corpus has ~85k characters
            store_shard_bytes=5000,
        )
        for name in ("a", "b")
    ]
    store_prepare.prepare_store(data[0], vocabulary_of(data[0]), workers=1, progress=False)
    store_prepare.prepare_store(data[1], vocabulary_of(data[1]), workers=2, progress=False)
    assert _store_bytes(tmp_path / "a") == _store_bytes(tmp_path / "b")
    sample = store_prepare.tokenizer_sample(store_prepare.plan_shards(data[0]), data[0], workers=1)
    assert 0 < sum(map(len, sample)) <= 20_000 < sum(map(len, lines))


def test_an_interrupted_preparation_finishes_with_the_same_bytes(tmp_path, corpus, monkeypatch):
    _, pattern = corpus
    data = _data(pattern, tmp_path / "store", store_shard_bytes=500)
    clean = dataclasses.replace(data, store_dir=str(tmp_path / "clean"))
    store_prepare.prepare_store(clean, vocabulary_of(clean), progress=False)
    real_add, calls = store_prepare._SplitWriter.add, []

    def full_disk(self, docs, texts):
        calls.append(1)
        if len(calls) == 5:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_add(self, docs, texts)

    monkeypatch.setattr(store_prepare._SplitWriter, "add", full_disk)
    with pytest.raises(store_prepare.StoreWriteError, match="No space left.*rerun"):
        store_prepare.prepare_store(data, vocabulary_of(data), progress=False)
    shards = tmp_path / "store" / SHARDS
    assert not (tmp_path / "store" / MANIFEST).exists()
    assert not list(shards.glob(".*"))  # the half-written shard was removed
    done = len(list(shards.iterdir()))
    monkeypatch.setattr(store_prepare._SplitWriter, "add", real_add)
    store_prepare.prepare_store(data, vocabulary_of(data), progress=False)
    assert len(list(shards.iterdir())) > done
    assert _store_bytes(tmp_path / "store") == _store_bytes(tmp_path / "clean")


def test_parts_prepare_their_shards_and_the_last_writes_the_manifest(tmp_path, corpus):
    _, pattern = corpus
    data = _data(pattern, tmp_path / "store", store_shard_bytes=500)
    assert (
        store_prepare.prepare_store(data, vocabulary_of(data), part=(1, 2), progress=False) is None
    )
    assert not (tmp_path / "store" / MANIFEST).exists()
    assert (
        store_prepare.prepare_store(data, vocabulary_of(data), part=(0, 2), progress=False)
        is not None
    )
    whole = dataclasses.replace(data, store_dir=str(tmp_path / "whole"))
    store_prepare.prepare_store(whole, vocabulary_of(whole), progress=False)
    assert _store_bytes(tmp_path / "store") == _store_bytes(tmp_path / "whole")


@pytest.mark.parametrize(
    "write, fields, message",
    [
        (None, {"corpus_path": "nothing-*.txt"}, r"matches no file"),
        (lambda d: (d / "e.txt").write_text(""), {}, r"e\.txt is empty"),
        (
            lambda d: (d / "x.txt").write_bytes(b"good line\nbad \xff byte\n"),
            {},
            r"x\.txt: bytes that are not UTF-8 at byte offset 14",
        ),
        (
            lambda d: (d / "y.jsonl").write_text('{"text": "a"}\n{"body": "b"}\n'),
            {},
            r"y\.jsonl: the record at byte offset 14 has no text field 'text' \(it has "
            r"\['body'\]\) ; set --config\.corpora\.text\.field",
        ),
        (
            lambda d: (d / "z.jsonl").write_text("{not json\n"),
            {},
            r"z\.jsonl: the line at byte offset 0 is not JSON",
        ),
    ],
)
def test_bad_inputs_are_refused_naming_the_file(tmp_path, write, fields, message):
    inputs = tmp_path / "in"
    inputs.mkdir()
    if write is not None:
        write(inputs)
    data = _data(inputs / "*", tmp_path / "store", **fields)
    if "corpus_path" in fields:
        data = dataclasses.replace(data, corpus_path=str(inputs / fields["corpus_path"]))
    with pytest.raises((StoreError, FileNotFoundError), match=message):
        store_prepare.prepare_store(data, vocabulary_of(data), progress=False)
    assert not (tmp_path / "store" / MANIFEST).exists()


def test_a_store_of_other_settings_or_damaged_is_refused_naming_it(tmp_path, corpus):
    _, pattern = corpus
    data = _data(pattern, tmp_path / "store", store_shard_bytes=2000)
    store_prepare.prepare_store(data, vocabulary_of(data), progress=False)
    other = dataclasses.replace(data, valid_fraction=0.2)
    with pytest.raises(StoreError, match=r"prepared with valid_fraction=0\.1.*asks for 0\.2"):
        TokenStore.open(tmp_path / "store", store_settings(other, vocabulary_of(other)))
    with pytest.raises(StoreError, match=r"begun from other inputs"):
        moved = dataclasses.replace(other, store_dir=str(tmp_path / "store"))
        store_prepare.prepare_plan_and_tokenizer(moved, vocabulary_of(moved))
    tokens = tmp_path / "store" / SHARDS / "00001" / "train.bin"
    raw = tokens.read_bytes()
    tokens.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(StoreError, match=r"shard 00001 .* is damaged: .* bytes.*rewrites"):
        TokenStore.open(tmp_path / "store")
    tokens.write_bytes(raw[:-2] + bytes([raw[-2] ^ 1]) + raw[-1:])
    with pytest.raises(StoreError, match=r"shard 00001 .* is damaged: .* SHA-256"):
        TokenStore.open(tmp_path / "store")
    tokens.write_bytes(raw)
    with pytest.raises(StoreError, match=r"no finished token store"):
        TokenStore.open(tmp_path / "missing")


@pytest.fixture(scope="module")
def store(tmp_path_factory, corpus):
    _, pattern = corpus
    data = _data(pattern, tmp_path_factory.mktemp("s") / "store", store_shard_bytes=700)
    return store_prepare.prepare_store(data, vocabulary_of(data), progress=False)


def _global(source, steps, count, start=0, seed=3):
    """The global batches of `steps`, stacked from `count` processes' rows."""
    parts = [
        store_pipeline.train_batches(
            source,
            seed=seed,
            batch_size=8,
            share=RowShare(i, count),
            start_step=start,
            num_steps=steps,
            threads=2,
        )
        for i in range(count)
    ]
    return [
        {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
        for batches in zip(*parts, strict=True)
    ]


@pytest.mark.parametrize("segments", [False, True])
def test_the_global_batch_of_a_step_is_the_same_for_any_process_count(store, segments):
    source = store_pipeline.WindowSource(store, "train", 8, segments=segments)
    steps = 2 * len(source) // 8 + 3  # more than two epochs
    whole = _global(source, steps, 1)
    for count in (2, 4):
        for a, b in zip(whole, _global(source, steps, count), strict=True):
            for key in a:
                np.testing.assert_array_equal(a[key], b[key])
    resumed = _global(source, steps, 2, start=5)
    for a, b in zip(whole[5:], resumed, strict=True):
        np.testing.assert_array_equal(a["inputs"], b["inputs"])
    # Each epoch is a new permutation of every window.
    per_epoch = len(source)
    rows = np.concatenate([b["inputs"] for b in whole])
    firsts = [rows[e * per_epoch : (e + 1) * per_epoch] for e in range(2)]
    windows = np.stack([source[i]["inputs"] for i in range(per_epoch)])
    for epoch in firsts:
        assert sorted(map(bytes, epoch)) == sorted(map(bytes, windows))
    assert not np.array_equal(firsts[0], firsts[1])


def test_windows_are_the_stream_shifted_and_segments_stay_in_documents(store):
    plain = store_pipeline.WindowSource(store, "train", 8, segments=False)
    packed = store_pipeline.WindowSource(store, "train", 8, segments=True)
    stream = store.read("train", 0, store.num_tokens("train"))
    for w in (0, 1, len(plain) - 1):
        window = plain[w]
        np.testing.assert_array_equal(window["inputs"], stream[w * 8 : w * 8 + 8])
        np.testing.assert_array_equal(window["targets"], stream[w * 8 + 1 : w * 8 + 9])
        seg = packed[w]
        ids = seg["segment_ids"]
        assert ids[0] == 1 and np.all(np.diff(ids) >= 0) and np.all(np.diff(ids) <= 1)
        # A document's EOS is not trained to predict the next one's BOS.
        eos = window["inputs"] == EOS_ID
        assert np.all(seg["targets"][eos] == PAD_ID)
        np.testing.assert_array_equal(seg["targets"][~eos], window["targets"][~eos])
        assert not np.any(window["targets"][eos] == PAD_ID)


def test_validation_batches_cover_the_split_in_order_with_padding_rows(store):
    valid = store_pipeline.WindowSource(store, "valid", 8, segments=False)
    whole = store_pipeline.eval_batches(valid, batch_size=8, share=RowShare())
    rows = np.concatenate([b["inputs"] for b in whole])
    assert len(rows) == 8 * -(-len(valid) // 8)
    for i in range(len(valid)):
        np.testing.assert_array_equal(rows[i], valid[i]["inputs"])
    assert not rows[len(valid) :].any()
    halves = [
        store_pipeline.eval_batches(valid, batch_size=8, share=RowShare(i, 2)) for i in range(2)
    ]
    stacked = np.concatenate(
        [np.concatenate([a["inputs"], b["inputs"]]) for a, b in zip(*halves, strict=True)]
    )
    np.testing.assert_array_equal(stacked, rows)


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(task="translation", corpus="tsv"), r"store_dir=.*feeds task='lm'"),
        (
            dict(corpus="hf", corpora={"hf": {"dataset": "x", "fields": "text"}}),
            r"corpus='hf'.*prepared from",
        ),
        (dict(packing="none"), r"packing='none'.*read as max_len windows"),
        (dict(loader_threads=0), r"loader_threads=0: must be a positive integer"),
    ],
)
def test_a_store_config_that_cannot_be_read_is_refused_by_its_field(tmp_path, fields, message):
    config = tiny_config(tmp_path / "x.txt", task="lm", corpus="text", packing="stream")
    config.update(bucket_lengths=(), store_dir=str(tmp_path / "store"), batch_size=4, **fields)
    with pytest.raises(ValueError, match=message):
        DataConfig.from_config(config)
