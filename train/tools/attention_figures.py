"""PNG pictures of one example's attention, and of the sinusoidal positional encoding.

  encoder_self_attention.png    rows = layers, columns = heads; source x source
  decoder_self_attention.png    decoder input x decoder input: the causal triangle
  decoder_cross_attention.png   decoder input (rows) x source (columns)
  positional_encoding.png       the sinusoidal table as a heatmap, plus fast to slow pairs

Every panel of a figure shares one colour scale, 0 to 1, shown by a colour bar; axis
titles say which side is the source and which the decoder input (whose row t predicts
token t+1). Tick labels are the tokens. Japanese tokens need a CJK font (Debian:
fonts-noto-cjk); when none is installed they are shown as their ids (`#123`) so the grid
stays readable.
"""

from __future__ import annotations

import math
import pathlib
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")  # files only, no screen

import numpy as np  # noqa: E402
from flax import linen as nn  # noqa: E402
from matplotlib import font_manager  # noqa: E402
from matplotlib import pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from flax_transformer import sinusoidal_positions  # noqa: E402
from flax_transformer.functional.positions import DEFAULT_BASE  # noqa: E402
from train.core.rundir import atomic_savefig  # noqa: E402
from train.tasks import task_of  # noqa: E402
from train.tools.attention_recording import (  # noqa: E402
    ATTENTION_KINDS,
    attention_maps,
    curve_dims,
    token_pieces,
)

DPI = 100

PANEL_INCHES = 2.4  # each heatmap panel is at least this square ...

TOKEN_INCHES = 0.16  # ... and grows by this per token beyond, so 8-pt labels stay apart

MARGIN_INCHES = (1.6, 1.0)  # (width, height) beyond the panels: labels, titles

COLOURBAR_INCHES = 0.9

TICK_FONT_SIZE = 8

MAX_TICKS = 48  # beyond this many tokens, tick labels are thinned

CJK_FONT_NAMES = (
    "Noto Sans CJK JP",
    "Noto Sans CJK SC",
    "IPAGothic",
    "IPAexGothic",
    "TakaoGothic",
    "WenQuanYi Micro Hei",
    "Droid Sans Fallback",
)


def _cjk_font() -> str | None:
    installed = {f.name for f in font_manager.fontManager.ttflist}
    return next((name for name in CJK_FONT_NAMES if name in installed), None)


def token_labels(pieces: Sequence[str], ids: Sequence[int], cjk_font: str | None) -> list[str]:
    """Readable tick labels: the token text, or `#id` where the font cannot draw it."""
    labels = []
    for piece, token in zip(pieces, ids, strict=True):
        text = piece.replace("\u2581", "_").strip() or f"#{token}"
        if cjk_font is None and any(ord(ch) > 0x24F for ch in text):
            text = f"#{token}"
        labels.append(text)
    return labels


def tick_labels(tokenizer, ids: Sequence[int], cjk_font: str | None) -> list[str]:
    """The tick labels of token ids: their pieces (`<pad>`, `<s>`, `</s>`, `<unk>` for the
    special ids), made readable by `token_labels`."""
    return token_labels(token_pieces(tokenizer, ids), ids, cjk_font)


