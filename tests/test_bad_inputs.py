"""Bad inputs to the public API: each is refused with an error naming the argument and the
fix, or gives a defined, documented result, eagerly and under `jit`.

The classes follow docs/api.md ("Inputs that are refused, and what jit does not check"):
1 masks that are not bool, 2 a rank-2 mask whose meaning depends on B == T, 3 integer inputs
to real-valued formulas, 4 NaN or inf behind a mask, 5 labels outside [0, V), 6 numbers
outside their range, 7 values that only jit hides (ids, positions, cache room, prompt
lengths), and errors that name the caller's argument rather than an internal function.
Every accepted input is compared with a float64 numpy computation written here.
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

from flax_transformer import (
    DecoderOnlyTransformer,
    Encoder,
    LayerNorm,
    MultiHeadAttention,
    Transformer,
    TransformerConfig,
    apply_rope,
    causal_mask,
    checked,
    combine_masks,
    dot_product_attention,
    feed_forward,
    gated_feed_forward,
    generate_text,
    generate_translation,
    label_smoothed_cross_entropy,
    layer_norm,
    multi_head_attention,
    padding_mask,
    rms_norm,
    simple_self_attention,
    sinusoidal_positions,
)
from flax_transformer.decoding import filter_logits, init_cache
from flax_transformer.decoding.sampling import MASKED_LOGIT
from flax_transformer.layers.attention_op import attention_op
from flax_transformer.sharding import init_sharded, make_mesh

KEY = jax.random.key(23)


def _eager_and_jit(fn):
    """The function as it is and jitted (shapes, dtypes and Python values are all static)."""
    return [fn, jax.jit(fn)]


def _reference_attention(q, k, v, mask=None, scale=None):
    """Float64 numpy single-head attention; a row with no visible key gives zeros."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    scores = q @ k.T * (1 / np.sqrt(q.shape[-1]) if scale is None else scale)
    if mask is None:
        mask = np.ones(scores.shape, bool)
    mask = np.broadcast_to(np.asarray(mask), scores.shape)
    scores = np.where(mask, scores, -np.inf)
    top = np.max(np.where(mask, scores, -1e300), axis=-1, keepdims=True)
    exp = np.where(mask, np.exp(scores - top), 0.0)
    total = exp.sum(-1, keepdims=True)
    weights = np.divide(exp, total, out=np.zeros_like(exp), where=total > 0)
    # Only the visible keys' values enter (0 * NaN is never formed).
    out = np.stack([weights[t, mask[t]] @ v[mask[t]] for t in range(len(q))])
    return out, weights


def _qkv(t=3, s=4, h=8, batch=None, heads=None):
    lead = () if batch is None else (batch,)
    qs = (*lead, t, *(() if heads is None else (heads,)), h)
    ks = (*lead, s, *(() if heads is None else (heads,)), h)
    k1, k2, k3 = jax.random.split(KEY, 3)
    return jax.random.normal(k1, qs), jax.random.normal(k2, ks), jax.random.normal(k3, ks)


@pytest.fixture(scope="module")
def tiny():
    """A tiny encoder-decoder and decoder-only model, unchecked and with debug_checks."""
    cfg = TransformerConfig(
        vocab_size=11, d_model=8, num_heads=2, d_ff=16, num_layers=1, max_len=8, dropout_rate=0.0
    )
    src, tgt = jnp.array([[3, 4, 5, 0]]), jnp.array([[1, 6, 7]])
    seq2seq = Transformer(cfg)
    lm = DecoderOnlyTransformer(cfg)
    return {
        "cfg": cfg,
        "src": src,
        "tgt": tgt,
        "seq2seq": seq2seq,
        "seq2seq_vars": seq2seq.init(KEY, src, tgt),
        "lm": lm,
        "lm_vars": lm.init(KEY, tgt),
        "checked_seq2seq": Transformer(cfg.replace(debug_checks=True)),
        "checked_lm": DecoderOnlyTransformer(cfg.replace(debug_checks=True)),
    }


# 1. Masks are bool, or refused with the conversion. ------------------------------------


ADDITIVE = np.where(np.array([[True, True, False, False]]), 0.0, -1e9).astype(np.float32)


@pytest.mark.parametrize("bad", [ADDITIVE, np.where(ADDITIVE == 0, 0.0, -np.inf), ADDITIVE == 0])
def test_dot_product_attention_takes_bool_masks_only(bad):
    q, k, v = _qkv()
    for fn in _eager_and_jit(lambda q, k, v, m: dot_product_attention(q, k, v, m)):
        if bad.dtype == bool:
            out, weights = fn(q, k, v, bad)
            ref_out, ref_w = _reference_attention(q, k, v, bad)
            np.testing.assert_allclose(out, ref_out, atol=1e-5)
            np.testing.assert_allclose(weights, ref_w, atol=1e-6)
            continue
        with pytest.raises(TypeError, match=r"mask has dtype float32.*pass m == 0"):
            fn(q, k, v, bad)
    # The fix the message names gives the bool mask's result.
    out_fixed, _ = dot_product_attention(q, k, v, jnp.asarray(ADDITIVE) == 0)
    np.testing.assert_allclose(
        out_fixed, _reference_attention(q, k, v, ADDITIVE == 0)[0], atol=1e-5
    )


