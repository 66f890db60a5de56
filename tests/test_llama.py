"""Hugging Face Llama in and out: logits within 1e-4 (float32), greedy generations equal.

Random local models only (nothing is downloaded), with grouped-query attention and rotary
positions on. Skipped without torch and transformers (CI installs requirements-torch.txt).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from flax_transformer import (
    DecoderOnlyTransformer,
    TransformerConfig,
    export_llama,
    generate_text,
    llama_config,
    load_llama,
)
from flax_transformer.interop.llama import EXPORTED_PAD_KEY

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

V, D, HEADS, FF, LAYERS, MAX_LEN = 61, 32, 4, 40, 2, 48
ATOL = RTOL = 1e-4


def _hf_llama(kv_heads=2, tie=False, model_type="llama", seed=0):
    """A random tiny Llama (or Mistral) with every weight perturbed, norms included."""
    torch.manual_seed(seed)
    fields = dict(
        vocab_size=V,
        hidden_size=D,
        intermediate_size=FF,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=kv_heads,
        max_position_embeddings=MAX_LEN,
        rms_norm_eps=1e-6,
        tie_word_embeddings=tie,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        rope_theta=500.0,  # far from the 10000 default: a wrong base shows in the logits
    )
    if model_type == "mistral":
        config = transformers.MistralConfig(sliding_window=None, **fields)
        model = transformers.MistralForCausalLM(config)
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**fields))
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape) * 0.2
            p.copy_(1.0 + noise if "norm" in name else p + noise)
    return model.eval()


def _tokens(seed, shape=(2, 17)):
    """Token ids, 0 included: imported models pad with an extra id, so every id is real."""
    tokens = np.random.default_rng(seed).integers(0, V, shape)
    tokens[:, ::5] = 0
    return tokens


def _hf_logits(model, tokens):
    with torch.no_grad():
        return model(torch.tensor(tokens)).logits.numpy()


CASES = {
    "gqa": dict(kv_heads=2),
    "mqa_tied": dict(kv_heads=1, tie=True),
    "mha": dict(kv_heads=HEADS),
    "mistral": dict(kv_heads=2, model_type="mistral"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_load_llama_logits(case):
    hf_model = _hf_llama(**CASES[case])
    config, variables = load_llama(hf_model)
    assert config.positional == "rope" and config.rope_base == 500.0
    assert config.kv_heads == CASES[case]["kv_heads"]
    assert (config.vocab_size, config.pad_id) == (V + 1, V)
    tokens = _tokens(1)
    got = jax.jit(DecoderOnlyTransformer(config).apply)(variables, jnp.asarray(tokens))
    expected = _hf_logits(hf_model, tokens)
    np.testing.assert_allclose(np.asarray(got)[..., :V], expected, atol=ATOL, rtol=RTOL)


def test_load_llama_from_a_directory_with_scanned_layers(tmp_path):
    hf_model = _hf_llama()
    hf_model.save_pretrained(tmp_path)
    config, variables = load_llama(tmp_path, scan_layers=True)
    tokens = _tokens(2)
    got = DecoderOnlyTransformer(config).apply(variables, jnp.asarray(tokens))
    expected = _hf_logits(hf_model, tokens)
    np.testing.assert_allclose(np.asarray(got)[..., :V], expected, atol=ATOL, rtol=RTOL)


def test_greedy_generation_equals_transformers():
    hf_model = _hf_llama(kv_heads=2)
    config, variables = load_llama(hf_model)
    steps, lengths = 14, [7, 3]
    prompts = np.full((2, max(lengths)), config.pad_id)  # right-padded with our pad id
    prompts[0] = _tokens(3, (1, 7))[0]
    prompts[1, :3] = _tokens(4, (1, 3))[0]
    ours = generate_text(
        DecoderOnlyTransformer(config),
        variables,
        jnp.asarray(prompts),
        jnp.asarray(lengths),
        eos_id=None,
        max_new_tokens=steps,
    )
    for row, length in enumerate(lengths):
        prompt = torch.tensor(prompts[row : row + 1, :length])
        with torch.no_grad():
            out = hf_model.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                do_sample=False,
                max_new_tokens=steps,
                pad_token_id=0,
            )
        np.testing.assert_array_equal(np.asarray(ours[row]), out[0, length:].numpy())


def _our_llama(**changes) -> TransformerConfig:
    fields = dict(
        vocab_size=V,
        d_model=D,
        num_heads=HEADS,
        num_kv_heads=2,
        d_ff=FF,
        num_layers=LAYERS,
        max_len=MAX_LEN,
        dropout_rate=0.0,
        norm="rmsnorm",
        positional="rope",
        rope_base=1000.0,
        activation="swiglu",
        use_bias=False,
        scale_embeddings=False,
        tie_output_embedding=False,
    )
    return TransformerConfig(**(fields | changes))


# Two exports through transformers; test_load_llama_logits keeps the import in the quick run.
@pytest.mark.slow
@pytest.mark.parametrize(
    "changes", [{}, dict(tie_output_embedding=True, num_kv_heads=1, scan_layers=True)]
)
def test_export_llama_round_trip(changes, tmp_path):
    config = _our_llama(**changes)
    model = DecoderOnlyTransformer(config)
    params = nn.unbox(model.init(jax.random.key(0), jnp.ones((1, 4), jnp.int32)))["params"]
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    noisy = [x + 0.2 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys, strict=True)]
    variables = {"params": jax.tree.unflatten(tree, noisy)}
    export_llama(config, variables, tmp_path, bos_token_id=1, eos_token_id=2)
    hf_model = transformers.LlamaForCausalLM.from_pretrained(tmp_path, local_files_only=True)
    # Our model masks its pad id 0, the exported Llama does not: compare without it.
    tokens = np.random.default_rng(5).integers(1, V, (2, 17))
    ours = np.asarray(model.apply(variables, jnp.asarray(tokens)))
    np.testing.assert_allclose(_hf_logits(hf_model.eval(), tokens), ours, atol=ATOL, rtol=RTOL)
    # And back: load_llama of the exported directory gives the same parameters and keeps
    # the model's padding (pad id 0 of V, recorded by the export), with no added id.
    config_back, variables_back = load_llama(tmp_path, scan_layers=config.scan_layers)
    assert (config_back.kv_heads, config_back.rope_base) == (config.kv_heads, 1000.0)
    assert (config_back.vocab_size, config_back.pad_id) == (V, config.pad_id) == (V, 0)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6),
        variables_back,
        variables,
    )


def test_llama_config_keeps_the_pad_id_export_llama_recorded():
    fields = dict(
        vocab_size=V, hidden_size=D, intermediate_size=FF, num_hidden_layers=1,
        num_attention_heads=HEADS, pad_token_id=0,
    )  # fmt: skip
    foreign = llama_config(transformers.LlamaConfig(**fields))
    assert (foreign.vocab_size, foreign.pad_id) == (V + 1, V)  # pad_token_id alone: not ours
    ours = llama_config(transformers.LlamaConfig(**fields, **{EXPORTED_PAD_KEY: 0}))
    assert (ours.vocab_size, ours.pad_id) == (V, 0)


@pytest.mark.parametrize(
    "changes, named",
    [
        (dict(norm="layernorm"), "norm='layernorm' (needs 'rmsnorm')"),
        (dict(positional="learned"), "positional='learned' (needs 'rope')"),
        (dict(activation="relu"), "activation='relu'"),
        (dict(use_bias=True), "attention_bias (or use_bias)=True"),
        (dict(qk_norm=True), "qk_norm=True (needs False)"),
        (dict(logits_soft_cap=30.0), "logits_soft_cap=30.0 (needs 0.0)"),
        (dict(activation="relu2"), "activation='relu2'"),
    ],
)
def test_export_llama_names_what_llama_cannot_hold(changes, named, tmp_path):
    config = _our_llama(**changes)
    variables = DecoderOnlyTransformer(config).init(jax.random.key(0), jnp.ones((1, 4), jnp.int32))
    with pytest.raises(ValueError, match="Llama's layout cannot hold") as err:
        export_llama(config, variables, tmp_path)
    assert named in str(err.value)
    assert not list(tmp_path.iterdir())


def test_scaled_rope_and_biases_are_refused():
    config = transformers.LlamaConfig(
        vocab_size=V,
        hidden_size=D,
        intermediate_size=FF,
        num_hidden_layers=1,
        num_attention_heads=HEADS,
        attention_bias=True,
        rope_scaling={"rope_type": "linear", "factor": 2.0},
    )
    with pytest.raises(ValueError, match="llama checkpoint not supported") as err:
        load_llama(transformers.LlamaForCausalLM(config))
    assert "rope type 'linear'" in str(err.value) and "attention_bias" in str(err.value)
