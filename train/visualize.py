"""Pictures of a trained model: attention maps per layer and head, and the positional encoding.

    python -m train.visualize --workdir runs/default --text "初に神天地を創造たまへり"
    python -m train.visualize --workdir runs/lm_kjv --text "In the beginning"

For a translation run the source is translated greedily (or, with `--target`, the given
target is fed to the decoder: teacher forcing), then one forward pass over (source, BOS +
target) records every attention; for a language model the prompt is continued and the
whole sequence is passed once. PNG files go to `--out` (default `WORKDIR/pictures`):

  encoder_self_attention.png    rows = layers, columns = heads; source x source
  decoder_self_attention.png    decoder input x decoder input: the causal triangle
  decoder_cross_attention.png   decoder input (rows) x source (columns)
  positional_encoding.png       the sinusoidal table as a heatmap, plus fast to slow pairs

Every panel of a figure shares one colour scale, 0 to 1, shown by a colour bar; axis
titles say which side is the source and which the decoder input (whose row t predicts
token t+1). Tick labels are the tokens. Japanese tokens need a CJK font (Debian:
fonts-noto-cjk); when none is installed they are shown as their ids (`#123`) so the grid
stays readable.

With `--html` the same example goes into the attention explorer instead: one interactive,
self-contained HTML page (inline JS/CSS, no network; `--out` names the file, default
`WORKDIR/pictures/explorer.html`; library: `render_explorer`, which takes `model.init`'s
output or its `['params']`):

    python -m train.visualize --workdir runs/default --text "In the beginning" --html

The page shows every attention the model sows into 'intermediates' (encoder self-attention,
decoder causal self-attention and cross-attention for translation; causal self-attention for
the language model): a head view (lines between the tokenizer's pieces, one layer and head
at a time or all heads overlaid), a heatmap with token labels and a colour bar (fixed 0-1,
or each map's own maximum), a model view (every layer and head as a small map; click one
to open it), a neuron view of one (query, key) pair (q, k, q·k, ÷√d_k, the mask, the
softmax weight and the weighted sum of values), and a positional-encoding panel (the
sinusoidal table, pairs from fast to slow as curves, and PE(p + k) = R(k) PE(p) for a
chosen offset k). Given target tokens are marked as given, generated ones as generated.
The data travels inside the page as JSON (`<script type="application/json"
id="attention-data">`), recorded by `attention_record`: the weights the model sows, and
the queries, keys, values and masks they came from (an `nn.intercept_methods` hook). The
page's script draws from it and records what it drew as `data-*` attributes and in
`window.__explorer`, which the browser test reads.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
import math
import os
import pathlib
import time
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no screen

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402
from flax import linen as nn  # noqa: E402
from matplotlib import font_manager  # noqa: E402
from matplotlib import pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from flax_transformer import (  # noqa: E402
    DecoderOnlyTransformer,
    MultiHeadAttention,
    generate_text,
    generate_translation,
    sinusoidal_positions,
)
from flax_transformer.decoding.validation import unbox_params  # noqa: E402
from flax_transformer.functional import apply_rope, broadcast_mask, project  # noqa: E402
from flax_transformer.functional.attention import MASK_VALUE  # noqa: E402
from flax_transformer.functional.positions import DEFAULT_BASE  # noqa: E402
from train import tools  # noqa: E402
from train.cli import (  # noqa: E402
    RUN_ERROR,
    USAGE_ERROR,
    RunFailure,
    die,
    parse_flags,
    quiet_library_logs,
)
from train.rundir import RunDir, WorkdirLock, atomic_savefig, atomic_write_text  # noqa: E402

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
PE_CURVES = 5  # (sin) dimensions drawn as curves, spread from the fastest pair to the slowest


def _cjk_font() -> str | None:
    installed = {f.name for f in font_manager.fontManager.ttflist}
    return next((name for name in CJK_FONT_NAMES if name in installed), None)


def token_pieces(tokenizer, ids: Sequence[int]) -> list[str]:
    """The tokenizer's piece for each id (`id_to_piece`), else the id's decoded text."""
    to_piece = getattr(tokenizer, "id_to_piece", None)
    if to_piece is not None:
        return [to_piece(int(i)) for i in ids]
    return [tokenizer.decode([int(i)]) or f"#{int(i)}" for i in ids]


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


def model_variables(model: nn.Module, params: Any) -> dict:
    """`{'params': plain arrays}` from what a caller holds: `model.init`'s output (the
    variables dict, boxed or unboxed, as `generate_*` take it) or its `['params']`."""
    required = ("decoder",) if isinstance(model, DecoderOnlyTransformer) else ("encoder", "decoder")
    return unbox_params(params, required, "train.visualize")


# ---- one forward pass, recorded ----

# Name under which the interceptor sows each attention's (q, k, v, mask) next to the
# 'attention_weights' that MultiHeadAttention sows itself.
RECORD_NAME = "explorer_qkv_mask"


def _projections(module: MultiHeadAttention, x_q, x_kv, positions_BT):
    """The queries, keys and values `(B, T|S, N, H)` the module computed from its inputs,
    recomputed from its parameters (keys and values of K < N heads repeated per query head,
    as `multi_head_attention` groups them)."""
    p = module.variables["params"]
    num_heads = module.num_heads
    kv_heads = module.num_kv_heads or num_heads

    def project_as(name, x):
        y = project(x.astype(module.dtype), p[f"{name}_kernel"].astype(module.dtype))
        return y + p[f"{name}_bias"].astype(module.dtype) if module.use_bias else y

    if module.cross:
        q_BTNH, kv_BS2KH = project_as("query", x_q), project_as("kv", x_kv)
        k_BSKH, v_BSKH = kv_BS2KH[:, :, 0], kv_BS2KH[:, :, 1]
    elif "qkv_kernel" in p:
        qkv_BT3NH = project_as("qkv", x_q)
        q_BTNH, k_BSKH, v_BSKH = (qkv_BT3NH[:, :, i] for i in range(3))
    else:
        q_BTNH, kv_BT2KH = project_as("query", x_q), project_as("kv", x_q)
        k_BSKH, v_BSKH = kv_BT2KH[:, :, 0], kv_BT2KH[:, :, 1]
    if module.rope:
        batch, length = x_q.shape[:2]
        if positions_BT is None:
            positions_BT = jnp.arange(length)[None, :]
        positions_BT = jnp.broadcast_to(positions_BT, (batch, length))
        q_BTNH = apply_rope(q_BTNH, positions_BT, module.rope_base)
        k_BSKH = apply_rope(k_BSKH, positions_BT, module.rope_base)
    group = num_heads // kv_heads
    return q_BTNH, jnp.repeat(k_BSKH, group, axis=2), jnp.repeat(v_BSKH, group, axis=2)


def _record_attention(next_fun, args, kwargs, context):
    """`nn.intercept_methods` hook: after each MultiHeadAttention call without a cache, sows
    what its weights came from, so the explorer can show q, k, v and the mask."""
    out = next_fun(*args, **kwargs)
    module = context.module
    if not isinstance(module, MultiHeadAttention) or context.method_name != "__call__":
        return out
    if kwargs.get("cache") is not None or not module.is_mutable_collection("intermediates"):
        return out
    given = dict(zip(("x_q", "x_kv", "mask"), args, strict=False))
    x_q, x_kv = given["x_q"], given.get("x_kv", kwargs.get("x_kv"))
    mask = given.get("mask", kwargs.get("mask"))
    q_BTNH, k_BSNH, v_BSNH = _projections(module, x_q, x_kv, kwargs.get("positions_BT"))
    batch, q_len, num_heads = q_BTNH.shape[:3]
    kv_len = k_BSNH.shape[1]
    if mask is None:
        mask_BNTS = jnp.ones((batch, num_heads, q_len, kv_len), bool)
    else:
        mask_BNTS = broadcast_mask(mask, batch, num_heads, q_len, kv_len)
    module.sow("intermediates", RECORD_NAME, (q_BTNH, k_BSNH, v_BSNH, mask_BNTS))
    return out


def _modules_with_weights(tree, path=()):
    """(path, dict) of every module in an 'intermediates' tree that sowed attention weights."""
    if isinstance(tree, Mapping):
        if "attention_weights" in tree:
            yield path, tree
        for key, sub in tree.items():
            yield from _modules_with_weights(sub, (*path, str(key)))


def _per_layer(value, scanned: bool) -> list[np.ndarray]:
    """Batch element 0 of a sown value, one array per layer (nn.scan stacks layers first)."""
    value = np.asarray(value)
    return [value[i, 0] for i in range(value.shape[0])] if scanned else [value[0]]


@functools.lru_cache(maxsize=8)
def _recording_apply(model: nn.Module):
    """`model.apply` with the recording hook, compiled once per model (and input shapes):
    unjitted, a scanned stack is traced again on every call."""

    def run(variables, *inputs):
        with nn.intercept_methods(_record_attention):
            return model.apply(variables, *inputs, mutable=["intermediates"])

    return jax.jit(run)


def attention_record(model: nn.Module, params: Any, *inputs) -> dict:
    """One forward pass, with every attention's weights, queries, keys, values and mask.

    Args:
        model: a `Transformer` (inputs: source, decoder ids) or `DecoderOnlyTransformer`.
        params: `model.init`'s output (boxed or not) or its `['params']`.
        *inputs: int ids `(B, S)`, `(B, T)` (or `(B, T)` for the language model); the
            record is of batch element 0.

    Returns:
        `{kind: {...}, 'logits': (T, V)}` with kind 'encoder_self', 'decoder_self' or
        'decoder_cross' (those the model has), each holding float32 'weights' `(L, N, T, S)`
        (the sown ones), 'q' `(L, N, T, H)`, 'k' and 'v' `(L, N, S, H)` (a key/value head
        repeated for each query head it serves), 'scores' `(L, N, T, S)` = q·k/√H as the
        attention computes them in float32, and bool 'mask' `(L, N, T, S)` (True = may
        attend).
    """
    variables = model_variables(model, params)
    logits, state = _recording_apply(model)(variables, *inputs)
    found: dict[str, list] = {}
    for path, sown in _modules_with_weights(state["intermediates"]):
        stack = "encoder" if "encoder" in path else "decoder"
        kind = "cross" if "cross_attention" in path else "self"
        layer = next((k for k in path if k.startswith("layers")), "")
        scanned = layer == "layers"
        (weights,) = sown["attention_weights"]
        ((q, k, v, mask),) = sown[RECORD_NAME]
        arrays = [_per_layer(a, scanned) for a in (weights, q, k, v, mask)]
        order = int(layer.split("_")[1]) if "_" in layer else 0
        found.setdefault(f"{stack}_{kind}", []).append((order, list(zip(*arrays, strict=True))))
    record: dict = {"logits": np.asarray(logits[0], np.float32)}
    for name, entries in found.items():
        layers = [per for _, per_layer in sorted(entries, key=lambda e: e[0]) for per in per_layer]
        weights_LNTS = np.stack([w for w, *_ in layers]).astype(np.float32)
        q_LTNH, k_LSNH, v_LSNH = (
            np.stack([layer[i] for layer in layers]).astype(np.float32) for i in (1, 2, 3)
        )
        q_LNTH, k_LNSH, v_LNSH = (np.swapaxes(a, 1, 2) for a in (q_LTNH, k_LSNH, v_LSNH))
        scale = np.float32(1.0 / math.sqrt(q_LNTH.shape[-1]))
        scores_LNTS = jnp.einsum(
            "lnth,lnsh->lnts", q_LNTH, k_LNSH, preferred_element_type=jnp.float32
        )
        record[name] = {
            "weights": weights_LNTS,
            "q": q_LNTH,
            "k": k_LNSH,
            "v": v_LNSH,
            "scores": np.asarray(scores_LNTS * scale, np.float32),
            "mask": np.stack([layer[4] for layer in layers]).astype(bool),
        }
    return record


def attention_maps(model: nn.Module, params: Any, *inputs) -> dict[str, np.ndarray]:
    """Attention weights of one forward pass, per stack and kind, for batch element 0.

    `params` as in `attention_record`. Returns `{'encoder_self' | 'decoder_self' |
    'decoder_cross': (L, N, T, S) float32 arrays}`.
    """
    record = attention_record(model, params, *inputs)
    return {name: kinds["weights"] for name, kinds in record.items() if name != "logits"}


# ---- PNG pictures ----


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


def curve_dims(dim: int, count: int = PE_CURVES) -> list[int]:
    """Sine dimensions 2i of `count` pairs spread evenly from the fastest pair (i = 0, a
    period of 2π positions) to the slowest (i = dim/2 - 1, a period near 2π·base)."""
    pairs = dim // 2
    chosen = sorted({round(j * (pairs - 1) / max(count - 1, 1)) for j in range(count)})
    return [2 * i for i in chosen]


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

    tgt = jnp.asarray([list(tgt_ids)], jnp.int32)
    is_lm = isinstance(model, DecoderOnlyTransformer)
    if is_lm:
        maps = attention_maps(model, params, tgt)
    else:
        maps = attention_maps(model, params, jnp.asarray([list(src_ids)], jnp.int32), tgt)
    t_labels = labels(tgt_ids)
    s_labels = labels(src_ids) if src_ids is not None else t_labels
    target = "sequence" if is_lm else "decoder input"
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


# ---- the attention explorer (--html) ----

TEMPLATE_NAME = "explorer.html"  # package data of `train` (pyproject.toml [package-data])
PAYLOAD_PLACEHOLDER = "__EXPLORER_DATA__"
# Decimals kept in the page. Attention weights and scores: 8, far inside the 1e-6 the
# browser test asks for. Queries, keys and values are only shown, to 3 decimals, and
# multiplied for display (the numbers the page states come from the weights and scores):
# 3 keep the page small. The positional table is drawn and checked against R(k) to about
# 1e-6: 6 suffice.
WEIGHT_DECIMALS = 8
VECTOR_DECIMALS = 3
POSITION_DECIMALS = 6
MAX_PE_POSITIONS = 128  # the positional panel shows at most this many positions

# (queries side, keys side, label) of each attention kind `attention_maps` returns.
ATTENTION_KINDS = {
    "encoder_self": ("source", "source", "encoder self-attention"),
    "decoder_self": ("target", "target", "decoder causal self-attention"),
    "decoder_cross": ("target", "source", "cross-attention (decoder queries, source keys)"),
}


def _cut_at_eos(row: np.ndarray, eos_id: int) -> list[int]:
    ids = [int(i) for i in row]
    return ids[: ids.index(eos_id)] if eos_id in ids else ids


def example_ids(
    model: nn.Module, params: Any, tokenizer, text: str, max_new_tokens: int
) -> tuple[list[int] | None, list[int], int]:
    """Greedy decoding of one example, as the ids the forward pass then runs on.

    Args:
        model: a `Transformer` (text is the source) or `DecoderOnlyTransformer` (the prompt).
        params: `model.init`'s output or its `['params']`.
        tokenizer: encodes `text` and gives the BOS/EOS ids.
        text: the source sentence or the prompt.
        max_new_tokens: the most tokens generated (capped to fit the model's max_len).

    Returns:
        `(source ids or None, decoder ids, prompt length)`: the decoder ids are BOS + the
        greedy translation (EOS cut), or BOS + prompt + continuation; the prompt length counts
        the ids before the generated ones (1 for translation: BOS).

    Raises:
        ValueError: `text` is empty or longer than the model's max_len allows.
    """
    cfg = model.config
    variables = model_variables(model, params)
    encoded = tokenizer.encode(text)
    if not encoded:
        raise ValueError(f"--text {text!r} has no tokens; give a sentence or a prompt.")
    is_lm = isinstance(model, DecoderOnlyTransformer)
    prompt = [tokenizer.bos_id, *encoded] if is_lm else [tokenizer.bos_id]
    room = cfg.max_len - len(prompt)
    if len(encoded) > cfg.max_len or room < 1:
        raise ValueError(
            f"--text has {len(encoded)} tokens; the model's max_len={cfg.max_len} leaves no "
            "room to generate after it: shorten the text."
        )
    new = min(max_new_tokens, room)
    if is_lm:
        rows = generate_text(
            model, variables, jnp.asarray([prompt]), eos_id=tokenizer.eos_id,
            max_new_tokens=new,
        )  # fmt: skip
        return None, prompt + _cut_at_eos(np.asarray(rows)[0], tokenizer.eos_id), len(prompt)
    rows = generate_translation(
        model, variables, jnp.asarray([encoded]), bos_id=tokenizer.bos_id,
        eos_id=tokenizer.eos_id, max_new_tokens=new,
    )  # fmt: skip
    return encoded, prompt + _cut_at_eos(np.asarray(rows)[0], tokenizer.eos_id), len(prompt)


def _rounded(array: np.ndarray, decimals: int) -> list:
    return np.round(np.asarray(array, np.float64), decimals).tolist()


def explorer_payload(
    model: nn.Module,
    params: Any,
    tokenizer,
    src_ids: Sequence[int] | None,
    tgt_ids: Sequence[int],
    *,
    prompt_length: int | None = None,
    title: str = "",
) -> dict:
    """Everything the page shows, as JSON-ready Python values.

    Args:
        model: a `Transformer` or `DecoderOnlyTransformer`.
        params: `model.init`'s output (the variables dict, boxed or not, as `generate_*`
            take it) or its `['params']`; trained or freshly initialised.
        tokenizer: gives the pieces of the ids (`token_pieces`).
        src_ids: source ids `(S,)` for translation; None for the language model.
        tgt_ids: decoder ids `(T,)`: BOS + target, or BOS + prompt + continuation.
        prompt_length: how many of `tgt_ids` were given; the rest were generated by the
            model (shown as generated). None: all were given (teacher-forced targets).
        title: a heading for the page.

    Returns:
        A dict with 'attention' (per kind: `(L, N, T, S)` weights, scores and mask, and
        q, k, v per head), 'sides' (pieces and ids), 'predicted' (each decoder row's
        most likely next token), 'positions' (the sinusoidal table) and the model's sizes.

    Raises:
        ValueError: missing or superfluous source ids for the model, empty target ids, or
            a prompt_length outside [1, len(tgt_ids)].
    """
    is_lm = isinstance(model, DecoderOnlyTransformer)
    if not tgt_ids:
        raise ValueError("tgt_ids is empty: the decoder needs at least BOS.")
    if is_lm != (src_ids is None):
        raise ValueError(
            f"{type(model).__name__} takes src_ids={'None' if is_lm else 'a list of ids'}, "
            f"got {'None' if src_ids is None else f'{len(src_ids)} ids'}."
        )
    given = len(tgt_ids) if prompt_length is None else int(prompt_length)
    if not 1 <= given <= len(tgt_ids):
        raise ValueError(
            f"prompt_length={prompt_length} must lie in [1, len(tgt_ids)={len(tgt_ids)}] (the "
            "ids given before the generated ones), or be None when every id was given."
        )
    tgt_1T = jnp.asarray([list(tgt_ids)], jnp.int32)
    inputs = (tgt_1T,) if is_lm else (jnp.asarray([list(src_ids)], jnp.int32), tgt_1T)
    record = attention_record(model, params, *inputs)
    sides = {
        "target": {"ids": [int(i) for i in tgt_ids], "pieces": token_pieces(tokenizer, tgt_ids)}
    }
    if not is_lm:
        sides["source"] = {
            "ids": [int(i) for i in src_ids],
            "pieces": token_pieces(tokenizer, src_ids),
        }
    probs_TV = np.asarray(jax.nn.softmax(record["logits"], axis=-1))
    best_T = probs_TV.argmax(-1)
    predicted = {
        "ids": [int(i) for i in best_T],
        "pieces": token_pieces(tokenizer, best_T),
        "probs": _rounded(probs_TV[np.arange(len(best_T)), best_T], 4),
    }
    attention = []
    for name, (queries, keys, label) in ATTENTION_KINDS.items():
        if name not in record:
            continue
        kind = record[name]
        attention.append(
            {
                "name": name,
                "label": "causal self-attention" if is_lm else label,
                "queries": queries,
                "keys": keys,
                "layers": int(kind["weights"].shape[0]),
                "heads": int(kind["weights"].shape[1]),
                "head_dim": int(kind["q"].shape[-1]),
                "weights": _rounded(kind["weights"], WEIGHT_DECIMALS),
                "scores": _rounded(kind["scores"], WEIGHT_DECIMALS),
                "mask": kind["mask"].astype(np.int8).tolist(),
                "q": _rounded(kind["q"], VECTOR_DECIMALS),
                "k": _rounded(kind["k"], VECTOR_DECIMALS),
                "v": _rounded(kind["v"], VECTOR_DECIMALS),
            }
        )
    cfg = model.config
    length = min(cfg.max_len, MAX_PE_POSITIONS)
    table = np.asarray(sinusoidal_positions(length, cfg.d_model), np.float64)
    return {
        "title": title,
        "task": "lm" if is_lm else "translation",
        "prompt_length": given,
        "mask_value": MASK_VALUE,
        "model": {
            "d_model": cfg.d_model,
            "num_heads": cfg.num_heads,
            "max_len": cfg.max_len,
            "positional": cfg.positional,
            "norm_position": cfg.norm_position,
        },
        "sides": sides,
        "predicted": predicted,
        "attention": attention,
        "positions": {
            "base": DEFAULT_BASE,
            "length": length,
            "dim": cfg.d_model,
            "curve_dims": curve_dims(cfg.d_model),
            "table": np.round(table, POSITION_DECIMALS).tolist(),
        },
    }


def write_explorer_html(payload: dict, path: str | os.PathLike) -> pathlib.Path:
    """Fills the page template with `payload` and writes it to `path`. Returns the path."""
    template = importlib.resources.files("train").joinpath(TEMPLATE_NAME).read_text("utf-8")
    if template.count(PAYLOAD_PLACEHOLDER) != 1:
        raise ValueError(
            f"train/{TEMPLATE_NAME} must hold {PAYLOAD_PLACEHOLDER} exactly once; the package "
            "data is damaged: reinstall flax-transformer."
        )
    # Inside <script>, "</" could close the element early; "<\/" is the same JSON string.
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, template.replace(PAYLOAD_PLACEHOLDER, data))
    return path


def render_explorer(
    model: nn.Module,
    params: Any,
    tokenizer,
    src_ids: Sequence[int] | None,
    tgt_ids: Sequence[int],
    path: str | os.PathLike,
    *,
    prompt_length: int | None = None,
    title: str = "",
) -> pathlib.Path:
    """Writes the explorer for one example and returns its path.

    `params` is `model.init`'s output (the whole variables dict, as `generate_text` and
    `generate_translation` take it) or its `['params']`; `tgt_ids` are given (teacher-forced)
    unless `prompt_length` says how many came before the generated ones. See
    `explorer_payload` for the other arguments.
    """
    payload = explorer_payload(
        model, params, tokenizer, src_ids, tgt_ids, prompt_length=prompt_length, title=title
    )
    return write_explorer_html(payload, path)


def _define_flags() -> None:
    """The program's flags; defined only when it runs, so that importing this module (tests,
    notebooks) does not clash with the flags of `train.main` in the same process."""
    flags.DEFINE_string("workdir", None, "Run directory written by train.main.", required=True)
    flags.DEFINE_string("text", None, "Source sentence, or the LM's prompt.", required=True)
    flags.DEFINE_string(
        "out",
        None,
        "Output folder for the PNGs (default WORKDIR/pictures); with --html, the HTML file "
        "(default WORKDIR/pictures/explorer.html).",
    )
    flags.DEFINE_integer("max_new_tokens", 24, "Tokens decoded at most after the text.")
    flags.DEFINE_string(
        "target",
        None,
        "Translation runs: feed this target to the decoder (BOS + its tokens, teacher "
        "forcing, as in training) instead of the greedy translation.",
    )
    flags.DEFINE_bool(
        "html",
        False,
        "Write the interactive attention explorer (one self-contained HTML file) instead of "
        "the PNG pictures.",
    )


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        die(f"unexpected arguments {list(argv[1:])} ; quote the --text.", USAGE_ERROR)
    given = flags.FLAGS
    visualize(given.workdir, given.text, given.out, given.max_new_tokens, given.html, given.target)


def given_target_ids(model: nn.Module, tokenizer, text: str, target: str) -> tuple[list, list]:
    """`(source ids, BOS + target ids)` of a translation example whose target is given.

    Raises:
        ValueError: the model is a language model, a text is empty, or a side is longer than
            the model's max_len.
    """
    if isinstance(model, DecoderOnlyTransformer):
        raise ValueError(
            "--target is for translation runs; a language model's --text is the whole "
            "sequence: put the continuation into --text."
        )
    src_ids, tgt_ids = tokenizer.encode(text), [tokenizer.bos_id, *tokenizer.encode(target)]
    max_len = model.config.max_len
    for flag, ids in (("--text", src_ids), ("--target", tgt_ids)):
        if not ids:
            raise ValueError(f"{flag} has no tokens; give a sentence.")
        if len(ids) > max_len:
            raise ValueError(
                f"{flag} has {len(ids)} tokens (with BOS for --target); the model's "
                f"max_len={max_len} is the most: shorten it."
            )
    return src_ids, tgt_ids


def visualize(
    workdir: str,
    text: str,
    out: str | None = None,
    max_new_tokens: int = 24,
    html: bool = False,
    target: str | None = None,
) -> list[pathlib.Path]:
    """The program: loads the run, decodes `text` (or takes the given `target`), writes the
    pictures (or the page) and prints what it wrote. Any error ends the process with one
    line (`train.cli.die`).

    Returns:
        The paths written.
    """
    quiet_library_logs()
    tools.check_positive("max_new_tokens", max_new_tokens)
    run = tools.load_run(workdir)
    tok = run.tokenizer
    started = time.perf_counter()
    try:
        if target is None:
            src_ids, tgt_ids, prompt_length = example_ids(
                run.model, run.params, tok, text, max_new_tokens
            )
        else:
            src_ids, tgt_ids = given_target_ids(run.model, tok, text, target)
            prompt_length = None  # every decoder input given
    except ValueError as err:
        die(str(err))
    if src_ids is None:
        print(f"prompt + continuation: {tok.decode(tgt_ids)}")
    elif prompt_length is None:
        print(f"source: {text}\ntarget (given, teacher-forced): {tok.decode(tgt_ids[1:])}")
    else:
        print(f"source: {text}\ntranslation: {tok.decode(tgt_ids[prompt_length:])}")
    html_default = RunDir(workdir).explorer
    html_path = pathlib.Path(out) if out else html_default
    folder = html_path.parent if html else pathlib.Path(out or html_default.parent)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        # Two visualize runs writing one folder would interleave their files.
        with WorkdirLock(folder, flag="--out"):
            if html:
                title = f"{pathlib.Path(workdir).name} (step {run.step}): {text}"
                path = render_explorer(
                    run.model,
                    run.params,
                    tok,
                    src_ids,
                    tgt_ids,
                    html_path,
                    prompt_length=prompt_length,
                    title=title,
                )
                seconds = time.perf_counter() - started
                print(
                    f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB; "
                    f"{'' if target else 'decoding, '}the forward pass and writing took "
                    f"{seconds:.1f} s)"
                )
                return [path]
            written = render_all(run.model, run.params, tok, src_ids, tgt_ids, folder)
            for path in written:
                print(f"wrote {path}")
            return written
    except RunFailure as err:  # the folder is locked by another visualize run
        die(str(err), RUN_ERROR)
    except OSError as err:
        die(f"{err} ; choose a writable --out, or free disk space.", RUN_ERROR)


if __name__ == "__main__":
    _define_flags()
    app.run(main, flags_parser=parse_flags)