def attention_figure(
    weights_LNTS: np.ndarray,
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    title: str,
    axis_titles: tuple[str, str] = ("queries", "keys"),
    font: str | None = None,
    vmax: float = 1.0,
) -> Figure:
    """One heatmap per (layer, head), rows = queries, columns = keys, on one colour scale
    from 0 to `vmax` (1: a weight's whole range, so that maps compare) with a colour bar.

    Args:
        weights_LNTS: `(L, N, T, S)` attention weights.
        row_labels, col_labels: the T query and S key tokens.
        title: the figure's title.
        axis_titles: (rows, columns), e.g. ("decoder input (queries)", "source (keys)").
        font: a font family for the labels (a CJK one for Japanese), or None.
        vmax: the weight drawn brightest.
    """
    layers, heads, rows, cols = weights_LNTS.shape
    panel = max(PANEL_INCHES, TOKEN_INCHES * max(rows, cols))
    size = (
        heads * panel + MARGIN_INCHES[0] + COLOURBAR_INCHES,
        layers * panel + MARGIN_INCHES[1] + panel * 0.15 * layers,
    )
    fig, axes = plt.subplots(layers, heads, figsize=size, squeeze=False, layout="constrained")
    font_kw = {"fontfamily": font} if font else {}
    step_r = -(-rows // MAX_TICKS)
    step_c = -(-cols // MAX_TICKS)
    image = None
    for layer in range(layers):
        for head in range(heads):
            ax = axes[layer][head]
            image = ax.imshow(
                weights_LNTS[layer, head],
                vmin=0.0,
                vmax=vmax,
                cmap="viridis",
                aspect="auto",
                interpolation="nearest",
            )
            ax.set_title(f"layer {layer}, head {head}", fontsize=9)
            ax.set_xticks(range(0, cols, step_c))
            ax.set_xticklabels(
                col_labels[::step_c], rotation=90, fontsize=TICK_FONT_SIZE, **font_kw
            )
            ax.set_yticks(range(0, rows, step_r))
            ax.set_yticklabels(row_labels[::step_r], fontsize=TICK_FONT_SIZE, **font_kw)
            if layer == layers - 1:
                ax.set_xlabel(axis_titles[1], fontsize=9)
            if head == 0:
                ax.set_ylabel(axis_titles[0], fontsize=9)
    bar = fig.colorbar(image, ax=axes, shrink=min(1.0, 4.0 / size[1] + 0.3), pad=0.02)
    bar.set_label("attention weight (one scale for every panel)", fontsize=9)
    fig.suptitle(title, fontsize=11)
    return fig


def plot_attention_grid(
    weights_LNTS: np.ndarray,
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    title: str,
    path: pathlib.Path,
    font: str | None = None,
    axis_titles: tuple[str, str] = ("queries", "keys"),
) -> pathlib.Path:
    """Writes `attention_figure` to `path` (PNG). Returns `path`."""
    fig = attention_figure(weights_LNTS, row_labels, col_labels, title, axis_titles, font)
    atomic_savefig(fig, path, dpi=DPI)
    plt.close(fig)
    return path


def plot_positional_encoding(length: int, dim: int, path: pathlib.Path) -> pathlib.Path:
    """The sinusoidal table `(length, dim)` as a heatmap, and fast to slow pairs as curves."""
    table = np.asarray(sinusoidal_positions(length, dim))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 8))
    image = top.imshow(
        table.T, aspect="auto", cmap="RdBu", vmin=-1, vmax=1, interpolation="nearest"
    )
    top.set_xlabel("position")
    top.set_ylabel("dimension")
    top.set_title(f"sinusoidal positional encoding ({length} positions x {dim} dimensions)")
    fig.colorbar(image, ax=top)
    for d in curve_dims(dim):
        period = 2 * math.pi * DEFAULT_BASE ** (d / dim)
        bottom.plot(table[:, d], label=f"dim {d} (sin), period {period:,.0f}")
    bottom.set_xlabel("position")
    bottom.legend(fontsize=8, ncol=3)
    bottom.set_title("pairs from fast to slow: slow ones change little over these positions")
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=DPI)
    plt.close(fig)
    return path


def render_all(
    model: nn.Module,
    params,
    tokenizer,
    src_ids: Sequence[int] | None,
    tgt_ids: Sequence[int],
    out: pathlib.Path,
) -> list[pathlib.Path]:
    """Every picture for one example. `tgt_ids` are the decoder (or LM) input ids; `params`
    is `model.init`'s output or its `['params']`."""
    out.mkdir(parents=True, exist_ok=True)
    font = _cjk_font()

    def labels(ids):
        return tick_labels(tokenizer, ids, font)

    task = task_of(model)
    maps = attention_maps(model, params, *task.shown_inputs(src_ids, tgt_ids))
    t_labels = labels(tgt_ids)
    s_labels = labels(src_ids) if src_ids is not None else t_labels
    target = task.decoder_input
    written = []
    for name, rows, cols, axis_titles in (
        ("encoder_self", s_labels, s_labels, ("source (queries)", "source (keys)")),
        ("decoder_self", t_labels, t_labels, (f"{target} (queries)", f"{target} (keys)")),
        ("decoder_cross", t_labels, s_labels, (f"{target} (queries)", "source (keys)")),
    ):
        if name in maps:
            title = ATTENTION_KINDS[name][2]
            if name != "encoder_self":
                title += f": the output of {target} row t predicts token t+1"
            written.append(
                plot_attention_grid(
                    maps[name],
                    rows,
                    cols,
                    title,
                    out / f"{name}_attention.png",
                    font,
                    axis_titles,
                )  # fmt: skip
            )
    config = model.config
    written.append(
        plot_positional_encoding(
            min(config.max_len, 128), config.d_model, out / "positional_encoding.png"
        )
    )
    return written
