"""The attention explorer: one self-contained HTML page, checked in a real headless browser.

The browser tests need Debian's chromium at /usr/bin/chromium (or $CHROMIUM) and the
`playwright` package (its own browser downloads are not used); they skip, saying which is
missing, only where one is.
"""

import functools
import json
import os
import pathlib
import re

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import linen as nn

from flax_transformer import DecoderOnlyTransformer, Transformer, TransformerConfig
from train import visualize
from train.checkpoint import TrainedModel
from train.tokenizer import ByteTokenizer

CHROMIUM = pathlib.Path(os.environ.get("CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WEIGHT_TOLERANCE = 1e-6  # the bound between sown and rendered weights
# A title that would end the page's <script> early if the JSON were not escaped.
HOSTILE_TITLE = "</script><script>throw new Error('escaped')</script> 神"


def _config(**changes):
    base = dict(vocab_size=260, d_model=16, num_heads=2, d_ff=32, num_layers=2, max_len=32)
    return TransformerConfig(dropout_rate=0.0, **{**base, **changes})


@functools.cache  # one init and forward pass per module, not per test
def _translation():
    model = Transformer(_config())
    ones = jnp.ones((1, 4), jnp.int32)
    params = nn.unbox(model.init(jax.random.key(0), ones, ones))["params"]
    tok = ByteTokenizer()
    src = tok.encode("初めに言")
    tgt = [tok.bos_id, *tok.encode("In the")]
    maps = visualize.attention_maps(model, params, jnp.asarray([src]), jnp.asarray([tgt]))
    return model, params, tok, src, tgt, maps


@functools.cache
def _language_model():
    model = DecoderOnlyTransformer(_config(num_layers=3, num_heads=4))
    params = nn.unbox(model.init(jax.random.key(1), jnp.ones((1, 4), jnp.int32)))["params"]
    tok = ByteTokenizer()
    ids = [tok.bos_id, *tok.encode("Let there")]
    return (
        model,
        params,
        tok,
        None,
        ids,
        visualize.attention_maps(model, params, jnp.asarray([ids])),
    )


def test_payload_holds_the_sown_weights_and_pieces():
    model, params, tok, src, tgt, maps = _translation()
    payload = visualize.explorer_payload(model, params, tok, src, tgt)
    assert [a["name"] for a in payload["attention"]] == list(visualize.ATTENTION_KINDS)
    for att in payload["attention"]:
        np.testing.assert_allclose(att["weights"], maps[att["name"]], atol=WEIGHT_TOLERANCE)
    assert payload["sides"]["source"]["pieces"][:2] == ["<0xE5>", "<0x88>"]
    assert payload["sides"]["target"]["pieces"][:3] == ["<s>", "I", "n"]
    table = np.asarray(payload["positions"]["table"])
    assert table.shape == (32, 16)


def test_html_is_self_contained_and_escapes_script_end(tmp_path):
    model, params, tok, src, tgt, _ = _translation()
    path = visualize.render_explorer(
        model, params, tok, src, tgt, tmp_path / "e.html", title=HOSTILE_TITLE
    )
    html = path.read_text("utf-8")
    assert visualize.PAYLOAD_PLACEHOLDER not in html
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)  # no CDN, no network
    data = re.search(r'id="attention-data">(.*?)</script>', html, re.S).group(1)
    assert json.loads(data)["title"] == HOSTILE_TITLE


def test_mismatched_source_ids_are_refused():
    model, params, tok, src, tgt, _ = _translation()
    with pytest.raises(ValueError, match="src_ids=a list of ids"):
        visualize.explorer_payload(model, params, tok, None, tgt)
    with pytest.raises(ValueError, match="tgt_ids is empty"):
        visualize.explorer_payload(model, params, tok, src, [])


def test_visualize_writes_html(tmp_path, monkeypatch, capsys):
    model, params, tok, *_ = _translation()
    config = ml_collections.ConfigDict({"max_len": 32})
    trained = TrainedModel(config, tok, model, params, 0)
    monkeypatch.setattr("train.visualize.load_trained", lambda workdir: trained)
    out = tmp_path / "page.html"
    assert visualize.visualize(str(tmp_path), "abc", out=str(out), html=True) == [out]
    assert out.is_file()
    assert re.search(r"wrote .*page\.html \(\d+ KiB; .* took [\d.]+ s\)", capsys.readouterr().out)


# ---- in the browser ----


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.skip(
            f"no browser at {CHROMIUM}: install Debian's chromium (apt-get install chromium)"
        )
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield launched
        launched.close()


def _open(browser, path):
    page = browser.new_page()
    errors = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda err: errors.append(str(err)))
    page.goto(path.as_uri())
    page.wait_for_function("window.__explorer && window.__explorer.ready", timeout=10_000)
    return page, errors


