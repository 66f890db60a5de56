"""Export to Hugging Face GPT-2: `transformers` loads the directory and gives our logits.

The models are ours, randomly initialised (every parameter perturbed, LayerNorm included, so
that a swapped scale and bias would show); nothing is downloaded. Skipped without torch and
transformers (CI installs them from requirements-torch.txt).
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from flax_transformer import DecoderOnlyTransformer, TransformerConfig
from flax_transformer.interop import export_gpt2, gpt2_tensors

V, D, HEADS, FF, LAYERS, MAX_LEN = 41, 32, 4, 48, 2, 24
PAD = 0
ATOL = RTOL = 1e-4


def _config(**changes) -> TransformerConfig:
    fields = dict(
        vocab_size=V,
        d_model=D,
        num_heads=HEADS,
        d_ff=FF,
        num_layers=LAYERS,
        max_len=MAX_LEN,
        dropout_rate=0.0,
        pad_id=PAD,
        positional="learned",
        activation="gelu_tanh",
        scale_embeddings=False,
    )
    return TransformerConfig(**(fields | changes))


def _random_variables(config: TransformerConfig, seed: int = 0) -> dict:
    """Initialised parameters plus noise on every leaf (norm scales stay near 1)."""
    model = DecoderOnlyTransformer(config)
    params = nn.unbox(model.init(jax.random.key(seed), jnp.ones((1, 4), jnp.int32)))["params"]
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
    noisy = [x + 0.2 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys, strict=True)]
    return {"params": jax.tree.unflatten(tree, noisy)}


def _tokens(seed: int) -> np.ndarray:
    """Token ids without the pad id (GPT-2 does not mask padding; see export.py)."""
    return np.random.default_rng(seed).integers(1, V, (2, 13))


CASES = {
    "learned_tied": {},
    "sinusoidal_scaled_scan": dict(
        positional="sinusoidal", scale_embeddings=True, activation="relu", scan_layers=True
    ),
    "untied_gelu": dict(tie_output_embedding=False, activation="gelu", layer_norm_eps=1e-6),
    "relu2": dict(activation="relu2"),  # transformers' "relu2", ReLU squared
}


@pytest.mark.slow  # transformers models built and run per case
@pytest.mark.parametrize("case", sorted(CASES))
def test_transformers_reproduces_our_logits(case, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = _config(**CASES[case])
    variables = _random_variables(config)
    export_gpt2(config, variables, tmp_path, bos_token_id=2, eos_token_id=3)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["tie_word_embeddings"] == (case in ("learned_tied", "relu2"))
    hf_model = transformers.GPT2LMHeadModel.from_pretrained(tmp_path, local_files_only=True)
    hf_model.eval()
    tokens = _tokens(1)
    with torch.no_grad():
        expected = hf_model(torch.tensor(tokens)).logits.numpy()
    got = DecoderOnlyTransformer(config).apply(variables, jnp.asarray(tokens))
    np.testing.assert_allclose(np.asarray(got), expected, atol=ATOL, rtol=RTOL)


def test_exported_tensors_are_gpt2_names_and_shapes():
    config = _config()
    tensors = gpt2_tensors(config, _random_variables(config))
    assert tensors["transformer.wte.weight"].shape == (V, D)
    assert tensors["transformer.wpe.weight"].shape == (MAX_LEN, D)
    assert tensors["transformer.h.1.attn.c_attn.weight"].shape == (D, 3 * D)
    assert tensors["transformer.h.0.mlp.c_proj.weight"].shape == (FF, D)
    assert "lm_head.weight" not in tensors  # tied: transformers reuses wte
    per_layer = 12
    assert len(tensors) == 2 + per_layer * LAYERS + 2


@pytest.mark.parametrize(
    "changes, named",
    [
        (dict(norm="rmsnorm"), "norm='rmsnorm' (needs 'layernorm')"),
        (dict(activation="swiglu"), "activation='swiglu'"),
        (dict(norm_position="post"), "norm_position='post' (needs 'pre')"),
        (dict(attention_bias=False), "attention_bias=False (needs True)"),
        (dict(output_bias=True), "output_bias=True (needs False)"),
        (dict(qk_norm=True), "qk_norm=True (needs False)"),
        (dict(logits_soft_cap=30.0), "logits_soft_cap=30.0 (needs 0.0)"),
    ],
)
def test_options_gpt2_cannot_hold_are_named(changes, named, tmp_path):
    config = _config(**changes)
    with pytest.raises(ValueError, match="GPT-2's layout cannot hold") as err:
        export_gpt2(config, _random_variables(config), tmp_path)
    assert named in str(err.value)
    assert not list(tmp_path.iterdir())  # refused before writing anything
