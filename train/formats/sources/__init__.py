"""What a pretrained source is (`--config.init_from`): a Hugging Face model directory
(`train.formats.sources.hf`), a GGUF file (`train.formats.sources.gguf`; also by the name of a
Python package that ships one, `--config.init_from=smollm2`) or a `train.main` run directory
(`train.formats.sources.run`), read without its weights.

Each kind is one module that defines its `Source` subclass and its `Kind` entry (whether a
path is of that kind, and how to read it; `train.formats.sources.base`), listed in `KINDS`
below, the one place a path's kind is decided (`read_source`). Every source answers the
floors above under the same names (`base.Source`: `model`, `tensor_reader()`,
`tokenizer_files()`, `chat_files()`, `copy_files()`, `tokenizer_sha256()`), so they never ask
which kind it is; a `train.main` run, whose model config, tokenizer and weights are the
program's own formats, says so by `trained_here`.

This package is a leaf of `train/`: config/, data/, store/ and program/ all read sources
through it, and it imports none of them. A run opens its source once (`train.program.loop`)
and hands the `Source` down; what the layers above do with it:
- `train.config.config_lib` merges its model config with the run's own choices;
- `train.data.tokenizers.vocabulary` carries it to the data path (`Vocabulary.opened`), where
  `train.data.tokenizers.open_tokenizer` (the one tokenizer factory) takes its tokenizer and
  `train.data.chat.template.source_chat_template` its chat template;
- `train.program.weights.load_weights` reads and places its weights.
A new kind of source is one new module here and its `KIND` in `KINDS` (docs/training.md, "Add
a pretrained-source format").
"""

from __future__ import annotations

import json
import os
import pathlib

from train.core.rundir import RunDir
from train.formats.sources import gguf, hf, run
from train.formats.sources.base import CONFIG_FILE, Kind, Source, fail, read_config_json
from train.formats.sources.gguf import PACKAGED, SUFFIX, GGUFSource, packaged_file
from train.formats.sources.hf import HFSource
from train.formats.sources.run import RunSource

__all__ = [
    "ARCHITECTURE_FIELDS",
    "CONFIG_FILE",
    "KINDS",
    "PACKAGED",
    "SNAPSHOT_DIR",
    "SOURCE_FILE",
    "GGUFSource",
    "HFSource",
    "Kind",
    "RunSource",
    "Source",
    "open_source",
    "origin",
    "read_source",
    "snapshot",
]

# The kinds of source, in the order a path is tried: the first whose `detect` accepts it
# reads it. A new kind is its module's name in the import line above and its KIND here.
KINDS = (gguf.KIND, run.KIND, hf.KIND)

# Where a run keeps the snapshot of its source, and the record of where it came from.
SNAPSHOT_DIR = RunDir.PRETRAINED
SOURCE_FILE = "source.json"

# TransformerConfig fields that the pretrained weights decide: `--config.model.<field>` must
# be None or equal. The others (dtype, scan_layers, remat, dropout, attention_impl, LoRA...)
# are the run's to choose.
ARCHITECTURE_FIELDS = (
    "vocab_size",
    "pad_id",
    "d_model",
    "num_heads",
    "num_kv_heads",
    "d_ff",
    "num_layers",
    "max_len",
    "norm",
    "norm_position",
    "final_norm",
    "positional",
    "rope_base",
    "activation",
    "use_bias",
    "layer_norm_eps",
    "share_embeddings",
    "tie_output_embedding",
    "scale_embeddings",
    "num_encoder_layers",
    "num_decoder_layers",
    "attention_bias",
    "ffn_bias",
    "norm_bias",
    "output_bias",
    "qk_norm",
    "logits_soft_cap",
)


# The sources this process has read, by path and the state of their files: each path is
# opened once and the same Source handed back while its files are unchanged (`read_source`).
# A run hands its Source down itself; this serves `validate_config`, which opens it before
# the run does, and the tools and notebooks that ask for a source by its path again.
_OPENED: dict[tuple, Source] = {}