def test_multi_head_attention_and_module_refuse_float_and_int_masks():
    tokens = jnp.array([[4, 5, 0], [6, 0, 0]])
    additive = jnp.where(padding_mask(tokens), 0.0, -1e9)
    q, k, v = _qkv(t=3, s=3, batch=2, heads=2)
    for fn in _eager_and_jit(lambda m: multi_head_attention(q, k, v, m)):
        with pytest.raises(TypeError, match=r"multi_head_attention: mask has dtype float32"):
            fn(additive)
        with pytest.raises(TypeError, match=r"dtype int32.*m.astype\(bool\)"):
            fn(padding_mask(tokens).astype(jnp.int32))
    x = jax.random.normal(KEY, (2, 3, 8))
    for impl in ("xla", "jax_nn"):
        module = MultiHeadAttention(num_heads=2, impl=impl)
        params = module.init(KEY, x)
        with pytest.raises(TypeError, match=r"MultiHeadAttention: mask has dtype float32"):
            module.apply(params, x, mask=additive)
        with pytest.raises(TypeError, match=r"MultiHeadAttention: mask has dtype float32"):
            jax.jit(functools.partial(module.apply, mask=additive))(params, x)
    with pytest.raises(TypeError, match=r"combine_masks: masks\[1\] has dtype float32"):
        combine_masks(causal_mask(3), additive)


def test_encoder_over_embeddings_refuses_a_float_mask():
    cfg = TransformerConfig(vocab_size=5, d_model=8, num_heads=2, d_ff=16, num_layers=1)
    encoder = Encoder(cfg, None)
    x = jax.random.normal(KEY, (2, 3, 8))
    valid = jnp.array([[True, True, False], [True, False, False]])[:, None, None, :]
    params = encoder.init(KEY, x, valid)
    with pytest.raises(TypeError, match="mask has dtype float32"):
        encoder.apply(params, x, jnp.where(valid, 0.0, -jnp.inf))


# 2. A rank-2 mask is (T, S); where B == T it cannot be told from (B, S), and is refused. -


def test_rank_2_mask_with_batch_equal_length_is_refused():
    tokens = jnp.array(
        [[4, 5, 0, 0, 0], [6, 7, 8, 0, 0], [1, 0, 0, 0, 0], [2, 3, 4, 5, 6], [9] * 5]
    )
    q, k, v = _qkv(t=5, s=5, batch=5, heads=2)
    for fn in _eager_and_jit(lambda m: multi_head_attention(q, k, v, m)):
        with pytest.raises(ValueError, match=r"B == T == 5.*mask\[:, None, None, :\]"):
            fn(tokens != 0)
        # Rank 4 states which it is, and gives the per-example result.
        out, _ = fn(padding_mask(tokens))
        for b in range(5):
            for n in range(2):
                ref, _ = _reference_attention(q[b, :, n], k[b, :, n], v[b, :, n], tokens[b] != 0)
                np.testing.assert_allclose(out[b, :, n], ref, atol=1e-5)
    with pytest.raises(ValueError, match=r"B == T == 5"):
        multi_head_attention(q, k, v, causal_mask(5))
    causal, _ = multi_head_attention(q, k, v, causal_mask(5)[None, None])
    ref, _ = _reference_attention(
        q[0, :, 0], k[0, :, 0], v[0, :, 0], np.tril(np.ones((5, 5), bool))
    )
    np.testing.assert_allclose(causal[0, :, 0], ref, atol=1e-5)
    x = jax.random.normal(KEY, (5, 5, 8))
    module = MultiHeadAttention(num_heads=2)
    params = module.init(KEY, x)
    with pytest.raises(ValueError, match=r"MultiHeadAttention: mask.shape=\(5, 5\) is rank 2"):
        module.apply(params, x, mask=tokens != 0)


def test_a_padding_mask_of_another_batch_size_gets_the_fix_in_its_message():
    tokens = jnp.array([[4, 5, 0, 0], [6, 7, 8, 0]])  # B = 2, S = 4, T = 3
    q, k, v = _qkv(t=3, s=4, batch=2, heads=2)
    with pytest.raises(ValueError, match=r"\(B, S\) padding mask: pass mask\[:, None, None, :\]"):
        multi_head_attention(q, k, v, tokens != 0)
    with pytest.raises(ValueError, match=r"do not broadcast together.*mask\[:, None, None, :\]"):
        combine_masks(causal_mask(4), jnp.array([[True] * 4] * 3))
    # B == T == S: combine_masks cannot know, and the attention that receives it refuses.
    square = jnp.array([[True] * 4, [True, True, False, False]] * 2)
    both = combine_masks(causal_mask(4), square)
    chex.assert_shape(both, (4, 4))
    q4, k4, v4 = _qkv(t=4, s=4, batch=4, heads=2)
    with pytest.raises(ValueError, match="B == T == 4"):
        multi_head_attention(q4, k4, v4, both)


