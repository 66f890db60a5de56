"""A GGUF file's vocabulary (`tokenizer.ggml.*`): `GGUFVocab`, read from a file's metadata
or from a Hugging Face `tokenizers.Tokenizer`, written back as the same keys, and built as a
`tokenizers.Tokenizer` that encodes as llama.cpp does.

A GGUF file keeps no `tokenizer.json`, only its parts, in llama.cpp's key names:

    tokenizer.ggml.model       'gpt2': a byte-level BPE (the only kind read and written here)
    tokenizer.ggml.pre         the pre-tokenizer, by name (`PRE_TOKENIZERS`)
    tokenizer.ggml.tokens      the vocabulary, in id order, in GPT-2's byte alphabet
    tokenizer.ggml.merges      the BPE merges, best first, as 'left right'
    tokenizer.ggml.token_type  per token: 1 normal, 3 control (special), 4 user-defined...
    tokenizer.ggml.{bos,eos,unknown,padding}_token_id, add_bos_token, add_eos_token

The pieces are put together as transformers' GGUF loader does: a BPE model without an
unknown token, GPT-2's byte-level decoder, control tokens (and the bos/eos/unk/pad tokens) as
special added tokens, user-defined tokens as plain added tokens, both matched whole. The
pre-tokenizer is the one llama.cpp's `llama-vocab.cpp` applies for the file's
`tokenizer.ggml.pre`:

    'gpt2'                             GPT-2's regex ('s|'t|...| ?\\p{L}+| ?\\p{N}+|...)
    'smollm'                           each digit alone (\\p{N}), then GPT-2's regex
    'llama-bpe', 'llama3', 'llama-v3'  Llama 3's regex; a word that is a whole token is
                                       taken as it is (`ignore_merges`)

`add_bos_token` / `add_eos_token` become the post-processor (`[bos] $A [eos]`, each mark
only where the file says so).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from typing import Any

# GGUF token types (gguf.TokenType; llama.cpp's llama_token_type).
NORMAL = 1
CONTROL = 3
USER_DEFINED = 4

# The vocabulary kind read and written: GPT-2's byte-level BPE (SentencePiece's 'llama',
# 'bert', 't5' are not).
BYTE_LEVEL_BPE = "gpt2"

# Llama 3's pre-tokenizer regex (its tokenizer.json; llama.cpp's LLAMA3 pre-tokenizer).
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Special-token roles: GGUFVocab's field -> the GGUF key of its id.
SPECIAL_ID_KEYS = {
    "bos_id": "tokenizer.ggml.bos_token_id",
    "eos_id": "tokenizer.ggml.eos_token_id",
    "unk_id": "tokenizer.ggml.unknown_token_id",
    "pad_id": "tokenizer.ggml.padding_token_id",
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
# The first name of each pre-tokenizer is the one written for a Hugging Face tokenizer.
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


@dataclasses.dataclass(frozen=True)
class GGUFVocab:
    """The `tokenizer.ggml.*` metadata of a byte-level BPE, as llama.cpp reads it.

    Attributes:
        tokens: the V tokens in id order (GPT-2's byte alphabet; special tokens as text).
        token_types: one GGUF token type per token (`NORMAL`, `CONTROL`, `USER_DEFINED`).
        merges: the BPE merges, best first, each 'left right'.
        pre: llama.cpp's pre-tokenizer name (a key of `PRE_TOKENIZERS`).
        bos_id, eos_id, unk_id, pad_id: the special ids (None: the file names none).
        add_bos, add_eos: whether llama.cpp frames a text with BOS / EOS.
    """

    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    merges: tuple[str, ...]
    pre: str
    bos_id: int | None = None
    eos_id: int | None = None
    unk_id: int | None = None
    pad_id: int | None = None
    add_bos: bool = False
    add_eos: bool = False

    def __post_init__(self):
        if self.pre not in PRE_TOKENIZERS:
            raise ValueError(
                f"tokenizer.ggml.pre={self.pre!r} is not supported; the GGUF vocabularies read "
                f"and written here use the pre-tokenizers {sorted(PRE_TOKENIZERS)}"
            )
        if len(self.token_types) != len(self.tokens):
            raise ValueError(
                f"tokenizer.ggml.token_type has {len(self.token_types)} entries for "
                f"{len(self.tokens)} tokens"
            )
        if not self.merges:
            raise ValueError("tokenizer.ggml.merges is missing or empty: a BPE needs its merges")
        for i, merge in enumerate(self.merges):
            if len(merge.split(" ")) != 2:
                raise ValueError(f"tokenizer.ggml.merges[{i}]={merge!r} is not 'left right'")
        for field, key in SPECIAL_ID_KEYS.items():
            index = getattr(self, field)
            if index is not None and not 0 <= index < len(self.tokens):
                raise ValueError(f"{key}={index} is outside its {len(self.tokens)} tokens")

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any]) -> GGUFVocab:
        """The vocabulary of a GGUF file's metadata (key -> value, arrays as lists).

        Raises:
            ValueError: a vocabulary kind or pre-tokenizer not read here (named, with the
                ones that are), or merges / token types / ids that do not fit the tokens.
        """
        kind = meta.get("tokenizer.ggml.model")
        if kind != BYTE_LEVEL_BPE:
            raise ValueError(
                f"tokenizer.ggml.model={kind!r} is not supported; the GGUF reader reads "
                f"byte-level BPE vocabularies ({BYTE_LEVEL_BPE!r}: GPT-2, SmolLM, Llama 3)"
            )
        tokens = tuple(meta.get("tokenizer.ggml.tokens") or ())
        if not tokens:
            raise ValueError("has no tokenizer.ggml.tokens: the model's vocabulary is missing")
        types = tuple(int(t) for t in meta.get("tokenizer.ggml.token_type") or ())
        ids = {field: meta.get(key) for field, key in SPECIAL_ID_KEYS.items()}
        return cls(
            tokens=tokens,
            token_types=types or (NORMAL,) * len(tokens),
            merges=tuple(meta.get("tokenizer.ggml.merges") or ()),
            pre=meta.get("tokenizer.ggml.pre"),
            **{field: None if i is None else int(i) for field, i in ids.items()},
            add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
            add_eos=bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        )

    def metadata(self) -> dict[str, Any]:
        """The `tokenizer.ggml.*` keys and values llama.cpp reads (None ids left out)."""
        meta: dict[str, Any] = {
            "tokenizer.ggml.model": BYTE_LEVEL_BPE,
            "tokenizer.ggml.pre": self.pre,
            "tokenizer.ggml.tokens": list(self.tokens),
            "tokenizer.ggml.token_type": list(self.token_types),
            "tokenizer.ggml.merges": list(self.merges),
        }
        for field, key in SPECIAL_ID_KEYS.items():
            if getattr(self, field) is not None:
                meta[key] = getattr(self, field)
        meta["tokenizer.ggml.add_bos_token"] = self.add_bos
        meta["tokenizer.ggml.add_eos_token"] = self.add_eos
        return meta

    def special_tokens(self) -> dict[str, str | None]:
        """tokenizer_config.json's bos/eos/unk/pad tokens (None where there is no id)."""
        roles = {"bos_token": self.bos_id, "eos_token": self.eos_id}
        roles |= {"unk_token": self.unk_id, "pad_token": self.pad_id}
        return {role: None if i is None else self.tokens[i] for role, i in roles.items()}

    def tokenizer(self):
        """The vocabulary as a `tokenizers.Tokenizer` that encodes as llama.cpp does (the
        module docstring). Its ids are the file's: V tokens, no pad id added.

        Raises:
            ValueError: merges of tokens the vocabulary lacks.
        """
        from tokenizers import AddedToken, Tokenizer, decoders, models

        spelling = byte_spelling()
        alphabet = set(spelling.values())

        def spelled(token: str) -> str:  # a token written in plain UTF-8, as transformers reads
            if set(token) <= alphabet:
                return token
            return "".join(spelling[byte] for byte in token.encode("utf-8"))

        vocab = {spelled(token): index for index, token in enumerate(self.tokens)}
        make_pre, ignore_merges = PRE_TOKENIZERS[self.pre]
        try:
            bpe = models.BPE(
                vocab=vocab,
                merges=[tuple(merge.split(" ")) for merge in self.merges],
                dropout=None,
                continuing_subword_prefix="",
                end_of_word_suffix="",
                fuse_unk=False,
                ignore_merges=ignore_merges,
            )
        except Exception as err:  # tokenizers raises a bare Exception: a merge of unknown tokens
            raise ValueError(
                f"tokenizer.ggml.merges do not fit tokenizer.ggml.tokens ({err})"
            ) from None
        tokenizer = Tokenizer(bpe)
        tokenizer.pre_tokenizer = make_pre()
        tokenizer.decoder = decoders.ByteLevel()
        pairs = list(zip(self.tokens, self.token_types, strict=True))
        special = [t for t, k in pairs if k == CONTROL and set(t) <= alphabet]
        roles = self.special_tokens()
        special += [t for t in roles.values() if t is not None and t not in special]
        tokenizer.add_special_tokens(
            [AddedToken(t, special=True, normalized=False) for t in special]
        )
        plain = [t for t, k in pairs if k == USER_DEFINED and t in vocab]
        tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in plain])
        tokenizer.post_processor = self._framing(roles, vocab)
        return tokenizer

    def _framing(self, roles: Mapping[str, str | None], vocab: Mapping[str, int]):
        """The post-processor: `[bos] $A [eos]` with each mark only where the file adds it."""
        from tokenizers import processors

        bos = roles["bos_token"] if self.add_bos else None
        eos = roles["eos_token"] if self.add_eos else None
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

    @classmethod
    def from_tokenizer(
        cls,
        tokenizer: Any,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        unk_token: str | None = None,
        pad_token: str | None = None,
        pre: str | None = None,
    ) -> GGUFVocab:
        """The GGUF vocabulary of a Hugging Face byte-level BPE `tokenizers.Tokenizer` (or
        its `tokenizer.json` text): tokens in id order, added special tokens as control
        tokens, other added tokens user-defined, the merges, BOS / EOS framing as its
        post-processor adds them.

        Args:
            tokenizer: the tokenizer (e.g. `Tokenizer.from_file('tokenizer.json')`).
            bos_token, eos_token, unk_token, pad_token: the special tokens (as in
                tokenizer_config.json); each must be in the vocabulary.
            pre: llama.cpp's pre-tokenizer name; None: recognised from the tokenizer's own
                pre-tokenizer among `PRE_TOKENIZERS`.

        Raises:
            ValueError: a tokenizer llama.cpp has no kind for (not a byte-level BPE, a
                normalizer, an unknown pre-tokenizer), ids with gaps, or a special token
                not in the vocabulary; one line naming it.
        """
        from tokenizers import Tokenizer

        if isinstance(tokenizer, str):
            tokenizer = Tokenizer.from_str(tokenizer)
        spec = json.loads(tokenizer.to_str())
        model = spec.get("model") or {}
        decoder = spec.get("decoder") or {}
        if model.get("type") != "BPE" or decoder.get("type") != "ByteLevel":
            raise ValueError(
                f"the tokenizer is a {model.get('type')} model with a {decoder.get('type')} "
                "decoder, which has no llama.cpp vocabulary kind here; GGUF export writes "
                "byte-level BPE tokenizers (GPT-2, SmolLM, Llama 3)"
            )
        if spec.get("normalizer") is not None:
            raise ValueError(
                f"the tokenizer has a normalizer ({spec['normalizer'].get('type')}), which "
                "llama.cpp's byte-level BPE does not apply; GGUF export refuses it"
            )
        pre = _recognise_pre(spec) if pre is None else pre
        by_id = {index: token for token, index in model["vocab"].items()}
        types = dict.fromkeys(by_id, NORMAL)
        for added in spec.get("added_tokens") or []:
            by_id[added["id"]] = added["content"]
            types[added["id"]] = CONTROL if added["special"] else USER_DEFINED
        gaps = sorted(set(range(len(by_id))) - set(by_id))
        if gaps:
            raise ValueError(
                f"the tokenizer's ids have gaps (first missing id {gaps[0]}); a GGUF "
                "vocabulary lists every id from 0"
            )
        tokens = tuple(by_id[i] for i in range(len(by_id)))
        index = {token: i for i, token in enumerate(tokens)}

        def token_id(role: str, token: str | None) -> int | None:
            if token is None:
                return None
            if token not in index:
                raise ValueError(f"{role}={token!r} is not in the tokenizer's vocabulary")
            return index[token]

        ids = dict(bos_id=token_id("bos_token", bos_token), eos_id=token_id("eos_token", eos_token))
        ids |= dict(
            unk_id=token_id("unk_token", unk_token), pad_id=token_id("pad_token", pad_token)
        )
        probe = "a"  # a text each framing mark shows on
        framed = tokenizer.encode(probe).ids
        bare = tokenizer.encode(probe, add_special_tokens=False).ids
        merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
        return cls(
            tokens=tokens,
            token_types=tuple(types[i] for i in range(len(tokens))),
            merges=tuple(merges),
            pre=pre,
            **ids,
            add_bos=ids["bos_id"] is not None and framed[:1] == [ids["bos_id"]] != bare[:1],
            add_eos=ids["eos_id"] is not None and framed[-1:] == [ids["eos_id"]] != bare[-1:],
        )


def _recognise_pre(spec: Mapping[str, Any]) -> str:
    """llama.cpp's name for a tokenizer.json's pre-tokenizer (and its `ignore_merges`).

    Raises:
        ValueError: none of `PRE_TOKENIZERS` matches.
    """
    from tokenizers import Tokenizer, models

    have = (spec.get("pre_tokenizer"), bool(spec["model"].get("ignore_merges", False)))
    for name, (make, ignore_merges) in PRE_TOKENIZERS.items():
        probe = Tokenizer(models.BPE())
        probe.pre_tokenizer = make()
        if (json.loads(probe.to_str())["pre_tokenizer"], ignore_merges) == have:
            return name
    raise ValueError(
        f"the tokenizer's pre-tokenizer ({json.dumps(have[0])[:200]}) is none llama.cpp knows "
        f"here ({', '.join(PRE_TOKENIZERS)}); name one with pre= if it splits text the same way"
    )
