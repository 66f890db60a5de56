"""SentencePiece tokenizers (unigram) with the shared special ids: trained once on a run's
training split and cached as a model file (`SentencePieceTokenizer.train_or_load`), or loaded
from one; lossless models (byte fallback, whitespace kept) decode every text back exactly.
The interface they share with the other tokenizers is `train.data.tokenizer`'s."""

from __future__ import annotations

import hashlib
import io
import os
import pathlib
import re
import tempfile
from collections.abc import Iterable, Iterator, Sequence

import sentencepiece as spm

from train.data.tokenizer import (
    BOS_ID,
    DEFAULT_SPECIALS,
    EOS_ID,
    NUM_SPECIAL_IDS,
    PAD_ID,
    UNK_ID,
    _check_decodable,
    check_encodable,
)

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
