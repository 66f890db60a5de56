"""Tokenizers: text <-> token ids, with one interface for bytes, SentencePiece and a
pretrained model's own tokenizer (`train.data.hf_tokenizer`).

Every tokenizer has `encode(str) -> list[int]`, `decode(list[int]) -> str`, `vocab_size`,
`pad_id`, `bos_id`, `eos_id` and `unk_id`, gathered as `specials` (a `SpecialIds`). The
tokenizers trained here share one set (`DEFAULT_SPECIALS`: pad 0, bos 1, eos 2, unk 3); a
pretrained model's tokenizer has its own, so the batching code and the model config
(`pad_id`) take the ids from the run's tokenizer, never from the constants below.
`encode` adds no BOS/EOS: the batching code adds them where the task needs them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import pathlib
import re
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol

import sentencepiece as spm

# Special ids shared by every tokenizer (`train.core.special_ids`), re-exported here.
from train.core.special_ids import (  # noqa: E402, F401
    BOS_ID,
    EOS_ID,
    NUM_BYTES,
    NUM_SPECIAL_IDS,
    PAD_ID,
    UNK_ID,
    model_vocab_size,
)

# ByteTokenizer: byte b has id b + BYTE_OFFSET, after the special ids.
BYTE_OFFSET = NUM_SPECIAL_IDS
# Pieces of the special ids, spelled as SentencePiece spells them.
SPECIAL_PIECES = ("<pad>", "<s>", "</s>", "<unk>")
PRINTABLE_ASCII = (0x20, 0x7E)  # bytes shown as themselves by ByteTokenizer.id_to_piece

# SentencePiece training defaults. 0.9995 is SentencePiece's recommendation for languages with
# large character sets (Japanese); the rarest 0.05% of characters become <unk>.
DEFAULT_CHARACTER_COVERAGE = 0.9995
# Sentences sampled for training: bounds the training time (the Bible has ~62k sides).
DEFAULT_INPUT_SENTENCE_SIZE = 200_000
DEFAULT_NUM_THREADS = 2
SPM_MODEL_TYPE = "unigram"
# Lossless SentencePiece (documents kept verbatim): no normalisation, whitespace kept as it
# is (runs of spaces, tabs, newlines; no dummy prefix), and any character outside the pieces
# spelled as its UTF-8 bytes (<0x00> ... <0xFF>, 256 pieces), so decode(encode(t)) == t.
LOSSLESS_TRAINER_OPTIONS = {
    "byte_fallback": True,
    "normalization_rule_name": "identity",
    "remove_extra_whitespaces": False,
    "add_dummy_prefix": False,
    "allow_whitespace_only_pieces": True,
    "split_by_whitespace": True,
}
# SentencePiece writes a space as this meta symbol inside pieces and decodes it back to a
# space, so a literal one in the text is encoded as its three byte pieces instead.
SPM_SPACE = "\u2581"
# SentencePiece's trainer skips sentences over 4192 bytes (its max_sentence_length): a long
# document is learned from in chunks of at most this many characters (4 bytes each at most).
_TRAIN_CHUNK_CHARS = 1000
# A text that only a lossless model round-trips: runs of spaces, a leading space, tab,
# newlines, a control character, a combining accent, CJK and an emoji (`lossless` probe).
_LOSSLESS_PROBE = "  a\tb\n\n c\r\n\x00e\u0301 \u4e16\U0001f600  "


@dataclasses.dataclass(frozen=True)
class SpecialIds:
    """A tokenizer's special ids: padding (masked in attention and the loss), the start and
    end marks the batching puts around every sequence, and the unknown piece (what word
    dropout writes); and whether a text starts with the start mark.

    Attributes:
        pad, bos, eos, unk: the ids; bos may equal eos (GPT-2 marks both with one token).
        starts_with_bos: a sequence begins with BOS: the tokenizers trained here always, a
            pretrained model's where its own tokenizer adds one (its post-processor or
            `add_bos_token`: Llama's yes, GPT-2's and SmolLM2's no), so that the model reads
            text framed as in its pretraining, never with a BOS it did not see there.
    """

    pad: int = PAD_ID
    bos: int = BOS_ID
    eos: int = EOS_ID
    unk: int = UNK_ID
    starts_with_bos: bool = True

    def document(self, ids: Sequence[int]) -> list[int]:
        """A document's ids as a training sequence: after the BOS where a sequence starts
        with one, and ended by the EOS (which also separates documents in a stream)."""
        start = [self.bos] if self.starts_with_bos else []
        return [*start, *ids, self.eos]

    def prompt(self, ids: Sequence[int]) -> list[int]:
        """A prompt's ids as the start of a sequence to continue: after the BOS where a
        sequence starts with one. An empty prompt of a tokenizer that adds no BOS starts
        from the EOS, what precedes every document of a packed stream."""
        if self.starts_with_bos:
            return [self.bos, *ids]
        return list(ids) if len(ids) else [self.eos]


# The special ids of the tokenizers trained here (bytes, SentencePiece).
DEFAULT_SPECIALS = SpecialIds()


class Tokenizer(Protocol):
    """What the training program needs from a tokenizer."""

    pad_id: int
    bos_id: int
    eos_id: int
    unk_id: int

    @property
    def specials(self) -> SpecialIds: ...

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


def _check_decodable(ids: Sequence[int], vocab_size: int) -> list[int]:
    """Returns `ids` as Python ints, or raises ValueError for an id outside [0, vocab_size)."""
    out = [int(i) for i in ids]
    for position, token_id in enumerate(out):
        if not 0 <= token_id < vocab_size:
            raise ValueError(
                f"Cannot decode token id {token_id} at position {position}: ids must lie in "
                f"[0, {vocab_size}) for this tokenizer; check that the model's vocab_size "
                "matches the tokenizer's."
            )
    return out


class ByteTokenizer:
    """UTF-8 bytes as tokens: needs no training, round-trips any string exactly.

    Ids: 0 pad, 1 bos, 2 eos, 3 unk (never produced; kept so every tokenizer has the same
    special ids), then byte b as b + 4, so `vocab_size` is 260.
    """

    pad_id = PAD_ID
    bos_id = BOS_ID
    eos_id = EOS_ID
    unk_id = UNK_ID

    specials = DEFAULT_SPECIALS

    @property
    def vocab_size(self) -> int:
        """Number of ids: the special ids plus one per byte value."""
        return BYTE_OFFSET + NUM_BYTES

    def encode(self, text: str) -> list[int]:
        """Encodes `text` as its UTF-8 bytes shifted past the special ids.

        Args:
            text: any string.

        Returns:
            One id per UTF-8 byte, each in [4, 260).

        Raises:
            ValueError: the text holds a lone surrogate (not a character; see
                `check_encodable`).
        """
        return [b + BYTE_OFFSET for b in check_encodable(text)]

    def decode(self, ids: Sequence[int]) -> str:
        """Decodes ids to text, skipping special ids.

        Args:
            ids: token ids in [0, vocab_size).

        Returns:
            The text; a byte sequence that is not valid UTF-8 (a model can emit one) becomes
            U+FFFD instead of raising.
        """
        ids = _check_decodable(ids, self.vocab_size)
        data = bytes(i - BYTE_OFFSET for i in ids if i >= BYTE_OFFSET)
        return data.decode("utf-8", errors="replace")

    def id_to_piece(self, token_id: int) -> str:
        """The piece an id stands for: a printable ASCII character as itself, any other byte
        as `<0xHH>`, and the special ids as `<pad>`, `<s>`, `</s>`, `<unk>`.

        Args:
            token_id: an id in [0, vocab_size).
        """
        (token_id,) = _check_decodable([token_id], self.vocab_size)
        if token_id < BYTE_OFFSET:
            return SPECIAL_PIECES[token_id]
        byte = token_id - BYTE_OFFSET
        return chr(byte) if PRINTABLE_ASCII[0] <= byte <= PRINTABLE_ASCII[1] else f"<0x{byte:02X}>"


def check_encodable(text: str) -> bytes:
    """The UTF-8 bytes of `text`, or ValueError where it holds a lone surrogate (U+D800 to
    U+DFFF alone: half of a pair, not a character, e.g. from a JSON `\\ud83d` escape without
    its partner), which no tokenizer can write and decode back.

    Args:
        text: any string.
    """
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(
            f"The text holds a lone surrogate U+{ord(text[err.start]):04X} at character "
            f"{err.start} (near {text[max(err.start - 20, 0) : err.start]!r}): half of a "
            "UTF-16 pair, not a Unicode character, so it cannot be tokenized; remove or "
            "replace it in the corpus (a JSON escape like \\ud83d needs its pair)."
        ) from None


def _sample_key(text: str) -> bytes:
    """A sentence's place in the deterministic sample of `train_or_load`."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()


