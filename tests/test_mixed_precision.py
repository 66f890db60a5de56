"""The mixed-precision policy (`flax_transformer.functional.precision`).

Every matmul and einsum takes its operands in the compute dtype and sums in float32. Pinned
here: float32 runs are the plain products bit for bit (functions and whole models, values
and gradients); in bfloat16 every product of a model's forward pass (each attention
implementation, cached decoding, both heads) is a bfloat16 x bfloat16 -> float32 dot; and
the bfloat16 error is no larger than the old bfloat16-in, bfloat16-out path's.

"The old path" is the policy with `accumulation_dtype` patched to return the operands'
dtype: the same code with every product rounded to bfloat16 (as before issue 58, except
that `q . k` already summed in float32 then).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from flax_transformer import DecoderOnlyTransformer, Transformer, TransformerConfig
from flax_transformer.decoding import init_cache
from flax_transformer.functional import (
    dot_product_attention,
    feed_forward,
    gated_feed_forward,
    gelu,
    precision,
    project,
)
from flax_transformer.functional.precision import (
    accumulation_dtype,
    mixed_dot_general,
    mixed_einsum,
)


def _enable_x64():
    return jax.enable_x64(True)


def _old_path(patch):
    """Products rounded to their operands' dtype (bfloat16 in, bfloat16 out)."""
    patch.setattr(precision, "accumulation_dtype", lambda *d: jnp.result_type(*d))


def _normal(seed, shape, scale=1.0):
    return scale * np.random.default_rng(seed).standard_normal(shape)


def test_accumulation_dtype_and_mixed_products():
    assert accumulation_dtype(jnp.bfloat16) == jnp.float32
    assert accumulation_dtype(jnp.float16, jnp.bfloat16) == jnp.float32
    assert accumulation_dtype(jnp.float32) == jnp.float32
    with _enable_x64():
        assert accumulation_dtype(jnp.float64) == jnp.float64
    a, b = _normal(0, (3, 4)).astype(np.float32), _normal(1, (4, 5)).astype(np.float32)
    y = mixed_einsum("ik,kj->ij", a, b, dtype=jnp.bfloat16)
    assert y.dtype == jnp.float32
    # Operands rounded to bfloat16, their products summed exactly enough in float32.
    a16 = np.asarray(jnp.asarray(a, jnp.bfloat16).astype(jnp.float32), np.float64)
    b16 = np.asarray(jnp.asarray(b, jnp.bfloat16).astype(jnp.float32), np.float64)
    np.testing.assert_allclose(np.asarray(y), a16 @ b16, rtol=1e-5, atol=1e-5)
    dims = (((1,), (0,)), ((), ()))
    z = mixed_dot_general(jnp.asarray(a, jnp.bfloat16), jnp.asarray(b, jnp.bfloat16), dims)
    assert z.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(z), np.asarray(y))


def test_float32_functions_are_the_plain_formulas_bit_for_bit():
    x, w = (
        jnp.asarray(_normal(0, (2, 5, 8)), jnp.float32),
        jnp.asarray(_normal(1, (8, 6)), jnp.float32),
    )
    np.testing.assert_array_equal(np.asarray(project(x, w)), np.asarray(x @ w))
    w2 = jnp.asarray(_normal(2, (6, 8)), jnp.float32)
    b1, b2 = jnp.asarray(_normal(3, (6,)), jnp.float32), jnp.asarray(_normal(4, (8,)), jnp.float32)
    old = jax.nn.relu(x @ w + b1) @ w2 + b2
    np.testing.assert_array_equal(np.asarray(feed_forward(x, w, b1, w2, b2)), np.asarray(old))
    q, k, v = (jnp.asarray(_normal(s, (5, 8)), jnp.float32) for s in (5, 6, 7))
    scores = jnp.einsum("th,sh->ts", q, k) * (1.0 / np.sqrt(8.0))
    old_out = jnp.einsum("ts,sh->th", jax.nn.softmax(scores, axis=-1), v)
    out, _ = dot_product_attention(q, k, v)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(old_out))


def _config(**changes):
    base = dict(
        vocab_size=40, d_model=32, num_heads=4, d_ff=64, num_layers=2, max_len=16, dropout_rate=0.0
    )
    return TransformerConfig(**base).replace(**changes)


