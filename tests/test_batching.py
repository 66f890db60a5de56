"""train.data.batching and the stream of train.data.packing: length filters, bucket lengths,
batch-size policies, translation and LM batches."""

import collections

import numpy as np
import pytest
from train_helpers import random_pairs

from train import tasks
from train.data import batching, epoch_stream, packing
from train.data import tokenizer as tokenizer_lib

TRANSLATION, LM = tasks.TASKS["translation"], tasks.TASKS["lm"]


def translation_batches(pairs, **kwargs):
    """Bucketed batches of (src ids, tgt ids) pairs."""
    sides = [TRANSLATION.to_sides(pair) for pair in pairs]
    return batching.bucketed_batches(TRANSLATION.sides, sides, **kwargs)


def lm_batches(documents, **kwargs):
    """Bucketed batches of documents' ids."""
    sides = [LM.to_sides(document) for document in documents]
    return batching.bucketed_batches(LM.sides, sides, **kwargs)


def stream_batches(documents, **kwargs):
    """Documents' ids concatenated and cut into windows."""
    sides = [LM.to_sides(document) for document in documents]
    return packing.stream_batches(LM.sides, sides, **kwargs)


# ---------------------------------------------------------------------------------------------
# Token ids and batching.


def test_default_bucket_lengths():
    assert batching.default_bucket_lengths(100) == (8, 16, 32, 64, 100)
    assert batching.default_bucket_lengths(64) == (8, 16, 32, 64)
    assert batching.default_bucket_lengths(5) == (5,)
    with pytest.raises(ValueError, match=r"max_len=0 must be positive"):
        batching.default_bucket_lengths(0)


def test_filter_by_length_drops_and_counts():
    pairs = [([5] * 4, [6] * 3), ([5] * 5, [6]), ([5], [6] * 4), ([5] * 2, [6] * 2)]
    kept, dropped = batching.filter_by_length(pairs, max_len=4, length=TRANSLATION.example_length)
    assert kept == [pairs[0], pairs[3]] and dropped == 2
    kept, dropped = batching.filter_by_length(
        [[5] * 3, [5] * 4], max_len=4, length=LM.example_length
    )
    assert kept == [[5] * 3] and dropped == 1


def test_filter_by_length_errors():
    with pytest.raises(
        ValueError, match=r"Example 1 needs length 6 > max_len=4.*on_too_long='drop'"
    ):
        batching.filter_by_length(
            [[1], [1] * 5], max_len=4, length=LM.example_length, on_too_long="error"
        )
    with pytest.raises(ValueError, match=r"on_too_long='clip' is not one of"):
        batching.filter_by_length([[1]], max_len=4, length=LM.example_length, on_too_long="clip")


def test_get_task_names_the_choices():
    assert tasks.get_task("lm") is tasks.TASKS["lm"]
    with pytest.raises(
        ValueError, match=r"task='mt' is not one of \('translation', 'lm', 'chat', 'dpo'\)"
    ):
        tasks.get_task("mt")


def test_tasks_know_what_their_examples_are_made_of():
    pairs, lines = [("ab", "AB"), ("c", "C")], ["ab", "c"]
    assert TRANSLATION.sentences(pairs) == ["ab", "AB", "c", "C"]
    assert LM.sentences(lines) == ["ab", "c"]
    tokenizer = tokenizer_lib.ByteTokenizer()
    encoded = TRANSLATION.encode(tokenizer, pairs[0])
    assert encoded == (tokenizer.encode("ab"), tokenizer.encode("AB"))
    assert LM.encode(tokenizer, "ab") == tokenizer.encode("ab")
    # The source as it is; BOS + target + EOS, read as decoder input and labels.
    assert TRANSLATION.to_sides(([7, 8, 9], [10])) == ([7, 8, 9], [1, 10, 2])
    assert LM.to_sides([5, 6]) == ([1, 5, 6, 2],)
    assert TRANSLATION.example_length(([7, 8, 9], [10])) == 3  # the source
    assert TRANSLATION.example_length(([7], [10, 11, 12])) == 4  # BOS + target
    assert LM.example_length([5, 6]) == 3


def test_translation_batch_contents():
    pairs = [([7, 8, 9], [10, 11]), ([12], [13, 14, 15, 16, 17])]
    (small,), (large,) = [
        translation_batches([p], bucket_lengths=(4, 8), batch_size=2) for p in pairs
    ]
    np.testing.assert_array_equal(small["src"], [[7, 8, 9, 0], [0, 0, 0, 0]])
    np.testing.assert_array_equal(small["tgt_in"], [[1, 10, 11, 0], [0, 0, 0, 0]])
    np.testing.assert_array_equal(small["tgt_out"], [[10, 11, 2, 0], [0, 0, 0, 0]])
    assert large["tgt_in"].shape == (2, 8)
    np.testing.assert_array_equal(large["tgt_out"][0], [13, 14, 15, 16, 17, 2, 0, 0])
    assert all(a.dtype == np.int32 for a in small.values())


