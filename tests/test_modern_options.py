"""Modern decoder options (the Llama-style stack): RMSNorm, gated feed-forward, bias switches."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from flax_transformer import (
    DecoderOnlyTransformer,
    FeedForward,
    RMSNorm,
    Transformer,
    TransformerConfig,
    gated_feed_forward,
    rms_norm,
)

SMALL = dict(vocab_size=50, d_model=16, num_heads=2, d_ff=24, num_layers=2, max_len=16)


def _leaf_names(params) -> set[str]:
    flat = jax.tree_util.tree_flatten_with_path(nn.unbox(params))[0]
    return {"/".join(str(getattr(k, "key", k)) for k in path) for path, _ in flat}


def test_rms_norm_formula():
    x = jax.random.normal(jax.random.key(0), (3, 5, 8)) * 3 + 1
    scale = jnp.linspace(0.5, 2.0, 8)
    xn = np.asarray(x, np.float64)
    expected = xn / np.sqrt((xn**2).mean(-1, keepdims=True) + 1e-6) * np.asarray(scale)
    np.testing.assert_allclose(rms_norm(x, scale), expected, rtol=1e-5)
    # Unlike LayerNorm the mean is kept: a constant row stays constant and nonzero.
    np.testing.assert_allclose(rms_norm(jnp.full((4,), 3.0), None), np.ones(4), rtol=1e-5)
    assert rms_norm(x.astype(jnp.bfloat16), scale).dtype == jnp.bfloat16


def test_rms_norm_module_matches_the_function():
    x = jax.random.normal(jax.random.key(1), (2, 3, 8))
    module = RMSNorm()
    params = module.init(jax.random.key(0), x)
    assert set(nn.unbox(params)["params"]) == {"scale"}
    np.testing.assert_allclose(module.apply(params, x), rms_norm(x, jnp.ones(8)), rtol=1e-6)


def test_gated_feed_forward_formula():
    keys = jax.random.split(jax.random.key(2), 4)
    x = jax.random.normal(keys[0], (5, 8))
    wg, wu = jax.random.normal(keys[1], (8, 12)), jax.random.normal(keys[2], (8, 12))
    wd = jax.random.normal(keys[3], (12, 8))
    xg, xu = np.asarray(x) @ np.asarray(wg), np.asarray(x) @ np.asarray(wu)
    silu = xg / (1 + np.exp(-xg))
    np.testing.assert_allclose(
        gated_feed_forward(x, wg, wu, wd), (silu * xu) @ np.asarray(wd), rtol=1e-4, atol=1e-4
    )


@pytest.mark.parametrize("activation", ["swiglu", "geglu"])
def test_gated_feed_forward_module(activation):
    x = jax.random.normal(jax.random.key(3), (2, 4, 8))
    module = FeedForward(d_ff=12, activation=activation, use_bias=False)
    params = module.init(jax.random.key(0), x)
    p = nn.unbox(params)["params"]
    assert set(p) == {"wg_kernel", "wi_kernel", "wo_kernel"}
    act = jax.nn.silu if activation == "swiglu" else (lambda h: jax.nn.gelu(h, approximate=False))
    expected = gated_feed_forward(x, p["wg_kernel"], p["wi_kernel"], p["wo_kernel"], act)
    np.testing.assert_allclose(module.apply(params, x), expected, rtol=1e-6)


def test_unknown_norm_and_activation_are_refused():
    with pytest.raises(ValueError, match=r"norm='batchnorm' is not one of \('layernorm', "):
        TransformerConfig(norm="batchnorm")
    with pytest.raises(ValueError, match=r"activation='reglu'"):
        TransformerConfig(activation="reglu")


@pytest.mark.slow  # scanned and unrolled decoders compiled
@pytest.mark.parametrize("scan", [False, True])
def test_llama_style_decoder_runs_and_scan_matches(scan):
    config = TransformerConfig(**SMALL, norm="rmsnorm", activation="swiglu", use_bias=False)
    tokens = jnp.array([[1, 5, 7, 9, 0, 0], [1, 3, 4, 2, 8, 6]])
    model = DecoderOnlyTransformer(config.replace(scan_layers=scan))
    params = model.init(jax.random.key(0), tokens)
    names = _leaf_names(params)
    assert not any("bias" in n for n in names), names  # RMSNorm and use_bias=False: none
    assert any("wg_kernel" in n for n in names)
    logits = model.apply(params, tokens)
    assert logits.shape == (2, 6, 50) and bool(jnp.all(jnp.isfinite(logits)))
    if scan:  # same numbers as the unrolled stack with the same weights
        unrolled = DecoderOnlyTransformer(config)
        ref_params = unrolled.init(jax.random.key(0), tokens)
        stacked = nn.unbox(params)["params"]["decoder"]["layers"]
        moved = jax.tree.map(lambda x: x, nn.unbox(ref_params))
        for i in range(config.num_layers):
            moved["params"]["decoder"][f"layers_{i}"] = jax.tree.map(lambda x, i=i: x[i], stacked)
        for name in ("embed", "decoder"):
            for key, value in nn.unbox(params)["params"][name].items():
                if key != "layers":
                    moved["params"][name][key] = value
        np.testing.assert_allclose(unrolled.apply(moved, tokens), logits, rtol=1e-5, atol=1e-5)


def _component(name: str) -> str:
    """'attention', 'ffn' or 'norm' for a bias leaf path (params/.../ffn/wi_bias)."""
    parts = name.split("/")
    if "self_attention" in parts or "cross_attention" in parts:
        return "attention"
    if "ffn" in parts:
        return "ffn"
    assert any(p.startswith("norm") or p == "final_norm" for p in parts), name
    return "norm"


def test_bias_switches_remove_exactly_their_biases():
    src = jnp.array([[4, 5, 6, 0]])
    tgt = jnp.array([[1, 7, 8]])

    def biases(**options) -> set[str]:
        model = Transformer(TransformerConfig(**SMALL, **options))
        names = _leaf_names(model.init(jax.random.key(0), src, tgt))
        return {_component(n) for n in names if "bias" in n}

    assert biases() == {"attention", "ffn", "norm"}
    assert biases(attention_bias=False) == {"ffn", "norm"}
    assert biases(ffn_bias=False) == {"attention", "norm"}
    assert biases(norm_bias=False) == {"attention", "ffn"}
    # use_bias=False with one switch back on keeps only that component's biases.
    assert biases(use_bias=False, ffn_bias=True) == {"ffn"}
    assert biases(use_bias=False) == set()


@pytest.mark.parametrize("tied", [True, False])
def test_output_bias(tied):
    tokens = jnp.array([[1, 5, 7]])
    config = TransformerConfig(**SMALL, output_bias=True, tie_output_embedding=tied)
    model = DecoderOnlyTransformer(config)
    params = nn.unbox(model.init(jax.random.key(0), tokens))
    names = _leaf_names(params)
    bias_name = "logits_bias" if tied else "logits/bias"
    assert any(n.endswith(bias_name) for n in names), names
    # The bias adds to every position's logits.
    shifted = jax.tree_util.tree_map_with_path(
        lambda path, x: x + 1.0 if "logits" in str(path[-1]) and "bias" in str(path) else x,
        params,
    )
    if not tied:
        shifted = jax.tree.map(lambda x: x, params)
        shifted["params"]["decoder"]["logits"]["bias"] += 1.0
    np.testing.assert_allclose(
        model.apply(shifted, tokens), model.apply(params, tokens) + 1.0, rtol=1e-5, atol=1e-5
    )
    no_bias = DecoderOnlyTransformer(TransformerConfig(**SMALL, tie_output_embedding=tied))
    assert not any(
        "logits_bias" in n or "logits/bias" in n
        for n in _leaf_names(no_bias.init(jax.random.key(0), tokens))
    )
