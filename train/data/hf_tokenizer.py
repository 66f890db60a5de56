"""A pretrained model's own tokenizer (`--config.tokenizer='pretrained'`): its
`tokenizer.json`, read with the `tokenizers` library (Hugging Face's Rust tokenizers; not
`transformers`).

The ids are the model's: a GPT-2 byte-level BPE id means what it meant in pretraining. Only
the special ids need a decision (`train.data.tokenizer.SpecialIds`):

- **bos / eos**: the model's own, from `config.json` (`bos_token_id`, `eos_token_id`), else
  from `tokenizer_config.json` (`bos_token`, `eos_token` looked up in the vocabulary). A
  sequence starts with the BOS only where the model's own tokenizer adds one
  (`SpecialIds.starts_with_bos`: what tokenizer.json's post-processor adds, as transformers
  5 decides): Llama's `<s>` yes; GPT-2's `<|endoftext|>` and SmolLM2's `<|im_start|>` (its
  id 1) no. Every document ends
  with the EOS, which also separates documents in a packed stream.
- **pad**: GPT-2 and Llama have no pad token that never occurs in text (a `pad_token_id`,
  where set, is often EOS or `<unk>`), and our models mask every `pad_id` key. As the
  library's importers do (`flax_transformer.interop.load_gpt2`, `load_llama`), the model
  gets one more id, `pad = V` (the checkpoint's vocabulary size), with a zero embedding row:
  `vocab_size = V + 1`. No text ever encodes to it; `train.export` drops it again.
- **unk**: the tokenizer's unknown token if it has one, else the pad id (only the
  translation task's word dropout writes it; byte-level BPE never needs it).

`encode` adds no special tokens (the batching frames sequences); `decode` drops pad, bos and
eos and keeps every other token, so a byte-level BPE round-trips any text exactly
(newlines, indentation, emoji).
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from train.data.tokenizer import SpecialIds, _check_decodable
from train.formats.sources.hf import TOKENIZER_CONFIG_FILE, TOKENIZER_FILE

# A text to ask a post-processor what it adds around any text.
_PROBE = "a"


def _token_id(tokenizer: Any, token: Any) -> int | None:
    """The id of a special token as tokenizer_config.json writes it (a string, or a dict
    with 'content'), or None."""
    if isinstance(token, dict):
        token = token.get("content")
    if not isinstance(token, str):
        return None
    return tokenizer.token_to_id(token)


def _rust_tokenizer():
    """`tokenizers.Tokenizer` (Hugging Face's Rust tokenizers)."""
    try:
        from tokenizers import Tokenizer
    except ImportError as err:  # pragma: no cover - a requirement of the program
        raise ValueError(
            "--config.tokenizer='pretrained' needs the `tokenizers` package: "
            "pip install -r requirements.txt"
        ) from err
    return Tokenizer


def _first_int(*values: Any) -> int | None:
    for value in values:
        if isinstance(value, list) and value:  # Llama 3 lists several eos ids
            value = value[0]
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


class PretrainedTokenizer:
    """A Hugging Face `tokenizer.json` behind the program's tokenizer interface
    (`train.data.tokenizer.Tokenizer`).

    Attributes:
        specials: pad (the added id V), bos, eos, unk; see the module docstring.
        where: where the tokenizer was read (a directory, or a GGUF file).
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        hf_config: Mapping[str, Any],
        tokenizer_config: Mapping[str, Any],
        model_vocab_size: int,
        pad_id: int,
        where: str | os.PathLike,
    ):
        """Wraps a `tokenizers.Tokenizer` and reads its special ids.

        Args:
            tokenizer: the `tokenizers.Tokenizer`.
            hf_config: the model's config.json (its `bos_token_id`, `eos_token_id`).
            tokenizer_config: tokenizer_config.json (its `bos_token`, `eos_token`,
                `unk_token`).
            model_vocab_size: the model's vocabulary, the added pad id included (V + 1).
            pad_id: the model's pad id (V for an imported checkpoint).
            where: named in errors.

        Raises:
            ValueError: a tokenizer with more ids than the model has, or no BOS/EOS to be
                found.
        """
        self.where = pathlib.Path(where)
        self._tok = tokenizer
        self._size = self._tok.get_vocab_size(with_added_tokens=True)
        if self._size > model_vocab_size:
            raise ValueError(
                f"{self.where}: the tokenizer has {self._size} ids but the model's vocabulary "
                f"holds {model_vocab_size}: the tokenizer does not belong to this model."
            )
        self._model_vocab_size = model_vocab_size
        self.specials = self._read_specials(hf_config, tokenizer_config, pad_id)

    @classmethod
    def from_directory(
        cls, directory: str | os.PathLike, *, model_vocab_size: int, pad_id: int
    ) -> PretrainedTokenizer:
        """The tokenizer of a Hugging Face model directory (or a run's copy of its files):
        `tokenizer.json`, with the special tokens of `config.json` and
        `tokenizer_config.json`.

        Raises:
            ValueError: no tokenizer.json, the `tokenizers` package missing, or as
                `PretrainedTokenizer`.
        """
        directory = pathlib.Path(directory)
        path = directory / TOKENIZER_FILE
        if not path.is_file():
            raise ValueError(
                f"{path} not found: --config.tokenizer='pretrained' reads the model's "
                "tokenizer.json (save_pretrained writes it: tokenizer.save_pretrained(dir))."
            )

        def read(name: str) -> dict:
            path = directory / name
            return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}

        return cls(
            _rust_tokenizer().from_file(str(path)),
            hf_config=read("config.json"),
            tokenizer_config=read(TOKENIZER_CONFIG_FILE),
            model_vocab_size=model_vocab_size,
            pad_id=pad_id,
            where=directory,
        )

    @classmethod
    def from_json(cls, text: str, **kwargs: Any) -> PretrainedTokenizer:
        """The tokenizer of a `tokenizer.json` text (a GGUF file's); `kwargs` as
        `PretrainedTokenizer`."""
        return cls(_rust_tokenizer().from_str(text), **kwargs)

    def _read_specials(
        self, model: Mapping[str, Any], tok: Mapping[str, Any], pad_id: int
    ) -> SpecialIds:
        bos = _first_int(model.get("bos_token_id"), _token_id(self._tok, tok.get("bos_token")))
        eos = _first_int(model.get("eos_token_id"), _token_id(self._tok, tok.get("eos_token")))
        if bos is None and eos is None:
            raise ValueError(
                f"{self.where}: neither config.json (bos_token_id, eos_token_id) nor "
                f"{TOKENIZER_CONFIG_FILE} (bos_token, eos_token) names a start or end token; "
                "add them there."
            )
        bos = eos if bos is None else bos
        eos = bos if eos is None else eos
        unk = _token_id(self._tok, tok.get("unk_token"))
        return SpecialIds(
            pad=pad_id,
            bos=bos,
            eos=eos,
            unk=pad_id if unk is None else unk,
            starts_with_bos=self._starts_with_bos(bos),
        )

    def _starts_with_bos(self, bos: int) -> bool:
        """Whether the tokenizer starts a text with its BOS: what tokenizer.json's
        post-processor adds. As in transformers 5, which drops tokenizer_config.json's
        `add_bos_token` wherever a tokenizer.json exists (a GGUF file's flag is written into
        the post-processor of the tokenizer.json made from it)."""
        if self._tok.post_processor is None:
            return False
        plain = self._tok.encode(_PROBE, add_special_tokens=False).ids
        framed = self._tok.encode(_PROBE, add_special_tokens=True).ids
        return len(framed) > len(plain) and framed[0] == bos

    @property
    def pad_id(self) -> int:
        return self.specials.pad

    @property
    def bos_id(self) -> int:
        return self.specials.bos

    @property
    def eos_id(self) -> int:
        return self.specials.eos

    @property
    def unk_id(self) -> int:
        return self.specials.unk

    @property
    def vocab_size(self) -> int:
        """The model's vocabulary, the added pad id included."""
        return self._model_vocab_size

    def encode(self, text: str) -> list[int]:
        """The model's ids of `text`, without special tokens."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """`encode(text)` and each token's [start, end) character span in `text` (the Rust
        tokenizer's offsets: a byte-level token holding part of a character spans all of it),
        for mapping tokens to the characters a chat template wrote (`train.data.chat.encoding`)."""
        encoding = self._tok.encode(text, add_special_tokens=False)
        return encoding.ids, encoding.offsets

    @property
    def added_tokens(self) -> dict[str, int]:
        """The tokens matched whole in any text (special or not; '<|im_end|>',
        '<|eot_id|>'...): token -> id."""
        return {t.content: i for i, t in self._tok.get_added_tokens_decoder().items()}

    @property
    def special_token_ids(self) -> frozenset[int]:
        """The ids of the added tokens marked special (control tokens)."""
        decoder = self._tok.get_added_tokens_decoder()
        return frozenset(i for i, t in decoder.items() if t.special)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """`encode` of each text, in one call (the Rust tokenizer's threads)."""
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        """The text of `ids`; pad, bos and eos are dropped, every other token kept.

        Raises:
            ValueError: an id outside [0, vocab_size).
        """
        ids = _check_decodable(ids, self._model_vocab_size)
        drop = {self.pad_id, self.bos_id, self.eos_id}
        kept = [i for i in ids if i not in drop and i < self._size]
        return self._tok.decode(kept, skip_special_tokens=False)

    def id_to_piece(self, token_id: int) -> str:
        """The tokenizer's token for an id (byte-level BPE shows a space as 'Ġ')."""
        (token_id,) = _check_decodable([token_id], self._model_vocab_size)
        if token_id == self.pad_id and token_id >= self._size:
            return "<pad>"
        return self._tok.id_to_token(token_id) or f"<{token_id}>"