READ_LINES = """() => Array.from(document.querySelectorAll('line.attn')).map(l => [
    Number(l.dataset.layer), Number(l.dataset.head), Number(l.dataset.query),
    Number(l.dataset.key), Number(l.dataset.weight), l.style.display !== 'none'])"""


def _rendered(page, shape_LNTS, layer):
    """The weights the page drew, as an (N, T, S) array (NaN where no line was drawn)."""
    drawn = np.full(shape_LNTS[1:], np.nan)
    for line_layer, head, query, key, weight, _ in page.evaluate(READ_LINES):
        assert line_layer == layer
        drawn[head, query, key] = weight
    return drawn


@pytest.mark.parametrize("example", [_translation, _language_model], ids=["translation", "lm"])
def test_page_renders_the_sown_weights(browser, tmp_path, example):
    model, params, tok, src, tgt, maps = example()
    path = visualize.render_explorer(
        model, params, tok, src, tgt, tmp_path / "e.html", title=HOSTILE_TITLE
    )
    page, errors = _open(browser, path)
    kinds = page.eval_on_selector_all("#kind option", "os => os.map(o => o.textContent)")
    assert len(kinds) == len(maps)
    for kind, name in enumerate(maps_order := [n for n in visualize.ATTENTION_KINDS if n in maps]):
        weights_LNTS = maps[name]
        layers, heads = weights_LNTS.shape[:2]
        page.select_option("#kind", str(kind))
        assert page.eval_on_selector_all("#layer option", "os => os.length") == layers
        assert page.eval_on_selector_all("#head option", "os => os.length") == heads + 1  # + all
        for layer in range(layers):
            page.select_option("#layer", str(layer))
            drawn = np.zeros_like(weights_LNTS[layer])
            for head in range(heads):
                page.select_option("#head", str(head))
                drawn[head] = _rendered(page, weights_LNTS.shape, layer)[head]
            np.testing.assert_allclose(drawn, weights_LNTS[layer], atol=WEIGHT_TOLERANCE, rtol=0)
            page.select_option("#head", "all")  # every head at once: the same numbers
            overlaid = _rendered(page, weights_LNTS.shape, layer)
            np.testing.assert_allclose(overlaid, weights_LNTS[layer], atol=WEIGHT_TOLERANCE, rtol=0)
    assert maps_order == [a["name"] for a in page.evaluate("window.__explorer.data.attention")]

    # Hovering query token 1 leaves only its lines: one per key and head.
    page.select_option("#kind", "0")
    page.select_option("#head", "all")
    page.hover('text.tok[data-role="query"][data-index="1"]')
    shown = [line for line in page.evaluate(READ_LINES) if line[5]]
    keys = maps[maps_order[0]].shape[-1]
    assert len(shown) == keys * maps[maps_order[0]].shape[1]
    assert {line[2] for line in shown} == {1}

    # The positional panel: PE(p + k) = R(k) PE(p), up to the table's 6 decimals.
    positions = page.evaluate("window.__explorer.positions")
    assert positions["maxError"] < 1e-5
    np.testing.assert_allclose(positions["dots"], positions["predicted"], atol=1e-4)
    assert errors == []
