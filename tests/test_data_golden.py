"""Every batch `build_dataset` makes is the one the program made before its data path was
rewritten, bit for bit: a resumed run's stream position means the same batches.

The digests below were computed by `describe` with the code of commit 2914836, on the tiny
corpora of `train_helpers`, for each packing of both tasks, with one process and with one
of two row shares on two devices, and with a SentencePiece tokenizer trained by the run.
`chars_per_token` alone was recomputed since (issue 41): it counts the characters of the
validation texts as read (no line break added per example) over the labels exactly scored.
"""

import hashlib
import json

import numpy as np
import pytest
from train_helpers import dataset_of, tiny_config, write_tiny_text, write_tiny_tsv

from train.config import config_lib
from train.core.rundir import RunDir
from train.data import epoch_stream
from train.data.batching import WHOLE_BATCH, RowShare


def _digest(batches) -> str:
    """SHA-256 (first 16 hex digits) of the batches' keys, dtypes, shapes and values."""
    digest = hashlib.sha256()
    for batch in batches:
        for key in sorted(batch):
            array = np.ascontiguousarray(batch[key])
            digest.update(f"{key}{array.dtype}{array.shape}".encode())
            digest.update(array.tobytes())
    return digest.hexdigest()[:16]


def describe(config, run: RunDir, num_devices: int = 1, share: RowShare = WHOLE_BATCH) -> dict:
    """What a Dataset holds, as digests and counts."""
    config_lib.validate_config(config)
    dataset = dataset_of(config, run, num_devices=num_devices, share=share)
    epochs = [dataset.build_epoch(epoch_stream.epoch_rng(config.seed, e)) for e in (0, 1)]
    texts = json.dumps(dataset.valid_examples).encode()
    return {
        "fingerprint": dataset.fingerprint["sha256"][:16],
        "sizes": dataset.sizes,
        "chars_per_token": dataset.chars_per_token,
        "valid_examples": hashlib.sha256(texts).hexdigest()[:16],
        "eval": [len(dataset.eval_batches), _digest(dataset.eval_batches)],
        "epochs": [[len(epoch), _digest(epoch)] for epoch in epochs],
    }


def _variant(name: str, tmp_path):
    """(config, num_devices, share) of a variant named corpus-packing[-2dev|-spm]."""
    corpus, packing, *extra = name.split("-")
    if corpus == "tsv":
        config = tiny_config(write_tiny_tsv(tmp_path), packing=packing, copied_targets=0.5)
    else:
        config = tiny_config(write_tiny_text(tmp_path), task="lm", corpus="text", packing=packing)
    if extra == ["2dev"]:  # rows from tokens_per_batch (translation) or by default buckets
        if corpus == "tsv":
            config.update(tokens_per_batch=64, batch_size=0)
        else:
            config.update(max_len=12, bucket_lengths=(), max_decode_len=0)
        return config, 2, RowShare(1 if corpus == "tsv" else 0, 2)
    if extra == ["spm"]:  # the smallest vocabularies these corpora's characters allow
        config.update(tokenizer="sentencepiece", vocab_size=48 if corpus == "tsv" else 24)
        # A language model's documents are verbatim and its SentencePiece lossless by
        # default now (issue 41): collapse_whitespace=True asks for the normalised text and
        # tokenizer of before, which must still give these batches bit for bit.
        config.collapse_whitespace = True
        config.copied_targets = 0.0
    return config, 1, WHOLE_BATCH


