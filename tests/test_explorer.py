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
import numpy as np
import pytest
from flax import linen as nn

from configs import default
from flax_transformer import DecoderOnlyTransformer, Transformer, TransformerConfig
from flax_transformer.functional.attention import MASK_VALUE
from train import visualize
from train.config import config_lib
from train.data.tokenizer import ByteTokenizer
from train.program.trained import TrainedModel
from train.tools import attention_recording, explorer

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
WEIGHT_TOLERANCE = 1e-6  # largest gap allowed between sown and drawn weights
# The trained default run's page (docs/explorer.md): the template filled with its data.
DOCS_PAGE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "explorer_default.html"
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
    maps = attention_recording.attention_maps(model, params, jnp.asarray([src]), jnp.asarray([tgt]))
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
        attention_recording.attention_maps(model, params, jnp.asarray([ids])),
    )


def test_payload_holds_the_sown_weights_and_pieces():
    model, params, tok, src, tgt, maps = _translation()
    payload = explorer.explorer_payload(model, params, tok, src, tgt)
    assert [a["name"] for a in payload["attention"]] == list(attention_recording.ATTENTION_KINDS)
    for att in payload["attention"]:
        np.testing.assert_allclose(att["weights"], maps[att["name"]], atol=WEIGHT_TOLERANCE)
    assert payload["sides"]["source"]["pieces"][:2] == ["<0xE5>", "<0x88>"]
    assert payload["sides"]["target"]["pieces"][:3] == ["<s>", "I", "n"]
    assert payload["prompt_length"] == len(tgt)  # targets the caller gives are given
    table = np.asarray(payload["positions"]["table"])
    assert table.shape == (32, 16)
    assert payload["positions"]["curve_dims"] == [0, 4, 8, 10, 14]  # pairs 0..7, fast to slow


# Three models recorded; test_payload_holds_the_sown_weights_and_pieces keeps the
# explorer in the quick run.
@pytest.mark.slow
@pytest.mark.parametrize(
    "model_cls, changes",
    [
        (Transformer, {}),
        (DecoderOnlyTransformer, {"scan_layers": True}),  # the decoder-only graph compiles faster
        (Transformer, {"positional": "rope", "num_kv_heads": 1}),
    ],
    ids=["plain", "scanned", "rope-multi-query"],
)
def test_recorded_queries_and_keys_give_the_sown_weights(model_cls, changes):
    """The neuron view's q, k and scores are what the weights came from: their masked
    softmax is the model's sown weights (scanned layers, rotary positions and shared key
    heads included)."""
    model = model_cls(_config(init_std=0.3, **changes))
    src, tgt = jnp.asarray([[5, 6, 7, 8, 0]]), jnp.asarray([[1, 9, 10]])  # source padding
    inputs = (tgt,) if model_cls is DecoderOnlyTransformer else (src, tgt)
    record = attention_recording.attention_record(
        model, model.init(jax.random.key(2), *inputs), *inputs
    )
    assert record["logits"].shape == (3, 260)
    kinds = (
        ["decoder_self"]
        if model_cls is DecoderOnlyTransformer
        else attention_recording.ATTENTION_KINDS
    )
    assert sorted(record) == sorted([*kinds, "logits"])
    for name in kinds:
        kind = record[name]
        scores = np.einsum("lnth,lnsh->lnts", kind["q"], kind["k"]) / np.sqrt(8)
        np.testing.assert_allclose(kind["scores"], scores, atol=1e-5)
        weights = jax.nn.softmax(jnp.where(kind["mask"], kind["scores"], MASK_VALUE), axis=-1)
        weights = jnp.where(kind["mask"], weights, 0.0)
        np.testing.assert_allclose(weights, kind["weights"], atol=WEIGHT_TOLERANCE, rtol=0)
        assert kind["q"].shape[:2] == kind["k"].shape[:2] == (2, 2)  # (L, N): K heads repeated
    if model_cls is Transformer:
        assert not record["encoder_self"]["mask"][..., 4].any()  # the padded source key
    assert np.array_equal(record["decoder_self"]["mask"][1, 1], np.tril(np.ones((3, 3), bool)))


