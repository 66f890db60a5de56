"""Pictures render from a tiny model: valid PNGs of the expected pixel size."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from matplotlib import image as mpimg

from flax_transformer import DecoderOnlyTransformer, Transformer, TransformerConfig
from train import visualize
from train.tokenizer import ByteTokenizer

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _config(**changes):
    return TransformerConfig(
        vocab_size=260,
        d_model=16,
        num_heads=2,
        d_ff=32,
        num_layers=2,
        max_len=32,
        dropout_rate=0.0,
        **changes,
    )


def _expected_pixels(layers, heads):
    width = (heads * visualize.CELL_INCHES + visualize.MARGIN_INCHES) * visualize.DPI
    height = (layers * visualize.CELL_INCHES + visualize.MARGIN_INCHES) * visualize.DPI
    return round(height), round(width)


def _check_png(path, shape=None):
    assert path.read_bytes()[:8] == PNG_MAGIC
    pixels = mpimg.imread(path)
    if shape is not None:
        assert pixels.shape[:2] == shape


@pytest.mark.parametrize("scan", [False, True])
def test_translation_pictures(tmp_path, scan):
    tok = ByteTokenizer()
    src = tok.encode("初めに言があった")  # multi-byte: labels fall back to ids without a CJK font
    tgt = [tok.bos_id, *tok.encode("In the beginning")]
    model = Transformer(_config(scan_layers=scan))
    params = nn.unbox(
        model.init(jax.random.key(0), jnp.ones((1, 4), jnp.int32), jnp.ones((1, 4), jnp.int32))
    )["params"]
    written = visualize.render_all(model, params, tok, src, tgt, tmp_path)
    names = sorted(p.name for p in written)
    assert names == [
        "decoder_cross_attention.png",
        "decoder_self_attention.png",
        "encoder_self_attention.png",
        "positional_encoding.png",
    ]
    for path in written[:-1]:
        _check_png(path, _expected_pixels(2, 2))
    _check_png(tmp_path / "positional_encoding.png", (800, 1000))

    maps = visualize.attention_maps(model, params, jnp.asarray([src]), jnp.asarray([tgt]))
    assert maps["encoder_self"].shape == (2, 2, len(src), len(src))
    assert maps["decoder_cross"].shape == (2, 2, len(tgt), len(src))
    decoder_self = maps["decoder_self"]
    np.testing.assert_allclose(decoder_self.sum(-1), 1.0, rtol=1e-5)
    upper = np.triu(np.ones((len(tgt), len(tgt)), bool), k=1)
    assert np.all(decoder_self[..., upper] == 0.0)  # the causal triangle


def test_language_model_pictures(tmp_path):
    tok = ByteTokenizer()
    ids = [tok.bos_id, *tok.encode("In the beginning God")]
    model = DecoderOnlyTransformer(_config().replace(num_layers=3))
    params = nn.unbox(model.init(jax.random.key(0), jnp.ones((1, 4), jnp.int32)))["params"]
    written = visualize.render_all(model, params, tok, None, ids, tmp_path)
    assert [p.name for p in written] == ["decoder_self_attention.png", "positional_encoding.png"]
    _check_png(written[0], _expected_pixels(3, 2))


def test_token_labels_fall_back_to_ids_without_cjk_font():
    labels = visualize.token_labels(["\u2581In", "神", ""], [40, 41, 42], cjk_font=None)
    assert labels == ["_In", "#41", "#42"]
    assert visualize.token_labels(["神"], [41], cjk_font="IPAGothic") == ["神"]