GOLDEN = {
    "tsv-none": {
        "fingerprint": "6b5dd5c8f4b383a0",
        "sizes": {"train": 279, "copied": 140, "valid": 21, "test": 0, "dropped_too_long": 0},
        "chars_per_token": 0.8955223880597015,
        "valid_examples": "5c344567e9452306",
        "eval": [2, "6b4c0294f8f179a9"],
        "epochs": [[27, "fd4f5233b83257ad"], [27, "c8d42dde692039e1"]],
    },
    "tsv-segments": {
        "fingerprint": "6b5dd5c8f4b383a0",
        "sizes": {"train": 279, "copied": 140, "valid": 21, "test": 0, "dropped_too_long": 0},
        "chars_per_token": 0.8955223880597015,
        "valid_examples": "5c344567e9452306",
        "eval": [2, "6b4c0294f8f179a9"],
        "epochs": [[13, "35682287b5bc9a2c"], [13, "73edbff0060ce9d9"]],
    },
    "tsv-none-2dev": {
        "fingerprint": "6b5dd5c8f4b383a0",
        "sizes": {"train": 279, "copied": 140, "valid": 21, "test": 0, "dropped_too_long": 0},
        "chars_per_token": 0.8955223880597015,
        "valid_examples": "5c344567e9452306",
        "eval": [6, "bb5e95bef37d4942"],
        "epochs": [[105, "d2d29b853e97314b"], [105, "1d178d1eb8a7a033"]],
    },
    "tsv-segments-2dev": {
        "fingerprint": "6b5dd5c8f4b383a0",
        "sizes": {"train": 279, "copied": 140, "valid": 21, "test": 0, "dropped_too_long": 0},
        "chars_per_token": 0.8955223880597015,
        "valid_examples": "5c344567e9452306",
        "eval": [6, "bb5e95bef37d4942"],
        "epochs": [[51, "2c8dbdd7c4ef70eb"], [51, "323d8c9c4e3203be"]],
    },
    "text-none": {
        "fingerprint": "3704530f57f9809c",
        "sizes": {"train": 147, "copied": 0, "valid": 20, "test": 0, "dropped_too_long": 33},
        "chars_per_token": 0.8974358974358975,
        "valid_examples": "6139dc2811256403",
        "eval": [2, "d278bf6a4fa58cf2"],
        "epochs": [[10, "e0438cdd89318868"], [10, "938c2eab14fe92bb"]],
    },
    "text-segments": {
        "fingerprint": "3704530f57f9809c",
        "sizes": {"train": 147, "copied": 0, "valid": 20, "test": 0, "dropped_too_long": 33},
        "chars_per_token": 0.8974358974358975,
        "valid_examples": "6139dc2811256403",
        "eval": [2, "d278bf6a4fa58cf2"],
        "epochs": [[7, "02e8e65a8db48581"], [7, "8d2de34473aaf1c7"]],
    },
    "text-stream": {
        "fingerprint": "3704530f57f9809c",
        "sizes": {"train": 178, "copied": 0, "valid": 22, "test": 0, "dropped_too_long": 0},
        "chars_per_token": 0.8293650793650794,
        "valid_examples": "d3121360edb717ef",
        "eval": [1, "e95fe6b84390b019"],
        "epochs": [[9, "0bf038ec43ffca98"], [9, "087b10cb54868e86"]],
    },
    "text-none-2dev": {
        "fingerprint": "3704530f57f9809c",
        "sizes": {"train": 114, "copied": 0, "valid": 15, "test": 0, "dropped_too_long": 71},
        "chars_per_token": 0.875,
        "valid_examples": "d160dccfc10e00d3",
        "eval": [2, "4be14a486970945c"],
        "epochs": [[8, "7517c10aa7c2ec37"], [8, "05a4aee7cbf9fc7d"]],
    },
    "text-segments-2dev": {
        "fingerprint": "3704530f57f9809c",
        "sizes": {"train": 114, "copied": 0, "valid": 15, "test": 0, "dropped_too_long": 71},
        "chars_per_token": 0.875,
        "valid_examples": "d160dccfc10e00d3",
        "eval": [2, "4be14a486970945c"],
        "epochs": [[6, "50638ae34e5e13db"], [6, "591e5ebbee90a614"]],
    },
    "text-stream-2dev": {
        "fingerprint": "3704530f57f9809c",
        "sizes": {"train": 178, "copied": 0, "valid": 22, "test": 0, "dropped_too_long": 0},
        "chars_per_token": 0.8293650793650794,
        "valid_examples": "d3121360edb717ef",
        "eval": [2, "cd674589ac52fb9a"],
        "epochs": [[12, "ba1f0e8d48386da1"], [12, "9ab7c84f6521d993"]],
    },
    "tsv-segments-spm": {
        "fingerprint": "6b5dd5c8f4b383a0",
        "sizes": {"train": 279, "copied": 0, "valid": 21, "test": 0, "dropped_too_long": 0},
        "chars_per_token": 1.4754098360655739,
        "valid_examples": "5c344567e9452306",
        "eval": [2, "e6a3cb52a9623709"],
        "epochs": [[6, "6a8679b4de32ed2a"], [6, "3b64d5b33ea1b48b"]],
    },
    "text-stream-spm": {
        "fingerprint": "3704530f57f9809c",
        "sizes": {"train": 178, "copied": 0, "valid": 22, "test": 0, "dropped_too_long": 0},
        "chars_per_token": 1.0245098039215685,
        "valid_examples": "d3121360edb717ef",
        "eval": [1, "bbdf5c937f215a1e"],
        "epochs": [[8, "eb6b4d8c8141179d"], [8, "c7d2d9fbc9e874d6"]],
    },
    "text-none-spm": {
        "fingerprint": "3704530f57f9809c",
        "sizes": {"train": 172, "copied": 0, "valid": 22, "test": 0, "dropped_too_long": 6},
        "chars_per_token": 1.1420765027322404,
        "valid_examples": "d3121360edb717ef",
        "eval": [2, "17653b5e912e3998"],
        "epochs": [[11, "ed76079ecc5c1393"], [11, "644649931a9caf38"]],
    },
}


@pytest.mark.parametrize("name", GOLDEN)
def test_batches_are_those_of_the_code_before_the_rewrite(name, tmp_path):
    config, num_devices, share = _variant(name, tmp_path)
    assert describe(config, RunDir(tmp_path), num_devices, share) == GOLDEN[name]
