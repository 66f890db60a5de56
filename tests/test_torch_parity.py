"""Parity with torch: imported weights give torch's logits (1e-4, float32) and generations.

The torch models are built locally with random weights (nothing is downloaded). Skipped
when torch (or, for GPT-2, transformers) is not installed; CI installs them from
requirements-torch.txt.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_transformer import DecoderOnlyTransformer, Transformer, generate_text
from flax_transformer.functional import sinusoidal_positions
from flax_transformer.interop import (
    config_from_torch,
    decoder_only_params_from_torch_encoder,
    load_gpt2,
    transformer_params_from_torch,
)

torch = pytest.importorskip("torch")
nn = torch.nn

V, D, HEADS, FF, MAX_LEN = 23, 16, 2, 32, 24
ATOL = RTOL = 1e-4


def _randomize(module, seed):
    """Random values in every parameter, norms included (torch inits LayerNorm to 1 and 0,
    which would hide a swapped scale/bias)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            is_norm_scale = "norm" in name and name.endswith("weight")
            p.copy_(1.0 + 0.2 * noise if is_norm_scale else 0.3 * noise)
    return module.eval()


def _causal(length):
    """torch's bool attention mask: True where a query may NOT look (the future)."""
    return torch.ones(length, length, dtype=torch.bool).triu(1)


def _tokens(seed, shape, low=1):
    return np.random.default_rng(seed).integers(low, V, shape).astype(np.int64)


class TorchSeq2Seq(nn.Module):
    """The reference around nn.Transformer: shared embedding * sqrt(D), our sinusoidal
    positions, tied output logits."""

    def __init__(self, norm_first):
        super().__init__()
        self.embed = nn.Embedding(V, D)
        table = np.asarray(sinusoidal_positions(MAX_LEN, D))
        self.register_buffer("pe", torch.tensor(table))
        self.transformer = nn.Transformer(
            D, HEADS, 2, 3, FF, dropout=0.0, batch_first=True, norm_first=norm_first
        )

    def forward(self, src, tgt, pad_id=0):
        def embed(ids):
            return self.embed(ids) * math.sqrt(D) + self.pe[: ids.shape[1]]

        causal = _causal(tgt.shape[1])
        y = self.transformer(
            embed(src),
            embed(tgt),
            tgt_mask=causal,
            tgt_is_causal=True,
            src_key_padding_mask=src == pad_id,
            tgt_key_padding_mask=tgt == pad_id,
            memory_key_padding_mask=src == pad_id,
        )
        return y @ self.embed.weight.T


class TorchCausalLM(nn.Module):
    """GPT-style torch model: nn.TransformerEncoder run causally, learned positions."""

    def __init__(self, norm_first):
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.pos = nn.Parameter(torch.zeros(MAX_LEN, D))
        layer = nn.TransformerEncoderLayer(
            D, HEADS, FF, 0.0, activation="gelu", batch_first=True, norm_first=norm_first
        )
        final = nn.LayerNorm(D) if norm_first else None
        self.stack = nn.TransformerEncoder(layer, 2, norm=final, enable_nested_tensor=False)

    def forward(self, ids):
        causal = _causal(ids.shape[1])
        h = self.stack(self.embed(ids) + self.pos[: ids.shape[1]], mask=causal, is_causal=True)
        return h @ self.embed.weight.T


# Post- and pre-norm, unrolled and scanned; the quick run keeps two that between them cover
# both norms and both layer loops, the full run all four.
_NORM_AND_SCAN = [
    pytest.param(False, False, id="post_norm-unrolled"),
    pytest.param(False, True, id="post_norm-scan", marks=pytest.mark.slow),
    pytest.param(True, False, id="pre_norm-unrolled", marks=pytest.mark.slow),
    pytest.param(True, True, id="pre_norm-scan"),
]