def test_params_or_the_whole_variables_dict_give_the_same_page(tmp_path):
    """`render_explorer` takes what `generate_*` take (model.init's output, boxed) as well as
    its ['params']."""
    model, params, tok, src, tgt, _ = _translation()
    boxed = model.init(jax.random.key(0), jnp.ones((1, 4), jnp.int32), jnp.ones((1, 4), jnp.int32))
    pages = [
        explorer.render_explorer(model, given, tok, src, tgt, tmp_path / f"{i}.html").read_text()
        for i, given in enumerate((params, boxed, {"params": params}))
    ]
    assert pages[0] == pages[1] == pages[2]
    with pytest.raises(ValueError, match="params lack"):
        explorer.render_explorer(model, {"params": {}}, tok, src, tgt, tmp_path / "x.html")


def test_generated_targets_are_marked_generated():
    model, params, tok, src, tgt, _ = _translation()
    payload = explorer.explorer_payload(model, params, tok, src, tgt, prompt_length=1)
    assert payload["prompt_length"] == 1
    with pytest.raises(ValueError, match=r"prompt_length=0 must lie in \[1, len\(tgt_ids\)=7\]"):
        explorer.explorer_payload(model, params, tok, src, tgt, prompt_length=0)


def test_html_is_self_contained_and_escapes_script_end(tmp_path):
    model, params, tok, src, tgt, _ = _translation()
    path = explorer.render_explorer(
        model, params, tok, src, tgt, tmp_path / "e.html", title=HOSTILE_TITLE
    )
    html = path.read_text("utf-8")
    assert explorer.PAYLOAD_PLACEHOLDER not in html
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)  # no CDN, no network
    data = re.search(r'id="attention-data">(.*?)</script>', html, re.S).group(1)
    assert json.loads(data)["title"] == HOSTILE_TITLE


def test_mismatched_source_ids_are_refused():
    model, params, tok, src, tgt, _ = _translation()
    with pytest.raises(ValueError, match="src_ids=a list of ids"):
        explorer.explorer_payload(model, params, tok, None, tgt)
    with pytest.raises(ValueError, match="tgt_ids is empty"):
        explorer.explorer_payload(model, params, tok, src, [])


def test_visualize_writes_html(tmp_path, monkeypatch, capsys):
    model, params, tok, *_ = _translation()
    config = default.get_config()
    config.update(max_len=32, bucket_lengths=(), max_decode_len=0, tokenizer="byte")
    experiment = config_lib.validate_config(config)
    trained = TrainedModel(config, tok, model, params, 0, experiment)
    monkeypatch.setattr("train.tools.tools.load_trained", lambda workdir: trained)
    out = tmp_path / "page.html"
    assert visualize.visualize(str(tmp_path), "abc", out=str(out), html=True) == [out]
    assert out.is_file()
    assert re.search(r"wrote .*page\.html \(\d+ KiB; .* took [\d.]+ s\)", capsys.readouterr().out)


def test_the_docs_page_is_the_current_template_filled_with_its_data(tmp_path):
    """docs/explorer_default.html is generated, not a second copy of the template: the page
    equals the current train/tools/explorer.html filled (by `write_explorer_html`) with the
    data it carries, byte for byte. The data itself comes from the trained default run; after
    a change of the template, `refill_page` writes the page again around it."""
    page = DOCS_PAGE.read_text("utf-8")
    copy = tmp_path / "page.html"
    copy.write_text(page, "utf-8")
    fresh = explorer.refill_page(copy).read_text("utf-8")
    lines, fresh_lines = page.splitlines(), fresh.splitlines()
    differ = [i + 1 for i, (a, b) in enumerate(zip(lines, fresh_lines, strict=False)) if a != b]
    same = page == fresh  # not compared in the assert: pytest would diff a 290 KB line
    assert same, (
        "docs/explorer_default.html is not the current template filled with its data (lines "
        f'{differ[:5] or "past the end"} differ): write it again with python -c "from '
        "train.tools.explorer import refill_page; refill_page('docs/explorer_default.html')\""
    )


