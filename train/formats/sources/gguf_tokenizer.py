"""The tokenizer a GGUF file describes (`tokenizer.ggml.*`), built as a Hugging Face
`tokenizers.Tokenizer`: what `train.formats.sources.gguf` writes as the run's `tokenizer.json`.

The vocabulary and the tokenizer are the library's (`flax_transformer.interop.gguf_vocab.
GGUFVocab`, whose docstring lists the keys and pre-tokenizers read); this module adds the
program's files around it: tokenizer_config.json (special tokens, framing flags, the chat
template) and the deterministic `tokenizer.json` text.

transformers 5 builds the same tokenizer for 'gpt2', but leaves out two steps llama.cpp
takes: it has no 'smollm' entry (so no digit split: '  1' after a word is 'Ġ','Ġ','1' there
and 'ĠĠ','1' here, as SmolLM2 was trained), and it keeps `ignore_merges` off for Llama 3.
tests/test_gguf.py pins both differences.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from flax_transformer.interop.gguf_vocab import (
    CONTROL,
    PRE_TOKENIZERS,
    USER_DEFINED,
    GGUFVocab,
    byte_spelling,
)

__all__ = [
    "CONTROL",
    "PRE_TOKENIZERS",
    "USER_DEFINED",
    "TokenizerError",
    "as_json",
    "build_tokenizer",
    "byte_spelling",
    "framing_flags",
    "special_tokens",
    "tokenizer_config",
    "tokenizer_json",
]


class TokenizerError(ValueError):
    """A tokenizer the file describes that cannot be built (the caller names the file)."""


def _vocab(meta: Mapping[str, Any]) -> GGUFVocab:
    try:
        return GGUFVocab.from_metadata(meta)
    except ValueError as err:
        raise TokenizerError(str(err)) from None


def build_tokenizer(meta: Mapping[str, Any]):
    """The `tokenizers.Tokenizer` of a GGUF file's `tokenizer.ggml.*` metadata (the file's V
    ids; the program's pad id is added by `train.data.hf_tokenizer`).

    Raises:
        TokenizerError: a vocabulary kind or pre-tokenizer not read here (named, with the
            ones that are), or merges / token types that do not fit the token list.
    """
    try:
        return _vocab(meta).tokenizer()
    except TokenizerError:
        raise
    except ValueError as err:
        raise TokenizerError(str(err)) from None


def special_tokens(meta: Mapping[str, Any]) -> dict[str, str | None]:
    """tokenizer_config.json's bos/eos/unk/pad tokens: the file's ids, as tokens (None
    where the file names none).

    Raises:
        TokenizerError: an id outside the token list.
    """
    return _vocab(meta).special_tokens()


def framing_flags(meta: Mapping[str, Any]) -> dict[str, bool]:
    """`add_bos_token` and `add_eos_token` as the file says (False where it says nothing,
    as transformers reads a byte-level BPE's)."""
    return {
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
    }


def tokenizer_config(meta: Mapping[str, Any], max_length: int) -> dict[str, Any]:
    """tokenizer_config.json for the tokenizer: its special tokens, its framing flags and
    the file's chat template (`tokenizer.chat_template`), for transformers and for the
    program's own readers (`train.data.hf_tokenizer`)."""
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **{role: token for role, token in special_tokens(meta).items() if token is not None},
        **framing_flags(meta),
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_length,
    }
    template = meta.get("tokenizer.chat_template")
    if template is not None:
        config["chat_template"] = template
    return config


def tokenizer_json(meta: Mapping[str, Any]) -> str:
    """The tokenizer as `tokenizer.json` text (deterministic: the run's snapshot and a token
    store compare its SHA-256)."""
    return build_tokenizer(meta).to_str(pretty=False)


def as_json(value: Mapping[str, Any] | Sequence[Any]) -> str:
    """A config file's text as the snapshot writes it."""
    return json.dumps(value, indent=2, ensure_ascii=False) + "\n"
