"""What a pretrained source is (`--config.init_from`): a Hugging Face model directory
(`train.formats.sources.hf`), a GGUF file (`train.formats.sources.gguf`; also by the name of
a Python package that ships one, `--config.init_from=smollm2`) or a `train.main` run directory
(`train.formats.sources.run`), read without its weights.

This package is a leaf of `train/`: config/, data/, store/ and program/ all read sources
through it, and it imports none of them. What the layers above do with a source:
- `train.config.config_lib` merges its model config with the run's own choices;
- `train.data.tokenizers.open_tokenizer` opens its tokenizer (the one tokenizer factory);
- `train.program.weights.load_weights` reads and places its weights.
A new kind of source is one new reader module here and one line in `read_source`.

A run copies a source's small files (config and tokenizer) into `workdir/pretrained/`
(`snapshot`), so its tools (`train.sample`, `train.export`) and a resumed run work after the
source has moved; `open_source` prefers that copy. A GGUF file's copy is a Hugging Face
directory (config.json, tokenizer.json, tokenizer_config.json): what reads it needs no GGUF
code.
"""

from __future__ import annotations

import json
import os
import pathlib

from train.core.rundir import RunDir
from train.formats.sources.gguf import PACKAGED, SUFFIX, GGUFSource, packaged_file, read_gguf_file
from train.formats.sources.hf import (
    CONFIG_FILE,
    HFSource,
    fail,
    read_config_json,
    read_hf_directory,
)
from train.formats.sources.run import RunSource, is_run_config, read_run_directory

# A source of any kind.
Source = HFSource | GGUFSource | RunSource

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


def read_source(path: str | os.PathLike, *, need_weights: bool = True) -> Source:
    """The pretrained source at `path`, checked.

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
    if directory.is_file() and directory.suffix == SUFFIX:
        return read_gguf_file(directory)
    if not directory.is_dir():
        what = "not a directory or" if directory.exists() else "no such directory or"
        raise fail(
            path,
            f"{what} {SUFFIX} file; give a local Hugging Face model directory, a "
            f"GGUF file, or one of {sorted(PACKAGED)} (a GGUF file an installed package ships)",
        )
    raw = read_config_json(directory)
    if is_run_config(raw):
        return read_run_directory(directory, raw, need_weights)
    if not isinstance(raw, dict) or "model_type" not in raw:
        raise fail(
            path,
            f"{CONFIG_FILE} has no model_type: neither a Hugging Face model nor a train.main run",
        )
    return read_hf_directory(directory, raw, need_weights)


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


def origin(source: Source) -> HFSource | GGUFSource | None:
    """The pretrained model a source started from: itself, or through the snapshots of
    runs started from runs (a Hugging Face directory then); None for a run trained from
    scratch."""
    while isinstance(source, RunSource):
        copy = source.path / SNAPSHOT_DIR
        if not (copy / CONFIG_FILE).is_file():
            return None
        source = read_source(copy, need_weights=False)
    return source
