"""Golden numbers of the worked examples in the study notes this project was built from
(notes on Happy-LLM ch. 2, on a from-scratch video course, and on Raschka's *Build a Large
Language Model (From Scratch)* ch. 3; the notes are not shipped, so each example's inputs and
printed values are quoted here). "HL notes" below are those on Happy-LLM ch. 2, "Raschka
notes" those on Raschka ch. 3.

Every expected value is recomputed here, independently of the library: float64 numpy, exact
`fractions.Fraction` arithmetic, or the notes' own loop code transcribed. Each test compares
the library against the recomputation, and the recomputation against what the notes print.
Where a printed number is wrong, the test pins the correct value and a comment quotes the
note (`NOTES_*` constants hold the printed values; `# OFF:` marks the wrong ones).
"""

from __future__ import annotations

import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_transformer.functional import (
    causal_mask,
    dot_product_attention,
    layer_norm,
    multi_head_attention,
    simple_self_attention,
    sinusoidal_positions,
)

# float32 library results against float64 recomputations.
F32_TOL = dict(rtol=1e-5, atol=1e-6)


def _softmax64(x: np.ndarray, axis: int = -1) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _printed(decimals: int) -> dict:
    """Tolerance of a number printed with `decimals` digits after the point."""
    return dict(rtol=0.0, atol=0.5 * 10.0**-decimals + 1e-12)


# --------------------------------------------------------------------------------------------
# HL notes, 01 注意力机制 §3: q = "fruit", K/V = apple, banana, chair; softmax(q K^T) V unscaled.
# --------------------------------------------------------------------------------------------
HL_Q = np.array([[1.0, 0.5]])
HL_K = np.array([[0.9, 0.6], [0.8, 0.7], [0.1, 0.1]])
HL_V = np.array([[5.0, 2.0], [4.0, 3.0], [1.0, 9.0]])
HAPPY_LLM_NOTES_SCORES = np.array([1.2, 1.15, 0.15])  # correct
# OFF: the notes print w ≈ [0.45, 0.43, 0.12]; softmax([1.2, 1.15, 0.15]) is
# [0.434562, 0.413368, 0.152070] ≈ [0.43, 0.41, 0.15]. The notes' weights overstate the gap to
# "chair" (e^1.2 / e^0.15 = e^1.05 ≈ 2.86, not 0.45 / 0.12 = 3.75).
HAPPY_LLM_NOTES_WEIGHTS = np.array([0.45, 0.43, 0.12])
HL_WEIGHTS = np.array([0.434562, 0.413368, 0.152070])
# OFF: the notes print the output [4.09, 3.27] (typeset once as "[4.093.27]"). That is the right
# arithmetic on their wrong weights; the output of the true weights is [3.978353, 3.477856].
HAPPY_LLM_NOTES_OUTPUT = np.array([4.09, 3.27])
HL_OUTPUT = np.array([3.978353, 3.477856])


def test_happy_llm_notes_fruit_scores_are_q_dot_k():
    exact = [
        sum(Fraction(str(a)) * Fraction(str(b)) for a, b in zip(HL_Q[0], k, strict=True))
        for k in HL_K
    ]
    assert exact == [Fraction("1.2"), Fraction("1.15"), Fraction("0.15")]
    np.testing.assert_allclose(HL_Q @ HL_K.T, HAPPY_LLM_NOTES_SCORES[None], rtol=0, atol=1e-15)


