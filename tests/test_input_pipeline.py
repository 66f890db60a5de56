"""train.data.pipeline.input_pipeline: the resumable epoch stream and the dataset built from a
config (copied targets)."""

import json

import numpy as np
import pytest
from train_helpers import dataset_of, random_pairs, tiny_config, write_tiny_tsv

from train.core.rundir import RunDir
from train.data import batching, epoch_stream
from train.tasks import TASKS

TRANSLATION = TASKS["translation"]

# ---------------------------------------------------------------------------------------------
# Resumable stream.


def _batches(pairs, rng=None):
    sides = [TRANSLATION.to_sides(pair) for pair in pairs]
    return batching.bucketed_batches(
        TRANSLATION.sides, sides, bucket_lengths=(8, 16), batch_size=4, rng=rng
    )


def _stream(pairs, seed=3, state=None):
    def build(rng):
        return _batches(pairs, rng)

    return epoch_stream.EpochStream(build, seed=seed, state=state)


def _ids(batch):
    return batch["src"].tobytes() + batch["tgt_in"].tobytes()


def test_stream_resumes_exactly_from_json_state():
    pairs = random_pairs(40, 16)
    uninterrupted = [_ids(next(s)) for s in [_stream(pairs)] for _ in range(45)]
    first = _stream(pairs)
    resumed = [_ids(next(first)) for _ in range(17)]
    saved = json.dumps(first.state_dict())
    second = _stream(pairs, state=json.loads(saved))
    resumed += [_ids(next(second)) for _ in range(45 - 17)]
    assert resumed == uninterrupted
    assert second.epoch >= 2  # crossed epoch boundaries


def test_stream_epochs_differ_and_seeds_reproduce():
    pairs = random_pairs(40, 16)
    stream = _stream(pairs)
    per_epoch = len(_batches(pairs))
    epoch0 = [_ids(next(stream)) for _ in range(per_epoch)]
    assert stream.state_dict() == {"epoch": 0, "position": per_epoch}
    epoch1 = [_ids(next(stream)) for _ in range(per_epoch)]
    assert stream.state_dict() == {"epoch": 1, "position": per_epoch}
    assert sorted(epoch0) != sorted(epoch1)  # examples regrouped, not just reordered
    again = _stream(pairs)
    assert [_ids(next(again)) for _ in range(per_epoch)] == epoch0
    other = _stream(pairs, seed=4)
    assert [_ids(next(other)) for _ in range(per_epoch)] != epoch0


@pytest.mark.parametrize(
    "state",
    [
        {"epoch": 0},
        {"epoch": -1, "position": 0},
        {"epoch": 0, "position": 1.5},
        {"epoch": 0, "position": 0, "x": 1},
    ],
)
def test_stream_rejects_malformed_state(state):
    with pytest.raises(ValueError, match=r"must be \{'epoch': int >= 0, 'position': int >= 0\}"):
        _stream(random_pairs(4, 8), state=state)


def test_stream_rejects_state_past_the_epoch_end():
    stream = _stream(random_pairs(4, 8), state={"epoch": 0, "position": 99})
    with pytest.raises(
        ValueError, match=r"position=99 is past the end of epoch 0.*delete the saved state"
    ):
        next(stream)


def test_stream_rejects_an_empty_epoch():
    with pytest.raises(ValueError, match=r"Epoch 0 has no items"):
        next(epoch_stream.EpochStream(lambda rng: [], seed=0))


def test_epoch_rng_rejects_negative_seed():
    with pytest.raises(ValueError, match=r"seed=-1 and epoch=0 must be non-negative"):
        epoch_stream.epoch_rng(-1, 0)


def test_copied_target_pairs_repeat_targets_as_sources():
    from train.data.pipeline.in_memory import copied_target_pairs

    pairs = [([10 + i], [100 + i, 7]) for i in range(10)]
    copies = copied_target_pairs(pairs, 0.5, seed=0)
    assert len(copies) == 5
    assert all(src == tgt and tgt in [t for _, t in pairs] for src, tgt in copies)
    assert len({tuple(t) for _, t in copies}) == 5  # five different targets
    assert copied_target_pairs(pairs, 0.5, seed=0) == copies  # a fixed choice per seed
    assert copied_target_pairs(pairs, 0.0, seed=0) == []
    assert len(copied_target_pairs(pairs, 1.0, seed=0)) == 10


def test_dataset_with_copied_targets_counts_them_apart(tmp_path):

    # One example per row, so rows can be told apart as copies (packing: test_packed_pipeline).
    config = tiny_config(write_tiny_tsv(tmp_path), copied_targets=0.5, packing="none")
    plain_config = tiny_config(write_tiny_tsv(tmp_path), packing="none")
    plain = dataset_of(plain_config, RunDir(tmp_path))
    dataset = dataset_of(config, RunDir(tmp_path))
    assert dataset.sizes["train"] == plain.sizes["train"]
    assert dataset.sizes["copied"] == pytest.approx(0.5 * plain.sizes["train"], abs=1)
    epoch = dataset.build_epoch(np.random.default_rng(0))
    rows = sum(int(np.count_nonzero(batch["src"].any(axis=1))) for batch in epoch)  # not padding
    assert rows == dataset.sizes["train"] + dataset.sizes["copied"]
    # Copies have their target as source: src == tgt_out without its EOS.
    copies = [
        (s, t)
        for batch in epoch
        for s, t in zip(batch["src"], batch["tgt_out"], strict=True)
        if np.array_equal(s[s != 0], t[t != 0][:-1])
    ]
    assert len(copies) >= dataset.sizes["copied"]
    assert plain.sizes["copied"] == 0
