"""Packed batches in the training program (`train.data.packing`, `config.packing='segments'`):
every example exactly once, in its own segment with the right ids and positions, and the
task's loss on a packed batch equal to the loss on the same examples one per row."""

import collections

import chex
import jax
import numpy as np
import pytest
from flax import linen as nn

from configs import default
from flax_transformer import (
    TransformerConfig,
    label_smoothed_cross_entropy,
    segment_positions,
)
from tests.train_helpers import tiny_config, write_tiny_tsv
from train.config import config_lib
from train.config.sections import DataConfig
from train.data import batching, epoch_stream, packing
from train.data.batching import RowShare
from train.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, SpecialIds
from train.program import steps
from train.tasks import TASKS, drop_target_tokens, get_task

TRANSLATION, LM = TASKS["translation"], TASKS["lm"]

V = 37
MAX_LEN = 16
LABEL_SMOOTHING = 0.1
RTOL = 1e-5


def _ids(rng: np.random.Generator, low: int, high: int) -> list[int]:
    """Random non-special ids (4.. V-1) of a random length in [low, high]."""
    return rng.integers(4, V, size=int(rng.integers(low, high + 1))).tolist()


def _pairs(num: int = 40, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    rng = np.random.default_rng(seed)
    return [(_ids(rng, 1, MAX_LEN), _ids(rng, 1, MAX_LEN - 1)) for _ in range(num)]


def _documents(num: int = 40, seed: int = 1) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [_ids(rng, 1, MAX_LEN - 1) for _ in range(num)]


def _segments(tokens_L: np.ndarray, segments_L: np.ndarray) -> dict[int, list[int]]:
    """Segment id -> its tokens, checking each segment is one contiguous run."""
    assert (np.diff(segments_L[segments_L > 0]) >= 0).all(), "segments out of order"
    out = {}
    for segment in np.unique(segments_L[segments_L > 0]):
        where = np.flatnonzero(segments_L == segment)
        assert np.array_equal(where, np.arange(where[0], where[-1] + 1)), "not contiguous"
        out[int(segment)] = tokens_L[where].tolist()
    return out


def _unpack_translation(batches) -> list[tuple[list[int], list[int]]]:
    """The (src, tgt) examples of packed batches, checking ids, BOS/EOS and positions."""
    examples = []
    for batch in batches:
        for row in range(batch["src"].shape[0]):
            src_segments, tgt_segments = (
                batch["src_segment_ids"][row],
                batch["tgt_segment_ids"][row],
            )
            assert np.all((batch["src"][row] == PAD_ID) == (src_segments == 0))
            assert np.all((batch["tgt_in"][row] == PAD_ID) == (tgt_segments == 0))
            # Segments are numbered 1, 2, ... from the start of the row.
            src, tgt_in = (
                _segments(batch["src"][row], src_segments),
                _segments(batch["tgt_in"][row], tgt_segments),
            )
            tgt_out = _segments(batch["tgt_out"][row], tgt_segments)
            assert list(src) == list(tgt_in) == list(range(1, len(src) + 1))
            for segment in src:
                assert tgt_in[segment][0] == BOS_ID and tgt_out[segment][-1] == EOS_ID
                assert tgt_in[segment][1:] == tgt_out[segment][:-1]
                examples.append((src[segment], tgt_out[segment][:-1]))
            # Positions restart at 0 in every segment, on both sides.
            for segments, parts in ((src_segments, src), (tgt_segments, tgt_in)):
                want = np.concatenate([np.arange(len(parts[s])) for s in parts] or [[]])
                got = np.asarray(segment_positions(segments[None]))[0]
                np.testing.assert_array_equal(got[: want.size], want)
                assert not got[want.size :].any()
    return examples


def _key(pair) -> tuple:
    return tuple(pair[0]), tuple(pair[1])


def _packed(task, examples, **kwargs):
    """Segment-packed batches of a task's tokenized examples, in rows of MAX_LEN."""
    sides = [task.to_sides(example) for example in examples]
    return packing.segment_batches(task.sides, sides, length=MAX_LEN, **kwargs)


def _bucketed(task, examples, **kwargs):
    """One example per row, in one bucket of MAX_LEN."""
    sides = [task.to_sides(example) for example in examples]
    return batching.bucketed_batches(task.sides, sides, bucket_lengths=(MAX_LEN,), **kwargs)


@pytest.mark.parametrize("seed", [None, 0, 1])
def test_segment_batches_hold_every_translation_example_once(seed):
    pairs = _pairs()
    rng = None if seed is None else np.random.default_rng(seed)
    batches = _packed(TRANSLATION, pairs, batch_size=4, rng=rng)
    for batch in batches:
        assert set(batch) == {"src", "tgt_in", "tgt_out", "src_segment_ids", "tgt_segment_ids"}
        for value in batch.values():
            assert value.shape == (4, MAX_LEN) and value.dtype == np.int32
    got = collections.Counter(map(_key, _unpack_translation(batches)))
    assert got == collections.Counter(map(_key, pairs))
    # Packing pays: fewer rows than one example per row.
    assert sum(b["src"].shape[0] for b in batches) < len(pairs)


def test_packed_batches_are_deterministic_given_the_rng_and_differ_between_epochs():
    pairs = _pairs()

    def epoch(e):
        return _packed(TRANSLATION, pairs, batch_size=4, rng=epoch_stream.epoch_rng(0, e))

    chex.assert_trees_all_equal(epoch(0), epoch(0))
    first, second = epoch(0), epoch(1)
    assert not all(np.array_equal(a["src"], b["src"]) for a, b in zip(first, second, strict=True))


def test_drop_remainder_drops_only_the_last_partial_batch():
    pairs = _pairs(num=60)
    kept = _packed(TRANSLATION, pairs, batch_size=4)
    dropped = _packed(TRANSLATION, pairs, batch_size=4, drop_remainder=True)
    rows = packing.pack_rows(
        np.asarray([(len(s), len(t) + 1) for s, t in pairs]),
        (MAX_LEN, MAX_LEN),
        np.arange(len(pairs)),
    )
    assert len(kept) == -(-len(rows) // 4) and len(dropped) == len(rows) // 4
    assert len(rows) % 4, "the test needs a partial last batch"
    assert not kept[-1]["src"][len(rows) % 4 :].any()  # its missing rows are padding


def test_row_shares_stack_into_the_whole_batch():
    pairs = _pairs()
    make = lambda share: _packed(  # noqa: E731
        TRANSLATION, pairs, batch_size=4, rng=np.random.default_rng(3), share=share
    )
    whole, parts = make(RowShare()), [make(RowShare(i, 2)) for i in range(2)]
    for k, batch in enumerate(whole):
        for key, value in batch.items():
            np.testing.assert_array_equal(value, np.concatenate([p[k][key] for p in parts]))


def test_tokens_per_batch_sets_the_rows():
    batches = _packed(TRANSLATION, _pairs(), tokens_per_batch=100, batch_size_multiple=2)
    assert batches[0]["src"].shape == (6, MAX_LEN)  # 100 // 16 = 6, a multiple of 2


def test_pack_rows_respects_every_side_and_rejects_an_example_too_long():
    sizes = np.asarray([(5, 1), (1, 5), (4, 4), (3, 3), (2, 2)])
    rows = packing.pack_rows(sizes, (6, 6), np.arange(5), window=2)
    assert sorted(np.concatenate(rows).tolist()) == list(range(5))
    for row in rows:
        assert (sizes[row].sum(axis=0) <= 6).all()
    with pytest.raises(ValueError, match="Example 1 needs"):
        packing.pack_rows(np.asarray([(1, 1), (7, 1)]), (6, 6), np.arange(2))


def test_segment_batches_hold_every_document_once():
    docs = _documents()
    batches = _packed(LM, docs, batch_size=4, rng=np.random.default_rng(0))
    got = []
    for batch in batches:
        assert set(batch) == {"inputs", "targets", "segment_ids"}
        for row in range(batch["inputs"].shape[0]):
            inputs = _segments(batch["inputs"][row], batch["segment_ids"][row])
            targets = _segments(batch["targets"][row], batch["segment_ids"][row])
            assert list(inputs) == list(range(1, len(inputs) + 1))
            for segment, ids in inputs.items():
                # Shifted within the document: its last label is its own EOS, never the
                # next document's BOS.
                assert ids[0] == BOS_ID and targets[segment] == [*ids[1:], EOS_ID]
                got.append(ids[1:])
    assert collections.Counter(map(tuple, got)) == collections.Counter(map(tuple, docs))


def _model_and_params(task_name: str):
    task = get_task(task_name)
    cfg = TransformerConfig(
        vocab_size=V, d_model=16, num_heads=2, d_ff=32, num_layers=2, max_len=MAX_LEN
    )
    model = task.make_model(cfg)
    params = nn.unbox(model.init(jax.random.key(0), *task.init_inputs()))["params"]
    return task, model, params


def _loss_sums(task, model, params, batches) -> np.ndarray:
    """Summed label-smoothed loss and target token count of the batches, as train_step sums."""
    total = np.zeros(2)
    for batch in batches:
        logits, labels = task.logits_and_labels(
            model, params, jax.tree.map(jax.numpy.asarray, batch), deterministic=True
        )
        loss, weights = label_smoothed_cross_entropy(
            logits, labels, label_smoothing=LABEL_SMOOTHING, pad_id=PAD_ID
        )
        total += [float(loss.sum()), float(weights.sum())]
    return total


@pytest.mark.slow
@pytest.mark.parametrize("task_name", ["translation", "lm"])
def test_packed_loss_equals_the_unpacked_loss(task_name):
    task, model, params = _model_and_params(task_name)
    examples = _pairs(num=24) if task_name == "translation" else _documents(num=24)
    packed = _packed(task, examples, batch_size=4, rng=np.random.default_rng(0))
    alone = _bucketed(task, examples, batch_size=8)
    assert sum(b[task.model_inputs[0]].shape[0] for b in packed) < len(examples)
    packed_sums = _loss_sums(task, model, params, packed)
    alone_sums = _loss_sums(task, model, params, alone)
    np.testing.assert_allclose(packed_sums, alone_sums, rtol=RTOL)
    assert sum(task.tokens_in(b) for b in packed) == sum(task.tokens_in(b) for b in alone)
    # The evaluation step's sums too (no smoothing; argmax accuracy).
    evaluate = jax.jit(lambda p, b: steps.eval_step(p, b, model=model, task=task))
    totals = [
        {k: sum(float(evaluate(params, b)[k]) for b in bs) for k in ("nll", "correct", "tokens")}
        for bs in (packed, alone)
    ]
    chex.assert_trees_all_close(totals[0], totals[1], rtol=RTOL)


def test_word_dropout_keeps_every_segment_bos():
    batch = _packed(TRANSLATION, _pairs(), batch_size=8)[0]
    dropped = np.asarray(
        drop_target_tokens(
            batch["tgt_in"],
            0.99,
            jax.random.key(0),
            unk_id=3,
            pad_id=PAD_ID,
            segment_ids_BT=batch["tgt_segment_ids"],
        )
    )
    starts = np.asarray(segment_positions(batch["tgt_segment_ids"])) == 0
    bos = starts & (batch["tgt_segment_ids"] > 0)
    assert (dropped[bos] == BOS_ID).all() and (dropped[batch["tgt_in"] == PAD_ID] == PAD_ID).all()
    assert (dropped[~starts & (batch["tgt_in"] != PAD_ID)] == 3).mean() > 0.9


def test_epoch_stream_resumes_packed_batches_exactly():
    pairs = _pairs(num=60)

    def build(rng):
        return _packed(TRANSLATION, pairs, batch_size=4, rng=rng)

    straight = epoch_stream.EpochStream(build, seed=7)
    for _ in range(len(build(None)) + 2):  # into the second epoch
        next(straight)
    state = straight.state_dict()
    assert state["epoch"] == 1
    want = [next(straight) for _ in range(5)]
    resumed = epoch_stream.EpochStream(build, seed=7, state=state)
    chex.assert_trees_all_equal([next(resumed) for _ in range(5)], want)


@pytest.mark.parametrize("task_name", ["translation", "lm"])
def test_segments_packer_packs_training_batches_only(task_name):
    config = default.get_config()  # the packers read only the batch shapes of the data
    config.max_len, config.tokens_per_batch, config.bucket_lengths = MAX_LEN, 64, (8, MAX_LEN)
    config = DataConfig.from_config(config)
    task = get_task(task_name)
    examples = _pairs() if task_name == "translation" else _documents()
    sides = [task.to_sides(example) for example in examples]
    segments, none = packing.get_packer("segments"), packing.get_packer("none")
    train = segments.batches(config, task.sides, sides, np.random.default_rng(0), num_devices=2)
    valid = segments.batches(config, task.sides, sides, None, num_devices=2, evaluation=True)
    assert all(b[task.model_inputs[0]].shape == (4, MAX_LEN) for b in train)
    assert any("segment_ids" in key for key in train[0])
    assert not any("segment_ids" in key for b in valid for key in b)
    unpacked = none.batches(config, task.sides, sides, np.random.default_rng(0), num_devices=2)
    assert not any("segment_ids" in key for b in unpacked for key in b)
    # Validation stays as bucketing builds it, bit for bit.
    chex.assert_trees_all_equal(valid, none.batches(config, task.sides, sides, None, 2))


def test_a_batch_that_does_not_split_names_the_config_flag():
    config = default.get_config()
    config.update(packing="stream", batch_size=6, tokens_per_batch=0, task="lm", corpus="kjv")
    config.copied_targets = 0.0
    data = DataConfig.from_config(config)
    flag = r"^--config\.batch_size=6: must be a multiple of the 4 "
    with pytest.raises(ValueError, match=flag + "devices"):
        packing.get_packer("stream").check(data, num_devices=4, share=RowShare())
    with pytest.raises(ValueError, match=flag + "processes"):
        packing.get_packer("none").check(data, num_devices=1, share=RowShare(0, 4))


def test_get_packer_names_the_choices():
    assert set(packing.PACKERS) == set(config_lib.PACKINGS)
    assert packing.get_packer("stream") is packing.PACKERS["stream"]
    with pytest.raises(ValueError, match=r"packing='pack' is not one of \('none', 'segments'"):
        packing.get_packer("pack")


@pytest.mark.parametrize(
    ("task_name", "packing_value", "match"),
    [
        ("translation", "stream", r"--config.packing='stream'.*one of \('none', 'segments'\)"),
        ("lm", "pack", r"--config.packing='pack'.*must be one of"),
    ],
)
def test_config_rejects_a_bad_packing(task_name, packing_value, match):
    config = default.get_config()
    config.task, config.packing = task_name, packing_value
    if task_name == "lm":
        config.corpus, config.copied_targets = "kjv", 0.0
    with pytest.raises(ValueError, match=match):
        config_lib.validate_config(config)


def test_config_accepts_segments_for_both_tasks_and_stream_needs_batch_size():
    config = default.get_config()
    config.packing = "segments"
    config_lib.validate_config(config)
    config.task, config.corpus, config.copied_targets = "lm", "kjv", 0.0
    config_lib.validate_config(config)
    config.packing = "stream"
    with pytest.raises(ValueError, match=r"--config.batch_size=0.*packing='stream'"):
        config_lib.validate_config(config)


def test_config_names_the_renamed_packed_field():
    config = default.get_config()
    config.packed = True  # an older config file
    with pytest.raises(ValueError, match=r"--config.packed=True.*renamed --config.packing"):
        config_lib.validate_config(config)


# A packed run; test_packing's packed-vs-unpacked gradient test keeps packing in the quick run.
@pytest.mark.slow
def test_packed_translation_run_trains(tmp_path):
    from train.program import loop as train_lib

    config = tiny_config(write_tiny_tsv(tmp_path), packing="segments", bleu_examples=0)
    results = train_lib.train_and_evaluate(config, str(tmp_path / "run"))
    assert np.isfinite(results["valid"]["nll"])


def test_packing_is_part_of_a_runs_identity():
    """A run resumes only with the batching it started with; a config.json written before
    `packing` replaced `packed` counts as packing='none' (or 'stream' for packed=True)."""
    saved = default.get_config().to_dict()
    del saved["packing"]
    saved["packed"] = False
    current = default.get_config()
    current.packing = "none"
    assert config_lib.changed_identity_fields(saved, current) == []
    current.packing = "segments"
    assert config_lib.changed_identity_fields(saved, current) == ["packing"]
    assert config_lib.changed_identity_fields({**saved, "packed": True}, current) == ["packing"]


@pytest.mark.parametrize("packer", ["none", "segments", "stream"])
def test_a_tokenizer_with_other_special_ids_frames_and_pads_with_them(packer):
    # A pretrained tokenizer's ids (pad appended after the vocabulary, BOS == EOS as in
    # GPT-2) reach every slot: no default id 0/1/2 is left in a batch.
    specials = SpecialIds(pad=V, bos=V - 1, eos=V - 1, unk=None)
    documents = _documents(num=7)
    sides = [LM.to_sides(document, specials) for document in documents]
    assert all(s[0][0] == V - 1 and s[0][-1] == V - 1 for s in sides)
    if packer == "none":
        batches = batching.bucketed_batches(
            LM.sides, sides, bucket_lengths=(MAX_LEN,), batch_size=4, pad_id=V
        )
    elif packer == "segments":
        batches = packing.segment_batches(LM.sides, sides, length=MAX_LEN, batch_size=4, pad_id=V)
    else:
        batches = packing.stream_batches(LM.sides, sides, seq_len=MAX_LEN, batch_size=4, pad_id=V)
    inputs = np.concatenate([b["inputs"] for b in batches])
    # Every real token is counted once; the rest is the tokenizer's pad.
    # (The stream is one sequence padded at its end: every token is an input there.)
    real = sum(len(s[0]) for s in sides) - (len(sides) if packer != "stream" else 0)
    assert sum(LM.tokens_in(b, V) for b in batches) == real
    assert not np.isin(inputs, [PAD_ID, BOS_ID, EOS_ID]).any()
    assert (inputs == V).any()