# 3. Integer inputs to real-valued formulas are refused, not truncated. -------------------


INT = jnp.array([[1, 2, 3, 10]])


@pytest.mark.parametrize(
    "name, call",
    [
        ("layer_norm", lambda x: layer_norm(x, None, None)),
        ("rms_norm", lambda x: rms_norm(x, None)),
        ("dot_product_attention", lambda x: dot_product_attention(x, x, x)),
        ("simple_self_attention", lambda x: simple_self_attention(x)),
        ("multi_head_attention", lambda x: multi_head_attention(*(x[None, :, None],) * 3)),
        ("apply_rope", lambda x: apply_rope(x[:, None], jnp.arange(1))),
        ("feed_forward", lambda x: feed_forward(x, jnp.ones((4, 2)), None, jnp.ones((2, 4)), None)),
        (
            "gated_feed_forward",
            lambda x: gated_feed_forward(x, *(jnp.ones((4, 2)),) * 2, jnp.ones((2, 4))),
        ),
    ],
)
def test_integer_inputs_are_refused(name, call):
    for fn in _eager_and_jit(call):
        with pytest.raises(TypeError, match=rf"{name}: .* has dtype int32.*astype\(jnp.float32\)"):
            fn(INT)
    out = call(INT.astype(jnp.float32))  # the fix works
    assert jnp.issubdtype(jax.tree.leaves(out)[0].dtype, jnp.floating)


def test_layer_norm_of_the_fixed_input_matches_numpy():
    x = np.array([[1.0, 2.0, 3.0, 10.0]])
    ref = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(layer_norm(jnp.asarray(x, jnp.float32), None, None), ref, atol=1e-6)
    module = LayerNorm()
    with pytest.raises(TypeError, match="layer_norm: x has dtype int32"):
        module.init(KEY, INT)


# 4. NaN or inf behind a mask never reaches the output. -----------------------------------


@pytest.mark.parametrize("poison", [np.nan, np.inf, -np.inf])
def test_a_masked_key_holding_nan_or_inf_does_not_reach_the_output(poison):
    q, k, v = _qkv(t=3, s=4)
    v = v.at[3].set(poison)  # key 3 is padding: no query may see it
    k = k.at[3].set(poison)
    mask = jnp.array([[True, True, True, False]] * 2 + [[False] * 4])  # query 2 sees nothing
    for fn in _eager_and_jit(lambda q, k, v, m: dot_product_attention(q, k, v, m)):
        out, weights = fn(q, k, v, mask)
        ref_out, ref_w = _reference_attention(q, k, v, mask)
        np.testing.assert_allclose(out, ref_out, atol=1e-5)
        np.testing.assert_allclose(weights, ref_w, atol=1e-6)
        np.testing.assert_array_equal(out[2], 0.0)  # a fully masked row: zeros
    tokens = jnp.array([[4, 5, 6, 0]])
    qb, kb, vb = _qkv(t=4, s=4, batch=1, heads=2)
    vb = vb.at[0, 3].set(poison)
    out, _ = multi_head_attention(qb, kb, vb, combine_masks(causal_mask(4), padding_mask(tokens)))
    assert np.isfinite(np.asarray(out[0, :3])).all()


def test_loss_at_a_padded_position_is_zero_whatever_its_logits():
    logits = jnp.array([[[1.0, 2.0, 3.0], [jnp.nan, jnp.inf, 0.0]]])
    labels = jnp.array([[2, 0]])

    def mean_loss(logits):
        loss, weights = label_smoothed_cross_entropy(logits, labels, label_smoothing=0.1)
        return loss.sum() / weights.sum()

    for fn in _eager_and_jit(lambda lg: label_smoothed_cross_entropy(lg, labels, pad_id=0)):
        loss, weights = fn(logits)
        ref = -np.log(np.exp(3) / np.exp([1.0, 2.0, 3.0]).sum())
        np.testing.assert_allclose(loss, [[ref, 0.0]], rtol=1e-6)
        np.testing.assert_array_equal(weights, [[1.0, 0.0]])
    grad = jax.grad(mean_loss)(logits)
    np.testing.assert_array_equal(grad[0, 1], 0.0)
    assert np.isfinite(np.asarray(grad)).all()


# 5. Labels outside [0, V): refused where concrete, NaN (never a wrap) under jit. ---------


@pytest.mark.parametrize("label", [3, -1, 7])
def test_labels_outside_the_classes(label):
    logits = jax.random.normal(KEY, (2, 3))
    labels = jnp.array([1, label])
    with pytest.raises(ValueError, match=rf"labels hold {label} at \(1,\), outside .*\[0, V=3\)"):
        label_smoothed_cross_entropy(logits, labels, pad_id=0)
    loss, weights = jax.jit(functools.partial(label_smoothed_cross_entropy, pad_id=0))(
        logits, labels
    )
    assert np.isnan(loss[1]) and weights[1] == 1.0  # a NaN the training loop stops on
    np.testing.assert_allclose(loss[0], -jax.nn.log_softmax(logits[0])[1], rtol=1e-6)
    # With debug_checks, through checked: raised from inside the jitted call, V included.
    loss_fn = checked(functools.partial(label_smoothed_cross_entropy, pad_id=0, debug_checks=True))
    low, high = sorted((1, label))
    with pytest.raises(checkify.JaxRuntimeError, match=rf"labels hold \[{low}, {high}\] where"):
        loss_fn(logits, labels)
    ok, _ = loss_fn(logits, jnp.array([1, 0]))  # pad_id passes
    assert ok[1] == 0.0


