"""The one tokenizer factory: `open_tokenizer(kind, vocab_size, path)` for a run, a token
store, its worker processes, the tools that read a trained run, and a pretrained source.

    kind             path                                   the tokenizer
    'byte'           (unused)                               ByteTokenizer
    'sentencepiece'  the model file (`spm_<V>.model` of a   SentencePieceTokenizer, trained on
                     run, `tokenizer.model` of a store)     `train_texts` where the file is missing
    'pretrained'     a pretrained source or its snapshot    the model's own
                     (a Hugging Face directory, a GGUF      (`train.formats.sources`):
                     file, a run)                           `tokenizer.json`, the GGUF file's
                                                            `tokenizer.ggml.*`, or the run's own

`Vocabulary` is what a run resolved once of its ids (the tokenizer kind, the model's
vocabulary size, the pretrained source, open), handed to the data path (the token store, the
chat template) so that it never reads `--config.init_from` again: a run opens its source once
(`train.program.loop`) and every floor below takes that `Source` (`source=`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
from collections.abc import Sequence

from train.core.rundir import RunDir
from train.data.hf_tokenizer import PretrainedTokenizer
from train.data.spm_tokenizer import SentencePieceTokenizer
from train.data.tokenizer import ByteTokenizer, Tokenizer
from train.formats import sources


def open_tokenizer(
    kind: str,
    vocab_size: int,
    path: str | os.PathLike,
    *,
    train_texts: Sequence[str] | None = None,
    lossless: bool = False,
    source: sources.Source | None = None,
) -> Tokenizer:
    """The tokenizer of `kind` read from `path` (see the module docstring).

    Args:
        kind: 'byte', 'sentencepiece' or 'pretrained' (`--config.tokenizer`).
        vocab_size: SentencePiece pieces (`--config.vocab_size`; unused by the others).
        path: the SentencePiece model file, or the pretrained source's directory.
        train_texts: the texts SentencePiece is trained on where `path` is missing (None:
            the model must exist).
        lossless: train a lossless SentencePiece model (the documents are verbatim); a model
            already there is read as it is (`SentencePieceTokenizer.lossless` says which).
        source: for 'pretrained', the source already open (the run's): its tokenizer,
            `path` not read (a copy of the same tokenizer: the run's snapshot, a store's).

    Raises:
        FileNotFoundError: the SentencePiece model is missing and no training text given.
        ValueError: an unknown kind, or a pretrained source that does not read.
    """
    if kind == "byte":
        return ByteTokenizer()
    if kind == "pretrained":
        return source_tokenizer(source or sources.read_source(path, need_weights=False))
    if kind != "sentencepiece":
        raise ValueError(
            f"--config.tokenizer={kind!r}: must be 'byte', 'sentencepiece' or 'pretrained'."
        )
    if train_texts is None:
        return SentencePieceTokenizer(path)
    if not pathlib.Path(path).exists():
        logging.info("Training SentencePiece (vocab %d) on the train split...", vocab_size)
    tokenizer = SentencePieceTokenizer.train_or_load(
        list(train_texts), path, vocab_size, lossless=lossless
    )
    if lossless and not tokenizer.lossless:
        logging.warning(
            "%s normalises text (trained before lossless tokenizers, or for collapsed "
            "whitespace) while this run keeps documents verbatim: their line breaks and "
            "runs of spaces are lost in tokens. Delete it (in a fresh --workdir) to train a "
            "lossless one.",
            path,
        )
    return tokenizer


def source_tokenizer(source: sources.Source) -> Tokenizer:
    """A pretrained source's tokenizer: the Hugging Face tokenizer it holds
    (`Source.tokenizer_files`: a `tokenizer.json`, or the one a GGUF file describes), with
    the model's added pad id; or, for a run (`trained_here`), the tokenizer it trained with."""
    if source.trained_here:
        return open_tokenizer(source.tokenizer, source.vocab_size, source.tokenizer_path())
    files = source.tokenizer_files()
    return PretrainedTokenizer.from_json(
        files.tokenizer_json,
        hf_config=files.model_config,
        tokenizer_config=files.tokenizer_config,
        where=files.where,
        model_vocab_size=source.model.vocab_size,
        pad_id=source.model.pad_id,
    )


def run_tokenizer(
    kind: str,
    vocab_size: int,
    run: RunDir,
    train_texts: Sequence[str] | None = None,
    *,
    lossless: bool = False,
    source: sources.Source | None = None,
) -> Tokenizer:
    """The tokenizer of a run directory (`RunDir.tokenizer_path`); SentencePiece is trained
    on `train_texts` on first use and kept there; a pretrained one is `source`'s where the
    run hands its open source (else read from the run's snapshot)."""
    path = run.tokenizer_path(kind, vocab_size)
    return open_tokenizer(
        kind, vocab_size, path, train_texts=train_texts, lossless=lossless, source=source
    )


@dataclasses.dataclass(frozen=True)
class Vocabulary:
    """The ids of a run, resolved once from its config: what a token store is prepared for.

    Attributes:
        kind: the tokenizer ('byte', 'sentencepiece', 'pretrained').
        size: the model's vocabulary: every id lies below it (a pretrained model's added
            pad id included).
        source: for 'pretrained', the source the tokenizer is read from (a Hugging Face
            directory, a run directory, or a run's snapshot of one); '' otherwise.
        identity: what the ids mean beyond their count: the SHA-256 of the pretrained
            source's tokenizer definition ('' for bytes and SentencePiece, whose store holds
            its own model).
        starts_with_bos: documents start with the BOS (`SpecialIds.starts_with_bos`).
        opened: for 'pretrained', the source at `source`, open: the data path takes its
            tokenizer, chat template and files from it and never reads `source` again. Not
            part of the value: two vocabularies of the same ids are equal.

    Raises:
        ValueError: a 'pretrained' vocabulary without its open source.
    """

    kind: str
    size: int
    source: str = ""
    identity: str = ""
    starts_with_bos: bool = True
    opened: sources.Source | None = dataclasses.field(default=None, compare=False, repr=False)

    def __post_init__(self):
        if self.kind == "pretrained" and self.opened is None:
            raise ValueError(
                f"Vocabulary(kind='pretrained', source={self.source!r}) has no open source: "
                "make it with train.data.tokenizers.vocabulary(data, vocab_size, source)."
            )


def vocabulary(
    data, model_vocab_size: int, source: str | os.PathLike | sources.Source = ""
) -> Vocabulary:
    """The `Vocabulary` of a data section whose model has `model_vocab_size` ids.

    Args:
        data: the data section (`train.config.sections.DataConfig`).
        model_vocab_size: the model section's `vocab_size` (`validate_config` resolved it).
        source: the pretrained source: open (the run's `Source`, carried on as
            `Vocabulary.opened`: nothing below reads its path again), or its path
            (default: `data.init_from`).

    Raises:
        ValueError: the pretrained source does not read.
    """
    if data.tokenizer != "pretrained":
        return Vocabulary(data.tokenizer, model_vocab_size)
    if isinstance(source, sources.Source):
        pretrained = source
    else:
        pretrained = sources.read_source(str(source or data.init_from), need_weights=False)
    starts_with_bos = source_tokenizer(pretrained).specials.starts_with_bos
    return Vocabulary(
        data.tokenizer,
        model_vocab_size,
        str(pretrained.path),
        pretrained.tokenizer_sha256(),
        starts_with_bos,
        opened=pretrained,
    )