LLAMA = dict(
    norm="rmsnorm",
    positional="rope",
    activation="swiglu",
    num_kv_heads=2,
    tie_output_embedding=False,
    use_bias=False,
)
VARIANTS = {
    "gpt": {},
    "llama": LLAMA,
    "blocked": dict(attention_impl="blocked"),
    "lora": dict(lora_rank=4, lora_targets=("q", "v", "o", "up", "down")),
}


def _tokens():
    tokens = np.random.default_rng(0).integers(1, 40, (2, 12))
    tokens[0, -3:] = 0  # padding
    return jnp.asarray(tokens, jnp.int32)


def _model_and_params(cfg):
    model = DecoderOnlyTransformer(cfg)
    params = nn.unbox(model.init(jax.random.key(0), _tokens()))
    # Nonzero LoRA B and biases: every path carries something.
    noise = lambda x, i: x + 0.05 * jax.random.normal(jax.random.key(i), x.shape, x.dtype)  # noqa: E731
    leaves, tree = jax.tree.flatten(params)
    return model, jax.tree.unflatten(tree, [noise(x, i) for i, x in enumerate(leaves)])


def _logits_and_grads(model, params):
    tokens = _tokens()
    logits = model.apply(params, tokens)
    grads = jax.grad(lambda p: model.apply(p, tokens).sum())(params)
    return np.asarray(logits), [np.asarray(g) for g in jax.tree.leaves(grads)]


@pytest.mark.parametrize("name", ["llama", "blocked", "lora"])
def test_float32_models_unchanged_bit_for_bit(name, monkeypatch):
    """float32 logits and gradients equal those of the plain products (no preferred type)."""
    model, params = _model_and_params(_config(**VARIANTS[name]))
    new = _logits_and_grads(model, params)
    _old_path(monkeypatch)
    old = _logits_and_grads(model, params)
    np.testing.assert_array_equal(new[0], old[0])
    for a, b in zip(new[1], old[1], strict=True):
        np.testing.assert_array_equal(a, b)


def _dots(jaxpr):
    """Every dot_general of a closed jaxpr, sub-jaxprs (scan, pjit, custom_vjp) included."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            yield eqn
        for value in eqn.params.values():
            for sub in value if isinstance(value, list | tuple) else (value,):
                if isinstance(sub, jax.extend.core.ClosedJaxpr):
                    yield from _dots(sub.jaxpr)
                elif isinstance(sub, jax.extend.core.Jaxpr):
                    yield from _dots(sub)


def _assert_bf16_in_f32_out(fn, *args):
    dots = list(_dots(jax.make_jaxpr(fn)(*args).jaxpr))
    assert dots
    for eqn in dots:
        ins = [v.aval.dtype for v in eqn.invars]
        assert ins == [jnp.bfloat16] * 2, (ins, eqn)
        assert eqn.outvars[0].aval.dtype == jnp.float32, eqn


@pytest.mark.parametrize("name", ["gpt", "llama", "blocked"])
def test_every_bf16_product_sums_in_float32(name):
    cfg = _config(dtype="bfloat16", **VARIANTS[name])
    model, params = _model_and_params(cfg)
    _assert_bf16_in_f32_out(lambda p: model.apply(p, _tokens()), params)
    # Cached decoding: a prefill of the prompt, then one step.
    cache = init_cache(cfg, 2, 16)
    _assert_bf16_in_f32_out(
        lambda p, c: model.apply(p, _tokens()[:, :4], c, method=model.extend), params, cache
    )


def test_every_bf16_product_of_the_encoder_decoder_sums_in_float32():
    cfg = _config(dtype="bfloat16")
    model = Transformer(cfg)
    src = _tokens()
    params = nn.unbox(model.init(jax.random.key(0), src, src))
    _assert_bf16_in_f32_out(lambda p: model.apply(p, src, src), params)


def _rounded(seed, shape, scale=1.0):
    """float64 values that bfloat16 holds exactly, so that only the arithmetic errs."""
    x = jnp.asarray(_normal(seed, shape, scale), jnp.bfloat16)
    return np.asarray(x.astype(jnp.float32), np.float64)


def _relative_error(got, want):
    return float(np.abs(np.asarray(got, np.float64) - want).max() / np.abs(want).max())


def _bf16_errors(fn, args):
    """`fn`'s relative error in bfloat16 against float64, by the policy and by the old path."""
    with _enable_x64():
        want = np.asarray(fn(*(jnp.asarray(a, jnp.float64) for a in args)), np.float64)
    bf16 = [jnp.asarray(a, jnp.bfloat16) for a in args]
    new = _relative_error(fn(*bf16).astype(jnp.float32), want)
    with pytest.MonkeyPatch.context() as patch:
        _old_path(patch)
        old = _relative_error(fn(*bf16).astype(jnp.float32), want)
    return new, old