@pytest.mark.parametrize("shuffle", [False, True])
def test_translation_batches_cover_each_example_once_in_few_shapes(shuffle):
    pairs = random_pairs(300, 32)
    buckets = batching.default_bucket_lengths(32)
    rng = epoch_stream.epoch_rng(0, 0) if shuffle else None
    batches = translation_batches(pairs, bucket_lengths=buckets, tokens_per_batch=256, rng=rng)
    shapes = {b["src"].shape for b in batches}
    assert shapes <= {(256 // length, length) for length in buckets}
    rows = [tuple(r[r > 0]) for b in batches for r in b["src"] if r.any()]
    assert collections.Counter(rows) == collections.Counter(tuple(s) for s, _ in pairs)
    for b in batches:  # each real row ends with exactly one EOS: nothing clipped
        real = b["src"].any(axis=1)
        np.testing.assert_array_equal((b["tgt_out"] == 2).sum(axis=1), real.astype(int))


def test_batch_size_policies():
    pairs = random_pairs(50, 16)
    fixed = translation_batches(pairs, bucket_lengths=(8, 16), batch_size=4)
    assert {b["src"].shape[0] for b in fixed} == {4}
    multiple = translation_batches(
        pairs, bucket_lengths=(8, 16), tokens_per_batch=50, batch_size_multiple=4
    )
    assert {b["src"].shape for b in multiple} == {(4, 8), (4, 16)}
    dropped = translation_batches(pairs, bucket_lengths=(8, 16), batch_size=4, drop_remainder=True)
    assert all(b["src"].any(1).all() for b in dropped)


def test_batch_size_policy_errors():
    pairs = random_pairs(5, 8)
    with pytest.raises(
        ValueError, match=r"exactly one of batch_size=None and tokens_per_batch=None"
    ):
        translation_batches(pairs, bucket_lengths=(8,))
    with pytest.raises(
        ValueError, match=r"batch_size=6 must be a positive multiple of batch_size_multiple=4"
    ):
        translation_batches(pairs, bucket_lengths=(8,), batch_size=6, batch_size_multiple=4)
    with pytest.raises(ValueError, match=r"batch_size_multiple=0 must be positive"):
        translation_batches(pairs, bucket_lengths=(8,), batch_size=6, batch_size_multiple=0)
    for buckets in [(8, 4), (), (0, 8)]:
        with pytest.raises(ValueError, match=r"must be positive and increasing"):
            translation_batches(pairs, bucket_lengths=buckets, batch_size=2)
    with pytest.raises(
        ValueError, match=r"needs length 9 > the largest bucket 8.*filter_by_length"
    ):
        translation_batches([([1] * 9, [1])], bucket_lengths=(8,), batch_size=2)


def test_lm_batches_shift_by_one():
    (batch,) = lm_batches([[5, 6, 7], [8]], bucket_lengths=(4, 8), batch_size=2)
    np.testing.assert_array_equal(batch["inputs"], [[1, 5, 6, 7], [1, 8, 0, 0]])
    np.testing.assert_array_equal(batch["targets"], [[5, 6, 7, 2], [8, 2, 0, 0]])


def test_stream_batches_cut_the_stream_into_windows():
    docs = [[5, 6, 7], [8, 9], [10]]  # stream: 1 5 6 7 2 1 8 9 2 1 10 2 (12 tokens)
    batches = stream_batches(docs, seq_len=4, batch_size=2)
    assert [b["inputs"].shape for b in batches] == [(2, 4), (2, 4)]
    inputs = np.concatenate([b["inputs"] for b in batches])
    targets = np.concatenate([b["targets"] for b in batches])
    np.testing.assert_array_equal(inputs[:3].ravel(), [1, 5, 6, 7, 2, 1, 8, 9, 2, 1, 10, 2])
    np.testing.assert_array_equal(targets[:3].ravel(), [5, 6, 7, 2, 1, 8, 9, 2, 1, 10, 2, 0])
    assert not inputs[3].any()  # padding row fills the last batch
    dropped = stream_batches(docs, seq_len=4, batch_size=2, drop_remainder=True)
    assert len(dropped) == 1 and dropped[0]["targets"][1, -1] == 2
    with pytest.raises(ValueError, match=r"seq_len=0 and batch_size=2 must be positive"):
        stream_batches(docs, seq_len=0, batch_size=2)
    pairs = [TRANSLATION.to_sides(([5], [6]))]
    with pytest.raises(ValueError, match=r"A stream is cut from one side with labels"):
        packing.stream_batches(TRANSLATION.sides, pairs, seq_len=4, batch_size=2)


def test_stream_shuffle_is_a_permutation_of_documents():
    docs = [[i + 3] * (i % 4 + 1) for i in range(40)]
    batches = stream_batches(docs, seq_len=8, batch_size=3, rng=epoch_stream.epoch_rng(1, 0))
    # Every token but the stream's first BOS is some row's target exactly once.
    tokens = np.concatenate([b["targets"].ravel() for b in batches])
    counts = collections.Counter(tokens[tokens > 2].tolist())
    assert counts == collections.Counter(t for d in docs for t in d)
