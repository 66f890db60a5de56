"""Generation: the KV cache against full recomputation, greedy, sampling filters, beam search.

The models are tiny, with random weights large enough (`_random_params`) that greedy
decoding does not just repeat one token, so a broken cache shows up in the tokens.
"""

import dataclasses
import functools
import itertools
import re
from pathlib import Path
from typing import ClassVar

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from flax_transformer import (
    Beam,
    DecoderOnlyTransformer,
    Greedy,
    Sample,
    Transformer,
    TransformerConfig,
    generate_text,
    generate_translation,
)
from flax_transformer.cache import move_rows
from flax_transformer.decoding import (
    MASKED_LOGIT,
    TokenByToken,
    beam_search,
    init_cache,
    length_penalty,
    sampling,
    search,
    select_rows,
    top_k_mask,
    top_p_mask,
)
from flax_transformer.decoding import generate as generate_module
from flax_transformer.decoding.steppers import text_stepper, translation_stepper

PAD, BOS, V = 0, 1, 23
CONFIG = TransformerConfig(
    vocab_size=V,
    d_model=32,
    num_heads=4,
    d_ff=64,
    num_layers=2,
    max_len=32,
    dropout_rate=0.0,
    tie_output_embedding=False,
)
PROMPT = jax.random.randint(jax.random.key(1), (3, 6), 2, V)
LENGTHS = jnp.array([6, 2, 4])
SOURCE = jax.random.randint(jax.random.key(2), (3, 7), 2, V).at[1, 4:].set(PAD)
N_NEW = 10


def _random_params(model, *args, seed=0, std=0.2, embed_std=0.5):
    """Normal weights (norm scales around 1) in the shapes of `model.init(key, *args)`.

    Larger than the 0.02 init, so greedy decoding does not just repeat one token; drawn
    with numpy on shapes from `jax.eval_shape`, so no init runs (eager init is slow).
    """
    shapes = nn.unbox(jax.eval_shape(model.init, jax.random.key(0), *args))
    leaves, tree = jax.tree_util.tree_flatten_with_path(shapes)
    rng = np.random.default_rng(seed)
    new = []
    for path, x in leaves:
        name = jax.tree_util.keystr(path)
        scale = embed_std if "embedding" in name else std if len(x.shape) >= 2 else 0.1
        offset = 1.0 if "scale" in name else 0.0
        new.append(jnp.asarray(rng.normal(size=x.shape) * scale + offset, jnp.float32))
    return jax.tree.unflatten(tree, new)


def _scanned(params, num_layers):
    """Unrolled parameters restacked for `scan_layers=True`: the same model, scanned."""
    tree = dict(params["params"])
    for name in ("encoder", "decoder"):
        if name in tree:
            stack = dict(tree[name])
            layers = [stack.pop(f"layers_{i}") for i in range(num_layers)]
            stack["layers"] = jax.tree.map(lambda *xs: jnp.stack(xs), *layers)
            tree[name] = stack
    return {"params": tree}


@functools.cache
def _lm(cfg=CONFIG, seed=0, **randomize):
    """A DecoderOnlyTransformer and random weights; scanned models get the unrolled weights."""
    model = DecoderOnlyTransformer(cfg.replace(scan_layers=False))
    params = _random_params(model, jnp.ones_like(PROMPT), seed=seed, **randomize)
    if cfg.scan_layers:
        return DecoderOnlyTransformer(cfg), _scanned(params, cfg.num_layers)
    return model, params


@functools.cache
def _mt(cfg=CONFIG, seed=0, **randomize):
    """A Transformer and random weights, as `_lm`."""
    model = Transformer(cfg.replace(scan_layers=False))
    ones = jnp.ones_like(SOURCE), jnp.ones_like(PROMPT)
    params = _random_params(model, *ones, seed=seed, **randomize)
    if cfg.scan_layers:
        return Transformer(cfg), _scanned(params, cfg.num_layers)
    return model, params


def _until_eos(tokens, eos_id):
    """bool mask of the generated positions up to and including the first EOS."""
    tokens = np.asarray(tokens)
    after = np.cumsum(tokens == eos_id, axis=1) - (tokens == eos_id)
    return after == 0


def _eos_seen_midway(tokens, exclude=(PAD, V - 1)):
    """(token, row, step): a token that greedy decoding first emits mid-sequence: a test's EOS."""
    for b, row in enumerate(np.asarray(tokens).tolist()):
        for step in range(2, len(row) - 1):
            if row[step] not in row[:step] and row[step] not in exclude:
                return row[step], b, step
    raise AssertionError(f"no token to use as EOS in {tokens}")


# The tests share compiled programs: the same shapes and static options everywhere (a probe
# EOS of V - 1 and per-step logits), so that each call below compiles at most once.
def _text(model, params, **kwargs):
    kwargs = {"eos_id": V - 1, "max_new_tokens": N_NEW, "return_logits": True, **kwargs}
    return generate_text(model, params, PROMPT, LENGTHS, **kwargs)


def _translate(model, params, **kwargs):
    kwargs = {"eos_id": V - 1, "max_new_tokens": N_NEW, "return_logits": True, **kwargs}
    return generate_translation(model, params, SOURCE, bos_id=BOS, **kwargs)


def _lm_full_logits(model, params, tokens, prompt, lengths):
    """Logits of the full forward pass at each generated position (prompt + tokens)."""
    batch, n = tokens.shape
    rows = [
        np.concatenate([np.asarray(prompt[b, : lengths[b]]), np.asarray(tokens[b])])
        for b in range(batch)
    ]
    width = max(len(r) for r in rows)
    full = np.stack([np.pad(r, (0, width - len(r))) for r in rows])
    logits = jax.jit(model.apply)(params, jnp.asarray(full))
    index = np.asarray(lengths)[:, None] - 1 + np.arange(n)[None, :]
    return np.take_along_axis(np.asarray(logits), index[..., None], axis=1)


