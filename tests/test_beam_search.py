"""Beam search against brute force: every continuation of tiny models, scored exactly.

Each model's next-token log-probabilities after every prefix come from one forward pass
over all sequences of `N_NEW` real tokens, so a plain Python beam search (`_reference_beam`)
and the exhaustive best can be computed from a table instead of from the model.
"""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_transformer import (
    Beam,
    DecoderOnlyTransformer,
    Transformer,
    TransformerConfig,
    generate_text,
    generate_translation,
)
from flax_transformer.decoding import length_penalty

PAD, BOS, EOS, V, N_NEW = 0, 1, 1, 5, 4  # 4 real tokens; 1 doubles as BOS and EOS
REAL = tuple(t for t in range(V) if t != PAD)
CONFIG = TransformerConfig(
    vocab_size=V,
    d_model=16,
    num_heads=2,
    d_ff=32,
    num_layers=2,
    max_len=16,
    dropout_rate=0.0,
    init_std=0.5,  # large weights: peaked distributions, so greedy and beams differ
    embed_init_std=1.0,
    tie_output_embedding=False,
)
PROMPTS = jnp.array([[2, 3, 4], [4, 4, 2], [3, 2, 2], [2, 4, 3]])
# Every candidate of every step fits in the beam: 3 ** 3 live prefixes times 4 tokens.
EXACT_K = 3 ** (N_NEW - 1) * len(REAL)


def _all_full(real, n_new):
    return np.array(list(itertools.product(real, repeat=n_new)), np.int32)


def _table(kind, model, params, prompts, real, n_new):
    """float64 `(B, len(real) ** n_new, n_new, V)`: log-probabilities (padding masked, then
    renormalised, as generation does) of the next token after each prefix of every
    sequence of n_new real tokens, row b continuing prompts[b]."""
    full = jnp.asarray(_all_full(real, n_new))
    rows, count = len(prompts), len(full)
    prompt_rows = jnp.repeat(prompts, count, axis=0)
    cand_rows = jnp.tile(full, (rows, 1))
    if kind == "text":
        seqs = jnp.concatenate([prompt_rows, cand_rows], axis=1)
        logits = jax.jit(model.apply)(params, seqs)[:, prompts.shape[1] - 1 : -1]
    else:
        tgt = jnp.concatenate([jnp.full((rows * count, 1), BOS), cand_rows[:, :-1]], axis=1)
        logits = jax.jit(model.apply)(params, prompt_rows, tgt)
    logp = jax.nn.log_softmax(logits.at[..., PAD].set(-1e30))
    return np.asarray(logp, np.float64).reshape(rows, count, n_new, -1)


def _lookup(table_SNV, real, prefix):
    """Log-probabilities `(V,)` of the token after `prefix`: read from any full sequence
    that starts with it (the model is causal)."""
    digits = [real.index(t) for t in prefix] + [0] * (table_SNV.shape[1] - len(prefix))
    index = functools.reduce(lambda acc, d: acc * len(real) + d, digits, 0)
    return table_SNV[index, len(prefix)]


def _penalty(n, alpha):
    return float(length_penalty(jnp.asarray(n), alpha))


def _score(table_SNV, real, tokens, eos, alpha):
    """Normalised score of a generated row (up to its first EOS, or all n_new tokens)."""
    tokens = [int(t) for t in tokens]
    n = tokens.index(eos) + 1 if eos in tokens else len(tokens)
    logp = sum(_lookup(table_SNV, real, tuple(tokens[:j]))[t] for j, t in enumerate(tokens[:n]))
    return logp / _penalty(n, alpha)


def _reference_beam(table_SNV, real, k, eos, alpha):
    """Beam search in plain Python: each step's extensions of the live hypotheses ranked by
    log-probability; those among the k best that end (EOS or the last step) are finished
    for good; the k best that do not end stay live. No early stop. Returns (score, tokens).
    """
    n_new = table_SNV.shape[1]
    live, finished = [((), 0.0)], []
    for i in range(n_new):
        cands = [
            (lp + _lookup(table_SNV, real, prefix)[t], prefix + (t,))
            for prefix, lp in live
            for t in real
        ]
        cands.sort(key=lambda c: -c[0])
        for lp, seq in cands[:k]:
            if seq[-1] == eos or i == n_new - 1:
                finished.append((lp / _penalty(i + 1, alpha), seq))
        live = [(seq, lp) for lp, seq in cands if seq[-1] != eos][:k]
    return max(finished, key=lambda f: f[0])


