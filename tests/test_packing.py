"""Packed sequences: segment ids in both models give each example the logits, loss and
gradients it has alone, and the pure builders (`segment_positions`, `segment_mask`) match
small examples worked by hand."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from flax_transformer import (
    DecoderOnlyTransformer,
    Transformer,
    TransformerConfig,
    causal_mask,
    combine_masks,
    label_smoothed_cross_entropy,
    segment_mask,
    segment_positions,
)

V, LENGTH = 41, 10  # every row, packed or alone, is padded to LENGTH
CONFIG = TransformerConfig(
    vocab_size=V,
    d_model=16,
    num_heads=4,
    d_ff=32,
    num_layers=2,
    max_len=16,
    dropout_rate=0.0,
)
# Examples per packed row: row 0 holds three (one pad token left), row 1 two.
LM_ROWS = [[3, 4, 2], [5, 4]]
# (source length, target length) of each example; row 0 ends in padding on both sides.
TRANSLATION_ROWS = [[(3, 2), (2, 4), (4, 3)], [(5, 4), (3, 4)]]
ATOL = RTOL = 1e-5
LABEL_SMOOTHING = 0.1
POSITIONALS = ["sinusoidal", "learned", "rope"]


def _cases(quick):
    """(positional, scan_layers) for every positional, unrolled and scanned; the cases not in
    `quick` are marked slow (the quick run keeps one case per test, the two tests between them
    covering scan, and the full run checks all six)."""
    return [
        pytest.param(p, s, marks=() if (p, s) in quick else pytest.mark.slow)
        for p in POSITIONALS
        for s in (False, True)
    ]


def _example(key: int, length: int) -> np.ndarray:
    """Random non-pad ids (pad_id 0 never drawn)."""
    return np.asarray(jax.random.randint(jax.random.key(key), (length,), 1, V), np.int32)


def _pack(rows: list[list[np.ndarray]]) -> tuple[jax.Array, jax.Array]:
    """Examples laid end to end in each row -> `(tokens (B, LENGTH), segment ids (B, LENGTH))`."""
    tokens = np.zeros((len(rows), LENGTH), np.int32)
    segments = np.zeros((len(rows), LENGTH), np.int32)
    for b, row in enumerate(rows):
        start = 0
        for s, ids in enumerate(row, start=1):
            tokens[b, start : start + len(ids)] = ids
            segments[b, start : start + len(ids)] = s
            start += len(ids)
    return jnp.asarray(tokens), jnp.asarray(segments)


def _alone(rows: list[list[np.ndarray]]) -> jax.Array:
    """Every example in a row of its own, right-padded: `(num_examples, LENGTH)`."""
    return _pack([[ids] for row in rows for ids in row])[0]


def _unpack(packed_BTX: jax.Array, rows: list[list[np.ndarray]]) -> list[jax.Array]:
    """The packed rows cut back into the examples' own positions."""
    out = []
    for b, row in enumerate(rows):
        start = 0
        for ids in row:
            out.append(packed_BTX[b, start : start + len(ids)])
            start += len(ids)
    return out


def _loss_sum(logits, labels):
    loss, _ = label_smoothed_cross_entropy(logits, labels, label_smoothing=LABEL_SMOOTHING)
    return loss.sum()


def _lm_data():
    tokens = [[_example(10 * b + i, n) for i, n in enumerate(row)] for b, row in enumerate(LM_ROWS)]
    labels = [
        [_example(100 + 10 * b + i, n) for i, n in enumerate(row)] for b, row in enumerate(LM_ROWS)
    ]
    return tokens, labels


def _translation_data():
    src = [
        [_example(10 * b + i, s) for i, (s, _) in enumerate(row)]
        for b, row in enumerate(TRANSLATION_ROWS)
    ]
    tgt = [
        [_example(200 + 10 * b + i, t) for i, (_, t) in enumerate(row)]
        for b, row in enumerate(TRANSLATION_ROWS)
    ]
    labels = [
        [_example(400 + 10 * b + i, t) for i, (_, t) in enumerate(row)]
        for b, row in enumerate(TRANSLATION_ROWS)
    ]
    return src, tgt, labels


