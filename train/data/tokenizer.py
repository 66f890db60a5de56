"""Tokenizers: text <-> token ids, with one interface for bytes (`ByteTokenizer`, here),
SentencePiece (`train.data.spm_tokenizer`) and a pretrained model's own tokenizer
(`train.data.hf_tokenizer`); this module holds that interface and the special ids.

Every tokenizer has `encode(str) -> list[int]`, `decode(list[int]) -> str`, `vocab_size`,
`pad_id`, `bos_id`, `eos_id` and `unk_id`, gathered as `specials` (a `SpecialIds`). The
tokenizers trained here share one set (`DEFAULT_SPECIALS`: pad 0, bos 1, eos 2, unk 3); a
pretrained model's tokenizer has its own, so the batching code and the model config
(`pad_id`) take the ids from the run's tokenizer, never from the constants below.
`encode` adds no BOS/EOS: the batching code adds them where the task needs them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

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
