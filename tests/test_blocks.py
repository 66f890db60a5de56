"""Blocks outside text: layers from a LayerConfig, stacks over embeddings, width checks."""

import chex
import jax
import jax.numpy as jnp
import pytest
from flax import linen as nn

from flax_transformer import (
    Decoder,
    DecoderLayer,
    DecoderOnlyTransformer,
    Embed,
    Encoder,
    EncoderLayer,
    LayerConfig,
    MultiHeadAttention,
    PositionalEncoding,
    Transformer,
    TransformerConfig,
    causal_mask,
    layer_norm,
)
from flax_transformer.decoding import init_cache

B, S, T, D, N, F, V = 2, 6, 5, 16, 4, 32, 37
CONFIG = TransformerConfig(
    vocab_size=V, d_model=D, num_heads=N, d_ff=F, num_layers=2, max_len=24, dropout_rate=0.0
)
X_BSD = jax.random.normal(jax.random.key(1), (B, S, D))
Y_BTD = jax.random.normal(jax.random.key(2), (B, T, D))
SRC_BS = jax.random.randint(jax.random.key(3), (B, S), 1, V)
TGT_BT = jax.random.randint(jax.random.key(4), (B, T), 1, V)


def _init(module, *args, **kwargs):
    return nn.unbox(module.init(jax.random.key(0), *args, **kwargs))


def test_layer_config_needs_no_vocabulary_and_equals_the_model_config_path():
    layer_config = LayerConfig(d_model=D, num_heads=N, d_ff=F, dropout_rate=0.0)
    assert layer_config == CONFIG.layer_config
    for layer, args in [
        (EncoderLayer, (X_BSD, None)),
        (DecoderLayer, (Y_BTD, X_BSD, causal_mask(T), None)),
    ]:
        params = _init(layer(layer_config), *args)
        out, _ = layer(layer_config).apply(params, *args)
        chex.assert_shape(out, args[0].shape)
        chex.assert_trees_all_close(out, layer(CONFIG).apply(params, *args)[0])


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"num_heads": 3}, r"LayerConfig.num_heads=3 does not divide d_model=16"),
        ({"d_ff": 0}, r"LayerConfig.d_ff=0 must be a positive integer"),
        ({"dropout_rate": 1.5}, r"LayerConfig.dropout_rate=1.5 must be in \[0, 1\)"),
        ({"norm_position": "mid"}, r"LayerConfig.norm_position='mid' is not one of"),
        ({"dtype": "float8"}, r"LayerConfig.dtype='float8' is not a known dtype"),
    ],
)
def test_layer_config_validates_its_fields(changes, message):
    with pytest.raises(ValueError, match=message):
        LayerConfig(**{"d_model": D, "num_heads": N, "d_ff": F, **changes})


def test_odd_width_is_fine_for_a_layer():
    # TransformerConfig needs an even width for sinusoidal positions; a layer has none.
    layer_config = LayerConfig(d_model=9, num_heads=3, d_ff=8)
    x = jnp.ones((1, 2, 9))
    out, _ = EncoderLayer(layer_config).apply(_init(EncoderLayer(layer_config), x), x)
    chex.assert_shape(out, (1, 2, 9))


@pytest.mark.parametrize(
    "layer, args",
    [
        (EncoderLayer, (jnp.ones((B, S, 8)), None)),
        (DecoderLayer, (jnp.ones((B, T, 8)), X_BSD, None, None)),
    ],
)
def test_layers_check_input_width_against_d_model(layer, args):
    with pytest.raises(ValueError, match=r"expects .* of shape \(B, T, d_model=16\), got"):
        _init(layer(CONFIG), *args)