@pytest.mark.parametrize("scan_layers", [False, True])
def test_text_cache_equals_full_recomputation(scan_layers):
    """Prompts of lengths 6, 2, 4 in one batch: tokens equal, per-step logits within 1e-5."""
    model, params = _lm(CONFIG.replace(scan_layers=scan_layers))
    greedy, _ = _text(model, params)
    assert len({tuple(r) for r in np.asarray(greedy)}) > 1 and len(set(np.asarray(greedy[0]))) > 2
    eos, row, step = _eos_seen_midway(greedy)
    tokens, logits = _text(model, params, eos_id=eos)
    ref_tokens, ref_logits = _text(model, params, eos_id=eos, use_cache=False)
    chex.assert_shape(tokens, (3, N_NEW))
    assert tokens.dtype == jnp.int32
    np.testing.assert_array_equal(tokens, ref_tokens)
    # EOS ends its row, padding follows; the other rows go on.
    np.testing.assert_array_equal(tokens[row, : step + 1], greedy[row, : step + 1])
    assert np.all(tokens[row, step + 1 :] == PAD) and np.all(tokens[:, 1] != PAD)
    valid = _until_eos(tokens, eos)
    full = _lm_full_logits(model, params, tokens, PROMPT, LENGTHS)
    np.testing.assert_allclose(np.asarray(logits)[valid], full[valid], atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(ref_logits)[valid], full[valid], atol=1e-5, rtol=0)
    if scan_layers:  # the same weights, stacked: the same tokens as the unrolled model
        np.testing.assert_array_equal(greedy, _text(*_lm())[0])


# test_text_cache_equals_full_recomputation keeps the cache check in the quick run.
@pytest.mark.slow
@pytest.mark.parametrize("scan_layers", [False, True])
def test_translation_cache_equals_full_recomputation(scan_layers):
    """Sources with padding; cross-attention keys/values cached once."""
    model, params = _mt(CONFIG.replace(scan_layers=scan_layers))
    greedy, _ = _translate(model, params)
    assert len({tuple(r) for r in np.asarray(greedy)}) > 1
    eos, row, step = _eos_seen_midway(greedy)
    tokens, logits = _translate(model, params, eos_id=eos)
    ref_tokens, _ = _translate(model, params, eos_id=eos, use_cache=False)
    np.testing.assert_array_equal(tokens, ref_tokens)
    np.testing.assert_array_equal(tokens[row, : step + 1], greedy[row, : step + 1])
    assert np.all(tokens[row, step + 1 :] == PAD)
    decoder_input = jnp.concatenate([jnp.full((3, 1), BOS), tokens[:, :-1]], axis=1)
    full = np.asarray(jax.jit(model.apply)(params, SOURCE, decoder_input))
    valid = _until_eos(tokens, eos)
    np.testing.assert_allclose(np.asarray(logits)[valid], full[valid], atol=1e-5, rtol=0)


def test_extend_in_chunks_equals_forward():
    """Model level, post-norm, learned positions, remat: a prompt of 4 tokens, then 1, then
    2, equals one forward pass; the cache index counts the tokens."""
    cfg = CONFIG.replace(norm_position="post", positional="learned", remat=True)
    model, params = _lm(cfg)
    tokens = jnp.concatenate([PROMPT, PROMPT[:, :1]], axis=1)  # (3, 7)
    expected = jax.jit(model.apply)(params, tokens)
    extend = jax.jit(functools.partial(model.apply, method="extend"))
    cache = init_cache(cfg, 3, 8)
    pieces = []
    for start, stop in [(0, 4), (4, 5), (5, 7)]:
        logits, cache = extend(params, tokens[:, start:stop], cache)
        pieces.append(logits)
    chex.assert_trees_all_close(jnp.concatenate(pieces, axis=1), expected, atol=1e-5)
    np.testing.assert_array_equal(cache["index"], [7, 7, 7])


# Several cache sizes compiled; test_bad_inputs keeps cache misuse in the quick run.
@pytest.mark.slow
def test_cache_overflow_raises():
    """A past defect: a 6-token prompt into a 4-slot cache, or a step past the last slot, used to
    write past the end silently. Exact fills work; ragged prompts count their real tokens."""
    model, params = _lm()
    extend = functools.partial(model.apply, params, method="extend")
    with pytest.raises(ValueError, match=r"cache has 4 slots, sequence 0 has filled 0 .* 6 new"):
        extend(PROMPT, init_cache(CONFIG, 3, 4))
    logits, cache = extend(PROMPT[:, :4], init_cache(CONFIG, 3, 4))  # exactly full
    chex.assert_shape(logits, (3, 4, V))
    np.testing.assert_array_equal(cache["index"], [4, 4, 4])
    with pytest.raises(ValueError, match=r"sequence 0 has filled 4 .* 1 new tokens would need 5"):
        extend(PROMPT[:, :1], cache)
    # Ragged prompts: rows 1 and 2 have room for one more token, row 0 has not.
    _, cache = extend(PROMPT[:, :4], init_cache(CONFIG, 3, 4), lengths_B=jnp.array([4, 3, 3]))
    with pytest.raises(ValueError, match=r"sequence 0 has filled 4"):
        extend(PROMPT[:, :1], cache)
    _, cache = extend(PROMPT[:, :1], cache, lengths_B=jnp.array([0, 1, 1]))
    np.testing.assert_array_equal(cache["index"], [4, 4, 4])
    with pytest.raises(
        ValueError, match=r"lengths_B=\[5, 1, 1\] must hold one count in \[0, T=4\]"
    ):
        extend(PROMPT[:, :4], init_cache(CONFIG, 3, 4), lengths_B=jnp.array([5, 1, 1]))

    mt, mt_params = _mt()
    prefill = functools.partial(mt.apply, mt_params, method="prefill")
    with pytest.raises(ValueError, match=r"cache has 2 slots, sequence 0 has filled 0 .* 3 new"):
        prefill(SOURCE, PROMPT[:, :3], init_cache(CONFIG, 3, 2, source_length=7))
    _, cache = prefill(SOURCE, PROMPT[:, :2], init_cache(CONFIG, 3, 2, source_length=7))
    with pytest.raises(ValueError, match=r"filled 2 .* 1 new tokens would need 3"):
        mt.apply(mt_params, PROMPT[:, :1], cache, method="extend")


