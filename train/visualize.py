"""Pictures of a trained model: attention maps per layer and head, and the positional encoding.

    python -m train.visualize --workdir runs/default --text "初に神天地を創造たまへり"
    python -m train.visualize --workdir runs/lm_kjv --text "In the beginning"

For a translation run the source is translated greedily, then one forward pass over
(source, BOS + translation) records every attention; for a language model the prompt is
continued and the whole sequence is passed once. PNG files go to `--out` (default
`WORKDIR/pictures`):

  encoder_self_attention.png    rows = layers, columns = heads; source x source
  decoder_self_attention.png    target x target: the causal triangle
  decoder_cross_attention.png   target (rows) x source (columns)
  positional_encoding.png       the sinusoidal table as a heatmap, plus a few dimensions

Tick labels are the tokens. Japanese tokens need a CJK font (Debian: fonts-noto-cjk); when
none is installed they are shown as their ids (`#123`) so the grid stays readable.

With `--html` the same example goes into the attention explorer instead: one interactive,
self-contained HTML page (inline JS/CSS, no network; `--out` names the file, default
`WORKDIR/pictures/explorer.html`; library: `render_explorer`):

    python -m train.visualize --workdir runs/default --text "In the beginning" --html

The page shows every attention the model sows into 'intermediates' (encoder self-attention,
decoder causal self-attention and cross-attention for translation; causal self-attention for
the language model) as lines between the tokenizer's pieces, one layer and head at a time or
all heads overlaid, and a positional-encoding panel: the sinusoidal table, a few of its
dimensions as curves, and PE(p + k) = R(k) PE(p) for a chosen offset k. The data travels
inside the page as JSON (`<script type="application/json" id="attention-data">`); the page's
script draws from it and records what it drew as `data-*` attributes on the SVG lines and in
`window.__explorer`, which the browser test reads.
"""

from __future__ import annotations

import importlib.resources
import json
import os
import pathlib
import time
from collections.abc import Sequence
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

from flax_transformer import (  # noqa: E402
    DecoderOnlyTransformer,
    generate_text,
    generate_translation,
    sinusoidal_positions,
)
from flax_transformer.functional.positions import DEFAULT_BASE  # noqa: E402
from train.checkpoint import load_trained  # noqa: E402
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
CELL_INCHES = 2.4  # each heatmap panel is CELL_INCHES square (plus margins)
MARGIN_INCHES = 1.0
MAX_TICKS = 40  # beyond this many tokens, tick labels are thinned
CJK_FONT_NAMES = (
    "Noto Sans CJK JP",
    "Noto Sans CJK SC",
    "IPAGothic",
    "IPAexGothic",
    "TakaoGothic",
    "WenQuanYi Micro Hei",
    "Droid Sans Fallback",
)
PE_CURVE_DIMS = (0, 1, 4, 5, 16, 17)  # fast and slower (sin, cos) pairs


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


def attention_maps(model: nn.Module, params, *inputs) -> dict[str, np.ndarray]:
    """Attention weights of one forward pass, per stack and kind, for batch element 0.

    Returns:
      {'encoder_self' | 'decoder_self' | 'decoder_cross': (L, N, T, S) float32 arrays}.
    """
    _, state = model.apply({"params": params}, *inputs, mutable=["intermediates"])
    found: dict[str, list[np.ndarray]] = {}
    flat = jax.tree_util.tree_flatten_with_path(state["intermediates"])[0]
    for path, value in flat:
        keys = [getattr(p, "key", getattr(p, "idx", None)) for p in path]
        if "attention_weights" not in keys:
            continue
        stack = "encoder" if "encoder" in keys else "decoder"
        kind = "cross" if "cross_attention" in keys else "self"
        layer = next((k for k in keys if isinstance(k, str) and k.startswith("layers")), "")
        weights = np.asarray(value, np.float32)
        if layer == "layers":  # nn.scan: a leading (L,) axis
            per_layer = [weights[i, 0] for i in range(weights.shape[0])]
        else:
            per_layer = [weights[0]]
        found.setdefault(f"{stack}_{kind}", []).append((layer, per_layer))
    maps = {}
    for name, entries in found.items():
        entries.sort(key=lambda e: int(e[0].split("_")[1]) if "_" in e[0] else 0)
        maps[name] = np.stack([w for _, layers in entries for w in layers])
    return maps