def test_decoder_layer_takes_an_encoder_of_another_width():
    encoded = jnp.ones((B, S, 8))
    params = _init(DecoderLayer(CONFIG), Y_BTD, encoded, None, None)
    assert params["params"]["cross_attention"]["kv_kernel"].shape == (8, 2, N, D // N)


@pytest.mark.parametrize("layer, args", [(EncoderLayer, (X_BSD,)), (DecoderLayer, (Y_BTD, X_BSD))])
def test_layer_dropout_by_keyword(layer, args):
    module = layer(CONFIG.layer_config.replace(dropout_rate=0.5))
    params = _init(module, *args)
    off = module.apply(params, *args)[0]
    chex.assert_trees_all_close(off, module.apply(params, *args, deterministic=True)[0])
    on = module.apply(params, *args, deterministic=False, rngs={"dropout": jax.random.key(1)})[0]
    assert not jnp.allclose(on, off)


@pytest.mark.parametrize(
    "module, args",
    [
        (EncoderLayer(CONFIG), (X_BSD, None)),
        (DecoderLayer(CONFIG), (Y_BTD, X_BSD, causal_mask(T), None)),
        (Encoder(CONFIG), (X_BSD, None)),
        (Decoder(CONFIG), (Y_BTD, X_BSD, None, None)),
        (MultiHeadAttention(num_heads=N), (X_BSD, None, None)),
        (PositionalEncoding(CONFIG.max_len), (X_BSD,)),
        (DecoderOnlyTransformer(CONFIG), (TGT_BT,)),
        (Transformer(CONFIG), (SRC_BS, TGT_BT)),
    ],
    ids=lambda x: type(x).__name__ if isinstance(x, nn.Module) else "",
)
def test_options_after_the_inputs_are_keyword_only(module, args):
    # `EncoderLayer(cfg).apply(v, x, mask, False)` once put False into positions_BS: no
    # dropout and no word. Every option after the inputs is keyword-only now.
    with pytest.raises(TypeError, match="positional argument"):
        module.init(jax.random.key(0), *args, False)


def test_extend_takes_lengths_by_keyword_only():
    lm = DecoderOnlyTransformer(CONFIG)
    cache = init_cache(CONFIG, B, 8)
    with pytest.raises(TypeError, match="positional argument"):
        lm.init(jax.random.key(0), TGT_BT, cache, jnp.full((B,), T), method="extend")


@pytest.mark.slow  # four layer loops with dropout compiled
@pytest.mark.parametrize("scan_layers", [False, True])
@pytest.mark.parametrize("remat", [False, True])
def test_stack_dropout_reaches_every_layer_under_scan_and_remat(scan_layers, remat):
    # nn.scan drops keyword arguments silently: the stack must still turn dropout on.
    # Attention dropout acts only inside the layers (the inputs' dropout rate is 0 here).
    cfg = CONFIG.replace(attention_dropout_rate=0.5, scan_layers=scan_layers, remat=remat)
    encoder = Encoder(cfg)
    params = _init(encoder, X_BSD, None)
    rngs = {"dropout": jax.random.key(1)}
    on = encoder.apply(params, X_BSD, None, deterministic=False, rngs=rngs)
    off = encoder.apply(params, X_BSD, None)
    assert not jnp.allclose(on, off)
    grads = jax.jit(
        jax.grad(lambda p: encoder.apply(p, X_BSD, None, deterministic=False, rngs=rngs).sum())
    )(params)
    assert all(jnp.isfinite(g).all() for g in jax.tree.leaves(grads))


def test_encoder_on_embeddings_equals_the_token_path():
    embed = Embed(V, D)
    with_embed = Encoder(CONFIG, embed)
    params = _init(with_embed, SRC_BS, None)["params"]
    table = params.pop("embed")["embedding"]
    x_BSD = table[SRC_BS] * jnp.sqrt(D)  # the token path scales by sqrt(d_model)
    out = Encoder(CONFIG).apply({"params": params}, x_BSD, None)
    chex.assert_trees_all_close(
        out, with_embed.apply({"params": {**params, "embed": {"embedding": table}}}, SRC_BS, None)
    )


def test_decoder_on_embeddings_returns_hidden_states():
    embed = Embed(V, D)
    with_embed = Decoder(CONFIG, embed)
    args = (X_BSD, causal_mask(T), None)
    params = _init(with_embed, TGT_BT, *args)["params"]
    table = params.pop("embed")["embedding"]
    hidden = Decoder(CONFIG).apply({"params": params}, table[TGT_BT] * jnp.sqrt(D), *args)
    chex.assert_shape(hidden, (B, T, D))
    logits = with_embed.apply({"params": {**params, "embed": {"embedding": table}}}, TGT_BT, *args)
    chex.assert_trees_all_close(logits, hidden @ table.T, atol=1e-5)


@pytest.mark.slow  # an encoder and a decoder over embeddings compiled
def test_embedding_masks_hide_padded_frames():
    valid_BS = jnp.arange(S)[None, :] < jnp.array([[S], [3]])
    encoder, decoder = Encoder(CONFIG), Decoder(CONFIG)
    key_mask = valid_BS[:, None, None, :]
    enc_params = _init(encoder, X_BSD, key_mask)
    noise = jax.random.normal(jax.random.key(9), X_BSD.shape) * ~valid_BS[..., None]
    a = encoder.apply(enc_params, X_BSD, key_mask)
    b = encoder.apply(enc_params, X_BSD + noise, key_mask)
    chex.assert_trees_all_close(a[1, :3], b[1, :3], atol=1e-5)
    chex.assert_trees_all_close(a[0], b[0])
    self_mask = causal_mask(T)
    dec_params = _init(decoder, Y_BTD, a, self_mask, key_mask)
    ya = decoder.apply(dec_params, Y_BTD, a, self_mask, key_mask)
    yb = decoder.apply(dec_params, Y_BTD, b, self_mask, key_mask)
    chex.assert_trees_all_close(ya[1], yb[1], atol=1e-5)


@pytest.mark.parametrize(
    "module, inputs, message",
    [
        (Encoder(CONFIG), SRC_BS, r"Encoder\(embed=None\) takes float embeddings"),
        (Encoder(CONFIG, Embed(V, D)), X_BSD, r"build it with embed=None"),
        (Encoder(CONFIG), jnp.ones((B, S, 8)), r"inputs of shape \(B, T, d_model=16\), got shape"),
    ],
)
def test_stack_inputs_checked(module, inputs, message):
    with pytest.raises(ValueError, match=message):
        _init(module, inputs, None)


def _silence_sublayers(params):
    """Zero the output projections of attention and FFN: each sublayer then returns 0."""
    silent = jax.tree.map(lambda x: x, params)
    for sublayer, names in (
        ("self_attention", ("out_kernel", "out_bias")),
        ("ffn", ("wo_kernel", "wo_bias")),
    ):
        for name in names:
            silent["params"][sublayer][name] = jnp.zeros_like(params["params"][sublayer][name])
    return silent


def test_residual_branch_carries_the_input_past_silent_sublayers():
    """x + Sublayer(LayerNorm(x)) (pre-norm) and LayerNorm(x + Sublayer(x)) (post-norm, the
    paper's §3.1): with sublayers that output 0, what is left is the residual path."""
    layer = EncoderLayer(CONFIG)
    silent = _silence_sublayers(_init(layer, X_BSD))
    out_BSD, _ = layer.apply(silent, X_BSD)
    chex.assert_trees_all_close(out_BSD, X_BSD)

    post = EncoderLayer(CONFIG.replace(norm_position="post"))
    silent = _silence_sublayers(_init(post, X_BSD))
    out_BSD, _ = post.apply(silent, X_BSD)
    twice = layer_norm(layer_norm(X_BSD, None, None), None, None)  # init: scale 1, bias 0
    chex.assert_trees_all_close(out_BSD, twice, atol=1e-5)