def test_happy_llm_notes_fruit_attention_unscaled():
    q, k, v = (jnp.asarray(a, jnp.float32) for a in (HL_Q, HL_K, HL_V))
    out, weights = dot_product_attention(q, k, v, scale=1.0)

    expected_w = _softmax64(HL_Q @ HL_K.T)
    np.testing.assert_allclose(expected_w[0], HL_WEIGHTS, **_printed(6))
    np.testing.assert_allclose(weights, expected_w, **F32_TOL)
    np.testing.assert_allclose(out, expected_w @ HL_V, **F32_TOL)
    np.testing.assert_allclose(out[0], HL_OUTPUT, **_printed(6))
    # scale=1.0 really is the unscaled form: log-weight gaps equal the raw score gaps.
    log_w = np.log(np.asarray(weights[0], np.float64))
    np.testing.assert_allclose(log_w - log_w[0], HAPPY_LLM_NOTES_SCORES - 1.2, atol=1e-6)

    # What the notes print: their weights are off beyond rounding, so is the output.
    assert not np.allclose(expected_w[0], HAPPY_LLM_NOTES_WEIGHTS, **_printed(2))
    np.testing.assert_allclose(np.round(expected_w[0], 2), [0.43, 0.41, 0.15])
    np.testing.assert_allclose(HAPPY_LLM_NOTES_WEIGHTS @ HL_V, HAPPY_LLM_NOTES_OUTPUT, atol=1e-12)
    assert not np.allclose(HL_OUTPUT, HAPPY_LLM_NOTES_OUTPUT, **_printed(2))


# HL notes, 01 §4.2: softmax([2, 0, -1]) ≈ [0.84, 0.11, 0.04] (correct: 0.8438, 0.1142, 0.0420);
# softmax([50, 0, -20]) = [0.999999..., 0.000000..., 0.000000...] (correct: 1 - 1.9e-22, ...).
@pytest.mark.parametrize(
    "scores, printed, decimals",
    [([2.0, 0.0, -1.0], [0.84, 0.11, 0.04], 2), ([50.0, 0.0, -20.0], [1.0, 0.0, 0.0], 6)],
)
def test_happy_llm_notes_softmax_winner_takes_all(scores, printed, decimals):
    # A 1-d query of 1 against 1-d keys equal to the scores feeds them to softmax unchanged.
    q = jnp.ones((1, 1), jnp.float32)
    k = jnp.asarray(scores, jnp.float32)[:, None]
    v = jnp.eye(3, dtype=jnp.float32)
    out, weights = dot_product_attention(q, k, v, scale=1.0)
    expected = _softmax64(scores)
    np.testing.assert_allclose(weights[0], expected, rtol=1e-5, atol=1e-30)
    np.testing.assert_allclose(out[0], expected, rtol=1e-5, atol=1e-30)
    np.testing.assert_allclose(expected, printed, **_printed(decimals))
    assert np.all(np.isfinite(weights))


def test_happy_llm_notes_dot_product_variance_grows_with_dk():
    """01 §4.1: for N(0, 1) entries, var(q·k) = d_k; dividing by sqrt(d_k) brings it back to 1."""
    rng = np.random.default_rng(0)
    n = 5_000  # relative spread of the sample variance: about sqrt(5 / n) = 3%
    for d_k in (2, 512):
        q, k = rng.standard_normal((2, n, d_k))
        dots = np.einsum("nd,nd->n", q, k)
        assert dots.var() == pytest.approx(d_k, rel=0.1)
        assert (dots / math.sqrt(d_k)).var() == pytest.approx(1.0, rel=0.1)


# --------------------------------------------------------------------------------------------
# HL notes, 02 multi-head shapes: Q, K (32, 8, 5, 64) -> scores (32, 8, 5, 5), mask (1, 1, 5, 5).
# Raschka notes, §3.6: batch=2, seq=4, d_model=8, h=2, d_k=4 -> heads (2, 2, 4, 4) -> concat
# (2, 4, 8).
# --------------------------------------------------------------------------------------------
def test_happy_llm_notes_multi_head_shapes():
    q = jax.ShapeDtypeStruct((32, 5, 8, 64), jnp.float32)  # ours is (B, T, N, H)
    mask = jax.ShapeDtypeStruct((1, 1, 5, 5), jnp.bool_)
    out, weights = jax.eval_shape(lambda q, m: multi_head_attention(q, q, q, m), q, mask)
    assert weights.shape == (32, 8, 5, 5)
    assert out.shape == (32, 5, 8, 64)