def _files_state(path: pathlib.Path) -> tuple | None:
    """What tells that a source's files changed: each file's size and modification time
    (the directory's own files, or the file itself); None where the path does not exist."""
    try:
        if path.is_dir():
            return tuple(
                (f.name, f.stat().st_mtime_ns, f.stat().st_size)
                for f in sorted(path.iterdir())
                if f.is_file()
            )
        stat = path.stat()
        return ((path.name, stat.st_mtime_ns, stat.st_size),)
    except OSError:
        return None


def read_source(path: str | os.PathLike, *, need_weights: bool = True) -> Source:
    """The pretrained source at `path`, checked; opened once per process and handed back
    again while its files are unchanged (a source read with its weights serves a read
    without them).

    Args:
        path: `--config.init_from`: a Hugging Face GPT-2 / Llama / Mistral directory, a
            Llama-family .gguf file, a name in `train.formats.sources.gguf.PACKAGED` (the GGUF file
            of an installed package), or a `train.main` run directory (or a run's snapshot
            of any of them).
        need_weights: also check that the weights are there (a snapshot has none; a GGUF
            file's tensor table is always read).

    Raises:
        ValueError: not a directory or .gguf file, no config.json, an unsupported model
            type, option or tensor type, or no weights; one line naming the path and the fix.
    """
    directory = pathlib.Path(path)
    if str(path) in PACKAGED and not directory.exists():
        directory = packaged_file(str(path))
    state = _files_state(directory)
    if state is not None:
        for weights in (True,) if need_weights else (True, False):
            opened = _OPENED.get((str(directory.resolve()), weights, state))
            if opened is not None:
                return opened
    source = _read_source(path, directory, need_weights)
    if state is not None:
        _OPENED[(str(directory.resolve()), need_weights, state)] = source
    return source


def _read_source(path, directory: pathlib.Path, need_weights: bool) -> Source:
    """The first kind in `KINDS` that accepts `directory` reads it; where none does, the
    error says what the path lacks."""
    for kind in KINDS:
        if kind.detect(directory):
            return kind.read(directory, need_weights)
    if not directory.is_dir():
        what = "not a directory or" if directory.exists() else "no such directory or"
        raise fail(
            path,
            f"{what} {SUFFIX} file; give a local Hugging Face model directory, a "
            f"GGUF file, or one of {sorted(PACKAGED)} (a GGUF file an installed package ships)",
        )
    read_config_json(directory)  # no config.json, or not JSON: says so
    raise fail(
        path,
        f"{CONFIG_FILE} has no model_type: neither a Hugging Face model nor a train.main run",
    )


def open_source(init_from: str, workdir: str | os.PathLike | None = None) -> Source:
    """`--config.init_from`'s source, or the run's snapshot of it where the run has one
    (`workdir/pretrained/`: the tools of a finished run work after the source has moved,
    and a resumed run needs no weights from it)."""
    if workdir is not None:
        copy = pathlib.Path(workdir) / SNAPSHOT_DIR
        if (copy / CONFIG_FILE).is_file():
            return read_source(copy, need_weights=False)
    return read_source(init_from)


def snapshot(source: Source, target: str | os.PathLike) -> None:
    """Copies the source's small files into `target` (a run's or a store's `pretrained/`)
    and records where they came from."""
    target = pathlib.Path(target)
    target.mkdir(parents=True, exist_ok=True)
    source.copy_files(target)
    record = {"path": str(source.path.resolve()), "family": source.family}
    (target / SOURCE_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def origin(source: Source) -> Source | None:
    """The pretrained model a source started from: itself, or through the snapshots of
    runs started from runs (a Hugging Face directory then); None for a run trained from
    scratch."""
    while source.trained_here:
        copy = source.path / SNAPSHOT_DIR
        if not (copy / CONFIG_FILE).is_file():
            return None
        source = read_source(copy, need_weights=False)
    return source
