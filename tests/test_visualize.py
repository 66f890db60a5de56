"""Pictures render from a tiny model: valid PNGs of the expected pixel size."""

import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from matplotlib import image as mpimg

from flax_transformer import DecoderOnlyTransformer, Transformer, TransformerConfig
from train import visualize
from train.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, ByteTokenizer

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


def test_tick_labels_name_the_special_ids():
    tok = ByteTokenizer()
    ids = [PAD_ID, BOS_ID, EOS_ID, UNK_ID, tok.encode("A")[0]]
    assert visualize.tick_labels(tok, ids, cjk_font=None) == ["<pad>", "<s>", "</s>", "<unk>", "A"]


def _visualize_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "train.visualize", *args],
        capture_output=True,
        text=True,
        cwd=pathlib.Path(__file__).parent.parent,
        timeout=120,
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--workdir", "somewhere"], "--text must have a value"),
        (["--workdir", "somewhere", "--text", "a", "--max_new_tokens=x"], "--max_new_tokens"),
        (["--text", "a", "--workdir", "{tmp}/none"], "is not a training run directory"),
        (["--text", "a", "--workdir", "{tmp}", "extra"], "unexpected arguments ['extra']"),
    ],
)
def test_cli_errors_are_one_line_with_the_usage_status(tmp_path, args, message):
    result = _visualize_cli(*(a.format(tmp=tmp_path) for a in args))
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr
    assert lines[-1].startswith("error: ") and message in lines[-1], result.stderr
    assert "Traceback" not in result.stderr
