"""Parameters a model does not use are refused, never ignored (round four, finding 1).

Flax ignores entries of the 'params' tree a model never reads: parameters trained with
`qk_norm=True` applied to a `qk_norm=False` model ran, their learned scales unused, and the
logits moved by up to 1.68. The models' `apply`, the exporters and the importers now name
such entries and the config option that would use them.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax.core import freeze

from flax_transformer import DecoderOnlyTransformer, Transformer, TransformerConfig
from flax_transformer.decoding import init_cache
from flax_transformer.interop import export_gpt2, export_llama
from flax_transformer.models import _expected_param_paths

SMALL = dict(vocab_size=37, d_model=16, num_heads=2, d_ff=24, num_layers=2, max_len=16)
TOKENS = jnp.array([[1, 5, 7, 9], [3, 4, 6, 0]])


def _lm_params(**changes):
    config = TransformerConfig(**{**SMALL, **changes})
    return DecoderOnlyTransformer(config).init(jax.random.key(0), TOKENS)


@pytest.mark.parametrize(
    "trained_with, hint",
    [
        (dict(qk_norm=True), r"qk_norm=True"),
        (dict(lora_rank=2), r"lora_rank > 0"),
        (dict(tie_output_embedding=False), r"tie_output_embedding=False"),
        (dict(output_bias=True), r"output_bias=True"),
        (dict(positional="learned"), r"positional='learned'"),
        (dict(activation="swiglu"), r"activation='swiglu' or 'geglu'"),
        (dict(num_layers=3), r"num_layers"),
    ],
)
def test_params_of_another_config_are_refused_naming_the_option(trained_with, hint):
    params = _lm_params(**trained_with)
    plain = DecoderOnlyTransformer(TransformerConfig(**SMALL))
    for apply in (plain.apply, jax.jit(plain.apply)):
        with pytest.raises(ValueError, match=r"DecoderOnlyTransformer.apply: params hold .*"):
            apply(params, TOKENS)
    with pytest.raises(ValueError, match=hint):
        plain.apply(params, TOKENS)


def test_qk_norm_params_on_a_plain_encoder_decoder_are_refused():
    config = TransformerConfig(**SMALL)
    params = Transformer(config.replace(qk_norm=True)).init(jax.random.key(0), TOKENS, TOKENS)
    with pytest.raises(ValueError, match=r"self_attention/key_norm_scale.*qk_norm=True"):
        Transformer(config).apply(params, TOKENS, TOKENS)
    with pytest.raises(ValueError, match=r"qk_norm=True"):
        Transformer(config).apply(params, TOKENS, method="encode")


def test_fitting_params_still_apply_with_every_collection():
    """The model's own params pass (boxed, unboxed, frozen), and collections other than
    'params' work as before: sown intermediates, the explicit cache of `extend`."""
    config = TransformerConfig(**SMALL)
    model = DecoderOnlyTransformer(config)
    variables = model.init(jax.random.key(0), TOKENS)
    want = model.apply(variables, TOKENS)
    for v in (nn.unbox(variables), freeze(nn.unbox(variables))):
        np.testing.assert_array_equal(model.apply(v, TOKENS), want)
    logits, state = model.apply(variables, TOKENS, mutable=["intermediates"])
    assert "intermediates" in state
    np.testing.assert_array_equal(logits, want)
    cache = init_cache(config, 2, 8)
    logits, _ = model.apply(variables, TOKENS, cache, method="extend")
    # Row 0 has no padding (a cache attends to every slot it was given, pad or not).
    np.testing.assert_allclose(logits[0], want[0], rtol=1e-5, atol=1e-6)


def test_the_expected_tree_is_traced_once_per_config():
    config = TransformerConfig(**SMALL, qk_norm=True)
    model = DecoderOnlyTransformer(config)
    variables = model.init(jax.random.key(0), TOKENS)
    model.apply(variables, TOKENS)
    before = _expected_param_paths.cache_info()
    for _ in range(3):
        model.apply(variables, TOKENS)
    DecoderOnlyTransformer(TransformerConfig(**SMALL, qk_norm=True)).apply(variables, TOKENS)
    after = _expected_param_paths.cache_info()
    assert (after.misses, after.hits) == (before.misses, before.hits + 4)


def test_exporters_refuse_params_the_config_does_not_use(tmp_path):
    """export_gpt2 / export_llama wrote only the entries they read: a qk_norm model's
    scales, or biases under a bias-free Llama config, were left out without a word."""
    gpt2 = TransformerConfig(**SMALL, positional="learned", activation="gelu_tanh")
    params = DecoderOnlyTransformer(gpt2.replace(qk_norm=True)).init(jax.random.key(0), TOKENS)
    with pytest.raises(ValueError, match=r"export_gpt2: params hold .*qk_norm=True"):
        export_gpt2(gpt2, params, tmp_path / "gpt2")
    llama = TransformerConfig(
        **SMALL,
        norm="rmsnorm",
        positional="rope",
        activation="swiglu",
        use_bias=False,
        scale_embeddings=False,
    )
    biased = DecoderOnlyTransformer(llama.replace(attention_bias=True))
    params = biased.init(jax.random.key(0), TOKENS)
    with pytest.raises(ValueError, match=r"export_llama: params hold .*attention_bias=True"):
        export_llama(llama, params, tmp_path / "llama")
    assert not (tmp_path / "llama").exists()


def test_torch_import_refuses_a_bias_the_config_would_drop():
    torch = pytest.importorskip("torch")
    from flax_transformer.interop import (
        config_from_torch,
        decoder_only_params_from_torch_encoder,
    )

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 2, 24, dropout=0.0, batch_first=True)
    encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    embedding = torch.nn.Embedding(37, 16)
    config = config_from_torch(encoder, vocab_size=37, max_len=16)
    decoder_only_params_from_torch_encoder(encoder, embedding, config)  # fits
    with pytest.raises(ValueError, match=r"in_proj_bias is a bias.*attention_bias=False"):
        decoder_only_params_from_torch_encoder(
            encoder, embedding, config.replace(attention_bias=False)
        )


def test_gpt2_import_refuses_an_untied_head_under_a_tied_config():
    transformers = pytest.importorskip("transformers")
    hf = transformers.GPT2Config(
        vocab_size=37, n_positions=16, n_embd=16, n_layer=1, n_head=2, tie_word_embeddings=False
    )
    model = transformers.GPT2LMHeadModel(hf)
    from flax_transformer.interop import load_gpt2

    load_gpt2(model)  # untied, as the checkpoint says
    with pytest.raises(ValueError, match=r"lm_head differs .*tie_output_embedding=False"):
        load_gpt2(model, tie_output_embedding=True)
