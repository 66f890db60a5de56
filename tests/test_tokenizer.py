"""Tests for train.data.tokenizer and train.data.spm_tokenizer: byte and SentencePiece
tokenizers."""

import io
import os

import pytest
import sentencepiece as spm

from train.data.spm_tokenizer import SentencePieceTokenizer
from train.data.tokenizer import (
    BOS_ID,
    BYTE_OFFSET,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    ByteTokenizer,
)

SMALL_VOCAB = 64

_EN_WORDS = "the quick brown fox jumps over lazy dog and cat while birds sing in tall trees".split()
_JA_WORDS = ["神は", "天と", "地を", "造られた", "光", "あれ", "夕となり", "朝となった"]


def _tiny_corpus() -> list[str]:
    """80 English and Japanese sentences made from small word lists."""
    english = [
        " ".join(_EN_WORDS[(i * k) % len(_EN_WORDS)] for k in range(1, 8)) for i in range(40)
    ]
    japanese = [
        "".join(_JA_WORDS[(i * k) % len(_JA_WORDS)] for k in range(1, 6)) for i in range(40)
    ]
    return english + japanese


@pytest.fixture(scope="module")
def spm_dir(tmp_path_factory):
    """A directory holding a model trained once for the module."""
    workdir = tmp_path_factory.mktemp("spm")
    SentencePieceTokenizer.train_or_load(
        _tiny_corpus(), workdir / f"spm_{SMALL_VOCAB}.model", SMALL_VOCAB
    )
    return workdir