def _ffn(x, w1, b1, w2, b2):
    return feed_forward(x, w1, b1, w2, b2, gelu)


def _swiglu(x, wg, wu, wd):
    return gated_feed_forward(x, wg, wu, wd)


def _attention(q, k, v):
    return dot_product_attention(q, k, v)[0]


# Width 512 and 2048 hidden units: sums long enough for bfloat16 rounding of the results
# (rather than of the inputs, which both paths share) to show.
FUNCTION_CASES = {
    "project": (project, [(64, 512), (512, 256)], 1 / 512**0.5),
    "feed_forward": (_ffn, [(64, 512), (512, 2048), (2048,), (2048, 512), (512,)], 0.05),
    "gated_feed_forward": (_swiglu, [(64, 512), (512, 2048), (512, 2048), (2048, 512)], 0.05),
    "attention": (_attention, [(128, 64), (256, 64), (256, 64)], 1.0),
}


@pytest.mark.parametrize("name", sorted(FUNCTION_CASES))
def test_bf16_error_no_larger_than_bf16_out(name):
    """Errors against float64 of the same bfloat16-exact inputs, max |err| / max |value|
    (measured 2026-12-07, AMD EPYC, jax 0.10.2): policy / old path project 4e-7 / 3.0e-3
    (the policy's float32 result of exact inputs is float32-accurate), feed_forward
    3.0e-3 / 4.5e-3, gated_feed_forward 2.7e-3 / 4.5e-3, attention 2.4e-3 / 7.8e-3."""
    fn, shapes, scale = FUNCTION_CASES[name]
    args = [_rounded(i, shape, scale) for i, shape in enumerate(shapes)]
    new, old = _bf16_errors(fn, args)
    print(f"{name}: policy {new:.2g}, old path {old:.2g}")
    assert new <= old, (new, old)


def _rms_relative_error(got, want):
    got = np.asarray(got, np.float64)
    return float(np.sqrt(np.mean((got - want) ** 2) / np.mean(want**2)))


@pytest.mark.parametrize("name", ["gpt", "llama"])
def test_bf16_model_error_no_larger_than_bf16_out(name):
    """A model's bfloat16 logits against its float32 logits on the same parameters (the
    configs take no float64; float32's own error, ~1e-6, is far below bfloat16's), as RMS
    error / RMS logit, D = 256 (measured 2026-12-07, AMD EPYC): policy / old path gpt
    3.7e-3 / 4.1e-3, llama 4.5e-3 / 4.9e-3. Most of the error is the rounding of the
    parameters and of the residual stream to bfloat16, which both paths share; the largest
    error of one logit is noisier (either path lower, depending on the seed)."""
    cfg = _config(d_model=256, d_ff=1024, **VARIANTS[name])
    model = DecoderOnlyTransformer(cfg)
    params = nn.unbox(model.init(jax.random.key(0), _tokens()))
    want = np.asarray(model.apply(params, _tokens()), np.float64)
    bf16_model = DecoderOnlyTransformer(cfg.replace(dtype="bfloat16"))
    new = _rms_relative_error(bf16_model.apply(params, _tokens()), want)
    with pytest.MonkeyPatch.context() as patch:
        _old_path(patch)
        old = _rms_relative_error(bf16_model.apply(params, _tokens()), want)
    print(f"{name}: policy {new:.2g}, old path {old:.2g}")
    assert new <= old, (new, old)