def test_cache_trees_for_unrolled_and_scanned_stacks():
    cache = init_cache(CONFIG, 2, 9, source_length=5)
    layer = cache["decoder"]["layers_1"]
    chex.assert_shape(
        [layer["self_attention"]["k"], layer["cross_attention"]["v"]], [(2, 4, 9, 8), (2, 4, 5, 8)]
    )
    scanned = init_cache(CONFIG.replace(scan_layers=True), 2, 9)
    chex.assert_shape(scanned["decoder"]["layers"]["self_attention"]["k"], (2, 2, 4, 9, 8))
    assert "cross_attention" not in scanned["decoder"]["layers"]
    scanned["index"] = jnp.array([3, 5])
    picked = select_rows(scanned, jnp.array([1, 1, 0]))
    np.testing.assert_array_equal(picked["index"], [5, 5, 3])
    chex.assert_shape(picked["decoder"]["layers"]["self_attention"]["v"], (2, 3, 4, 9, 8))
    with pytest.raises(ValueError, match="cache length 40 exceeds TransformerConfig.max_len=32"):
        init_cache(CONFIG, 1, 40)


@pytest.mark.parametrize("kind", ["text", "translation"])
def test_beam_one_equals_greedy(kind):
    """`beam_search` itself with K = 1 (the public functions route beam_size=1 to greedy
    decoding) and no length penalty gives greedy's tokens, EOS included. (With a penalty
    the search may go on past greedy's EOS to a longer hypothesis that scores better:
    test_beam_search.py checks that case against a reference.)"""
    if kind == "text":
        model, params = _lm()
        run = functools.partial(_text, model, params)
        stepper = lambda: text_stepper(model, params, PROMPT, LENGTHS, N_NEW, True)
    else:
        model, params = _mt()
        run = functools.partial(_translate, model, params)
        stepper = lambda: translation_stepper(model, params, SOURCE, BOS, N_NEW, True)
    eos = _eos_seen_midway(run()[0])[0]
    greedy, _ = run(eos_id=eos)
    assert np.any(np.asarray(greedy) == eos)
    beam = jax.jit(
        lambda: beam_search(
            stepper(), beam_size=1, max_new_tokens=N_NEW, eos_id=eos, pad_id=PAD, alpha=0.0
        )
    )()
    np.testing.assert_array_equal(beam, greedy)


def test_children_stay_in_parent_rows_and_move_rows_equals_gather():
    """Beam placement is a permutation that leaves every parent row to its first child, so
    the in-place `move_rows` gives the cache `select_rows` gathers (unrolled and scanned)."""
    k = 4
    origin = np.random.default_rng(0).integers(0, k, (200, k))
    hyp = np.asarray(search._children_in_parent_rows(jnp.asarray(origin)))
    np.testing.assert_array_equal(np.sort(hyp, axis=1), np.tile(np.arange(k), (200, 1)))
    parent = np.take_along_axis(origin, hyp, axis=1)  # the parent of the hypothesis in row j
    np.testing.assert_array_equal(np.take_along_axis(parent, parent, axis=1), parent)
    first = np.array([[list(row).index(p) for p in row] for row in origin])  # first child
    for b in range(len(origin)):
        for j in set(origin[b].tolist()):
            assert hyp[b, j] == first[b, list(origin[b]).index(j)]
    rng = np.random.default_rng(1)
    rows = jnp.asarray((np.arange(2)[:, None] * k + parent[:2]).reshape(-1))
    for scan_layers in (False, True):
        cache = init_cache(CONFIG.replace(scan_layers=scan_layers), 2 * k, 9)
        cache = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), x.dtype), cache)
        chex.assert_trees_all_equal(
            jax.jit(move_rows)(cache, rows), jax.jit(select_rows)(cache, rows)
        )


@pytest.mark.slow  # test_beam_search_finds_exhaustive_best keeps beam search in the quick run
@pytest.mark.parametrize("kind", ["text", "translation"])
def test_beam_search_in_place_reorder_equals_gather(kind):
    """The beam loop's in-place `move_rows` gives the beams of a full gather each step."""
    if kind == "text":
        model, params = _lm()
        make = lambda: text_stepper(model, params, PROMPT, LENGTHS, N_NEW, True)
    else:
        model, params = _mt()
        make = lambda: translation_stepper(model, params, SOURCE, BOS, N_NEW, True)

    def beams(gather):
        stepper = make()
        if gather:
            stepper = stepper._replace(move=stepper.reorder)
        return beam_search(
            stepper, beam_size=3, max_new_tokens=N_NEW, eos_id=5, pad_id=PAD, alpha=0.6
        )

    np.testing.assert_array_equal(jax.jit(lambda: beams(False))(), jax.jit(lambda: beams(True))())


V_SMALL = 5  # pad 0, then 4 real tokens; token 1 doubles as EOS (and BOS)


def _all_sequences(n_new, eos):
    """Every output of up to n_new tokens: ending at its first EOS or at n_new, pad after."""
    real = [t for t in range(V_SMALL) if t != PAD]
    out = []
    for length in range(1, n_new + 1):
        for seq in itertools.product(real, repeat=length):
            if eos not in seq[:-1] and (length == n_new or seq[-1] == eos):
                out.append(list(seq) + [PAD] * (n_new - length))
    return np.array(out, np.int32)