def _schema(value):
    """A payload's shape without its numbers: dict keys, list nesting, leaf types."""
    if isinstance(value, dict):
        return {key: _schema(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_schema(value[0])] if value else []
    if isinstance(value, bool) or value is None:
        return repr(value)
    return "number" if isinstance(value, int | float) else type(value).__name__


def test_the_docs_pages_data_has_the_shape_the_template_reads():
    """The docs page's data (from a trained run, not recomputed here) has the keys and the
    nesting a fresh payload has, and its attention maps fit its own tokens and heads."""
    data = explorer.page_payload(DOCS_PAGE.read_text("utf-8"))
    model, params, tok, src, tgt, _ = _translation()
    assert _schema(data) == _schema(explorer.explorer_payload(model, params, tok, src, tgt))
    sides = {name: len(side["ids"]) for name, side in data["sides"].items()}
    for kind in data["attention"]:
        want = (kind["layers"], data["model"]["num_heads"], sides[kind["queries"]])
        assert np.shape(kind["weights"]) == (*want, sides[kind["keys"]]), kind["name"]


def test_page_payload_refuses_a_page_without_data():
    with pytest.raises(ValueError, match="no filled attention-data element"):
        explorer.page_payload("<html></html>")
    template = (pathlib.Path(explorer.__file__).parent / explorer.TEMPLATE_NAME).read_text()
    with pytest.raises(ValueError, match="no filled attention-data element"):
        explorer.page_payload(template)


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
    # A bound for a page that never gets ready, not a wait: it returns once the page is.
    page.wait_for_function("window.__explorer && window.__explorer.ready", timeout=60_000)
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


@pytest.mark.slow  # a browser per case
@pytest.mark.parametrize("example", [_translation, _language_model], ids=["translation", "lm"])
def test_page_renders_the_sown_weights(browser, tmp_path, example):
    model, params, tok, src, tgt, maps = example()
    path = explorer.render_explorer(
        model, params, tok, src, tgt, tmp_path / "e.html", title=HOSTILE_TITLE
    )
    page, errors = _open(browser, path)
    kinds = page.eval_on_selector_all("#kind option", "os => os.map(o => o.textContent)")
    assert len(kinds) == len(maps)
    for kind, name in enumerate(
        maps_order := [n for n in attention_recording.ATTENTION_KINDS if n in maps]
    ):
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


# Where cell (i, j) of a map canvas is on the screen: its box, border, label margins, cell size.
CELL_GEOMETRY = """c => { const b = c.getBoundingClientRect();
    return { x: b.left + c.clientLeft + Number(c.dataset.left), y: b.top + c.clientTop +
             Number(c.dataset.top), cell: Number(c.dataset.cell) }; }"""
READ_NEURON = """() => Object.fromEntries(Array.from(document.querySelectorAll(
    '#neuron [data-field]')).map(e => [e.dataset.field,
                                       [Number(e.dataset.value), e.textContent]]))"""
READ_VECTOR = """(name) => Array.from(document.querySelectorAll(
    `#neuron [data-vector="${name}"] span`)).map(c => Number(c.dataset.value))"""


def _hover_cell(page, selector, i, j):
    """Moves the mouse to the middle of cell (i, j) of a map and returns the tooltip's data."""
    page.locator(selector).scroll_into_view_if_needed()
    at = page.eval_on_selector(selector, CELL_GEOMETRY)
    page.mouse.move(at["x"] + (j + 0.5) * at["cell"], at["y"] + (i + 0.5) * at["cell"])
    return page.eval_on_selector("#tip", "t => ({...t.dataset})")


def _inputs(src, tgt):
    tgt_1T = jnp.asarray([tgt])
    return (tgt_1T,) if src is None else (jnp.asarray([src]), tgt_1T)


@pytest.mark.parametrize("example", [_translation, _language_model], ids=["translation", "lm"])
def test_neuron_and_model_views_show_the_models_numbers(browser, tmp_path, example):
    """Hovering the heatmap puts a (query, key) pair into the neuron view: its q·k/√d_k, the
    mask and the softmax weight are the model's, within 1e-6; a model-view cell is the sown
    weight too, and clicking its map opens it."""
    model, params, tok, src, tgt, _ = example()
    record = attention_recording.attention_record(model, params, *_inputs(src, tgt))
    prompt_length = 1 if src is not None else 3  # BOS (+ 2 prompt tokens), the rest generated
    path = explorer.render_explorer(
        model, params, tok, src, tgt, tmp_path / "e.html", prompt_length=prompt_length
    )
    page, errors = _open(browser, path)
    names = [n for n in attention_recording.ATTENTION_KINDS if n in record]
    for kind, name in enumerate(names):
        weights, scores = record[name]["weights"], record[name]["scores"]
        layers, heads, rows, cols = weights.shape
        layer, head = layers - 1, heads - 1
        page.select_option("#kind", str(kind))
        page.select_option("#layer", str(layer))
        page.select_option("#head", str(head))
        # The last row sees every key; row 1 of a causal map has masked keys past 1.
        for i, j in [(rows - 1, 0), (1, cols - 1), (rows // 2, cols // 2)]:
            tip = _hover_cell(page, "#heatmap", i, j)
            where = {"layer": str(layer), "head": str(head), "query": str(i), "key": str(j)}
            assert tip == {"map": "heatmap", **where, "value": tip["value"]}
            assert abs(float(tip["value"]) - weights[layer, head, i, j]) <= WEIGHT_TOLERANCE
            neuron = page.evaluate(READ_NEURON)
            shown = page.eval_on_selector("#neuron", "n => ({...n.dataset})")
            assert shown == {"kind": name, **where}
            score, weight = scores[layer, head, i, j], weights[layer, head, i, j]
            assert abs(neuron["scaled"][0] - score) <= WEIGHT_TOLERANCE
            assert abs(neuron["weight"][0] - weight) <= WEIGHT_TOLERANCE
            assert neuron["mask"][0] == int(record[name]["mask"][layer, head, i, j])
            assert f"score {abs(score):.4f}" in neuron["scaled"][1].replace("-", "")
            assert f"weight {weight:.4f}" in neuron["weight"][1]
            head_dim = record[name]["q"].shape[-1]
            assert abs(neuron["dot"][0] - score * np.sqrt(head_dim)) <= 1e-5
            q, k = page.evaluate(READ_VECTOR, "q"), page.evaluate(READ_VECTOR, "k")
            stored = 0.5 * 10.0**-explorer.VECTOR_DECIMALS + 1e-7  # vectors' rounding
            np.testing.assert_allclose(q, record[name]["q"][layer, head, i], atol=stored)
            np.testing.assert_allclose(k, record[name]["k"][layer, head, j], atol=stored)
            total = page.evaluate(READ_VECTOR, "sum")  # Σ_s w·v: the head's output row
            expected = weights[layer, head, i] @ record[name]["v"][layer, head]
            np.testing.assert_allclose(total, expected, atol=stored)  # weights sum to 1
        if name == "decoder_self":
            assert neuron["mask"][0] == 1 and page.evaluate(READ_NEURON)["mask"][0] == 1
            _hover_cell(page, "#heatmap", 1, cols - 1)
            masked = page.evaluate(READ_NEURON)
            assert masked["mask"][0] == 0 and masked["weight"][0] == 0.0  # the causal triangle

        # A click pins the pair: the neuron view stays on it while the mouse moves on.
        _hover_cell(page, "#heatmap", rows - 1, 0)
        page.mouse.down()
        page.mouse.up()
        _hover_cell(page, "#heatmap", 0, 0)
        pinned = page.eval_on_selector("#neuron", "n => [n.dataset.query, n.dataset.key]")
        assert pinned == [str(rows - 1), "0"]

        # The model view: one small map per layer and head, the same weights.
        thumbs = page.eval_on_selector_all("#modelview canvas", "cs => cs.length")
        assert thumbs == layers * heads
        other = f'#modelview canvas[data-layer="0"][data-head="{heads // 2}"]'
        tip = _hover_cell(page, other, rows - 1, cols - 1)
        assert (tip["map"], tip["layer"], tip["head"]) == ("model", "0", str(heads // 2))
        assert abs(float(tip["value"]) - weights[0, heads // 2, rows - 1, cols - 1]) <= 1e-6
        page.click(other)
        assert page.eval_on_selector("#layer", "s => s.value") == "0"
        assert page.eval_on_selector("#head", "s => s.value") == str(heads // 2)
        assert page.eval_on_selector(other, "c => c.classList.contains('open')")

    # The fixed 0-1 scale by default, each map's maximum as an option.
    assert page.eval_on_selector("#colourbar", "c => c.dataset.vmax") == "1"
    page.select_option("#scale", "max")
    top = float(page.eval_on_selector("#colourbar", "c => c.dataset.vmax"))
    assert abs(top - weights[0, heads // 2].max()) <= WEIGHT_TOLERANCE  # the open map's
    # Given decoder inputs are labelled given, generated ones generated.
    assert page.eval_on_selector_all(".chip.given", "cs => cs.length") == prompt_length
    generated = page.eval_on_selector_all(".chip.generated", "cs => cs.length")
    assert generated == len(tgt) - prompt_length
    assert "row t predicts token t+1" in page.inner_text("#heatmap-title")
    assert errors == []