# SentencePiece's complaint about a vocabulary below the pieces it must hold.
_REQUIRED_PIECES = re.compile(r"smaller than required_chars\. \d+ vs (\d+)")


def _training_chunks(texts: Iterable[str]) -> Iterator[str]:
    """The texts in pieces SentencePiece's trainer keeps: each line (with its line break,
    so that newlines are learned too), cut into `_TRAIN_CHUNK_CHARS` characters at most."""
    for text in texts:
        for line in text.splitlines(keepends=True):
            for start in range(0, len(line), _TRAIN_CHUNK_CHARS):
                yield line[start : start + _TRAIN_CHUNK_CHARS]


class SentencePieceTokenizer:
    """A SentencePiece model (unigram) with the shared special ids.

    Build one with `SentencePieceTokenizer.train_or_load(...)` (trains once, then reuses the
    cached model file) or `SentencePieceTokenizer(model_path)` for an existing file.

    A model trained with `lossless=True` (`LOSSLESS_TRAINER_OPTIONS`) decodes every text back
    exactly; one trained without (the translation default) normalises text (NFKC, whitespace
    runs to one space) as models trained before lossless ones existed did. Which one a file
    holds is found by a probe round trip when it is loaded (`lossless`), so old files keep
    working as they did.

    Attributes:
        model_path: the model file.
        was_trained: True if this instance trained the model, False if it loaded a file.
        lossless: whether `decode(encode(text)) == text` for every text (byte fallback and
            whitespace kept; a literal U+2581 is written as its byte pieces).
    """

    pad_id = PAD_ID
    bos_id = BOS_ID
    eos_id = EOS_ID
    unk_id = UNK_ID
    specials = DEFAULT_SPECIALS

    def __init__(self, model_path: str | os.PathLike, *, was_trained: bool = False):
        """Loads a model file.

        Args:
            model_path: a `.model` file written by SentencePiece with this module's special ids.
            was_trained: recorded in `self.was_trained`; set by `train_or_load`.

        Raises:
            FileNotFoundError: the file does not exist.
            ValueError: the file is not a SentencePiece model or has other special ids.
        """
        self.model_path = pathlib.Path(model_path)
        self.was_trained = was_trained
        if not self.model_path.is_file():
            raise FileNotFoundError(
                f"SentencePiece model {self.model_path} not found; train one with "
                "SentencePieceTokenizer.train_or_load(texts, model_path, vocab_size)."
            )
        self._sp = spm.SentencePieceProcessor()
        try:
            self._sp.Load(model_file=str(self.model_path))
        except (RuntimeError, OSError) as err:
            raise ValueError(
                f"SentencePiece model {self.model_path} is corrupt or unreadable ({err}); "
                "delete it and it will be retrained on the next run."
            ) from err
        found = (self._sp.pad_id(), self._sp.bos_id(), self._sp.eos_id(), self._sp.unk_id())
        expected = (PAD_ID, BOS_ID, EOS_ID, UNK_ID)
        if found != expected:
            raise ValueError(
                f"SentencePiece model {self.model_path} has (pad, bos, eos, unk) ids {found}, "
                f"expected {expected}; delete it to retrain it with train_or_load."
            )
        # The byte pieces of a literal U+2581 (a model without byte pieces gives <unk>).
        self._space_ids = [self._sp.PieceToId(f"<0x{b:02X}>") for b in SPM_SPACE.encode()]
        probe = self._sp.DecodeIds(self._sp.EncodeAsIds(_LOSSLESS_PROBE))
        self.lossless = probe == _LOSSLESS_PROBE and UNK_ID not in self._space_ids

    @classmethod
    def train_or_load(
        cls,
        texts: Iterable[str],
        model_path: str | os.PathLike,
        vocab_size: int,
        *,
        character_coverage: float = DEFAULT_CHARACTER_COVERAGE,
        input_sentence_size: int = DEFAULT_INPUT_SENTENCE_SIZE,
        num_threads: int = DEFAULT_NUM_THREADS,
        byte_fallback: bool = False,
        lossless: bool = False,
    ) -> SentencePieceTokenizer:
        """Loads the model file at `model_path`, training it first if it is missing.

        For translation pass the source and target sides together (one shared vocabulary), e.g.
        `itertools.chain.from_iterable(train_pairs)`, and only the training split, so that
        validation text never shapes the vocabulary. The cache is keyed by vocab size only:
        delete the file after changing the corpus.

        Args:
            texts: training sentences; consumed only when the model has to be trained.
            model_path: the cached model (its folder is created if missing).
            vocab_size: number of pieces including the 4 special ids.
            character_coverage: fraction of characters the vocabulary must cover.
            input_sentence_size: at most this many sentences are used for training (0: all,
                else more than 100, as SentencePiece requires): beyond
                it, those with the smallest hashes (the same sample at every run).
            num_threads: SentencePiece trainer threads.
            byte_fallback: spell uncovered characters as bytes instead of <unk> (needs
                vocab_size above 256 + the number of distinct characters kept).
            lossless: train a model that decodes every text back exactly
                (`LOSSLESS_TRAINER_OPTIONS`: byte fallback, no normalisation, whitespace
                kept); needs vocab_size of at least 4 + 256 + the characters kept. An
                existing file is loaded as it is, lossless or not (see `lossless`).

        Returns:
            The tokenizer; `was_trained` says whether it was trained by this call.

        Raises:
            ValueError: vocab_size too small or too large for the corpus, or no text.
        """
        if vocab_size <= NUM_SPECIAL_IDS:
            raise ValueError(
                f"vocab_size={vocab_size} must exceed the {NUM_SPECIAL_IDS} special ids."
            )
        model_path = pathlib.Path(model_path)
        workdir = model_path.parent
        if model_path.exists():
            return cls(model_path)
        sentences = [t for t in texts if t.strip()]
        if not sentences:
            raise ValueError(
                f"No non-empty text to train the SentencePiece model {model_path} on; pass "
                "the training split's sentences as `texts`."
            )
        options = {"byte_fallback": byte_fallback}
        if lossless:
            options = LOSSLESS_TRAINER_OPTIONS
            sentences = list(_training_chunks(sentences))
        if input_sentence_size and len(sentences) > input_sentence_size:
            # SentencePiece would sample them with an unseeded generator, so two runs on one
            # corpus would get two tokenizers: take those with the smallest hashes instead.
            sentences = sorted(sentences, key=_sample_key)[:input_sentence_size]
        model = io.BytesIO()
        try:
            spm.SentencePieceTrainer.Train(
                sentence_iterator=iter(sentences),
                model_writer=model,
                vocab_size=vocab_size,
                model_type=SPM_MODEL_TYPE,
                character_coverage=character_coverage,
                input_sentence_size=input_sentence_size,
                shuffle_input_sentence=True,
                num_threads=num_threads,
                pad_id=PAD_ID,
                bos_id=BOS_ID,
                eos_id=EOS_ID,
                unk_id=UNK_ID,
                minloglevel=2,  # warnings and errors only: training logs are long
                **options,
            )
        except RuntimeError as err:
            too_small = _REQUIRED_PIECES.search(str(err))
            if too_small and lossless:
                raise ValueError(
                    f"vocab_size={vocab_size} is too small for a lossless SentencePiece model "
                    f"of this corpus: it needs at least {too_small.group(1)} pieces "
                    f"({NUM_SPECIAL_IDS} special ids, 256 byte pieces and one per character "
                    f"kept); set --config.vocab_size={too_small.group(1)} or more (or "
                    "--config.tokenizer=byte)."
                ) from err
            raise ValueError(
                f"SentencePiece training of {model_path} with vocab_size={vocab_size} on "
                f"{len(sentences)} sentences failed ({err}); choose a vocab_size in the range "
                "that message names (a small corpus supports only a small vocabulary)."
            ) from err
        workdir.mkdir(parents=True, exist_ok=True)
        # Write then rename, so an interrupted run never leaves a half-written cached model.
        with tempfile.NamedTemporaryFile(dir=workdir, suffix=".tmp", delete=False) as tmp:
            tmp.write(model.getvalue())
            tmp.flush()
            os.fsync(tmp.fileno())  # on disk before the rename makes it the cached model
        os.replace(tmp.name, model_path)
        return cls(model_path, was_trained=True)

    @property
    def vocab_size(self) -> int:
        """Number of pieces, special ids included."""
        return self._sp.GetPieceSize()

    def encode(self, text: str) -> list[int]:
        """Encodes text to piece ids (no BOS/EOS).

        Args:
            text: any string; a model that is not `lossless` normalises it (NFKC,
                whitespace) first.

        Returns:
            Piece ids in [4, vocab_size) (3 for characters outside the vocabulary of a model
            without byte fallback).

        Raises:
            ValueError: the text holds a lone surrogate (`check_encodable`).
        """
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """`encode` of each text, in one call (SentencePiece's own loop: faster for many).

        Args:
            texts: strings.

        Returns:
            One list of piece ids per text.

        Raises:
            ValueError: a text holds a lone surrogate (`check_encodable`).
        """
        texts = list(texts)
        try:
            docs = self._sp.Encode(texts, out_type=int)
        except (RuntimeError, TypeError):  # what SentencePiece says of a string not UTF-8
            for text in texts:
                check_encodable(text)
            raise
        if self.lossless:
            for i, text in enumerate(texts):
                if SPM_SPACE in text:
                    docs[i] = self._encode_with_space(text)
        return docs

    def _encode_with_space(self, text: str) -> list[int]:
        """A lossless model's ids of a text holding the literal U+2581, which SentencePiece
        would decode as a space: the parts between encoded, the byte pieces of U+2581
        between them."""
        parts = self._sp.Encode(text.split(SPM_SPACE), out_type=int)
        ids = list(parts[0])
        for part in parts[1:]:
            ids += self._space_ids
            ids += part
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """Decodes piece ids to text; pad, bos and eos are skipped.

        Args:
            ids: token ids in [0, vocab_size).

        Returns:
            The detokenised text (<unk> shows as " ⁇ ").
        """
        ids = _check_decodable(ids, self.vocab_size)
        return self._sp.DecodeIds(ids)

    def id_to_piece(self, token_id: int) -> str:
        """The SentencePiece piece of an id, as the model splits text (`▁` marks a word start).

        Args:
            token_id: an id in [0, vocab_size).
        """
        (token_id,) = _check_decodable([token_id], self.vocab_size)
        return self._sp.IdToPiece(token_id)