@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")
@pytest.mark.parametrize("norm_first, scan_layers", _NORM_AND_SCAN)
def test_torch_transformer_logits(norm_first, scan_layers):
    ref = _randomize(TorchSeq2Seq(norm_first), seed=1)
    config = config_from_torch(
        ref.transformer, vocab_size=V, max_len=MAX_LEN, scan_layers=scan_layers
    )
    assert config.final_norm and config.norm_position == ("pre" if norm_first else "post")
    variables = transformer_params_from_torch(ref.transformer, ref.embed, config)
    src, tgt = _tokens(2, (2, 7)), _tokens(3, (2, 5))
    src[1, 5:], tgt[1, 3:] = 0, 0  # right padding (pad_id 0), masked on both sides
    with torch.no_grad():
        expected = ref(torch.tensor(src), torch.tensor(tgt)).numpy()
    got = jax.jit(Transformer(config).apply)(variables, jnp.asarray(src), jnp.asarray(tgt))
    real = tgt != 0  # torch and we differ only at padded query rows, which nothing reads
    np.testing.assert_allclose(np.asarray(got)[real], expected[real], atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("norm_first, scan_layers", _NORM_AND_SCAN)
def test_torch_causal_encoder_logits(norm_first, scan_layers):
    ref = _randomize(TorchCausalLM(norm_first), seed=4)
    config = config_from_torch(
        ref.stack,
        vocab_size=V,
        max_len=MAX_LEN,
        positional="learned",
        scale_embeddings=False,
        scan_layers=scan_layers,
    )
    assert config.activation == "gelu" and config.final_norm == norm_first
    variables = decoder_only_params_from_torch_encoder(
        ref.stack, ref.embed, config, positions=ref.pos
    )
    tokens = _tokens(5, (2, 9))
    with torch.no_grad():
        expected = ref(torch.tensor(tokens)).numpy()
    got = jax.jit(DecoderOnlyTransformer(config).apply)(variables, jnp.asarray(tokens))
    np.testing.assert_allclose(np.asarray(got), expected, atol=ATOL, rtol=RTOL)


def test_mismatched_config_is_rejected():
    ref = TorchCausalLM(norm_first=True).eval()
    config = config_from_torch(ref.stack, vocab_size=V, max_len=MAX_LEN, positional="learned")
    with pytest.raises(ValueError, match="num_heads"):
        decoder_only_params_from_torch_encoder(
            ref.stack, ref.embed, config.replace(num_heads=4), positions=ref.pos
        )
    with pytest.raises(ValueError, match="final_norm"):
        decoder_only_params_from_torch_encoder(
            ref.stack, ref.embed, config.replace(final_norm=False), positions=ref.pos
        )
    with pytest.raises(ValueError, match="embedding"):
        decoder_only_params_from_torch_encoder(ref.stack, ref.pos, config, positions=ref.pos)


# GPT-2 --------------------------------------------------------------------------------------

GPT2_VOCAB = 97


def _gpt2():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf_config = transformers.GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=4,
        vocab_size=GPT2_VOCAB,
        n_positions=64,
        bos_token_id=None,  # GPT-2's 50256 is outside this tiny vocabulary; no EOS stop
        eos_token_id=None,
        # Wider than GPT-2's 0.02, so that greedy choices are not near-ties.
        initializer_range=0.2,
    )
    model = transformers.GPT2LMHeadModel(hf_config).eval()
    with torch.no_grad():  # random LayerNorm gains and shifts too (init would be 1 and 0)
        for name, p in model.named_parameters():
            if ".ln_" in name:
                p.copy_(torch.randn(p.shape) * 0.2 + (1.0 if name.endswith("weight") else 0.0))
    return model


@pytest.mark.parametrize(
    "source, scan_layers", [("object", False), ("directory", True)], ids=["object", "directory"]
)
def test_gpt2_logits(tmp_path, source, scan_layers):
    hf_model = _gpt2()
    if source == "directory":
        hf_model.save_pretrained(tmp_path)
    config, variables = load_gpt2(
        tmp_path if source == "directory" else hf_model, scan_layers=scan_layers
    )
    assert (config.vocab_size, config.pad_id) == (GPT2_VOCAB + 1, GPT2_VOCAB)
    tokens = np.random.default_rng(6).integers(0, GPT2_VOCAB, (2, 11))
    tokens[:, [0, 4]] = 0  # id 0 is a real GPT-2 token: it must not be masked as padding
    with torch.no_grad():
        expected = hf_model(torch.tensor(tokens)).logits.numpy()
    got = jax.jit(DecoderOnlyTransformer(config).apply)(variables, jnp.asarray(tokens))
    assert got.shape == (2, 11, GPT2_VOCAB + 1)
    np.testing.assert_allclose(np.asarray(got)[..., :GPT2_VOCAB], expected, atol=ATOL, rtol=RTOL)


def test_gpt2_greedy_generation():
    hf_model = _gpt2()
    config, variables = load_gpt2(hf_model)
    steps, lengths = 12, [6, 3]
    prompts = np.full((2, max(lengths)), config.pad_id)  # right-padded with our pad id
    prompts[0] = [5, 0, 17, 0, 42, 8]
    prompts[1, :3] = [0, 63, 0]
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
                pad_token_id=GPT2_VOCAB - 1,  # unused (no EOS), but generate asks for one
            )
        np.testing.assert_array_equal(np.asarray(ours[row]), out[0, length:].numpy())
