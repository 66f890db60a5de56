"""An interactive attention explorer: one self-contained HTML file (inline JS/CSS, no network).

    python -m train.visualize --workdir runs/default --text "In the beginning" --html

The page shows, for one example, every attention the model sows into 'intermediates'
(encoder self-attention, decoder causal self-attention and cross-attention for translation;
causal self-attention for the language model) as lines between the tokenizer's pieces, one
layer and head at a time or all heads overlaid, and a positional-encoding panel: the
sinusoidal table, a few of its dimensions as curves, and PE(p + k) = R(k) PE(p) for a chosen
offset k.

The data travels inside the page as JSON (`<script type="application/json"
id="attention-data">`); the page's script draws from it and records what it drew as
`data-*` attributes on the SVG lines and in `window.__explorer`, which the browser test reads.
"""

from __future__ import annotations

import importlib.resources
import json
import os
import pathlib
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from flax_transformer import DecoderOnlyTransformer, generate_text, generate_translation
from flax_transformer.functional.positions import DEFAULT_BASE, sinusoidal_positions
from train.rundir import atomic_write_text
from train.visualize import attention_maps

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


def token_pieces(tokenizer, ids: Sequence[int]) -> list[str]:
    """The tokenizer's piece for each id (`id_to_piece`), else the id's decoded text."""
    to_piece = getattr(tokenizer, "id_to_piece", None)
    if to_piece is not None:
        return [to_piece(int(i)) for i in ids]
    return [tokenizer.decode([int(i)]) or f"#{int(i)}" for i in ids]


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