# Weight seeds for which greedy decoding misses the best sequence in some rows.
@pytest.mark.parametrize("kind,seed", [("text", 5), ("translation", 4)])
def test_beam_search_finds_exhaustive_best(kind, seed):
    """All 121 outputs of up to 4 tokens over 4 real tokens, scored by the full model with
    the length penalty: 4-beam search returns the best, which greedy misses in some rows."""
    n_new, eos, alpha = 4, 1, 0.6
    cfg = CONFIG.replace(vocab_size=V_SMALL)
    prompts = jnp.array([[2, 3, 4], [4, 4, 2], [3, 2, 2], [2, 4, 3]])
    cands = _all_sequences(n_new, eos)  # (C, n_new)
    count = len(cands)
    rows = len(prompts)
    # Row b * C + c: prompt b followed by candidate c, all scored in one forward pass.
    prompt_rows = jnp.repeat(prompts, count, axis=0)
    cand_rows = jnp.tile(jnp.asarray(cands), (rows, 1))
    if kind == "text":
        model, params = _lm(cfg, seed, std=0.5, embed_std=1.0)
        run = lambda **kw: generate_text(
            model, params, prompts, None, eos_id=eos, max_new_tokens=n_new, **kw
        )
        seqs = jnp.concatenate([prompt_rows, cand_rows], axis=1)
        logits = jax.jit(model.apply)(params, seqs)[:, prompts.shape[1] - 1 : -1]
    else:
        model, params = _mt(cfg, seed, std=0.5, embed_std=1.0)
        run = lambda **kw: generate_translation(
            model, params, prompts, bos_id=BOS, eos_id=eos, max_new_tokens=n_new, **kw
        )
        tgt = jnp.concatenate([jnp.full((rows * count, 1), BOS), cand_rows[:, :-1]], axis=1)
        logits = jax.jit(model.apply)(params, prompt_rows, tgt)
    # Generation never emits padding, so its probability mass is excluded here too.
    logp = np.asarray(jax.nn.log_softmax(logits.at[..., PAD].set(-1e30)))
    token_logp = np.take_along_axis(logp, np.asarray(cand_rows)[..., None], axis=2)[..., 0]
    lengths = np.where(np.any(cands == PAD, 1), np.argmax(cands == PAD, 1), n_new)
    generated = np.arange(n_new)[None, :] < lengths[:, None]
    penalty = np.asarray(length_penalty(jnp.asarray(lengths), alpha))
    scores = (token_logp.reshape(rows, count, n_new) * generated).sum(-1) / penalty
    best = cands[np.argmax(scores, axis=1)]  # (rows, n_new)
    np.testing.assert_array_equal(run(beam_size=4, length_penalty=alpha), best)
    misses = np.any(np.asarray(run()) != best, axis=1).sum()
    assert misses >= 1  # the search finds what greedy decoding does not


@pytest.mark.slow  # test_models' scan-equals-unrolled keeps scanned layers in the quick run
def test_beam_search_scanned_equals_unrolled():
    """Beam reordering of a scanned cache (layer axis first) and of the cross-attention
    keys/values: the same beams as the unrolled model with the same weights."""
    model, params = _mt()
    kwargs = dict(bos_id=BOS, eos_id=5, max_new_tokens=N_NEW, beam_size=3)
    beams = generate_translation(model, params, SOURCE, **kwargs)
    chex.assert_shape(beams, (3, N_NEW))
    scanned, scanned_params = _mt(CONFIG.replace(scan_layers=True))
    np.testing.assert_array_equal(
        generate_translation(scanned, scanned_params, SOURCE, **kwargs), beams
    )


def test_sampling():
    """top_k=1 and temperature -> 0 pick the argmax; each sample lies in its step's top-k or
    top-p nucleus; a key always draws the same tokens, another key other tokens."""
    model, params = _lm()
    key = jax.random.key(3)
    run = functools.partial(_text, model, params)
    greedy = run()[0]
    np.testing.assert_array_equal(run(temperature=1.0, top_k=1, rng=key)[0], greedy)
    np.testing.assert_array_equal(run(temperature=1e-4, rng=key)[0], greedy)
    sampled = run(temperature=1.0, rng=key)[0]
    assert not np.array_equal(sampled, greedy)
    np.testing.assert_array_equal(run(temperature=1.0, rng=key)[0], sampled)
    assert not np.array_equal(run(temperature=1.0, rng=jax.random.key(8))[0], sampled)

    tokens, logits = run(temperature=2.0, top_k=3, rng=key)
    valid = _until_eos(tokens, V - 1)
    logits = np.asarray(logits.at[..., PAD].set(-1e30))  # generation never emits padding
    chosen = np.take_along_axis(logits, np.asarray(tokens)[..., None], axis=2)[..., 0]
    assert np.all((chosen >= np.sort(logits, axis=-1)[..., -3])[valid])
    np.testing.assert_array_equal(run(temperature=1.0, top_p=1e-6, rng=key)[0], greedy)
    tokens, logits = run(temperature=1.0, top_p=0.5, rng=key)
    valid = _until_eos(tokens, V - 1)
    probs = np.asarray(jax.nn.softmax(logits.at[..., PAD].set(-1e30)))
    chosen = np.take_along_axis(probs, np.asarray(tokens)[..., None], axis=2)
    # The mass of the tokens more likely than a nucleus member is below p.
    above = np.where(probs > chosen, probs, 0.0).sum(-1)
    assert np.all((above < 0.5)[valid])
    assert not np.array_equal(tokens, greedy)


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class _Uniform(TokenByToken):
    """A sampler written outside the library: uniform over the tokens not masked."""

    draws: ClassVar[bool] = True

    def next_tokens(self, logits_BV, rng):
        flat_BV = jnp.where(logits_BV <= MASKED_LOGIT, MASKED_LOGIT, 0.0)
        return jax.random.categorical(rng, flat_BV, axis=-1).astype(jnp.int32)

    def tree_flatten(self):
        return (), None

    @classmethod
    def tree_unflatten(cls, aux, leaves):
        return cls()


