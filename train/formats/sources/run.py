"""A `train.main` run directory as a pretrained source: a decoder-only model trained here
(a language model, or a chat run's), fine-tuned further (`--config.init_from=runs/lm_kjv`,
`--config.init_from=runs/sft_smollm2` for DPO after SFT).

Read here: that the directory is a run (its config.json records `task` and `model`), that it
has checkpoints, and which tokenizer it used (the
`tokenizer` and `vocab_size` fields it recorded). The run's model config is read with its
whole checked config, by `train.config.config_lib.read_saved`, its tokenizer by
`train.data.tokenizers.open_tokenizer`, and its weights by `train.program.trained.load_trained`:
all above this package, which `RunSource.trained_here` tells them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import pathlib
import shutil
from collections.abc import Mapping
from typing import Any, ClassVar

from train.core.rundir import RunDir
from train.formats.sources.base import (
    CONFIG_FILE,
    Kind,
    Source,
    config_json_or_none,
    copy_file,
    fail,
    read_config_json,
)

# The run's own snapshot of what it started from (`train.formats.sources.snapshot`).
SNAPSHOT_DIR = RunDir.PRETRAINED


@dataclasses.dataclass(frozen=True)
class RunSource(Source):
    """A `train.main` run directory (or a run's snapshot of its small files): its model
    config, tokenizer and weights are the program's own formats, read by the floors above
    (`trained_here`), so it has no `model`, `tensor_reader()`, `tokenizer_files()` or
    `chat_files()` of its own.

    Attributes:
        path: the directory.
        tokenizer: the run's `--config.tokenizer` ('byte', 'sentencepiece', 'pretrained').
        vocab_size: the run's `--config.vocab_size` (SentencePiece pieces).
    """

    path: pathlib.Path
    tokenizer: str
    vocab_size: int
    family: str = "run"
    trained_here: ClassVar[bool] = True

    def tokenizer_path(self) -> pathlib.Path:
        """Where the run's tokenizer is read from (`RunDir.tokenizer_path`)."""
        return RunDir(self.path).tokenizer_path(self.tokenizer, self.vocab_size)

    def copy_files(self, target: pathlib.Path) -> None:
        """Copies the run's config.json, its SentencePiece model, its copy of its own chat
        template (a chat run's; a run started from it trains with that template) and its own
        snapshot of what it started from into `target`."""
        run = RunDir(self.path)
        if (run.path / SNAPSHOT_DIR).is_dir():
            shutil.copytree(run.path / SNAPSHOT_DIR, target / SNAPSHOT_DIR, dirs_exist_ok=True)
        for path in (run.config, run.tokenizer_model(self.vocab_size), run.chat_template):
            if path.is_file():
                copy_file(path, target / path.name)

    def tokenizer_sha256(self) -> str:
        """The SHA-256 of the run's config.json, which names its tokenizer."""
        return hashlib.sha256((self.path / CONFIG_FILE).read_bytes()).hexdigest()


def is_run_config(raw: Any) -> bool:
    """Whether a parsed config.json is a `train.main` run's."""
    return isinstance(raw, dict) and "task" in raw and "model" in raw


def read_run_directory(
    directory: pathlib.Path, raw: Mapping[str, Any], need_weights: bool
) -> RunSource:
    """The `RunSource` of a run directory whose config.json is `raw`.

    Raises:
        ValueError: the run has no checkpoints (when `need_weights`), or its config.json
            lacks its tokenizer fields. (Which tasks' runs may start another is the config's
            to check, `train.config.config_lib.source_model`.)
    """
    if need_weights and not any(RunDir(directory).checkpoints.glob("*")):
        raise fail(directory, "a train.main run without checkpoints: train it first")
    kind, vocab_size = raw.get("tokenizer"), raw.get("vocab_size")
    if not isinstance(kind, str) or not isinstance(vocab_size, int):
        raise fail(
            directory,
            f"its {CONFIG_FILE} records no tokenizer and vocab_size: not a run of train.main",
        )
    return RunSource(directory, kind, vocab_size)


KIND = Kind(
    "train.main run",
    detect=lambda path: is_run_config(config_json_or_none(path)),
    read=lambda path, need_weights: read_run_directory(path, read_config_json(path), need_weights),
)