def plot_attention_grid(
    weights_LNTS: np.ndarray,
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    title: str,
    path: pathlib.Path,
    font: str | None = None,
) -> pathlib.Path:
    """One heatmap per (layer, head): rows = queries, columns = keys. Returns `path`."""
    layers, heads, rows, cols = weights_LNTS.shape
    size = (heads * CELL_INCHES + MARGIN_INCHES, layers * CELL_INCHES + MARGIN_INCHES)
    fig, axes = plt.subplots(layers, heads, figsize=size, squeeze=False)
    font_kw = {"fontfamily": font} if font else {}
    step_r = max(1, rows // MAX_TICKS)
    step_c = max(1, cols // MAX_TICKS)
    for layer in range(layers):
        for head in range(heads):
            ax = axes[layer][head]
            panel = weights_LNTS[layer, head]
            # Colour scale per panel: near-uniform heads would otherwise all look flat.
            ax.imshow(
                panel,
                vmin=0.0,
                vmax=max(float(panel.max()), 1e-6),
                cmap="viridis",
                aspect="auto",
                interpolation="nearest",
            )
            ax.set_title(f"layer {layer} head {head}", fontsize=7)
            ax.set_xticks(range(0, cols, step_c))
            ax.set_xticklabels(col_labels[::step_c], rotation=90, fontsize=5, **font_kw)
            ax.set_yticks(range(0, rows, step_r))
            ax.set_yticklabels(row_labels[::step_r], fontsize=5, **font_kw)
    fig.suptitle(title, fontsize=10)
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.08, top=0.92, wspace=0.5, hspace=0.6)
    atomic_savefig(fig, path, dpi=DPI)
    plt.close(fig)
    return path


def plot_positional_encoding(length: int, dim: int, path: pathlib.Path) -> pathlib.Path:
    """The sinusoidal table `(length, dim)` as a heatmap, and a few columns as curves."""
    table = np.asarray(sinusoidal_positions(length, dim))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 8))
    image = top.imshow(
        table.T, aspect="auto", cmap="RdBu", vmin=-1, vmax=1, interpolation="nearest"
    )
    top.set_xlabel("position")
    top.set_ylabel("dimension")
    top.set_title(f"sinusoidal positional encoding ({length} positions x {dim} dimensions)")
    fig.colorbar(image, ax=top)
    for d in (d for d in PE_CURVE_DIMS if d < dim):
        bottom.plot(table[:, d], label=f"dim {d} ({'sin' if d % 2 == 0 else 'cos'})")
    bottom.set_xlabel("position")
    bottom.legend(fontsize=8, ncol=3)
    bottom.set_title("each (sin, cos) pair turns at its own frequency: fast gears first")
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
    """Every picture for one example. `tgt_ids` are the decoder (or LM) input ids."""
    out.mkdir(parents=True, exist_ok=True)
    font = _cjk_font()

    def labels(ids):
        return tick_labels(tokenizer, ids, font)

    tgt = jnp.asarray([list(tgt_ids)], jnp.int32)
    if isinstance(model, DecoderOnlyTransformer):
        maps = attention_maps(model, params, tgt)
    else:
        maps = attention_maps(model, params, jnp.asarray([list(src_ids)], jnp.int32), tgt)
    t_labels = labels(tgt_ids)
    s_labels = labels(src_ids) if src_ids is not None else t_labels
    written = []
    for name, rows, cols in (
        ("encoder_self", s_labels, s_labels),
        ("decoder_self", t_labels, t_labels),
        ("decoder_cross", t_labels, s_labels),
    ):
        if name in maps:
            title = name.replace("_", " ") + " attention (rows: queries, columns: keys)"
            written.append(
                plot_attention_grid(
                    maps[name], rows, cols, title, out / f"{name}_attention.png", font
                )
            )
    config = model.config
    written.append(
        plot_positional_encoding(
            min(config.max_len, 128), config.d_model, out / "positional_encoding.png"
        )
    )
    return written


# The attention explorer (--html).

TEMPLATE_NAME = "explorer.html"  # package data of `train` (pyproject.toml [package-data])
PAYLOAD_PLACEHOLDER = "__EXPLORER_DATA__"
# Decimals kept in the page. Attention weights: 8, far inside the 1e-6 the test asks for.
# The positional table is only drawn (and checked against R(k) to about 1e-6): 6 suffice.
WEIGHT_DECIMALS = 8
POSITION_DECIMALS = 6
MAX_PE_POSITIONS = 128  # the positional panel shows at most this many positions

# (queries side, keys side, label) of each attention kind `attention_maps` returns.
ATTENTION_KINDS = {
    "encoder_self": ("source", "source", "encoder self-attention"),
    "decoder_self": ("target", "target", "decoder causal self-attention"),
    "decoder_cross": ("target", "source", "cross-attention (target queries, source keys)"),
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
        params: its 'params' collection.
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
            model, {"params": params}, jnp.asarray([prompt]), eos_id=tokenizer.eos_id,
            max_new_tokens=new,
        )  # fmt: skip
        return None, prompt + _cut_at_eos(np.asarray(rows)[0], tokenizer.eos_id), len(prompt)
    rows = generate_translation(
        model, {"params": params}, jnp.asarray([encoded]), bos_id=tokenizer.bos_id,
        eos_id=tokenizer.eos_id, max_new_tokens=new,
    )  # fmt: skip
    return encoded, prompt + _cut_at_eos(np.asarray(rows)[0], tokenizer.eos_id), len(prompt)