def test_a_new_sampler_is_one_class():
    """A `TokenByToken` subclass defined here decodes through `generate_text` with nothing
    else changed: it gets a key per step, never emits padding, and needs `rng`."""
    model, params = _lm()
    key = jax.random.key(3)
    tokens, _ = _text(model, params, strategy=_Uniform(), rng=key)
    np.testing.assert_array_equal(_text(model, params, strategy=_Uniform(), rng=key)[0], tokens)
    valid = _until_eos(tokens, V - 1)
    assert np.all(np.asarray(tokens)[valid] != PAD)
    assert len(set(np.asarray(tokens)[valid].tolist())) > 3  # not one repeated token
    with pytest.raises(ValueError, match="needs a PRNG key"):
        _text(model, params, strategy=_Uniform())


# logits_hook tests: module-level hooks, so each (hook, options) pair compiles once.
PREFIX = (7, 8, 9)


def _force_prefix(logits_RV, tokens_RN, step):
    """Steps 0..2 may emit only PREFIX[step]; later steps are free."""
    del tokens_RN
    want = jnp.asarray(PREFIX)[jnp.minimum(step, len(PREFIX) - 1)]
    only_RV = jnp.where(jnp.arange(logits_RV.shape[-1]) == want, logits_RV, MASKED_LOGIT)
    return jnp.where(step < len(PREFIX), only_RV, logits_RV)


def _no_repeat(logits_RV, tokens_RN, step):
    """Ban every token already generated (pad included: generation never emits it)."""
    del step
    rows_R1 = jnp.arange(logits_RV.shape[0])[:, None]
    seen_RV = jnp.zeros(logits_RV.shape, bool).at[rows_R1, tokens_RN].set(True)
    return jnp.where(seen_RV, MASKED_LOGIT, logits_RV)


def _ban(token):
    return lambda logits_RV, tokens_RN, step: logits_RV.at[:, token].set(MASKED_LOGIT)


def test_logits_hook_bans_a_token():
    """A banned token never appears, in greedy, sampled and beam decoding; the
    hook runs inside the compiled loop and its logits are what `return_logits` shows."""
    model, params = _lm()
    greedy = np.asarray(_text(model, params)[0])
    banned = int(np.bincount(greedy.ravel(), minlength=V)[1 : V - 1].argmax()) + 1
    assert np.any(greedy == banned)  # the token greedy decoding likes most
    hook = _ban(banned)
    tokens, logits = _text(model, params, logits_hook=hook)
    assert not np.any(np.asarray(tokens) == banned)
    np.testing.assert_array_equal(np.asarray(logits)[..., banned], np.float32(MASKED_LOGIT))
    key = jax.random.key(5)
    sampled, _ = _text(model, params, logits_hook=hook, temperature=1.5, rng=key)
    assert not np.any(np.asarray(sampled) == banned)
    beams = generate_text(
        model,
        params,
        PROMPT,
        LENGTHS,
        eos_id=V - 1,
        max_new_tokens=N_NEW,
        beam_size=3,
        logits_hook=hook,
    )
    assert not np.any(np.asarray(beams) == banned)


@pytest.mark.slow  # test_logits_hook_bans_a_token keeps the hook in the quick run
def test_logits_hook_forces_a_prefix_and_sees_the_tokens_so_far():
    """A forced prefix comes out first, and the continuation is the model's own after it
    (greedy); a hook reading `tokens` (no repeats) works in greedy and beam search, over
    (B, N) and (B * K, N) rows."""
    lm, lm_params = _lm()
    forced, _ = _text(lm, lm_params, logits_hook=_force_prefix, eos_id=None)
    np.testing.assert_array_equal(np.asarray(forced)[:, :3], np.tile(PREFIX, (3, 1)))
    # Greedy after the prefix equals greedy from the prompt with the prefix appended.
    rows = [list(np.asarray(PROMPT[b, : LENGTHS[b]])) + list(PREFIX) for b in range(3)]
    width = max(map(len, rows))
    longer = jnp.asarray([r + [PAD] * (width - len(r)) for r in rows])
    rest = generate_text(lm, lm_params, longer, LENGTHS + 3, eos_id=None, max_new_tokens=N_NEW - 3)
    np.testing.assert_array_equal(np.asarray(forced)[:, 3:], rest)

    mt, mt_params = _mt()
    kwargs = dict(bos_id=BOS, eos_id=V - 1, max_new_tokens=N_NEW, beam_size=3)
    beams = generate_translation(mt, mt_params, SOURCE, logits_hook=_force_prefix, **kwargs)
    np.testing.assert_array_equal(np.asarray(beams)[:, :3], np.tile(PREFIX, (3, 1)))

    def repeats(row):
        real = row[row != PAD]
        return len(set(real.tolist())) < len(real)

    assert any(repeats(row) for row in np.asarray(_translate(mt, mt_params)[0]))
    for tokens in (
        _translate(mt, mt_params, logits_hook=_no_repeat)[0],
        generate_translation(mt, mt_params, SOURCE, logits_hook=_no_repeat, **kwargs),
    ):
        assert not any(repeats(row) for row in np.asarray(tokens)), tokens


def test_logits_hook_errors():
    model, params = _lm()
    with pytest.raises(ValueError, match="logits_hook must be a function"):
        _text(model, params, logits_hook="ban 5")
    with pytest.raises(ValueError, match=r"shape it was given, \(3, 23\); it returned \(3,\)"):
        _text(model, params, logits_hook=lambda logits, tokens, step: logits[:, 0])


