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

With `--html` the same example goes into one interactive, self-contained HTML page instead
(train/explorer.py; `--out` names the file, default `WORKDIR/pictures/explorer.html`):

    python -m train.visualize --workdir runs/default --text "In the beginning" --html
"""

from __future__ import annotations

import argparse
import pathlib
import time
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")  # files only, no screen

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import linen as nn  # noqa: E402
from matplotlib import font_manager  # noqa: E402
from matplotlib import pyplot as plt  # noqa: E402

from flax_transformer import DecoderOnlyTransformer, sinusoidal_positions  # noqa: E402
from train.cli import (  # noqa: E402
    RUN_ERROR,
    RunFailure,  # noqa: E402
    die,
    quiet_library_logs,
)
from train.rundir import RunDir, WorkdirLock, atomic_savefig  # noqa: E402

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
PE_CURVE_DIMS = (0, 1, 4, 5, 16, 17)  # fast and slower (sin, cos) pairs, as in seed 000


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
        return token_labels(
            [
                tokenizer.decode([i])
                if i > 3
                else ("<bos>", "<eos>", "<eos>", "<unk>")[max(i - 1, 0)]
                for i in ids
            ],
            ids,
            font,
        )

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


def main(argv: Sequence[str] | None = None) -> None:
    from train import explorer
    from train.checkpoint import load_trained

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True, help="a run directory of train.main")
    parser.add_argument("--text", required=True, help="source sentence, or the LM's prompt")
    parser.add_argument(
        "--out",
        default=None,
        help="output folder for the PNGs (default WORKDIR/pictures); with --html, the HTML "
        "file (default WORKDIR/pictures/explorer.html)",
    )
    parser.add_argument("--max_new_tokens", type=int, default=24)
    parser.add_argument(
        "--html",
        action="store_true",
        help="write the interactive attention explorer (one self-contained HTML file) "
        "instead of the PNG pictures",
    )
    args = parser.parse_args(argv)
    quiet_library_logs()
    try:
        run = load_trained(args.workdir)
    except RunFailure as err:  # damaged config.json or checkpoints
        die(str(err), RUN_ERROR)
    except (FileNotFoundError, ValueError) as err:
        die(str(err))
    tok = run.tokenizer
    started = time.perf_counter()
    try:
        src_ids, tgt_ids, prompt_length = explorer.example_ids(
            run.model, run.params, tok, args.text, args.max_new_tokens
        )
    except ValueError as err:
        die(str(err))
    generated = tok.decode(tgt_ids[prompt_length:])
    if src_ids is None:
        print(f"prompt + continuation: {tok.decode(tgt_ids)}")
    else:
        print(f"source: {args.text}\ntranslation: {generated}")
    html_default = RunDir(args.workdir).explorer
    html_path = pathlib.Path(args.out) if args.out else html_default
    out = html_path.parent if args.html else pathlib.Path(args.out or html_default.parent)
    try:
        out.mkdir(parents=True, exist_ok=True)
        # Two visualize runs writing one folder would interleave their files.
        with WorkdirLock(out, flag="--out"):
            if args.html:
                title = f"{pathlib.Path(args.workdir).name} (step {run.step}): {args.text}"
                path = explorer.render_explorer(
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
                return
            for path in render_all(run.model, run.params, tok, src_ids, tgt_ids, out):
                print(f"wrote {path}")
    except RunFailure as err:  # the folder is locked by another visualize run
        die(str(err), RUN_ERROR)
    except OSError as err:
        die(f"{err} ; choose a writable --out, or free disk space.", RUN_ERROR)


if __name__ == "__main__":
    main()
