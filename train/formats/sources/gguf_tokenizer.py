"""The tokenizer a GGUF file describes (`tokenizer.ggml.*`), built as a Hugging Face
`tokenizers.Tokenizer`: what `train.formats.sources.gguf` writes as the run's `tokenizer.json`.

A GGUF file keeps no `tokenizer.json`, only its parts, in llama.cpp's key names:

    tokenizer.ggml.model       'gpt2': a byte-level BPE (the only kind read here)
    tokenizer.ggml.pre         the pre-tokenizer, by name (`PRE_TOKENIZERS`)
    tokenizer.ggml.tokens      the vocabulary, in id order, in GPT-2's byte alphabet
    tokenizer.ggml.merges      the BPE merges, best first, as 'left right'
    tokenizer.ggml.token_type  per token: 3 control (special), 4 user-defined, 1 normal...
    tokenizer.ggml.{bos,eos,unknown,padding}_token_id, add_bos_token, add_eos_token

The pieces are put together as transformers' GGUF loader does
(`transformers.integrations.gguf.gguf_tokenizer_mapping`): a BPE model without an unknown
token, GPT-2's byte-level decoder, control tokens (and the bos/eos/unk/pad tokens) as special
added tokens, user-defined tokens as plain added tokens, both matched whole in the text.

The pre-tokenizer is the one llama.cpp's tokenizer (`llama-vocab.cpp`) applies for the
file's `tokenizer.ggml.pre`, which is the one the model was trained with:

    'gpt2'                             GPT-2's regex ('s|'t|...| ?\\p{L}+| ?\\p{N}+|...)
    'smollm'                           each digit alone (\\p{N}), then GPT-2's regex
                                       (SmolLM's own tokenizer.json: Digits + ByteLevel)
    'llama-bpe', 'llama3', 'llama-v3'  Llama 3's regex; a word that is a whole token is
                                       taken as it is (`ignore_merges`, as llama.cpp and
                                       Llama 3's tokenizer.json do)

transformers 5 builds the same tokenizer for 'gpt2', but leaves out two of these steps: it
has no 'smollm' entry (so no digit split: '  1' after a word is 'Ġ','Ġ','1' there and
'ĠĠ','1' here, as SmolLM2 was trained), and it keeps `ignore_merges` off for Llama 3.
tests/test_gguf.py pins both differences.

`add_bos_token` / `add_eos_token` become the tokenizer's post-processor (a
`TemplateProcessing` that frames one text as `[bos] $A [eos]`, each only where the file says
so), as transformers frames them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

# GGUF token types (gguf.TokenType; llama.cpp's llama_token_type).
CONTROL = 3
USER_DEFINED = 4

# The vocabulary kind read: GPT-2's byte-level BPE (SentencePiece 'llama', 'bert', 't5' are not).
BYTE_LEVEL_BPE = "gpt2"

# Llama 3's pre-tokenizer regex (its tokenizer.json; llama.cpp's LLAMA3 pre-tokenizer).
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Special-token roles: tokenizer_config.json's key -> the GGUF key of its id.
SPECIAL_IDS = {
    "bos_token": "tokenizer.ggml.bos_token_id",
    "eos_token": "tokenizer.ggml.eos_token_id",
    "unk_token": "tokenizer.ggml.unknown_token_id",
    "pad_token": "tokenizer.ggml.padding_token_id",
}


def _gpt2_regex():
    from tokenizers import pre_tokenizers

    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _smollm():
    from tokenizers import pre_tokenizers

    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _gpt2_regex()])


def _llama3():
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


# `tokenizer.ggml.pre` -> (the pre-tokenizer, whether whole-word tokens skip the merges).
PRE_TOKENIZERS: dict[str, tuple[Callable[[], Any], bool]] = {
    "gpt2": (_gpt2_regex, False),
    "smollm": (_smollm, False),
    "llama-bpe": (_llama3, True),
    "llama3": (_llama3, True),
    "llama-v3": (_llama3, True),
}


def byte_spelling() -> dict[int, str]:
    """GPT-2's byte alphabet: each byte as one printable character (the printable Latin-1
    bytes as themselves, the others shifted past U+0100 in byte order)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    spelling = {byte: chr(byte) for byte in printable}
    shifted = 0
    for byte in range(256):
        if byte not in spelling:
            spelling[byte] = chr(256 + shifted)
            shifted += 1
    return spelling


class TokenizerError(ValueError):
    """A tokenizer the file describes that cannot be built (the caller names the file)."""