def explorer_payload(
    model: nn.Module,
    params: Any,
    tokenizer,
    src_ids: Sequence[int] | None,
    tgt_ids: Sequence[int],
    *,
    prompt_length: int = 1,
    title: str = "",
) -> dict:
    """Everything the page shows, as JSON-ready Python values.

    Args:
        model: a `Transformer` or `DecoderOnlyTransformer`.
        params: its 'params' collection (trained or freshly initialised).
        tokenizer: gives the pieces of the ids (`token_pieces`).
        src_ids: source ids `(S,)` for translation; None for the language model.
        tgt_ids: decoder ids `(T,)`: BOS + translation, or BOS + prompt + continuation.
        prompt_length: how many of `tgt_ids` were given rather than generated.
        title: a heading for the page.

    Returns:
        A dict with 'attention' (per kind: `(L, N, T, S)` weights as nested lists), 'sides'
        (pieces and ids), 'positions' (the sinusoidal table) and the model's sizes.

    Raises:
        ValueError: missing or superfluous source ids for the model, or empty target ids.
    """
    is_lm = isinstance(model, DecoderOnlyTransformer)
    if not tgt_ids:
        raise ValueError("tgt_ids is empty: the decoder needs at least BOS.")
    if is_lm != (src_ids is None):
        raise ValueError(
            f"{type(model).__name__} takes src_ids={'None' if is_lm else 'a list of ids'}, "
            f"got {'None' if src_ids is None else f'{len(src_ids)} ids'}."
        )
    tgt_1T = jnp.asarray([list(tgt_ids)], jnp.int32)
    inputs = (tgt_1T,) if is_lm else (jnp.asarray([list(src_ids)], jnp.int32), tgt_1T)
    maps = attention_maps(model, params, *inputs)
    sides = {
        "target": {"ids": [int(i) for i in tgt_ids], "pieces": token_pieces(tokenizer, tgt_ids)}
    }
    if not is_lm:
        sides["source"] = {
            "ids": [int(i) for i in src_ids],
            "pieces": token_pieces(tokenizer, src_ids),
        }
    attention = []
    for name, (queries, keys, label) in ATTENTION_KINDS.items():
        if name not in maps:
            continue
        weights_LNTS = maps[name]
        attention.append(
            {
                "name": name,
                "label": "causal self-attention" if is_lm else label,
                "queries": queries,
                "keys": keys,
                "layers": int(weights_LNTS.shape[0]),
                "heads": int(weights_LNTS.shape[1]),
                "weights": np.round(weights_LNTS.astype(np.float64), WEIGHT_DECIMALS).tolist(),
            }
        )
    cfg = model.config
    length = min(cfg.max_len, MAX_PE_POSITIONS)
    table = np.asarray(sinusoidal_positions(length, cfg.d_model), np.float64)
    return {
        "title": title,
        "task": "lm" if is_lm else "translation",
        "prompt_length": int(prompt_length),
        "model": {
            "d_model": cfg.d_model,
            "num_heads": cfg.num_heads,
            "max_len": cfg.max_len,
            "positional": cfg.positional,
            "norm_position": cfg.norm_position,
        },
        "sides": sides,
        "attention": attention,
        "positions": {
            "base": DEFAULT_BASE,
            "length": length,
            "dim": cfg.d_model,
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
    prompt_length: int = 1,
    title: str = "",
) -> pathlib.Path:
    """Writes the explorer for one example (see `explorer_payload` for the arguments)."""
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
    visualize(given.workdir, given.text, given.out, given.max_new_tokens, given.html)


def visualize(
    workdir: str, text: str, out: str | None = None, max_new_tokens: int = 24, html: bool = False
) -> list[pathlib.Path]:
    """The program: loads the run, decodes `text`, writes the pictures (or the page) and
    prints what it wrote. Any error ends the process with one line (`train.cli.die`).

    Returns:
        The paths written.
    """
    quiet_library_logs()
    try:
        run = load_trained(workdir)
    except RunFailure as err:  # damaged config.json or checkpoints
        die(str(err), RUN_ERROR)
    except (FileNotFoundError, ValueError) as err:
        die(str(err))
    tok = run.tokenizer
    started = time.perf_counter()
    try:
        src_ids, tgt_ids, prompt_length = example_ids(
            run.model, run.params, tok, text, max_new_tokens
        )
    except ValueError as err:
        die(str(err))
    generated = tok.decode(tgt_ids[prompt_length:])
    if src_ids is None:
        print(f"prompt + continuation: {tok.decode(tgt_ids)}")
    else:
        print(f"source: {text}\ntranslation: {generated}")
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
                    f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB; decoding, forward "
                    f"pass and writing took {seconds:.1f} s)"
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