def test_argmax_first_equals_argmax_with_ties_and_nans():
    rng = np.random.default_rng(0)
    logits = rng.integers(-3, 4, (64, 50)).astype(np.float32)  # many ties
    logits[5, [7, 20]] = np.nan
    logits[9, :] = -np.inf
    logits = jnp.asarray(logits)
    got = jax.jit(sampling.argmax_first)(logits)
    np.testing.assert_array_equal(got, jnp.argmax(logits, axis=-1))
    assert got.dtype == jnp.int32


def test_top_p_keeps_exactly_the_smallest_set_reaching_p():
    probs = np.array([0.1, 0.4, 0.2, 0.3])  # sorted: 0.4, 0.3, 0.2, 0.1
    logits = jnp.log(jnp.asarray(probs))
    expected = {
        0.05: [1],
        0.35: [1],
        0.5: [1, 3],
        0.69: [1, 3],
        0.75: [1, 3, 2],
        0.89: [1, 3, 2],
        0.95: [0, 1, 2, 3],
        1.0: [0, 1, 2, 3],
    }
    for p, kept in expected.items():
        mask = np.asarray(top_p_mask(logits, p))
        assert sorted(np.flatnonzero(mask)) == sorted(kept), p
    # Against brute force on random distributions (batched rows).
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(50, 7)) * 2
    probs = np.asarray(jax.nn.softmax(jnp.asarray(logits)))
    for p in (0.3, 0.6, 0.9):
        mask = np.asarray(top_p_mask(jnp.asarray(logits), p))
        for row, m in zip(probs, mask, strict=True):
            order = np.argsort(-row)
            size = int(np.argmax(np.cumsum(row[order]) >= p)) + 1
            assert set(np.flatnonzero(m)) == set(order[:size].tolist())
    assert np.array_equal(top_k_mask(jnp.array([[3.0, 1.0, 2.0, 0.0]]), 2), [[1, 0, 1, 0]])


def test_compiled_once_per_shape(monkeypatch):
    """New prompts, lengths, EOS and temperature reuse the program; a new shape retraces."""
    traces = []
    original = generate_module.text_stepper

    def counting(*args, **kwargs):
        traces.append(args[2].shape)
        return original(*args, **kwargs)

    monkeypatch.setattr(generate_module, "text_stepper", counting)
    model, params = _lm()
    prompt = jax.random.randint(jax.random.key(4), (5, 3), 2, V)
    kwargs = dict(max_new_tokens=7, top_p=0.9)
    for i, (eos, temperature) in enumerate([(4, 0.5), (9, 1.0), (11, 1.7)]):
        lengths = jnp.array([3, 1, 2, 3, i + 1])
        key = jax.random.key(i)
        generate_text(
            model,
            params,
            prompt + i,
            lengths,
            eos_id=eos,
            temperature=temperature,
            rng=key,
            **kwargs,
        )
    assert traces == [(5, 3)]
    # The same program through strategy values: temperature and top_p are traced leaves.
    for temperature in (0.3, 2.5):
        strategy = Sample(temperature, top_p=0.9)
        generate_text(model, params, prompt, eos_id=3, max_new_tokens=7, strategy=strategy, rng=key)
    assert traces == [(5, 3)]
    generate_text(model, params, prompt[:4], None, eos_id=4, temperature=1.0, rng=key, **kwargs)
    assert traces == [(5, 3), (4, 3)]
    # Beam search: one program for any length penalty, by keyword or as a Beam.
    beams = dict(eos_id=4, max_new_tokens=7)
    generate_text(model, params, prompt, beam_size=3, length_penalty=0.6, **beams)
    generate_text(model, params, prompt, strategy=Beam(3, length_penalty=1.2), **beams)
    assert traces == [(5, 3), (4, 3), (5, 3)]


def test_strategies_decode_as_their_keywords():
    """`strategy=` runs the very program the older keywords run: the same tokens and logits,
    greedy, sampled (one key) and beam search, for both models."""
    lm, lm_params = _lm()
    mt, mt_params = _mt()
    key = jax.random.key(3)
    cases = [
        ({}, Greedy()),
        (dict(temperature=1.0), Sample(1.0)),
        (dict(temperature=2.0, top_k=3), Sample(2.0, top_k=3)),
        (dict(temperature=1.0, top_p=0.5), Sample(top_p=0.5)),
    ]
    for keywords, strategy in cases:
        chex.assert_trees_all_equal(
            _text(lm, lm_params, rng=key, strategy=strategy),
            _text(lm, lm_params, rng=key, **keywords),
        )
    chex.assert_trees_all_equal(
        _translate(mt, mt_params, strategy=Sample(1.5), rng=key),
        _translate(mt, mt_params, temperature=1.5, rng=key),
    )
    assert not np.array_equal(
        _translate(mt, mt_params, strategy=Greedy())[0],
        _translate(mt, mt_params, strategy=Sample(1.5), rng=key)[0],
    )
    beam = dict(eos_id=5, max_new_tokens=N_NEW)
    np.testing.assert_array_equal(
        generate_translation(mt, mt_params, SOURCE, bos_id=BOS, strategy=Beam(3), **beam),
        generate_translation(mt, mt_params, SOURCE, bos_id=BOS, beam_size=3, **beam),
    )
    np.testing.assert_array_equal(
        generate_text(lm, lm_params, PROMPT, LENGTHS, strategy=Beam(3, 1.0), **beam),
        generate_text(lm, lm_params, PROMPT, LENGTHS, beam_size=3, length_penalty=1.0, **beam),
    )


def test_boxed_unboxed_and_bare_params_agree():
    model = DecoderOnlyTransformer(CONFIG)
    boxed = jax.jit(model.init)(jax.random.key(0), PROMPT)
    assert isinstance(boxed["params"]["embed"]["embedding"], nn.Partitioned)
    expected = _text(model, nn.unbox(boxed))[0]
    np.testing.assert_array_equal(_text(model, boxed)[0], expected)
    np.testing.assert_array_equal(_text(model, nn.unbox(boxed)["params"])[0], expected)