def test_raschka_notes_fused_heads_equal_separate_heads():
    """One big (8, 8) projection split into 2 heads == 2 small (8, 4) projections (§3.6)."""
    rng = np.random.default_rng(3)
    batch, seq, d_model, heads, d_k = 2, 4, 8, 2, 4
    x = rng.standard_normal((batch, seq, d_model))
    w_q, w_k, w_v = rng.standard_normal((3, d_model, d_model)) / math.sqrt(d_model)

    def split(a):  # (B, T, D) -> (B, T, N, H), the notes' view(2, 4, 2, 4)
        return jnp.asarray(a.reshape(batch, seq, heads, d_k), jnp.float32)

    out, weights = multi_head_attention(split(x @ w_q), split(x @ w_k), split(x @ w_v))
    assert out.shape == (batch, seq, heads, d_k)
    assert weights.shape == (batch, heads, seq, seq)
    # The notes' layout (batch, heads, seq, d_k) = (2, 2, 4, 4) is ours transposed.
    assert jnp.transpose(out, (0, 2, 1, 3)).shape == (2, 2, 4, 4)
    concat = np.asarray(out).reshape(batch, seq, d_model)

    for h in range(heads):
        cols = slice(h * d_k, (h + 1) * d_k)
        q, k, v = x @ w_q[:, cols], x @ w_k[:, cols], x @ w_v[:, cols]
        w = _softmax64(q @ np.swapaxes(k, 1, 2) / math.sqrt(d_k))
        np.testing.assert_allclose(weights[:, h], w, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(concat[..., cols], w @ v, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------------------
# Course notes: batch=1, seq=3, d_model=4 -> d_k=2, scale 1/sqrt(2), causal mask.
# --------------------------------------------------------------------------------------------
COURSE_X = ("0.1 0.2 0.3 0.4", "0.5 0.4 0.3 0.2", "0.0 0.1 0.0 0.1")
COURSE_WQ = ("0.2 -0.1", "0.0 0.1", "0.1 0.2", "-0.1 0.0")
COURSE_WK = ("0.1 0.1", "0.0 -0.1", "0.2 0.0", "0.0 0.2")
COURSE_WV = ("0.1 0.0", "-0.1 0.1", "0.2 -0.1", "0.0 0.2")
COURSE_NOTES_Q = np.array([[0.01, 0.07], [0.11, 0.05], [-0.01, 0.01]])  # correct (exact)
COURSE_NOTES_K = np.array([[0.07, 0.07], [0.11, 0.05], [0.0, 0.01]])  # correct (exact)
COURSE_NOTES_V = np.array([[0.05, 0.07], [0.07, 0.05], [-0.01, 0.03]])  # correct (exact)
# Printed (precision=4) "True = masked" mask; ours is its negation (True = may attend).
COURSE_NOTES_MASKED = np.array([[0, 1, 1], [0, 0, 1], [0, 0, 0]], dtype=bool)
# Visible entries of the printed masked scores (masked ones print -1e9).
# OFF: entry [2, 0] prints 1.3632e-11. Exactly, q2·k0 = -0.01*0.07 + 0.01*0.07 = 0; the notes'
# number is float32 rounding noise of X @ W (float64 gives -5e-21). Correct value: 0.
COURSE_NOTES_SCORES = {
    (0, 0): 3.9598e-03,
    (1, 0): 7.9196e-03,
    (1, 1): 1.0324e-02,
    (2, 0): 1.3632e-11,
    (2, 1): -4.2426e-04,
    (2, 2): 7.0711e-05,
}
COURSE_NOTES_WEIGHTS = np.array([[1.0, 0.0, 0.0], [0.4994, 0.5006, 0.0], [0.3334, 0.3332, 0.3334]])
# Correct to the printed 4 decimals; the outputs print 0.06 for 0.060012 and 0.059988.
COURSE_NOTES_OUTPUT = np.array([[0.05, 0.07], [0.06, 0.06], [0.0367, 0.05]])


def _fractions(rows) -> list[list[Fraction]]:
    return [[Fraction(s) for s in row.split()] for row in rows]


def _matmul_exact(a, b):
    return [
        [sum(x * y for x, y in zip(row, col, strict=True)) for col in zip(*b, strict=True)]
        for row in a
    ]


def test_course_notes_projections_and_scores_exact():
    x = _fractions(COURSE_X)
    q, k, v = (_matmul_exact(x, _fractions(w)) for w in (COURSE_WQ, COURSE_WK, COURSE_WV))
    for exact, printed in ((q, COURSE_NOTES_Q), (k, COURSE_NOTES_K), (v, COURSE_NOTES_V)):
        assert exact == [[Fraction(str(p)) for p in row] for row in printed]

    qk = _matmul_exact(q, list(zip(*k, strict=True)))  # exact Q K^T
    assert qk[2][0] == 0  # the notes' 1.3632e-11 is rounding noise
    for (i, j), printed in COURSE_NOTES_SCORES.items():
        exact = float(qk[i][j]) / math.sqrt(2)
        if (i, j) == (2, 0):
            assert exact == 0.0 and printed != 0.0
        else:
            assert exact == pytest.approx(printed, rel=5e-5)


@pytest.mark.parametrize("scale", [1.0 / math.sqrt(2.0), None])
def test_course_notes_causal_attention(scale):
    x = np.array([[float(s) for s in row.split()] for row in COURSE_X])
    q64, k64, v64 = (
        x @ np.array([[float(s) for s in r.split()] for r in w])
        for w in (COURSE_WQ, COURSE_WK, COURSE_WV)
    )
    mask = causal_mask(3)
    np.testing.assert_array_equal(mask, ~COURSE_NOTES_MASKED)

    out, weights = dot_product_attention(
        *(jnp.asarray(a, jnp.float32) for a in (q64, k64, v64)), mask, scale=scale
    )

    scores = np.where(np.asarray(mask), q64 @ k64.T / math.sqrt(2.0), -np.inf)
    expected_w = _softmax64(scores)
    np.testing.assert_allclose(weights, expected_w, **F32_TOL)
    np.testing.assert_allclose(out, expected_w @ v64, **F32_TOL)
    np.testing.assert_array_equal(np.asarray(weights)[~np.asarray(mask)], 0.0)
    # Pinned recomputed values (more digits than the notes print).
    np.testing.assert_allclose(
        expected_w,
        [[1.0, 0.0, 0.0], [0.499399, 0.500601, 0.0], [0.333373, 0.333231, 0.333396]],
        **_printed(6),
    )
    np.testing.assert_allclose(
        expected_w @ v64, [[0.05, 0.07], [0.060012, 0.059988], [0.036661, 0.05]], **_printed(6)
    )
    # What the notes print (numpy precision=4) agrees to its 4 decimals.
    np.testing.assert_allclose(expected_w, COURSE_NOTES_WEIGHTS, **_printed(4))
    np.testing.assert_allclose(expected_w @ v64, COURSE_NOTES_OUTPUT, **_printed(4))


# --------------------------------------------------------------------------------------------
# Raschka notes, §3.3: simplified self-attention, "Your journey starts with one step", 3-d
# embeddings (the vectors are given in §3.4 as `inputs`).
# --------------------------------------------------------------------------------------------
RASCHKA_INPUTS = np.array(
    [
        [0.43, 0.15, 0.89],  # Your    x(1)
        [0.55, 0.87, 0.66],  # journey x(2)
        [0.57, 0.85, 0.64],  # starts  x(3)
        [0.22, 0.58, 0.33],  # with    x(4)
        [0.77, 0.25, 0.10],  # one     x(5)
        [0.05, 0.80, 0.55],  # step    x(6)
    ]
)
RASCHKA_NOTES_WEIGHTS_2 = np.array([0.14, 0.24, 0.23, 0.12, 0.11, 0.16])  # correct to 2 decimals
# Not printed in the notes; recomputed here (float64) and pinned.
RASCHKA_SCORES_2 = ("0.9544", "1.4950", "1.4754", "0.8434", "0.7070", "1.0865")
RASCHKA_WEIGHTS_2 = np.array([0.138548, 0.237891, 0.233274, 0.123992, 0.108182, 0.158114])
RASCHKA_CONTEXT_2 = np.array([0.441866, 0.651482, 0.568309])
RASCHKA_WEIGHTS = np.array(
    [
        [0.209835, 0.200581, 0.198149, 0.124228, 0.122049, 0.145158],
        [0.138548, 0.237891, 0.233274, 0.123992, 0.108182, 0.158114],
        [0.139008, 0.236921, 0.232602, 0.124204, 0.110800, 0.156464],
        [0.143527, 0.207394, 0.204552, 0.146192, 0.126295, 0.172039],
        [0.152611, 0.195839, 0.197491, 0.136687, 0.187859, 0.129514],
        [0.138471, 0.218364, 0.212759, 0.142048, 0.098806, 0.189552],
    ]
)


def test_raschka_notes_journey_scores_exact():
    x = [[Fraction(str(v)) for v in row] for row in RASCHKA_INPUTS]
    scores_2 = [sum(a * b for a, b in zip(x[1], row, strict=True)) for row in x]
    assert scores_2 == [Fraction(s) for s in RASCHKA_SCORES_2]


def test_raschka_notes_simple_self_attention():
    context, weights = simple_self_attention(jnp.asarray(RASCHKA_INPUTS, jnp.float32))
    assert context.shape == (6, 3) and weights.shape == (6, 6)

    # Independent recomputation: explicit loops over tokens, float64.
    n = len(RASCHKA_INPUTS)
    expected_w = np.zeros((n, n))
    expected_z = np.zeros((n, 3))
    for i in range(n):
        scores = [float(RASCHKA_INPUTS[i] @ RASCHKA_INPUTS[j]) for j in range(n)]
        exps = [math.exp(s) for s in scores]  # small scores: the naive softmax is safe here
        expected_w[i] = [e / sum(exps) for e in exps]
        for j in range(n):
            expected_z[i] += expected_w[i, j] * RASCHKA_INPUTS[j]

    np.testing.assert_allclose(weights, expected_w, **F32_TOL)
    np.testing.assert_allclose(context, expected_z, **F32_TOL)
    np.testing.assert_allclose(expected_w, RASCHKA_WEIGHTS, **_printed(6))
    np.testing.assert_allclose(expected_w[1], RASCHKA_WEIGHTS_2, **_printed(6))
    np.testing.assert_allclose(expected_z[1], RASCHKA_CONTEXT_2, **_printed(6))
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-6)
    # The notes' printed weights of "journey".
    np.testing.assert_allclose(expected_w[1], RASCHKA_NOTES_WEIGHTS_2, **_printed(2))


def test_raschka_notes_causal_mask_picture():
    """§3.5's additive mask: 0 on and below the diagonal, -inf above."""
    picture = """
        0  -∞  -∞  -∞  -∞  -∞
        0   0  -∞  -∞  -∞  -∞
        0   0   0  -∞  -∞  -∞
        0   0   0   0  -∞  -∞
        0   0   0   0   0  -∞
        0   0   0   0   0   0
    """
    visible = np.array(
        [[tok == "0" for tok in line.split()] for line in picture.strip().splitlines()]
    )
    np.testing.assert_array_equal(causal_mask(6), visible)


# §3.5's demo rows come from untrained torch.rand weights with no seed, so they cannot be
# reproduced; only their structure can be checked. Every printed row sums to 1.
RASCHKA_NOTES_UNMASKED = {
    0: [0.14, 0.16, 0.18, 0.15, 0.19, 0.18],
    1: [0.15, 0.17, 0.16, 0.18, 0.17, 0.17],
}
RASCHKA_NOTES_CAUSAL = {
    0: [1.00, 0.00, 0.00, 0.00, 0.00, 0.00],
    1: [0.45, 0.55, 0.00, 0.00, 0.00, 0.00],
    2: [0.30, 0.35, 0.35, 0.00, 0.00, 0.00],
    # OFF: the notes' causal row 5 is a copy of their *unmasked row 0*. The last causal row
    # equals the unmasked *last* row (row 5 sees every key), which the notes do not print.
    5: [0.14, 0.16, 0.18, 0.15, 0.19, 0.18],
}
# (Row 1 is borderline rather than provably off: renormalising the printed unmasked [0.15, 0.17]
# gives [0.47, 0.53]; [0.45, 0.55] is reachable only at the edge of the 2-decimal rounding.)


def test_raschka_notes_causal_rows_are_renormalised_prefixes():
    for rows in (RASCHKA_NOTES_UNMASKED, RASCHKA_NOTES_CAUSAL):
        for row in rows.values():
            assert sum(row) == pytest.approx(1.0, abs=1e-9)
    assert RASCHKA_NOTES_CAUSAL[5] == RASCHKA_NOTES_UNMASKED[0]  # the copy flagged above

    rng = np.random.default_rng(789)
    w_q, w_k, w_v = rng.uniform(size=(3, 3, 2))  # like torch.rand(d_in=3, d_out=2)
    x = jnp.asarray(RASCHKA_INPUTS, jnp.float32)
    q, k, v = (x @ jnp.asarray(w, jnp.float32) for w in (w_q, w_k, w_v))
    _, full = dot_product_attention(q, k, v)
    _, causal = dot_product_attention(q, k, v, causal_mask(6))
    full, causal = np.asarray(full), np.asarray(causal)

    np.testing.assert_array_equal(causal[0], np.eye(6)[0])
    for t in range(6):
        prefix = full[t, : t + 1] / full[t, : t + 1].sum()
        np.testing.assert_allclose(causal[t, : t + 1], prefix, rtol=1e-5)
        np.testing.assert_array_equal(causal[t, t + 1 :], 0.0)
    np.testing.assert_allclose(causal[5], full[5], rtol=1e-6)


# --------------------------------------------------------------------------------------------
# HL notes, 04 §1: PositionEncoding(seq_len=4, d_model=4, n=100) and PE(pos+k) = R(k) PE(pos).
# --------------------------------------------------------------------------------------------
def _notes_position_encoding(seq_len: int, d_model: int, n: float = 10000) -> np.ndarray:
    """The notes' `PositionEncoding`, transcribed (float64 numpy, two loops)."""
    p = np.zeros((seq_len, d_model))
    for k in range(seq_len):
        for i in np.arange(int(d_model / 2)):
            denominator = np.power(n, 2 * i / d_model)
            p[k, 2 * i] = np.sin(k / denominator)
            p[k, 2 * i + 1] = np.cos(k / denominator)
    return p


# Rows k: [sin k, cos k, sin(k/10), cos(k/10)] (frequencies 1 and 100^(-1/2)). The notes print
# only row 0, "[0, 1, 0, 1]", which is correct.
HL_PE_4x4 = np.array(
    [
        [0.0, 1.0, 0.0, 1.0],
        [0.84147098, 0.54030231, 0.09983342, 0.99500417],
        [0.90929743, -0.41614684, 0.19866933, 0.98006658],
        [0.14112001, -0.98999250, 0.29552021, 0.95533649],
    ]
)


def test_happy_llm_notes_position_encoding_table():
    table = sinusoidal_positions(4, 4, base=100)
    assert table.shape == (4, 4) and table.dtype == jnp.float32
    expected = _notes_position_encoding(4, 4, n=100)
    np.testing.assert_allclose(expected, HL_PE_4x4, rtol=0, atol=1e-8)
    np.testing.assert_allclose(table, expected, **F32_TOL)
    np.testing.assert_array_equal(table[0], [0.0, 1.0, 0.0, 1.0])


def _rotation(k: int, dim: int, base: float) -> np.ndarray:
    """Block-diagonal R(k): 2x2 blocks [[cos wk, sin wk], [-sin wk, cos wk]] on (sin, cos)."""
    r = np.zeros((dim, dim))
    for i in range(dim // 2):
        w = 1.0 / base ** (2 * i / dim)
        c, s = math.cos(w * k), math.sin(w * k)
        r[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = [[c, s], [-s, c]]
    return r


@pytest.mark.parametrize(
    "length, dim, base, pairs",
    [
        (4, 4, 100.0, [(0, 1), (1, 1), (0, 2), (1, 2), (0, 3), (2, 1)]),
        (64, 8, 10000.0, [(0, 1), (1, 2), (5, 7), (20, 3), (10, 40), (50, 13), (1, 62)]),
    ],
)
def test_happy_llm_notes_relative_position_rotation(length, dim, base, pairs):
    table = np.asarray(sinusoidal_positions(length, dim, base=base), np.float64)
    np.testing.assert_allclose(table, _notes_position_encoding(length, dim, base), atol=1e-5)
    for pos, k in pairs:
        r = _rotation(k, dim, base)
        # Column-vector form of the notes: PE(pos+k) = R(k) @ PE(pos), R independent of pos.
        np.testing.assert_allclose(r @ table[pos], table[pos + k], atol=1e-5)
        np.testing.assert_allclose(r @ r.T, np.eye(dim), atol=1e-12)
        if k < length - pos - 1:
            np.testing.assert_allclose(
                _rotation(1, dim, base) @ r, _rotation(k + 1, dim, base), atol=1e-12
            )
        # The orientation matters: the transpose turns the other way, PE(pos+k) -> PE(pos).
        np.testing.assert_allclose(r.T @ table[pos + k], table[pos], atol=1e-5)
        assert not np.allclose(r.T @ table[pos], table[pos + k], atol=1e-3)


# --------------------------------------------------------------------------------------------
# HL notes, 03 §1 LayerNorm: the code is a_2 * (x - mean) / (std + eps) + b_2 with eps=1e-6,
# where torch's `x.std` is the *unbiased* (divide by D-1) standard deviation. The formula the
# notes print beside it (garbled as "Zj=σ2+ϵZj−μj") is the standard (x - mean) / sqrt(var + eps)
# instead. The notes give no numbers; the example x = [1, 2, 3, 4] is ours.
# --------------------------------------------------------------------------------------------
NOTES_LN_EPS = 1e-6


def _notes_layer_norm(x, a_2, b_2, eps=NOTES_LN_EPS):
    x = np.asarray(x, np.float64)
    mean = x.mean(-1, keepdims=True)
    std = x.std(-1, ddof=1, keepdims=True)  # torch.Tensor.std default: unbiased
    return a_2 * (x - mean) / (std + eps) + b_2


def test_happy_llm_notes_layer_norm_notes_form():
    x = np.array([1.0, 2.0, 3.0, 4.0])
    notes = _notes_layer_norm(x, 1.0, 0.0)
    np.testing.assert_allclose(notes, [-1.161894, -0.387298, 0.387298, 1.161894], **_printed(6))
    # The notes say the result has "均值 0，方差 1": true of the unbiased variance only; the
    # per-token (biased) variance is (D-1)/D = 0.75 here.
    assert notes.var(ddof=1) == pytest.approx(1.0, rel=1e-5)
    assert notes.var() == pytest.approx(0.75, rel=1e-5)

    # Our std+eps form uses the biased std (divide by D), so it is sqrt(D/(D-1)) larger.
    ours = layer_norm(jnp.asarray(x, jnp.float32), None, None, NOTES_LN_EPS, eps_inside_sqrt=False)
    np.testing.assert_allclose(ours, [-1.341640, -0.447213, 0.447213, 1.341640], **_printed(5))
    assert not np.allclose(ours, notes, atol=1e-2)
    # Exact correspondence: notes(x; a, eps) == ours(x; a * c, eps * c) with c = sqrt((D-1)/D).
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 16)) * 3.0 + 1.0
    a_2, b_2 = rng.standard_normal((2, 16))
    c = math.sqrt((16 - 1) / 16)
    ours = layer_norm(
        jnp.asarray(x, jnp.float32),
        jnp.asarray(a_2 * c, jnp.float32),
        jnp.asarray(b_2, jnp.float32),
        NOTES_LN_EPS * c,
        eps_inside_sqrt=False,
    )
    np.testing.assert_allclose(ours, _notes_layer_norm(x, a_2, b_2), rtol=1e-5, atol=1e-5)
    # And the standard form (eps inside the sqrt, biased variance) on the same x = [1, 2, 3, 4].
    std_form = layer_norm(jnp.asarray([1.0, 2.0, 3.0, 4.0]), None, None, 1e-5)
    np.testing.assert_allclose(std_form, [-1.341635, -0.447212, 0.447212, 1.341635], **_printed(5))
