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
from matplotlib import pyplot as plt

from flax_transformer import DecoderOnlyTransformer, Transformer, TransformerConfig
from train import visualize
from train.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, ByteTokenizer
from train.tasks import get_task, task_of
from train.tools import attention_figures, attention_recording

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


def _check_png(path, shape=None):
    """A valid PNG; returns its (height, width) in pixels."""
    assert path.read_bytes()[:8] == PNG_MAGIC
    pixels = mpimg.imread(path)
    if shape is not None:
        assert pixels.shape[:2] == shape
    return pixels.shape[:2]


@pytest.mark.slow  # test_language_model_pictures keeps the pictures in the quick run
@pytest.mark.parametrize("scan", [False, True])
def test_translation_pictures(tmp_path, scan):
    tok = ByteTokenizer()
    src = tok.encode("初めに言があった")  # multi-byte: labels fall back to ids without a CJK font
    tgt = [tok.bos_id, *tok.encode("In the beginning")]
    model = Transformer(_config(scan_layers=scan))
    params = nn.unbox(
        model.init(jax.random.key(0), jnp.ones((1, 4), jnp.int32), jnp.ones((1, 4), jnp.int32))
    )["params"]
    written = attention_figures.render_all(model, params, tok, src, tgt, tmp_path)
    names = sorted(p.name for p in written)
    assert names == [
        "decoder_cross_attention.png",
        "decoder_self_attention.png",
        "encoder_self_attention.png",
        "positional_encoding.png",
    ]
    sizes = [_check_png(path) for path in written[:-1]]
    assert all(height > 400 and width > 500 for height, width in sizes)
    _check_png(tmp_path / "positional_encoding.png", (800, 1000))

    maps = attention_recording.attention_maps(model, params, jnp.asarray([src]), jnp.asarray([tgt]))
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
    written = attention_figures.render_all(model, params, tok, None, ids, tmp_path)
    assert [p.name for p in written] == ["decoder_self_attention.png", "positional_encoding.png"]
    height, width = _check_png(written[0])
    assert height > width  # 3 layers (rows) of 2 heads (columns)


def test_attention_figure_has_one_colour_scale_a_colour_bar_and_axis_titles():
    weights = np.random.default_rng(0).dirichlet(np.ones(5), size=(2, 3, 4))  # (L, N, T, S)
    fig = attention_figures.attention_figure(
        weights, list("abcd"), list("vwxyz"), "cross", ("decoder input", "source")
    )
    panels = [ax for ax in fig.axes if ax.images]
    assert len(panels) == 6 and len(fig.axes) == 7  # one colour bar for all six
    assert {ax.images[0].get_clim() for ax in panels} == {(0.0, 1.0)}
    bar = next(ax for ax in fig.axes if not ax.images)
    assert "attention weight" in bar.get_ylabel()
    assert {ax.get_xlabel() for ax in panels[-3:]} == {"source"}  # the last layer's row
    assert {ax.get_ylabel() for ax in panels[::3]} == {"decoder input"}  # the first column
    sizes = {t.get_fontsize() for ax in panels for t in ax.get_xticklabels() + ax.get_yticklabels()}
    assert min(sizes) >= attention_figures.TICK_FONT_SIZE >= 8
    assert [t.get_text() for t in panels[0].get_xticklabels()] == list("vwxyz")
    plt.close(fig)


def test_panels_grow_with_the_tokens_so_labels_stay_apart():
    def inches(tokens):
        weights = np.full((1, 1, tokens, tokens), 1.0 / tokens)
        labels = [f"t{i}" for i in range(tokens)]
        fig = attention_figures.attention_figure(weights, labels, labels, "self")
        width, height = fig.get_size_inches()
        plt.close(fig)
        return width, height

    small, large = inches(5), inches(40)
    assert small[0] == pytest.approx(
        attention_figures.PANEL_INCHES
        + attention_figures.MARGIN_INCHES[0]
        + attention_figures.COLOURBAR_INCHES
    )
    assert large[0] - small[0] == pytest.approx(
        40 * attention_figures.TOKEN_INCHES - attention_figures.PANEL_INCHES
    )
    assert large[1] > small[1]


def test_positional_curves_spread_from_fast_to_slow_pairs():
    assert attention_recording.curve_dims(128) == [0, 32, 64, 94, 126]  # pairs 0, 16, 32, 47, 63
    assert attention_recording.curve_dims(4) == [0, 2]
    periods = [2 * np.pi * 10000 ** (d / 128) for d in attention_recording.curve_dims(128)]
    assert periods[0] == pytest.approx(2 * np.pi) and periods[-1] > 50_000


def test_token_labels_fall_back_to_ids_without_cjk_font():
    labels = attention_figures.token_labels(["\u2581In", "神", ""], [40, 41, 42], cjk_font=None)
    assert labels == ["_In", "#41", "#42"]
    assert attention_figures.token_labels(["神"], [41], cjk_font="IPAGothic") == ["神"]


def test_the_runs_task_says_what_the_text_is_and_whether_a_target_may_be_given():
    """The CLI asks the run's Task, not the model's class: a translation's text is the
    source, a language model's the prompt; only translation takes --target."""
    tok, model, lm_model = (
        ByteTokenizer(),
        Transformer(_config()),
        DecoderOnlyTransformer(_config()),
    )
    translation, lm = get_task("translation"), get_task("lm")
    assert translation.shown_prompt(tok, [70, 71]) == ([70, 71], [BOS_ID])
    assert lm.shown_prompt(tok, [70, 71]) == (None, [BOS_ID, 70, 71])
    assert visualize.given_target_ids(translation, model, tok, "ab", "c") == (
        tok.encode("ab"),
        [BOS_ID, *tok.encode("c")],
    )
    with pytest.raises(ValueError, match="--target is for translation runs"):
        visualize.given_target_ids(lm, lm_model, tok, "ab", "c")
    assert task_of(model) is translation and task_of(lm_model) is lm


def test_tick_labels_name_the_special_ids():
    tok = ByteTokenizer()
    ids = [PAD_ID, BOS_ID, EOS_ID, UNK_ID, tok.encode("A")[0]]
    assert attention_figures.tick_labels(tok, ids, cjk_font=None) == [
        "<pad>",
        "<s>",
        "</s>",
        "<unk>",
        "A",
    ]


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
        # Each case starts a process (~3 s, most of it importing jax); the quick run keeps one.
        pytest.param(
            ["--workdir", "somewhere"], "--text must have a value", marks=pytest.mark.slow
        ),
        pytest.param(
            ["--workdir", "somewhere", "--text", "a", "--max_new_tokens=x"],
            "--max_new_tokens",
            marks=pytest.mark.slow,
        ),
        (["--text", "a", "--workdir", "{tmp}/none"], "is not a training run directory"),
        pytest.param(
            ["--text", "a", "--workdir", "{tmp}", "extra"],
            "unexpected arguments ['extra']",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_cli_errors_are_one_line_with_the_usage_status(tmp_path, args, message):
    result = _visualize_cli(*(a.format(tmp=tmp_path) for a in args))
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr
    assert lines[-1].startswith("error: ") and message in lines[-1], result.stderr
    assert "Traceback" not in result.stderr