def test_bad_inputs_raise_before_compute():
    lm, lm_params = _lm()
    mt, mt_params = _mt()
    text = lambda **kw: generate_text(
        lm, lm_params, PROMPT, LENGTHS, **{"eos_id": 5, "max_new_tokens": 4, **kw}
    )
    cases = [
        (dict(max_new_tokens=27), r"P=6 \+ max_new_tokens=27 exceeds TransformerConfig.max_len=32"),
        (dict(max_new_tokens=0), "max_new_tokens=0 must be an int >= 1"),
        (dict(beam_size=0), "beam_size=0 must be an int >= 1"),
        (dict(top_p=0.0, temperature=1.0), r"top_p=0.0 must be in \(0, 1\]"),
        (dict(top_p=1.5), r"top_p=1.5 must be in \(0, 1\]"),
        (dict(top_k=-1), "top_k=-1 must be an int"),
        (dict(temperature=-1.0), "temperature=-1.0 must be >= 0"),
        (dict(temperature=0.8), r"needs a PRNG key: pass rng=jax.random.key\(0\)"),
        (dict(beam_size=2, temperature=0.8), "beam search .* is deterministic"),
        (dict(top_k=5), "do nothing with greedy decoding"),
        (dict(top_p=0.9), r"top_p=0.9 narrow .* do nothing with greedy decoding"),
        (dict(eos_id=V), f"eos_id={V} must be a token id"),
        (dict(eos_id=PAD), "equals pad_id"),
        (dict(beam_size=2, return_logits=True), "return_logits=True is for beam_size=1"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            text(**kwargs)
    run = lambda prompt, lengths: generate_text(
        lm, lm_params, prompt, lengths, eos_id=None, max_new_tokens=2
    )
    with pytest.raises(ValueError, match=r"prompt_lengths=\[6, 0, 4\] must lie in \[1, P=6\]"):
        run(PROMPT, jnp.array([6, 0, 4]))
    with pytest.raises(ValueError, match="prompt_lengths=\\[7, 2, 4\\]"):
        run(PROMPT, jnp.array([7, 2, 4]))
    with pytest.raises(ValueError, match=r"shape \(B,\)=\(3,\)"):
        run(PROMPT, jnp.array([6, 2]))
    with pytest.raises(ValueError, match=r"holds pad_id=0 at \(1, 1\), inside its prompt_length"):
        run(PROMPT.at[1, 1].set(PAD), LENGTHS)
    with pytest.raises(ValueError, match=f"token id {V} at \\(2, 0\\), outside the vocabulary"):
        run(PROMPT.at[2, 0].set(V), LENGTHS)
    with pytest.raises(ValueError, match="needs a DecoderOnlyTransformer"):
        generate_text(mt, mt_params, PROMPT, LENGTHS, eos_id=None, max_new_tokens=2)
    with pytest.raises(ValueError, match="needs an encoder-decoder Transformer"):
        generate_translation(lm, lm_params, SOURCE, bos_id=BOS, eos_id=2, max_new_tokens=2)
    with pytest.raises(ValueError, match=r"params lack \['encoder'\]"):
        generate_translation(mt, lm_params, SOURCE, bos_id=BOS, eos_id=2, max_new_tokens=2)
    with pytest.raises(ValueError, match=r"BOS \+ max_new_tokens=32 tokens exceed"):
        generate_translation(mt, mt_params, SOURCE, bos_id=BOS, eos_id=2, max_new_tokens=32)
    with pytest.raises(ValueError, match=f"bos_id={V} must be a token id"):
        generate_translation(mt, mt_params, SOURCE, bos_id=V, eos_id=2, max_new_tokens=2)


def test_bfloat16_compute_generates():
    """bf16 compute (float32 params, float32 softmax and logits) through the cache."""
    model, params = _mt(CONFIG.replace(dtype="bfloat16"))
    tokens = generate_translation(model, params, SOURCE, bos_id=BOS, eos_id=5, max_new_tokens=6)
    chex.assert_shape(tokens, (3, 6))
    assert tokens.dtype == jnp.int32 and np.all((np.asarray(tokens) >= 0) & (tokens < V))


def test_bfloat16_decoding_agrees_with_float32():
    """decode_dtype='bfloat16' casts the float32 weights once and caches keys/values in
    bfloat16. Its per-step logits stay within 0.05 of float32's (here up to about 3.4: 8
    mantissa bits, about 0.4% per rounding, through two layers) until the tokens first
    differ, and at least 3 in 4 greedy tokens are equal (a near-tie may flip one, and the
    sequence then goes its own way)."""
    model, params = _lm()
    tokens, logits = map(np.asarray, _text(model, params))
    bf_tokens, bf_logits = map(np.asarray, _text(model, params, decode_dtype="bfloat16"))
    assert bf_logits.dtype == np.float32
    agree = np.cumprod(tokens == bf_tokens, axis=1).astype(bool)
    assert agree[:, 0].all() and (tokens == bf_tokens).mean() >= 0.75
    np.testing.assert_allclose(bf_logits[agree], logits[agree], atol=0.05, rtol=0)
    # Weights already in bfloat16 give the same tokens (the cast is then a no-op).
    bf_params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
    np.testing.assert_array_equal(_text(model, bf_params, decode_dtype=jnp.bfloat16)[0], bf_tokens)
    with pytest.raises(ValueError, match="decode_dtype='int8' must be None"):
        _text(model, params, decode_dtype="int8")


# Rotary positions with grouped- and multi-query attention: keys are rotated before
# they are cached, and the cache holds K heads; cached decoding must equal recomputation.
# The speedrun's options too (issue 51): QK-norm (keys cached normalised, cross-attention
# keys normalised once), ReLU squared, logit soft-capping (a cap below the random model's
# logits, so it changes them). Eight decodes per case; test_text_cache_equals_full_
# recomputation keeps the cache check in the quick run.
@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [
        {"positional": "rope", "num_kv_heads": 2},
        {"positional": "rope", "num_kv_heads": 1, "scan_layers": True},
        {"qk_norm": True, "activation": "relu2", "logits_soft_cap": 3.0},
        {"positional": "rope", "qk_norm": True, "logits_soft_cap": 3.0, "scan_layers": True},
    ],
    ids=["rope-gqa", "rope-mqa-scan", "qknorm-relu2-softcap", "rope-qknorm-softcap-scan"],
)
def test_rope_and_grouped_query_cache_equals_full_recomputation(options):
    cfg = CONFIG.replace(**options)
    model, params = _lm(cfg)
    greedy, logits = _text(model, params)
    ref_tokens, _ = _text(model, params, use_cache=False)
    np.testing.assert_array_equal(greedy, ref_tokens)
    assert len({tuple(r) for r in np.asarray(greedy)}) > 1
    full = _lm_full_logits(model, params, greedy, PROMPT, LENGTHS)
    valid = _until_eos(greedy, V - 1)  # the probe EOS; padding after it is not scored
    np.testing.assert_allclose(np.asarray(logits)[valid], full[valid], atol=1e-5, rtol=0)
    beam_kwargs = dict(eos_id=5, max_new_tokens=N_NEW, beam_size=3)
    np.testing.assert_array_equal(
        generate_text(model, params, PROMPT, LENGTHS, **beam_kwargs),
        generate_text(model, params, PROMPT, LENGTHS, use_cache=False, **beam_kwargs),
    )
    mt, mt_params = _mt(cfg)
    translated, _ = _translate(mt, mt_params)
    np.testing.assert_array_equal(translated, _translate(mt, mt_params, use_cache=False)[0])
    beams = generate_translation(mt, mt_params, SOURCE, bos_id=BOS, **beam_kwargs)
    np.testing.assert_array_equal(
        beams,
        generate_translation(mt, mt_params, SOURCE, bos_id=BOS, use_cache=False, **beam_kwargs),
    )


@pytest.mark.slow  # prefill and apply compiled for two models
def test_bos_equal_to_pad_is_refused_because_the_cache_would_disagree():
    """A past defect: with bos_id == pad_id, `apply` (and training) masks the BOS key
    while the cached path attends to it. The disagreement is real; generation refuses it."""
    model, params = _mt()
    src = SOURCE[:1]
    decoder_in = jnp.array([[PAD]])
    ref_logits = model.apply(params, src, decoder_in)[:, 0]
    cache = init_cache(CONFIG, 1, 4, source_length=src.shape[1])
    cached_logits, _ = model.apply(params, src, decoder_in, cache, method=model.prefill)
    assert float(jnp.max(jnp.abs(cached_logits[:, 0] - ref_logits))) > 1e-4
    # With a real BOS the two paths agree.
    bos_in = jnp.array([[BOS]])
    bos_logits, _ = model.apply(params, src, bos_in, cache, method=model.prefill)
    np.testing.assert_allclose(bos_logits[:, 0], model.apply(params, src, bos_in)[:, 0], atol=1e-5)
    with pytest.raises(ValueError, match=r"bos_id=0 equals pad_id=0.*another bos_id"):
        generate_translation(model, params, src, bos_id=PAD, eos_id=V - 1, max_new_tokens=2)


@pytest.mark.parametrize(
    "rng, message",
    [
        (0, "got int"),
        (jax.random.split(jax.random.key(0), 3), r"shape \(3,\).*split a batch of keys"),
        (jnp.zeros((3, 2), jnp.uint32), r"shape \(3, 2\)"),
        (jnp.zeros((2,), jnp.int32), "dtype int32"),
    ],
)
def test_rng_must_be_one_prng_key(rng, message):
    model, params = _lm()
    with pytest.raises(ValueError, match="generate_text: rng must be one PRNG key.*" + message):
        generate_text(
            model, params, PROMPT, LENGTHS, eos_id=None, max_new_tokens=2, temperature=1.0, rng=rng
        )


def test_rng_accepts_a_typed_or_legacy_key():
    model, params = _lm()
    for rng in (jax.random.key(3), jax.random.PRNGKey(3)):
        tokens = generate_text(
            model, params, PROMPT, LENGTHS, eos_id=None, max_new_tokens=2, temperature=1.0, rng=rng
        )
        assert tokens.shape == (3, 2)


def _pad_first(logits_RV, tokens_RN, step):
    """pad_id the most likely token by far, at every step."""
    del tokens_RN, step
    return logits_RV.at[:, PAD].set(1e6)


@pytest.mark.parametrize(
    "strategy", [Greedy(), Sample(1.0), Beam(2, 0.0)], ids=["greedy", "sample", "beam"]
)
def test_pad_id_is_never_emitted_even_as_the_argmax_and_the_docs_say_so(strategy):
    """Issue 52: generation masks pad_id out of every step's logits (the model masks pad
    keys, so an emitted pad could not be read back), which `Greedy()`'s docs, "plain
    argmax", did not say. With pad the argmax at every step, no strategy emits it; pad
    appears only as the filling after EOS."""
    model, params = _lm()
    tokens = generate_text(
        model, params, PROMPT, LENGTHS, eos_id=None, max_new_tokens=N_NEW, strategy=strategy,
        logits_hook=_pad_first, rng=jax.random.key(0) if strategy.draws else None,
    )  # fmt: skip
    assert not np.any(np.asarray(tokens) == PAD)
    api = (Path(__file__).resolve().parents[1] / "docs" / "api.md").read_text()
    for heading in ("### `Greedy()`", "### `generate_translation("):
        section = api[api.index(heading) :]
        section = " ".join(section[: section.index("\n### ", 1)].split())
        assert re.search(r"never (emits|emitted|generates?)[^.]*pad_id", section), heading
    assert re.search(r"never emits[^.]*pad_id", " ".join(Greedy.__doc__.split()))