def test_torch_ignore_index_as_pad_id():
    logits = jax.random.normal(KEY, (3, 5))
    labels = jnp.array([4, -100, 0])
    for fn in _eager_and_jit(lambda lg: label_smoothed_cross_entropy(lg, labels, pad_id=-100)):
        loss, weights = fn(logits)
        logp = np.asarray(jax.nn.log_softmax(np.asarray(logits, np.float64)))
        np.testing.assert_allclose(loss, [-logp[0, 4], 0.0, -logp[2, 0]], rtol=1e-5)
        np.testing.assert_array_equal(weights, [1.0, 0.0, 1.0])


# 6. Numbers outside their range, and values of the wrong Python type. --------------------


@pytest.mark.parametrize(
    "call, match",
    [
        (
            lambda: dot_product_attention(*_qkv(), dropout_rate=1.5),
            r"dropout_rate=1.5 .* in \[0, 1\)",
        ),
        (lambda: dot_product_attention(*_qkv(), dropout_rate=1.0), r"dropout_rate=1.0"),
        (lambda: multi_head_attention(*_qkv(batch=1, heads=1), dropout_rate=-0.1), "dropout_rate"),
        (lambda: dot_product_attention(*_qkv(), scale=float("nan")), r"scale=nan"),
        (lambda: layer_norm(jnp.ones((2, 4)), None, None, eps=-1), r"layer_norm: eps=-1 .* > 0"),
        (lambda: rms_norm(jnp.ones((2, 4)), None, eps=-1.0), r"rms_norm: eps=-1.0"),
        (lambda: layer_norm(jnp.ones((2, 4)), None, None, eps=float("inf")), "eps=inf"),
        (lambda: sinusoidal_positions(4, 4, base=float("nan")), r"base=nan .* > 0"),
        (lambda: sinusoidal_positions(4, 4, base=float("inf")), r"base=inf"),
        (lambda: TransformerConfig(layer_norm_eps=float("nan")), r"layer_norm_eps=nan .* > 0"),
        (lambda: TransformerConfig(layer_norm_eps=float("inf")), r"layer_norm_eps=inf"),
        (lambda: TransformerConfig(init_std=float("inf")), r"init_std=inf"),
        (lambda: TransformerConfig(dropout_rate="0.1"), r"dropout_rate='0.1' must be a number"),
        (lambda: TransformerConfig(debug_checks=1), r"debug_checks=1 must be True or False"),
        (
            lambda: feed_forward(jnp.ones((2, 4)), jnp.ones(4), None, jnp.ones((4, 4)), None),
            r"w1_DF \(4,\)",
        ),
        (
            lambda: layer_norm(jnp.ones((2, 4)), jnp.ones(3), None),
            r"scale has shape \(3,\).*\(4,\)",
        ),
        (lambda: rms_norm(jnp.ones((2, 4)), jnp.ones((4, 1))), r"rms_norm: scale has shape"),
    ],
)
def test_out_of_range_values_are_refused(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


@pytest.mark.parametrize(
    "attribute, field, value, match",
    [
        ("qk_norm_eps", "layer_norm_eps", 0.0, r"qk_norm_eps=0.0 must be > 0"),
        ("qk_norm_eps", "layer_norm_eps", float("nan"), r"qk_norm_eps=nan must be a finite"),
        ("qk_norm", "qk_norm", "yes", r"qk_norm='yes' must be True or False, got str"),
        ("use_bias", "use_bias", 1, r"use_bias=1 must be True or False, got int"),
        ("init_std", "init_std", -0.02, r"init_std=-0.02 must be > 0"),
        ("rope_base", "rope_base", 0.0, r"rope_base=0.0 must be"),
        ("impl", "attention_impl", "flash", r"impl='flash' is not one of"),
    ],
)
def test_attention_module_attributes_get_the_config_fields_checks(attribute, field, value, match):
    """MultiHeadAttention built without a config is refused what the config refuses, with
    the same message naming its own attribute (before: qk_norm_eps=0.0 failed inside
    rms_norm as 'eps=0.0', and qk_norm='yes' was taken as True)."""
    x = jnp.ones((1, 3, 8))
    with pytest.raises(ValueError, match=r"MultiHeadAttention\." + match):
        MultiHeadAttention(num_heads=2, **{"qk_norm": True, attribute: value}).init(
            jax.random.key(0), x
        )
    with pytest.raises(ValueError, match=r"TransformerConfig\." + field):
        TransformerConfig(**{field: value})


def test_pad_id_must_be_an_int():
    with pytest.raises(ValueError, match=r"pad_id=0.5 must be an int token id"):
        TransformerConfig(pad_id=0.5)
    with pytest.raises(TypeError, match=r"pad_id=0.5 must be an int"):
        padding_mask(jnp.array([[1, 0]]), pad_id=0.5)


def test_temperature_and_length_penalty_must_be_finite(tiny):
    common = dict(eos_id=2, max_new_tokens=3)
    lm, lm_vars, prompt = tiny["lm"], tiny["lm_vars"], tiny["tgt"]
    with pytest.raises(ValueError, match=r"generate_text: temperature=inf must be a finite"):
        generate_text(lm, lm_vars, prompt, temperature=float("inf"), rng=KEY, **common)
    with pytest.raises(ValueError, match=r"generate_translation: length_penalty=inf"):
        generate_translation(
            tiny["seq2seq"], tiny["seq2seq_vars"], tiny["src"], bos_id=1, beam_size=2,
            length_penalty=float("inf"), **common,
        )  # fmt: skip
    with pytest.raises(ValueError, match=r"length_penalty=1000.0 makes the length penalty"):
        generate_text(lm, lm_vars, prompt, beam_size=2, length_penalty=1000.0, **common)


def test_a_huge_temperature_never_samples_a_masked_token():
    logits = jnp.array([[MASKED_LOGIT, 0.0, 1.0, -1.0]])
    filtered = filter_logits(logits, temperature=1e30)
    assert filtered[0, 0] == MASKED_LOGIT
    draws = jax.random.categorical(KEY, jnp.repeat(filtered, 2000, axis=0))
    assert (draws != 0).all()


def test_fractional_lengths_and_bad_cache_sizes(tiny):
    cfg, lm, lm_vars = tiny["cfg"], tiny["lm"], tiny["lm_vars"]
    cache = init_cache(cfg, 2, 6)
    tokens = jnp.array([[1, 6, 7], [1, 8, 0]])
    with pytest.raises(TypeError, match=r"lengths_B must be int token counts.*float32"):
        lm.apply(lm_vars, tokens, cache, lengths_B=jnp.array([2.5, 1.7]), method="extend")
    for bad, exc in ((-1, ValueError), (2.5, TypeError), (0, ValueError)):
        with pytest.raises(exc, match=r"init_cache: batch="):
            init_cache(cfg, bad, 6)
        with pytest.raises(exc, match=r"init_cache: length="):
            init_cache(cfg, 2, bad)


def test_meshes_of_no_devices_or_non_int_sizes():
    for kwargs, match in (
        (dict(devices=[]), "devices is empty"),
        (dict(data=1.5), r"data=1.5 must be an int"),
        (dict(fsdp=True), r"fsdp=True must be an int"),
    ):
        with pytest.raises(ValueError, match=match):
            make_mesh(**kwargs)


# 7. What jit hides: ids, positions, cache room and prompt lengths. -----------------------


@pytest.mark.parametrize("bad_id", [11, 50, -1])
def test_token_ids_outside_the_vocabulary(tiny, bad_id):
    model, variables, src = tiny["seq2seq"], tiny["seq2seq_vars"], tiny["src"]
    tgt = jnp.array([[1, 6, bad_id]])
    with pytest.raises(ValueError, match=rf"tgt_tokens holds token id {bad_id} at \(0, 2\)"):
        model.apply(variables, src, tgt)
    # Unchecked under jit: NaN logits (an id never reads another token's row, -1 included).
    logits = jax.jit(model.apply)(variables, src, tgt)
    assert np.isnan(np.asarray(logits[0, 2])).all()
    # debug_checks + checked: raised from inside the jitted call.
    apply = checked(tiny["checked_seq2seq"].apply)
    with pytest.raises(checkify.JaxRuntimeError, match=r"tgt_tokens holds token ids in \["):
        apply(variables, src, tgt)
    ok = apply(variables, src, tiny["tgt"])
    chex.assert_trees_all_close(ok, model.apply(variables, src, tiny["tgt"]), atol=1e-6)


@pytest.mark.parametrize("bad_position", [8, -1])
def test_positions_outside_the_table(tiny, bad_position):
    lm, variables, tokens = tiny["lm"], tiny["lm_vars"], tiny["tgt"]
    positions = jnp.array([[0, 1, bad_position]])
    with pytest.raises(ValueError, match=r"positions holds positions in \[.*max_len=8"):
        lm.apply(variables, tokens, positions_BT=positions)
    logits = jax.jit(lambda v, t, p: lm.apply(v, t, positions_BT=p))(variables, tokens, positions)
    assert np.isnan(np.asarray(logits[0, 2])).all()  # NaN, not the row of position 7
    apply = checked(tiny["checked_lm"].apply)
    with pytest.raises(checkify.JaxRuntimeError, match=r"positions holds positions in"):
        apply(variables, tokens, positions_BT=positions)


# Packed rows: 0 is padding and each example one contiguous run of its id. 0-based ids made
# the first example padding (off by up to 5.8); a reopened id let two runs attend to each
# other (off by 2.9). Both refused, naming the row, position and value.
SEGMENT_CASES = [
    ([[0, 0, 0, 1, 1, 1]], r"is 0 \(padding\) at \(0, 0\), where \w+ holds the real token 3"),
    ([[1, 1, 2, 2, 1, 1]], r"holds segment id 1 again at \(0, 4\), after another id"),
]
PACKED = jnp.array([[3, 4, 5, 6, 7, 8]])


@pytest.mark.parametrize("segments, message", SEGMENT_CASES)
def test_segment_ids_of_the_decoder_only_model(tiny, segments, message):
    lm, variables = tiny["lm"], tiny["lm_vars"]
    segments = jnp.array(segments)
    with pytest.raises(ValueError, match="segment_ids " + message):
        lm.apply(variables, PACKED, segment_ids_BT=segments)
    apply = checked(tiny["checked_lm"].apply)
    with pytest.raises(checkify.JaxRuntimeError, match="segment_ids " + message):
        apply(variables, PACKED, segment_ids_BT=segments)
    # Valid ids, padding in segment 0 and a pad token inside a segment, pass both ways.
    tokens, valid = jnp.array([[3, 4, 0, 6, 0, 0]]), jnp.array([[1, 1, 1, 2, 0, 0]])
    chex.assert_trees_all_close(
        apply(variables, tokens, segment_ids_BT=valid),
        lm.apply(variables, tokens, segment_ids_BT=valid),
        atol=1e-6,
    )


@pytest.mark.parametrize("side", ["src", "tgt"])
@pytest.mark.parametrize("segments, message", SEGMENT_CASES)
def test_segment_ids_of_both_sides_of_the_encoder_decoder(tiny, side, segments, message):
    model, variables = tiny["seq2seq"], tiny["seq2seq_vars"]
    good = jnp.array([[1, 1, 1, 2, 2, 2]])
    ids = {"src_segment_ids_BS": good, "tgt_segment_ids_BT": good}
    ids[f"{side}_segment_ids_{'BS' if side == 'src' else 'BT'}"] = jnp.array(segments)
    match = f"{side}_segment_ids {message}"
    with pytest.raises(ValueError, match=match):
        model.apply(variables, PACKED, PACKED, **ids)
    with pytest.raises(checkify.JaxRuntimeError, match=match):
        checked(tiny["checked_seq2seq"].apply)(variables, PACKED, PACKED, **ids)
    encoded = model.apply(variables, PACKED, segment_ids_BS=good, method="encode")
    with pytest.raises(ValueError, match=match):  # decode alone checks both sides too
        model.apply(variables, encoded, PACKED, PACKED, **ids, method="decode")
    if side == "src":
        with pytest.raises(ValueError, match=r"src_segment_ids " + message):
            model.apply(
                variables, PACKED, segment_ids_BS=ids["src_segment_ids_BS"], method="encode"
            )


def test_cache_overflow(tiny):
    cfg, lm, variables = tiny["cfg"], tiny["lm"], tiny["lm_vars"]
    tokens = tiny["tgt"]  # 3 tokens into 2 slots
    with pytest.raises(ValueError, match="KV cache overflow: the cache has 2 slots"):
        lm.apply(variables, tokens, init_cache(cfg, 1, 2), method="extend")
    extend = jax.jit(lambda v, t, c: lm.apply(v, t, c, method="extend"))
    logits, cache = extend(variables, tokens, init_cache(cfg, 1, 2))
    assert np.isnan(np.asarray(logits)).all()  # not the drifted logits of a shorter cache
    apply = checked(tiny["checked_lm"].apply)
    with pytest.raises(checkify.JaxRuntimeError, match="KV cache overflow: the cache has 2"):
        apply(variables, tokens, init_cache(cfg, 1, 2), method="extend")
    fits, _ = apply(variables, tokens, init_cache(cfg, 1, 3), method="extend")
    chex.assert_trees_all_close(fits, lm.apply(variables, tokens), atol=1e-5)


def test_prompt_lengths_under_jit(tiny):
    prompts = jnp.array([[1, 6, 7, 8], [1, 9, 0, 0]])
    kwargs = dict(eos_id=2, max_new_tokens=2)
    with pytest.raises(ValueError, match=r"prompt_lengths=\[4, 0\] must lie in \[1, P=4\]"):
        generate_text(tiny["lm"], tiny["lm_vars"], prompts, jnp.array([4, 0]), **kwargs)

    def under_jit(model):
        return jax.jit(lambda v, p, n: generate_text(model, v, p, n, **kwargs))

    with pytest.raises(checkify.JaxRuntimeError, match=r"prompt_lengths hold \[0, 4\]"):
        checked(lambda v, p, n: generate_text(tiny["checked_lm"], v, p, n, **kwargs))(
            tiny["lm_vars"], prompts, jnp.array([4, 0])
        )
    # Unchecked: the empty prompt's first logits are NaN, never those of row -1.
    _, logits = jax.jit(
        lambda v, p, n: generate_text(tiny["lm"], v, p, n, return_logits=True, **kwargs)
    )(tiny["lm_vars"], prompts, jnp.array([4, 0]))
    assert np.isnan(np.asarray(logits[1, 0])).all() and np.isfinite(np.asarray(logits[0])).all()
    good = under_jit(tiny["lm"])(tiny["lm_vars"], prompts, jnp.array([4, 2]))
    np.testing.assert_array_equal(
        good, generate_text(tiny["lm"], tiny["lm_vars"], prompts, jnp.array([4, 2]), **kwargs)
    )


def test_generation_with_debug_checks_raises_itself_and_decodes_the_same(tiny):
    kwargs = dict(eos_id=2, max_new_tokens=3)
    plain = generate_text(tiny["lm"], tiny["lm_vars"], tiny["tgt"], **kwargs)
    checked_out = generate_text(tiny["checked_lm"], tiny["lm_vars"], tiny["tgt"], **kwargs)
    np.testing.assert_array_equal(plain, checked_out)


def test_debug_checks_under_plain_jit_names_checked(tiny):
    """jax refuses an unfunctionalized check only when lowering, naming none of ours; the
    models refuse it while tracing and name `checked`. Eager grad and vmap check at once."""
    lm, variables, tokens = tiny["checked_lm"], tiny["lm_vars"], tiny["tgt"]

    def loss(params, tokens):
        return lm.apply(params, tokens).sum()

    step = jax.value_and_grad(loss)
    for fn in (jax.jit(lm.apply), jax.jit(step)):
        with pytest.raises(ValueError, match=r"debug_checks=True .* flax_transformer\.checked"):
            fn(variables, tokens)
    with pytest.raises(ValueError, match=r"checked\(fn\) instead of jax\.jit"):
        jax.jit(lambda v, p: generate_text(lm, v, p, eos_id=2, max_new_tokens=2))(variables, tokens)
    value, _ = checked(step)(variables, tokens)  # the fix the message names
    err, (own, _) = jax.jit(checkify.checkify(step))(variables, tokens)  # and checkify by hand
    err.throw()
    eager, _ = step(variables, tokens)
    np.testing.assert_allclose(value, eager, rtol=1e-5)
    np.testing.assert_allclose(own, eager, rtol=1e-5)
    with pytest.raises(checkify.JaxRuntimeError, match="token ids in"):
        checked(step)(variables, tokens + 20)
    err, _ = jax.jit(checkify.checkify(step))(variables, tokens + 20)
    with pytest.raises(checkify.JaxRuntimeError, match="token ids in"):
        err.throw()
    with pytest.raises(ValueError, match="token id 21"):  # eager grad still checks
        jax.grad(loss)(variables, tokens + 20)
    jax.vmap(lambda t: lm.apply(variables, t[None]))(tokens)  # eager vmap runs unrefused


def test_extend_before_prefill_and_caches_of_the_other_model(tiny):
    cfg, model, variables = tiny["cfg"], tiny["seq2seq"], tiny["seq2seq_vars"]
    fresh = init_cache(cfg, 1, 4, source_length=4)
    bos = jnp.array([[1]])
    with pytest.raises(ValueError, match=r"holds no encoded source.*run Transformer.prefill"):
        model.apply(variables, bos, fresh, method="extend")
    apply = checked(tiny["checked_seq2seq"].apply)
    with pytest.raises(checkify.JaxRuntimeError, match="holds no encoded source"):
        apply(variables, bos, fresh, method="extend")
    with pytest.raises(ValueError, match=r"prefill: this cache has no cross-attention part"):
        model.apply(variables, tiny["src"], bos, init_cache(cfg, 1, 4), method="prefill")
    with pytest.raises(ValueError, match=r"built for sources of shape \(1, 6\)"):
        model.apply(variables, tiny["src"], bos, init_cache(cfg, 1, 4, 6), method="prefill")
    with pytest.raises(ValueError, match=r"DecoderOnlyTransformer.extend: this cache has a cross"):
        tiny["lm"].apply(tiny["lm_vars"], bos, fresh, method="extend")
    # A cache of another config (layer count, layout, heads) is named as such.
    lm_cfg = tiny["lm"].config
    others = {
        "layers": lm_cfg.replace(num_layers=lm_cfg.decoder_layers + 1),
        "scanned": lm_cfg.replace(scan_layers=not lm_cfg.scan_layers),
        "heads": lm_cfg.replace(num_heads=lm_cfg.num_heads * 2, d_model=lm_cfg.d_model * 2),
    }
    for other in others.values():
        with pytest.raises(ValueError, match=r"extend: (the )?cache.*built for another config"):
            tiny["lm"].apply(tiny["lm_vars"], bos, init_cache(other, 1, 4), method="extend")
    # After prefill, extend reads the encoded source: the same logits as the full model.
    logits, cache = model.apply(variables, tiny["src"], bos, fresh, method="prefill")
    step, _ = model.apply(variables, jnp.array([[6]]), cache, method="extend")
    full = model.apply(variables, tiny["src"], jnp.array([[1, 6]]))
    chex.assert_trees_all_close(jnp.concatenate([logits, step], 1), full, atol=1e-5)


# Errors at the boundary name the caller's argument. --------------------------------------


def test_errors_name_the_argument_not_an_internal():
    q, k, _ = _qkv(t=3, s=4, batch=2, heads=4)
    v2 = jax.random.normal(KEY, (2, 4, 2, 8))
    with pytest.raises(ValueError, match=r"multi_head_attention: k and v need the same .* K"):
        multi_head_attention(q, k, v2)
    x = jax.random.normal(KEY, (2, 3, 8))
    for heads, exc in ((0, ValueError), (-2, ValueError), (2.0, TypeError)):
        with pytest.raises(exc, match=rf"MultiHeadAttention: num_heads={heads}"):
            MultiHeadAttention(num_heads=heads).init(KEY, x)
    cfg = TransformerConfig(vocab_size=11, d_model=8, num_heads=2, d_ff=16, num_layers=1)
    model = DecoderOnlyTransformer(cfg)
    with pytest.raises(ValueError, match=r"tokens is empty.*at least one token"):
        model.init(KEY, jnp.zeros((2, 0), jnp.int32))


def test_lists_work_as_arrays_and_scalars_are_refused_by_name(tiny):
    """A nested Python list where an array is expected is converted as `jnp.asarray` does;
    a scalar, a string or a ragged list is refused naming the argument (before: an
    AttributeError "'list' object has no attribute 'ndim'")."""
    q, k, v = _qkv()
    x = np.asarray(q)
    calls = {  # name: (function, valid arguments, the argument to spoil)
        "q": (dot_product_attention, (q, k, v), 0),
        "x_TD": (simple_self_attention, (x,), 0),
        "x": (lambda x, s: layer_norm(x, s, None), (x, np.ones(8, np.float32)), 0),
        "scale": (lambda x, s: layer_norm(x, s, None), (x, np.ones(8, np.float32)), 1),
        "w1_DF": (
            lambda x, w1, w2: feed_forward(x, w1, None, w2, None),
            (x, np.ones((8, 4), np.float32), np.ones((4, 8), np.float32)),
            1,
        ),
        "tokens": (lambda t: tiny["lm"].apply(tiny["lm_vars"], t), (np.asarray(tiny["tgt"]),), 0),
    }
    for name, (fn, args, i) in calls.items():
        want = fn(*args)
        as_list = fn(*args[:i], np.asarray(args[i]).tolist(), *args[i + 1 :])
        chex.assert_trees_all_close(as_list, want)
        for bad, exc in ((2, ValueError), ("abc", TypeError), ([[1.0, 2.0], [3.0]], TypeError)):
            with pytest.raises(exc, match=name):
                fn(*args[:i], bad, *args[i + 1 :])
    src, tgt = tiny["src"], tiny["tgt"]
    got = tiny["seq2seq"].apply(tiny["seq2seq_vars"], src.tolist(), tgt.tolist())
    chex.assert_trees_all_close(got, tiny["seq2seq"].apply(tiny["seq2seq_vars"], src, tgt))
    with pytest.raises(ValueError, match=r"src_tokens must be int token ids of shape \(B, T\)"):
        tiny["seq2seq"].apply(tiny["seq2seq_vars"], 3, tgt)


def test_splash_on_a_cpu_names_the_interpret_switch():
    """Pallas refuses a TPU kernel on the CPU only when lowering ("Only interpret mode is
    supported on CPU backend"); the library refuses it there first, naming
    `splash_interpret`, and a program lowered for a TPU from this CPU host keeps the kernel."""
    q = jax.random.normal(KEY, (1, 128, 2, 8))

    def splash(q):
        return attention_op(q, q, q, None, impl="splash")[0]

    def loss(q):
        return splash(q).sum()

    for fn in (splash, jax.jit(splash), jax.jit(jax.grad(loss))):
        with pytest.raises(ValueError, match=r"attention_impl='splash' .*splash_interpret\(\)"):
            fn(q)
    lowered = jax.jit(jax.grad(loss)).trace(q).lower(lowering_platforms=("tpu",))
    assert "tpu_custom_call" in lowered.as_text()


def test_a_mesh_that_cannot_split_a_parameter_names_it():
    devices = jax.devices()
    cfg = TransformerConfig(vocab_size=11, d_model=8, num_heads=2, d_ff=16, num_layers=1)
    model = DecoderOnlyTransformer(cfg)
    # One device standing for a tensor axis of 3 is impossible, so build the rule check on a
    # fake 3-wide mesh of the same device: only `check_divisible` reads the sizes.
    mesh = jax.sharding.Mesh(np.array(devices[:1] * 3).reshape(1, 1, 3), ("data", "fsdp", "tensor"))
    with pytest.raises(
        ValueError,
        match=r"parameter \['params'\].* is split over mesh axes \('tensor',\) of size 3",
    ):
        init_sharded(model, mesh, KEY, jnp.ones((1, 4), jnp.int32))
