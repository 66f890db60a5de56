"""docs/api.md, the README and docs/interop.md stay true to the code: every export named,
signatures, snippets."""

import dataclasses
import inspect
import re
from pathlib import Path

import jax.numpy as jnp
import pytest
from flax import linen as nn

import flax_transformer
from flax_transformer import decoding, functional

ROOT = Path(__file__).resolve().parents[1]
API = (ROOT / "docs" / "api.md").read_text()
README = (ROOT / "README.md").read_text()
INTEROP = (ROOT / "docs" / "interop.md").read_text()
MULTIPROCESS = (ROOT / "docs" / "multiprocess.md").read_text()
EXPORTS = sorted(
    {
        (mod.__name__, name)
        for mod in (flax_transformer, decoding, functional)
        for name in mod.__all__
    }
)
TOP_LEVEL = flax_transformer.__all__
METHODS = ("__call__", "encode", "decode", "prefill", "extend", "attend")


def _named(text: str, name: str) -> bool:
    """`name` in backticks, alone or after a dotted prefix (`decoding.name`)."""
    return re.search(r"`(?:[\w.]*\.)?" + re.escape(name) + r"\b", text) is not None


def _signature_text(name: str) -> str:
    """The argument list of the first "`name(...)`" in docs/api.md (may span lines)."""
    match = re.search(r"`" + re.escape(name) + r"\((.*?)\)`", API, re.DOTALL)
    assert match, f"docs/api.md has no `{name}(...)` signature"
    return match.group(1)


def _section(name: str) -> str:
    """The docs/api.md section under the heading "### `name(...)`"."""
    start = API.index(f"### `{name}(")
    end = re.search(r"\n##+ ", API[start + 1 :])
    return API[start : start + 1 + end.start()] if end else API[start:]


def _parameters(fn) -> list[str]:
    params = inspect.signature(fn).parameters.values()
    return [p.name for p in params if p.name != "self" and p.kind not in (p.VAR_KEYWORD,)]


@pytest.mark.parametrize("module, name", EXPORTS)
def test_every_export_is_in_the_api_reference(module, name):
    assert _named(API, name), f"{module}.{name} is missing from docs/api.md"


@pytest.mark.parametrize("name", TOP_LEVEL)
def test_signatures_in_the_api_reference_match_the_code(name):
    obj = getattr(flax_transformer, name)
    if inspect.isclass(obj) and issubclass(obj, nn.Module):
        fields = [f.name for f in dataclasses.fields(obj) if f.name not in ("parent", "name")]
        heading = _signature_text(name)
        missing = [f for f in fields if not re.search(rf"\b{f}\b", heading)]
        assert not missing, f"{name} fields {missing} missing from its docs/api.md heading"
        section = _section(name)
        for method in METHODS:
            if method in vars(obj):
                args = [
                    a for a in _parameters(vars(obj)[method]) if not re.search(rf"\b{a}\b", section)
                ]
                assert not args, f"{name}.{method} arguments {args} missing from docs/api.md"
    elif dataclasses.is_dataclass(obj):
        heading = _signature_text(name)
        missing = [f.name for f in dataclasses.fields(obj) if f"{f.name}=" not in heading]
        missing = [m for m in missing if not re.search(rf"\b{m}\b", heading)]
        assert not missing, f"{name} fields {missing} missing from docs/api.md"
    else:
        text = _signature_text(name)
        missing = [a for a in _parameters(obj) if not re.search(rf"\b{a}\b", text)]
        assert not missing, f"{name} arguments {missing} missing from docs/api.md"


@pytest.mark.parametrize(
    "name", [n for n in decoding.__all__ if inspect.isfunction(getattr(decoding, n))]
)
def test_decoding_signatures_in_the_api_reference(name):
    text = _signature_text(name)
    missing = [a for a in _parameters(getattr(decoding, name)) if not re.search(rf"\b{a}\b", text)]
    assert not missing, f"decoding.{name} arguments {missing} missing from docs/api.md"


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, re.DOTALL)


# Every snippet of docs/api.md; the quick run keeps the tour and the short pages' snippets.
@pytest.mark.slow
def test_api_reference_snippets_run_and_their_shapes_hold():
    namespace: dict = {}
    for block in _python_blocks(API):
        exec(compile(block, "docs/api.md", "exec"), namespace)
    assert namespace["encoded"].shape == (2, 4, 32)
    assert namespace["packed_logits"].shape == (2, 6, 100)  # "Packed sequences"
    assert namespace["cache"]["index"].tolist() == [3, 2]  # the LM prefill, lengths [3, 2]
    inter = namespace["inter"]
    B, N, S, T = 2, 4, 4, 3
    shapes = {
        ("encoder", "self_attention"): (B, N, S, S),
        ("decoder", "self_attention"): (B, N, T, T),
        ("decoder", "cross_attention"): (B, N, T, S),
    }
    for (stack, attention), shape in shapes.items():
        for i in range(2):
            assert inter[stack][f"layers_{i}"][attention]["attention_weights"][0].shape == shape
    config, src, tgt = namespace["config"], namespace["src"], namespace["tgt"]
    model = flax_transformer.Transformer(config.replace(scan_layers=True))
    params = model.init(namespace["jax"].random.key(0), src, tgt)
    _, state = model.apply(params, src, tgt, mutable=["intermediates"])
    stacked = state["intermediates"]["encoder"]["layers"]["self_attention"]["attention_weights"]
    assert stacked[0].shape == (config.encoder_layers, B, N, S, S)


def test_readme_links_the_reference_and_names_every_export():
    assert "docs/api.md" in README
    missing = [name for name in TOP_LEVEL if not _named(README, name)]
    assert not missing, f"README.md does not name {missing}"


@pytest.mark.slow  # the nnx bridge itself has quick tests (test_nnx.py)
def test_interop_page_nnx_snippet_runs():
    section = INTEROP[INTEROP.index("## Flax NNX") :]
    namespace: dict = {}
    exec(compile(_python_blocks(section)[0], "docs/interop.md", "exec"), namespace)
    assert jnp.isfinite(namespace["loss"])
    assert set(namespace["params"]) == {"embed", "decoder"}


# About 20 s on 2 busy cores (a training step compiled); the quick run keeps the constraint
# count of a smaller step (test_sharding.py).
@pytest.mark.slow
def test_multiprocess_page_step_snippet_runs_and_keeps_its_constraints():
    import jax

    section = MULTIPROCESS[MULTIPROCESS.index("## Many devices") :]
    namespace: dict = {}
    exec(compile(_python_blocks(section)[0], "docs/multiprocess.md", "exec"), namespace)
    assert jnp.isfinite(namespace["loss"])
    args = [namespace[k] for k in ("params", "opt_state", "key", "src", "tgt", "labels")]
    lowered = {
        "without": jax.jit(namespace["step"]).lower(*args).as_text(),
        "with": namespace["train_step"].lower(*args).as_text(),
    }
    counts = {  # the page's numbers; the dropout key's constraint (empty mesh) not counted
        name: sum(
            "sharding_constraint" in line and "@empty_mesh" not in line
            for line in text.splitlines()
        )
        for name, text in lowered.items()
    }
    assert counts == {"without": 0, "with": 12}