def _assert_examples_match(packed_logits, alone_logits, rows):
    for i, got in enumerate(_unpack(packed_logits, rows)):
        want = alone_logits[i, : got.shape[0]]
        chex.assert_trees_all_close(got, want, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("positional, scan_layers", _cases({("rope", True)}))
def test_packed_lm_matches_each_example_alone(positional, scan_layers):
    cfg = CONFIG.replace(positional=positional, scan_layers=scan_layers)
    model = DecoderOnlyTransformer(cfg)
    examples, labels = _lm_data()
    tokens_BT, segments_BT = _pack(examples)
    alone_BT = _alone(examples)
    params = nn.unbox(model.init(jax.random.key(0), tokens_BT))

    packed = jax.jit(model.apply)(params, tokens_BT, segment_ids_BT=segments_BT)
    alone = jax.jit(model.apply)(params, alone_BT)
    chex.assert_shape(packed, (len(LM_ROWS), LENGTH, V))
    _assert_examples_match(packed, alone, examples)

    labels_BT, alone_labels = _pack(labels)[0], _alone(labels)
    chex.assert_trees_all_close(
        _loss_sum(packed, labels_BT), _loss_sum(alone, alone_labels), rtol=RTOL
    )


@pytest.mark.parametrize("positional, scan_layers", _cases({("learned", False)}))
def test_packed_translation_matches_each_example_alone(positional, scan_layers):
    cfg = CONFIG.replace(positional=positional, scan_layers=scan_layers)
    model = Transformer(cfg)
    src, tgt, labels = _translation_data()
    (src_BS, src_segments_BS), (tgt_BT, tgt_segments_BT) = _pack(src), _pack(tgt)
    params = nn.unbox(model.init(jax.random.key(0), src_BS, tgt_BT))

    packed = jax.jit(model.apply)(
        params,
        src_BS,
        tgt_BT,
        src_segment_ids_BS=src_segments_BS,
        tgt_segment_ids_BT=tgt_segments_BT,
    )
    alone = jax.jit(model.apply)(params, _alone(src), _alone(tgt))
    _assert_examples_match(packed, alone, tgt)

    labels_BT, alone_labels = _pack(labels)[0], _alone(labels)
    chex.assert_trees_all_close(
        _loss_sum(packed, labels_BT), _loss_sum(alone, alone_labels), rtol=RTOL
    )


@pytest.mark.parametrize(
    "positional",
    [p if p == "rope" else pytest.param(p, marks=pytest.mark.slow) for p in POSITIONALS],
)
def test_packed_gradients_are_finite_and_equal_the_unpacked_ones(positional):
    """The gradient of the summed loss is the same whether the examples are packed or not."""
    cfg = CONFIG.replace(positional=positional)
    model = Transformer(cfg)
    src, tgt, labels = _translation_data()
    (src_BS, src_seg), (tgt_BT, tgt_seg) = _pack(src), _pack(tgt)
    labels_BT = _pack(labels)[0]
    params = nn.unbox(model.init(jax.random.key(0), src_BS, tgt_BT))

    def packed_loss(p):
        logits = model.apply(
            p, src_BS, tgt_BT, src_segment_ids_BS=src_seg, tgt_segment_ids_BT=tgt_seg
        )
        return _loss_sum(logits, labels_BT)

    def alone_loss(p):
        return _loss_sum(model.apply(p, _alone(src), _alone(tgt)), _alone(labels))

    grads = jax.jit(jax.grad(packed_loss))(params)
    chex.assert_tree_all_finite(grads)
    alone = jax.jit(jax.grad(alone_loss))(params)
    chex.assert_trees_all_close(grads, alone, atol=1e-5, rtol=1e-4)


def test_packed_lm_gradients_are_finite_under_remat_and_scan():
    model = DecoderOnlyTransformer(CONFIG.replace(positional="rope", scan_layers=True, remat=True))
    examples, labels = _lm_data()
    tokens_BT, segments_BT = _pack(examples)
    params = nn.unbox(model.init(jax.random.key(0), tokens_BT))

    def loss(p):
        return _loss_sum(model.apply(p, tokens_BT, segment_ids_BT=segments_BT), _pack(labels)[0])

    grads = jax.jit(jax.grad(loss))(params)
    chex.assert_tree_all_finite(grads)
    assert any(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(grads))


def test_packed_call_eager_equals_jit():
    model = DecoderOnlyTransformer(CONFIG)
    tokens_BT, segments_BT = _pack(_lm_data()[0])
    params = model.init(jax.random.key(0), tokens_BT)
    eager = model.apply(params, tokens_BT, segment_ids_BT=segments_BT)
    jitted = jax.jit(model.apply)(params, tokens_BT, segment_ids_BT=segments_BT)
    chex.assert_trees_all_close(eager, jitted, atol=1e-6)


def test_given_positions_override_segment_positions():
    """Explicit positions win: the segment positions passed by hand give the same logits."""
    model = DecoderOnlyTransformer(CONFIG.replace(positional="learned"))
    tokens_BT, segments_BT = _pack(_lm_data()[0])
    params = model.init(jax.random.key(0), tokens_BT)
    default = model.apply(params, tokens_BT, segment_ids_BT=segments_BT)
    given = model.apply(
        params,
        tokens_BT,
        segment_ids_BT=segments_BT,
        positions_BT=segment_positions(segments_BT),
    )
    chex.assert_trees_all_equal(default, given)
    shifted = model.apply(params, tokens_BT, segment_ids_BT=segments_BT, positions_BT=segments_BT)
    assert not np.allclose(default, shifted)


def test_packing_errors_name_the_argument():
    lm, ed = DecoderOnlyTransformer(CONFIG), Transformer(CONFIG)
    tokens_BT, segments_BT = _pack(_lm_data()[0])
    lm_params = lm.init(jax.random.key(0), tokens_BT)
    ed_params = ed.init(jax.random.key(0), tokens_BT, tokens_BT)
    with pytest.raises(ValueError, match=r"segment_ids must be int ids of the shape of tokens"):
        lm.apply(lm_params, tokens_BT, segment_ids_BT=segments_BT[:, :-1])
    with pytest.raises(ValueError, match=r"segment_ids must be int ids"):
        lm.apply(lm_params, tokens_BT, segment_ids_BT=segments_BT.astype(jnp.float32))
    with pytest.raises(ValueError, match=r"positions holds positions in \[0, 16\]"):
        lm.apply(lm_params, tokens_BT, positions_BT=jnp.full_like(tokens_BT, 16).at[0, 0].set(0))
    with pytest.raises(ValueError, match=r"both src_segment_ids and tgt_segment_ids"):
        ed.apply(ed_params, tokens_BT, tokens_BT, src_segment_ids_BS=segments_BT)
    with pytest.raises(ValueError, match=r"tgt_segment_ids must be int ids"):
        ed.apply(
            ed_params,
            tokens_BT,
            tokens_BT,
            src_segment_ids_BS=segments_BT,
            tgt_segment_ids_BT=segments_BT[:1],
        )


# Pure functions, golden values worked by hand.


VARIANTS = pytest.mark.parametrize("variant", [lambda f: f, jax.jit], ids=["eager", "jit"])


@VARIANTS
def test_segment_positions_restart_in_each_segment(variant):
    segments = jnp.array([[1, 1, 1, 2, 2, 3, 0, 0], [1, 1, 2, 2, 2, 2, 2, 0]])
    want = [[0, 1, 2, 0, 1, 0, 0, 0], [0, 1, 0, 1, 2, 3, 4, 0]]
    got = variant(segment_positions)(segments)
    assert got.dtype == jnp.int32
    chex.assert_trees_all_equal(got, jnp.array(want, jnp.int32))
    # One sequence; a new segment starts wherever the id changes, whatever its value.
    got_T = variant(segment_positions)(jnp.array([2, 2, 1, 1, 1, 0]))
    chex.assert_trees_all_equal(got_T, jnp.array([0, 1, 0, 1, 2, 0], jnp.int32))


def test_check_packing_returns_the_positions_to_use():
    """`checks.tokens.check_packing` returned these before the 2026-12-04 move and None
    after it (code that read them got None without an error): the return is back."""
    from flax_transformer.checks.tokens import check_packing
    from flax_transformer.functional import segment_positions as functional_positions

    tokens = jnp.array([[5, 6, 7, 8, 0], [5, 6, 7, 8, 9]])
    segments = jnp.array([[1, 1, 2, 2, 0], [1, 2, 2, 2, 3]])
    names = ("tokens", "segment_ids", "positions")
    got = check_packing(tokens, segments, None, 16, 0, names)
    np.testing.assert_array_equal(got, [[0, 1, 0, 1, 0], [0, 0, 1, 2, 0]])
    given = jnp.array([[0, 1, 2, 3, 4]])
    assert check_packing(tokens, segments, given, 16, 0, names) is given
    assert check_packing(tokens, None, None, 16, 0, names) is None
    jitted = jax.jit(lambda t, s: check_packing(t, s, None, 16, 0, names))(tokens, segments)
    np.testing.assert_array_equal(jitted, got)
    # One function, two names: functional.segment_positions is the packing convention's.
    assert functional_positions is segment_positions


@VARIANTS
def test_segment_mask_golden(variant):
    q, k = jnp.array([1, 1, 2, 0]), jnp.array([1, 2, 2, 0, 1])
    # Row t: True where k[s] == q[t] and k[s] != 0; the padding query (q = 0) sees nothing.
    want_TS = jnp.array(
        [
            [1, 0, 0, 0, 1],
            [1, 0, 0, 0, 1],
            [0, 1, 1, 0, 0],
            [0, 0, 0, 0, 0],
        ],
        jnp.bool_,
    )
    chex.assert_trees_all_equal(variant(segment_mask)(q, k), want_TS)
    batched = variant(segment_mask)(jnp.stack([q, q]), jnp.stack([k, jnp.ones_like(k)]))
    chex.assert_shape(batched, (2, 1, 4, 5))
    chex.assert_trees_all_equal(batched[0, 0], want_TS)
    chex.assert_trees_all_equal(
        batched[1, 0], jnp.array([[1] * 5, [1] * 5, [0] * 5, [0] * 5], bool)
    )


def test_segment_mask_with_causal_mask_is_block_lower_triangular():
    segments = jnp.array([[1, 1, 2, 2, 2]])
    mask = combine_masks(causal_mask(5), segment_mask(segments, segments))
    want = jnp.array(
        [
            [1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0],
            [0, 0, 1, 0, 0],
            [0, 0, 1, 1, 0],
            [0, 0, 1, 1, 1],
        ],
        jnp.bool_,
    )
    chex.assert_shape(mask, (1, 1, 5, 5))
    chex.assert_trees_all_equal(mask[0, 0], want)


def test_segment_builders_reject_bad_inputs():
    with pytest.raises(ValueError, match=r"same B, or \(T,\) and \(S,\)"):
        segment_mask(jnp.ones((2, 3), jnp.int32), jnp.ones((3, 3), jnp.int32))
    with pytest.raises(ValueError, match=r"same B"):
        segment_mask(jnp.ones((2, 3), jnp.int32), jnp.ones((3,), jnp.int32))
    with pytest.raises(ValueError, match=r"int k_segments"):
        segment_mask(jnp.ones((3,), jnp.int32), jnp.ones((3,)))
    with pytest.raises(ValueError, match=r"int segment ids"):
        segment_positions(jnp.ones((2, 3)))