@pytest.mark.parametrize(
    "text",
    ["", "hello, world", "元始に神天地を創造たまへり", "mixed 日本語 text ✓ 🎉", " \t\n spaces  "],
)
def test_byte_round_trip_is_exact(text):
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert all(BYTE_OFFSET <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text


def test_byte_special_ids_and_vocab():
    tok = ByteTokenizer()
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (0, 1, 2, 3)
    assert tok.vocab_size == 260
    assert tok.encode("A") == [ord("A") + BYTE_OFFSET]


def test_byte_decode_skips_specials_and_replaces_invalid_utf8():
    tok = ByteTokenizer()
    ids = [BOS_ID, *tok.encode("ok"), EOS_ID, PAD_ID, PAD_ID]
    assert tok.decode(ids) == "ok"
    # 0xE6 0x97 starts a 3-byte character that never ends.
    truncated = tok.encode("日")[:2]
    assert tok.decode(truncated + tok.encode("x")) == "\ufffdx"


@pytest.mark.parametrize("bad_id", [-1, 260])
def test_byte_decode_rejects_out_of_range(bad_id):
    with pytest.raises(ValueError, match=rf"token id {bad_id} at position 1.*\[0, 260\)"):
        ByteTokenizer().decode([BOS_ID, bad_id])


def test_spm_special_ids_and_vocab(spm_dir):
    tok = SentencePieceTokenizer.train_or_load(
        [], spm_dir / f"spm_{SMALL_VOCAB}.model", SMALL_VOCAB
    )
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (PAD_ID, BOS_ID, EOS_ID, UNK_ID)
    assert tok.vocab_size == SMALL_VOCAB
    pieces = [tok._sp.IdToPiece(i) for i in range(4)]
    assert pieces == ["<pad>", "<s>", "</s>", "<unk>"]


@pytest.mark.parametrize("index", [0, 7, 40, 55])
def test_spm_round_trip_on_normalised_text(spm_dir, index):
    tok = SentencePieceTokenizer(spm_dir / f"spm_{SMALL_VOCAB}.model")
    text = _tiny_corpus()[index]
    ids = tok.encode(text)
    assert ids and all(4 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text
    assert tok.decode([BOS_ID, *ids, EOS_ID, PAD_ID]) == text


def test_spm_unknown_character_becomes_unk(spm_dir):
    tok = SentencePieceTokenizer(spm_dir / f"spm_{SMALL_VOCAB}.model")
    assert UNK_ID in tok.encode("Ω")


def test_spm_cache_is_reused_not_retrained(spm_dir):
    path = spm_dir / f"spm_{SMALL_VOCAB}.model"
    mtime = os.stat(path).st_mtime_ns

    def must_not_be_read():
        raise AssertionError("texts consumed although a cached model exists")
        yield  # pragma: no cover

    tok = SentencePieceTokenizer.train_or_load(
        must_not_be_read(), spm_dir / f"spm_{SMALL_VOCAB}.model", SMALL_VOCAB
    )
    assert not tok.was_trained
    assert os.stat(path).st_mtime_ns == mtime
    assert sorted(p.name for p in spm_dir.iterdir()) == [path.name]  # no temp files left


def test_spm_first_call_trains(tmp_path):
    tok = SentencePieceTokenizer.train_or_load(
        _tiny_corpus(), tmp_path / "new" / f"spm_{SMALL_VOCAB}.model", SMALL_VOCAB
    )
    assert tok.was_trained
    assert (tmp_path / "new" / f"spm_{SMALL_VOCAB}.model").is_file()


def test_spm_missing_model_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"absent\.model not found.*train_or_load"):
        SentencePieceTokenizer(tmp_path / "absent.model")


def test_spm_corrupt_model_names_path_and_says_delete(tmp_path):
    path = tmp_path / f"spm_{SMALL_VOCAB}.model"
    path.write_bytes(b"not a sentencepiece model")
    with pytest.raises(ValueError, match=rf"{path.name} is corrupt.*delete it"):
        SentencePieceTokenizer.train_or_load(
            _tiny_corpus(), tmp_path / f"spm_{SMALL_VOCAB}.model", SMALL_VOCAB
        )


def test_spm_model_with_other_special_ids_is_rejected(tmp_path):
    model = io.BytesIO()
    spm.SentencePieceTrainer.Train(
        sentence_iterator=iter(_tiny_corpus()),
        model_writer=model,
        vocab_size=SMALL_VOCAB,
        minloglevel=2,
    )  # SentencePiece defaults: unk 0, bos 1, eos 2, no pad
    path = tmp_path / "foreign.model"
    path.write_bytes(model.getvalue())
    with pytest.raises(ValueError, match=r"foreign\.model has \(pad, bos, eos, unk\) ids"):
        SentencePieceTokenizer(path)


def test_spm_vocab_too_large_for_corpus(tmp_path):
    with pytest.raises(ValueError, match=r"vocab_size=5000 .*failed.*choose a vocab_size"):
        SentencePieceTokenizer.train_or_load(_tiny_corpus(), tmp_path / "spm_5000.model", 5000)
    assert not any(tmp_path.iterdir())


def test_spm_vocab_not_above_specials(tmp_path):
    with pytest.raises(ValueError, match=r"vocab_size=4 must exceed the 4 special ids"):
        SentencePieceTokenizer.train_or_load(_tiny_corpus(), tmp_path / "spm_4.model", 4)


def test_spm_without_text(tmp_path):
    with pytest.raises(ValueError, match=r"No non-empty text.*training split"):
        SentencePieceTokenizer.train_or_load(
            ["", "  "], tmp_path / f"spm_{SMALL_VOCAB}.model", SMALL_VOCAB
        )


def test_spm_decode_rejects_out_of_range(spm_dir):
    tok = SentencePieceTokenizer(spm_dir / f"spm_{SMALL_VOCAB}.model")
    with pytest.raises(ValueError, match=rf"token id {SMALL_VOCAB} at position 0"):
        tok.decode([SMALL_VOCAB])


def test_byte_pieces_show_ascii_and_hex_bytes():
    tok = ByteTokenizer()
    ids = [PAD_ID, BOS_ID, EOS_ID, UNK_ID, *tok.encode("a 神")]
    pieces = [tok.id_to_piece(i) for i in ids]
    assert pieces == ["<pad>", "<s>", "</s>", "<unk>", "a", " ", "<0xE7>", "<0xA5>", "<0x9E>"]
    with pytest.raises(ValueError, match="token id 260"):
        tok.id_to_piece(260)


def test_spm_pieces_join_to_the_text(spm_dir):
    tok = SentencePieceTokenizer(spm_dir / f"spm_{SMALL_VOCAB}.model")
    text = _tiny_corpus()[0]
    pieces = [tok.id_to_piece(i) for i in tok.encode(text)]
    assert "".join(pieces).replace("\u2581", " ").strip() == text
    assert tok.id_to_piece(BOS_ID) == "<s>"


def test_spm_on_more_sentences_than_it_samples_is_the_same_at_every_run(tmp_path):
    # Beyond input_sentence_size SentencePiece would draw an unseeded sample: two runs on one
    # corpus got two tokenizers (and two losses) before the sample was made deterministic.
    corpus = _tiny_corpus() * 3 + [f"{w} {i}" for i, w in enumerate(_EN_WORDS * 5)]
    models = []
    for name in ("a", "b", "c"):
        path = tmp_path / name / f"spm_{SMALL_VOCAB}.model"
        order = corpus if name != "c" else corpus[::-1]  # the sample ignores the input order
        SentencePieceTokenizer.train_or_load(order, path, SMALL_VOCAB, input_sentence_size=150)
        models.append(path.read_bytes())
    assert models[0] == models[1] == models[2]
