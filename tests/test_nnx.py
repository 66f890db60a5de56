"""Every layer, block and model runs under Flax NNX through `nnx.bridge.ToNNX`.

For each: lazy init through the bridge (no mesh, no `nnx.use_eager_sharding(False)`), one
`nnx.Optimizer` (Adam) step that lowers the loss, and the NNX module's output equal to the
linen module's with the same weights.
"""

import chex
import jax
import jax.numpy as jnp
import optax
import pytest
from flax import linen as nn
from flax import nnx

from flax_transformer import (
    Decoder,
    DecoderLayer,
    DecoderOnlyTransformer,
    Embed,
    Encoder,
    EncoderLayer,
    FeedForward,
    LayerNorm,
    MultiHeadAttention,
    PositionalEncoding,
    Transformer,
    TransformerConfig,
    causal_mask,
)
from flax_transformer.sharding import DEFAULT_RULES, make_mesh

B, T, S, D, N, V = 2, 5, 6, 16, 4, 37
CONFIG = TransformerConfig(
    vocab_size=V, d_model=D, num_heads=N, d_ff=32, num_layers=2, max_len=24, dropout_rate=0.0
)
X_BTD = jax.random.normal(jax.random.key(1), (B, T, D))
X_BSD = jax.random.normal(jax.random.key(2), (B, S, D))
SRC_BS = jax.random.randint(jax.random.key(3), (B, S), 1, V)
TGT_BT = jax.random.randint(jax.random.key(4), (B, T), 1, V)
LABELS_BT = jnp.roll(TGT_BT, -1, axis=1)


def _embed():
    return Embed(V, D)


# name -> (linen module, call args, whether the output is logits)
CASES = {
    "LayerNorm": (LayerNorm(), (X_BTD,), False),
    "MultiHeadAttention": (MultiHeadAttention(N), (X_BTD, None, causal_mask(T)), False),
    "CrossAttention": (MultiHeadAttention(N, cross=True), (X_BTD, X_BSD), False),
    "FeedForward": (FeedForward(d_ff=32), (X_BTD,), False),
    "Embed": (_embed(), (TGT_BT,), False),
    "PositionalEncoding": (PositionalEncoding(CONFIG.max_len, "learned"), (X_BTD,), False),
    "EncoderLayer": (EncoderLayer(CONFIG), (X_BSD, None), False),
    "DecoderLayer": (DecoderLayer(CONFIG), (X_BTD, X_BSD, causal_mask(T), None), False),
    "Encoder": (Encoder(CONFIG, _embed()), (SRC_BS, None), False),
    "Encoder-embeddings": (Encoder(CONFIG), (X_BSD, None), False),
    "Decoder": (Decoder(CONFIG, _embed()), (TGT_BT, X_BSD, causal_mask(T), None), True),
    "Transformer": (Transformer(CONFIG), (SRC_BS, TGT_BT), True),
    "Transformer-scan": (Transformer(CONFIG.replace(scan_layers=True)), (SRC_BS, TGT_BT), True),
    "DecoderOnlyTransformer": (DecoderOnlyTransformer(CONFIG), (TGT_BT,), True),
}


def _loss(out, logits: bool) -> jax.Array:
    if isinstance(out, tuple):  # EncoderLayer / DecoderLayer return (x, cache)
        out = out[0]
    if logits:
        return optax.softmax_cross_entropy_with_integer_labels(out, LABELS_BT).mean()
    return jnp.mean(jnp.square(out - 1.0))


# The quick run keeps the unrolled Transformer (the whole model, about 5 s on 2 cores); the
# layers and the scanned Transformer (about 25 s together) run in the full suite.
@pytest.mark.parametrize(
    "name",
    [n if n == "Transformer" else pytest.param(n, marks=pytest.mark.slow) for n in CASES],
)
def test_nnx_bridge_init_train_step_and_linen_equality(name):
    module, args, logits = CASES[name]
    model = nnx.bridge.ToNNX(module, rngs=nnx.Rngs(0))
    nnx.bridge.lazy_init(model, *args)
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)

    def loss_fn(m):
        return _loss(m(*args), logits)

    @nnx.jit  # one program for the step: eager, its ops would each compile (~4x the time)
    def train_step(m, opt):
        loss, grads = nnx.value_and_grad(loss_fn)(m)
        opt.update(m, grads)
        return loss

    before = train_step(model, optimizer)
    after = nnx.jit(loss_fn)(model)
    assert after < before, (name, float(before), float(after))

    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    assert params, f"{name} has no parameters"
    reference = module.apply({"params": params}, *args)
    chex.assert_trees_all_close(model(*args), reference, atol=1e-6)


def test_nnx_params_keep_logical_axis_names_for_sharding():
    model = nnx.bridge.ToNNX(Transformer(CONFIG), rngs=nnx.Rngs(0))
    nnx.bridge.lazy_init(model, SRC_BS, TGT_BT)
    state = nnx.state(model, nnx.Param)
    specs = nnx.get_partition_spec(state)
    qkv = specs["encoder"]["layers_0"]["self_attention"]["qkv_kernel"].get_value()
    assert tuple(qkv) == ("embed", "qkv", "heads", "kv")
    # docs/interop.md's recipe: logical names -> mesh shardings by the same rules as linen.
    shardings = nn.logical_to_mesh_sharding(specs, make_mesh(), DEFAULT_RULES)
    nnx.update(model, jax.device_put(state, shardings))
    chex.assert_trees_all_close(
        model(SRC_BS, TGT_BT),
        Transformer(CONFIG).apply({"params": nnx.to_pure_dict(state)}, SRC_BS, TGT_BT),
        atol=1e-6,
    )
