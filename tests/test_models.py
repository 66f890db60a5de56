"""The full models: shapes, masking properties, scan/unrolled equality, sizes, errors."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from flax_transformer import DecoderOnlyTransformer, Transformer, TransformerConfig

B, S, T = 2, 6, 5


def _tokens(key, shape, vocab, pad_tail=0):
    ids = jax.random.randint(jax.random.key(key), shape, 1, vocab)
    if pad_tail:
        ids = ids.at[:, -pad_tail:].set(0)
    return ids


def _init(model, *args):
    return nn.unbox(model.init(jax.random.key(0), *args))


@pytest.mark.parametrize("norm_position", ["pre", "post"])
@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
def test_transformer_logits_shape(tiny_config, norm_position, positional):
    cfg = tiny_config.replace(norm_position=norm_position, positional=positional)
    src, tgt = _tokens(1, (B, S), cfg.vocab_size), _tokens(2, (B, T), cfg.vocab_size)
    model = Transformer(cfg)
    params = _init(model, src, tgt)
    logits = jax.jit(model.apply)(params, src, tgt)
    chex.assert_shape(logits, (B, T, cfg.vocab_size))
    assert logits.dtype == jnp.float32
    chex.assert_tree_all_finite(logits)
    assert ("final_norm" in params["params"]["encoder"]) == (norm_position == "pre")


def test_encode_decode_methods_equal_call(tiny_config):
    src, tgt = _tokens(1, (B, S), 37, pad_tail=2), _tokens(2, (B, T), 37)
    model = Transformer(tiny_config)
    params = _init(model, src, tgt)
    encoded = model.apply(params, src, method=model.encode)
    chex.assert_shape(encoded, (B, S, tiny_config.d_model))
    logits = model.apply(params, encoded, src, tgt, method=model.decode)
    chex.assert_trees_all_close(logits, model.apply(params, src, tgt), atol=1e-6)


def test_decoder_only_is_causal(tiny_config):
    model = DecoderOnlyTransformer(tiny_config)
    tokens = _tokens(3, (B, 10), tiny_config.vocab_size)
    params = _init(model, tokens)
    logits = model.apply(params, tokens)
    chex.assert_shape(logits, (B, 10, tiny_config.vocab_size))
    for t in (0, 4, 8):
        changed = tokens.at[:, t + 1 :].set(_tokens(4, (B, 10 - t - 1), tiny_config.vocab_size))
        assert not np.array_equal(changed, tokens)
        other = model.apply(params, changed)
        chex.assert_trees_all_close(other[:, : t + 1], logits[:, : t + 1], atol=1e-6)
        assert not np.allclose(other[:, t + 1 :], logits[:, t + 1 :])


def test_transformer_decoder_is_causal(tiny_config):
    src, tgt = _tokens(1, (B, S), 37), _tokens(2, (B, T), 37)
    model = Transformer(tiny_config)
    params = _init(model, src, tgt)
    logits = model.apply(params, src, tgt)
    changed = tgt.at[:, 3:].set(_tokens(5, (B, T - 3), 37))
    chex.assert_trees_all_close(model.apply(params, src, changed)[:, :3], logits[:, :3], atol=1e-6)


def test_source_padding_is_ignored(tiny_config):
    """Trimming the pad columns of the source leaves the decoder output unchanged."""
    model = Transformer(tiny_config)
    src = _tokens(1, (B, S), 37, pad_tail=3)
    tgt = _tokens(2, (B, T), 37)
    params = _init(model, src, tgt)
    full = model.apply(params, src, tgt)
    trimmed = model.apply(params, src[:, : S - 3], tgt)
    chex.assert_trees_all_close(full, trimmed, atol=1e-5)
    # And the pad columns' content does not matter once they are masked: fill with garbage
    # positions by extending with more padding.
    longer = jnp.concatenate([src, jnp.zeros((B, 4), src.dtype)], axis=1)
    chex.assert_trees_all_close(model.apply(params, longer, tgt), full, atol=1e-5)


@pytest.mark.parametrize("model_cls", [Transformer, DecoderOnlyTransformer])
def test_scan_equals_unrolled(tiny_config, model_cls):
    cfg = tiny_config.replace(num_layers=3)
    src, tgt = _tokens(1, (B, S), 37, pad_tail=1), _tokens(2, (B, T), 37)
    args = (src, tgt) if model_cls is Transformer else (tgt,)
    unrolled = model_cls(cfg)
    params = _init(unrolled, *args)
    scanned = model_cls(cfg.replace(scan_layers=True))
    scanned_params = _init(scanned, *args)

    def stack(tree):
        for stack_name in ("encoder", "decoder"):
            if stack_name not in tree:
                continue
            layers = [tree[stack_name].pop(f"layers_{i}") for i in range(cfg.num_layers)]
            tree[stack_name]["layers"] = jax.tree.map(lambda *xs: jnp.stack(xs), *layers)
        return tree

    converted = {"params": stack(jax.tree.map(lambda x: x, params["params"]))}
    chex.assert_trees_all_equal_shapes(converted, scanned_params)
    expected = unrolled.apply(params, *args)
    chex.assert_trees_all_close(scanned.apply(converted, *args), expected, atol=1e-5)
    remat = model_cls(cfg.replace(scan_layers=True, remat=True))
    chex.assert_trees_all_close(remat.apply(converted, *args), expected, atol=1e-5)


# Gradients of four models. The quick run keeps remat in test_packing's remat-and-scan
# gradient test (finite gradients); this equality is checked in the full suite only.
@pytest.mark.slow
def test_remat_gradients_equal(tiny_config):
    tokens = _tokens(3, (B, 8), 37)
    plain, remat = (DecoderOnlyTransformer(tiny_config.replace(remat=r)) for r in (False, True))
    params = _init(plain, tokens)

    def loss(model, p):
        return jnp.mean(model.apply(p, tokens) ** 2)

    chex.assert_trees_all_close(
        jax.grad(lambda p: loss(remat, p))(params),
        jax.grad(lambda p: loss(plain, p))(params),
        atol=1e-6,
    )


def test_dropout_changes_output_only_when_enabled():
    cfg = TransformerConfig(
        vocab_size=37,
        d_model=16,
        num_heads=4,
        d_ff=32,
        num_layers=1,
        max_len=16,
        dropout_rate=0.3,
        attention_dropout_rate=0.3,
    )
    model = DecoderOnlyTransformer(cfg)
    tokens = _tokens(3, (B, 8), 37)
    params = _init(model, tokens)
    ref = model.apply(params, tokens)
    train = model.apply(params, tokens, deterministic=False, rngs={"dropout": jax.random.key(1)})
    assert not np.allclose(ref, train)
    chex.assert_trees_all_close(ref, model.apply(params, tokens, deterministic=True))


def test_bf16_compute_keeps_float32_params_and_logits(tiny_config):
    cfg = tiny_config.replace(dtype="bfloat16")
    src, tgt = _tokens(1, (B, S), 37), _tokens(2, (B, T), 37)
    model = Transformer(cfg)
    params = _init(model, src, tgt)
    assert {p.dtype for p in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}
    logits, state = model.apply(params, src, tgt, mutable=["intermediates"])
    assert logits.dtype == jnp.float32
    # The weights come out of a float32 softmax; the sown queries, keys and values
    # ('attention_inputs') stay in the compute dtype.
    sown = jax.tree_util.tree_leaves_with_path(state["intermediates"])
    weights = [w for path, w in sown if "attention_weights" in jax.tree_util.keystr(path)]
    assert weights and all(w.dtype == jnp.float32 for w in weights)
    reference = Transformer(tiny_config).apply(params, src, tgt)
    chex.assert_trees_all_close(logits, reference, atol=0.1)


def test_param_dtype_bfloat16_stores_bf16(tiny_config):
    cfg = tiny_config.replace(param_dtype="bfloat16")
    params = _init(DecoderOnlyTransformer(cfg), _tokens(1, (B, T), 37))
    assert {p.dtype for p in jax.tree.leaves(params)} == {jnp.dtype(jnp.bfloat16)}


def test_untied_output_and_separate_vocabularies(tiny_config):
    cfg = tiny_config.replace(
        share_embeddings=False, tie_output_embedding=False, target_vocab_size=29
    )
    src, tgt = _tokens(1, (B, S), 37), _tokens(2, (B, T), 29)
    model = Transformer(cfg)
    params = _init(model, src, tgt)
    chex.assert_shape(model.apply(params, src, tgt), (B, T, 29))
    p = params["params"]
    chex.assert_shape(
        [p["embed"]["embedding"], p["target_embed"]["embedding"], p["decoder"]["logits"]["kernel"]],
        [(37, 16), (29, 16), (16, 29)],
    )


def _hand_count_base(vocab: int) -> int:
    """Parameters of the paper's base model as built here, counted by hand.

    d=512, d_ff=2048, N=6 layers per stack, shared and tied embeddings, biases everywhere,
    sinusoidal positions (no parameters), pre-norm (one final LayerNorm per stack).
    """
    d, f, n = 512, 2048, 6
    attention = 4 * d * d + 4 * d  # W_Q, W_K, W_V, W_O and their biases
    ffn = d * f + f + f * d + d
    norm = 2 * d
    encoder_layer = attention + ffn + 2 * norm
    decoder_layer = 2 * attention + ffn + 3 * norm
    return vocab * d + n * encoder_layer + n * decoder_layer + 2 * norm


def test_base_model_full_size_shapes_and_count():
    cfg = TransformerConfig(
        vocab_size=37000, d_model=512, num_heads=8, d_ff=2048, num_layers=6, max_len=256
    )
    model = Transformer(cfg)
    src = jax.ShapeDtypeStruct((8, 256), jnp.int32)
    shapes = nn.unbox(jax.eval_shape(model.init, jax.random.key(0), src, src))
    count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))
    assert count == _hand_count_base(37000) == 63_084_544  # the paper reports ~65M
    logits = jax.eval_shape(model.apply, shapes, src, src)
    chex.assert_shape(logits, (8, 256, 37000))
    layer = shapes["params"]["decoder"]["layers_5"]
    chex.assert_shape(layer["cross_attention"]["kv_kernel"], (512, 2, 8, 64))
    chex.assert_shape(layer["ffn"]["wi_kernel"], (512, 2048))


def test_base_model_scanned_shapes():
    cfg = TransformerConfig(
        vocab_size=37000,
        d_model=512,
        num_heads=8,
        d_ff=2048,
        num_layers=6,
        max_len=256,
        scan_layers=True,
    )
    src = jax.ShapeDtypeStruct((2, 64), jnp.int32)
    boxed = jax.eval_shape(Transformer(cfg).init, jax.random.key(0), src, src)
    kernel = boxed["params"]["encoder"]["layers"]["self_attention"]["qkv_kernel"]
    assert kernel.names == ("layers", "embed", "qkv", "heads", "kv")
    chex.assert_shape(kernel.value, (6, 512, 3, 8, 64))
    count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nn.unbox(boxed)))
    assert count == _hand_count_base(37000)


def test_bad_inputs_raise_before_compute(tiny_config):
    model = DecoderOnlyTransformer(tiny_config)
    tokens = _tokens(1, (B, T), 37)
    params = _init(model, tokens)
    with pytest.raises(ValueError, match=r"exceeds TransformerConfig.max_len=24"):
        model.apply(params, _tokens(1, (B, 25), 37))
    with pytest.raises(ValueError, match=r"token id 37 at \(1, 2\), outside the vocabulary"):
        model.apply(params, tokens.at[1, 2].set(37))
    with pytest.raises(ValueError, match="token id -1"):
        model.apply(params, tokens.at[0, 0].set(-1))
    with pytest.raises(ValueError, match=r"shape \(B, T\)"):
        model.apply(params, tokens[0])
    with pytest.raises(ValueError, match="integer token ids"):
        model.apply(params, tokens.astype(jnp.float32))
    enc_dec = Transformer(tiny_config)
    with pytest.raises(ValueError, match="same batch size"):
        enc_dec.init(jax.random.key(0), _tokens(1, (2, S), 37), _tokens(1, (3, T), 37))