def build_tokenizer(meta: Mapping[str, Any]):
    """The `tokenizers.Tokenizer` of a GGUF file's `tokenizer.ggml.*` metadata.

    Args:
        meta: the file's metadata (key -> value; arrays as lists).

    Raises:
        TokenizerError: a vocabulary kind or pre-tokenizer not read here (named, with the
            ones that are), or merges / token types that do not fit the token list.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models

    kind = meta.get("tokenizer.ggml.model")
    if kind != BYTE_LEVEL_BPE:
        raise TokenizerError(
            f"tokenizer.ggml.model={kind!r} is not supported; init_from reads byte-level BPE "
            f"vocabularies ({BYTE_LEVEL_BPE!r}: GPT-2, SmolLM, Llama 3)"
        )
    pre = meta.get("tokenizer.ggml.pre")
    if pre not in PRE_TOKENIZERS:
        raise TokenizerError(
            f"tokenizer.ggml.pre={pre!r} is not supported; init_from reads the pre-tokenizers "
            f"{sorted(PRE_TOKENIZERS)}"
        )
    tokens = list(meta["tokenizer.ggml.tokens"])
    types = list(meta.get("tokenizer.ggml.token_type") or [])
    if types and len(types) != len(tokens):
        raise TokenizerError(
            f"tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens"
        )
    merges = []
    for i, merge in enumerate(meta.get("tokenizer.ggml.merges") or []):
        pair = tuple(merge.split(" "))
        if len(pair) != 2:
            raise TokenizerError(f"tokenizer.ggml.merges[{i}]={merge!r} is not 'left right'")
        merges.append(pair)
    if not merges:
        raise TokenizerError("tokenizer.ggml.merges is missing or empty: a BPE needs its merges")

    spelling = byte_spelling()
    alphabet = set(spelling.values())

    def spelled(token: str) -> str:  # a token written in plain UTF-8, as transformers reads it
        if set(token) <= alphabet:
            return token
        return "".join(spelling[byte] for byte in token.encode("utf-8"))

    vocab = {spelled(token): index for index, token in enumerate(tokens)}
    make_pre, ignore_merges = PRE_TOKENIZERS[pre]
    try:
        bpe = models.BPE(
            vocab=vocab,
            merges=merges,
            dropout=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            ignore_merges=ignore_merges,
        )
    except Exception as err:  # tokenizers raises a bare Exception: a merge of unknown tokens
        raise TokenizerError(
            f"tokenizer.ggml.merges do not fit tokenizer.ggml.tokens ({err})"
        ) from None
    tokenizer = Tokenizer(bpe)
    tokenizer.pre_tokenizer = make_pre()
    tokenizer.decoder = decoders.ByteLevel()
    roles = special_tokens(meta)
    special = [
        t for t, k in zip(tokens, types, strict=False) if k == CONTROL and set(t) <= alphabet
    ]
    special += [t for t in roles.values() if t is not None and t not in special]
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    plain = [t for t, k in zip(tokens, types, strict=False) if k == USER_DEFINED and t in vocab]
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in plain])
    tokenizer.post_processor = _framing(meta, roles, vocab)
    return tokenizer


def special_tokens(meta: Mapping[str, Any]) -> dict[str, str | None]:
    """tokenizer_config.json's bos/eos/unk/pad tokens: the file's ids, as tokens (None
    where the file names none).

    Raises:
        TokenizerError: an id outside the token list.
    """
    tokens = meta["tokenizer.ggml.tokens"]
    out: dict[str, str | None] = {}
    for role, key in SPECIAL_IDS.items():
        index = meta.get(key)
        if index is not None and not 0 <= index < len(tokens):
            raise TokenizerError(f"{key}={index} is outside its {len(tokens)} tokens")
        out[role] = None if index is None else tokens[index]
    return out


def framing_flags(meta: Mapping[str, Any]) -> dict[str, bool]:
    """`add_bos_token` and `add_eos_token` as the file says (False where it says nothing,
    as transformers reads a byte-level BPE's)."""
    return {
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
    }


def _framing(meta: Mapping[str, Any], roles: Mapping[str, str | None], vocab: Mapping[str, int]):
    """The post-processor: `[bos] $A [eos]` with each mark only where the file adds it."""
    from tokenizers import processors

    flags = framing_flags(meta)
    bos = roles["bos_token"] if flags["add_bos_token"] else None
    eos = roles["eos_token"] if flags["add_eos_token"] else None
    marks = [t for t in (bos, eos) if t is not None]

    def frame(sequence: str, type_id: int) -> str:
        parts = [f"{bos}:{type_id}"] if bos else []
        parts.append(f"${sequence}:{type_id}")
        return " ".join(parts + ([f"{eos}:{type_id}"] if eos else []))

    return processors.TemplateProcessing(
        single=frame("A", 0),
        pair=f"{frame('A', 0)} {frame('B', 1)}",
        special_tokens=[(t, vocab[t]) for t in dict.fromkeys(marks)],
    )


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