def _exhaustive_best(table_SNV, real, eos, alpha):
    """The best score over every output (ending at its first EOS or after n_new tokens)."""
    n_new = table_SNV.shape[1]
    outputs = {
        tuple(seq[: seq.index(eos) + 1] if eos in seq else seq)
        for seq in map(list, _all_full(real, n_new).tolist())
    }
    return max(_score(table_SNV, real, seq, eos, alpha) for seq in outputs)


@functools.cache
def _model(kind):
    """A tiny model and its weights, and the table of its log-probabilities on PROMPTS."""
    if kind == "text":
        model = DecoderOnlyTransformer(CONFIG)
        params = jax.jit(model.init)(jax.random.key(5), jnp.ones_like(PROMPTS))
    else:
        model = Transformer(CONFIG)
        ones = jnp.ones_like(PROMPTS)
        params = jax.jit(model.init)(jax.random.key(4), ones, ones)
    return model, params, _table(kind, model, params, PROMPTS, list(REAL), N_NEW)


def _beam(kind, k, alpha):
    model, params, _ = _model(kind)
    common = dict(eos_id=EOS, max_new_tokens=N_NEW, strategy=Beam(k, alpha))
    if kind == "text":
        return np.asarray(generate_text(model, params, PROMPTS, **common))
    return np.asarray(generate_translation(model, params, PROMPTS, bos_id=BOS, **common))


ALPHAS = (0.0, 0.6, 2.0)
SLOW = pytest.mark.slow  # the quick run keeps one K below and one at the vocabulary size


@pytest.mark.parametrize(
    "kind,k",
    [
        ("text", 2),
        ("translation", 3),
        pytest.param("text", 1, marks=SLOW),
        pytest.param("text", 4, marks=SLOW),
        pytest.param("text", 8, marks=SLOW),
        pytest.param("text", EXACT_K, marks=SLOW),
        pytest.param("translation", 1, marks=SLOW),
        pytest.param("translation", 2, marks=SLOW),
        pytest.param("translation", 8, marks=SLOW),
        pytest.param("translation", EXACT_K, marks=SLOW),
    ],
)
def test_beam_search_equals_reference_and_brute_force(kind, k):
    """For each length penalty, each row's beam equals the Python reference beam search
    on the exact table (which never stops early, so the early stop changes nothing), and
    it never beats the exhaustive best; with every candidate in the beam it is that best."""
    _, _, table = _model(kind)
    for alpha in ALPHAS:
        out = _beam(kind, k, alpha)
        for b in range(len(PROMPTS)):
            got = _score(table[b], list(REAL), out[b], EOS, alpha)
            want, seq = _reference_beam(table[b], list(REAL), k, EOS, alpha)
            best = _exhaustive_best(table[b], list(REAL), EOS, alpha)
            assert got == pytest.approx(want, abs=1e-5), (alpha, b, out[b], seq)
            assert list(out[b][: len(seq)]) == list(seq), (alpha, b)
            assert not np.any(out[b][len(seq) :] != PAD)
            assert got <= best + 1e-5
            if k >= EXACT_K:
                assert got == pytest.approx(best, abs=1e-5)


def test_beam_keeps_finished_hypothesis_issue34():
    """Issue 34: Beam(5) and Beam(8) returned [4, 4, 4, 3] (log p -3.951) while Beam(16)
    returned [2] (-3.136): EOS at step 0 was pushed out of the beam by live hypotheses
    that scored better then and worse later. [2] is the best of every output."""
    cfg = TransformerConfig(
        vocab_size=6,
        d_model=16,
        num_heads=2,
        d_ff=32,
        num_layers=2,
        max_len=16,
        dropout_rate=0.0,
        init_std=0.2,
        embed_init_std=0.5,
        tie_output_embedding=False,
    )
    model = DecoderOnlyTransformer(cfg)
    params = jax.jit(model.init)(jax.random.key(1), jnp.ones((1, 3), jnp.int32))
    prompt, eos, real = jnp.array([[1, 3, 4]]), 2, [1, 2, 3, 4, 5]
    table = _table("text", model, params, prompt, real, N_NEW)[0]
    assert _exhaustive_best(table, real, eos, 0.0) == pytest.approx(-3.136, abs=1e-3)
    for k in (5, 8, 16):
        out = generate_text(
            model, params, prompt, eos_id=eos, max_new_tokens=N_NEW, strategy=Beam(k, 0.0)
        )
        np.testing.assert_array_equal(out, [[2, PAD, PAD, PAD]])
    assert _score(table, real, [2], eos, 0.0) == pytest.approx(-3.136, abs=1e-3)
