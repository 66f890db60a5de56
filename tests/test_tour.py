"""docs/tour.md stays true: every snippet runs, every file, symbol and test it names exists."""

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOUR = ROOT / "docs" / "tour.md"
SNIPPET = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
HEADING = re.compile(r"^## (.+)$", re.M)
# `path/to/file.py::Class::test_name` or `path/to/file.py::test_name`
TEST_REF = re.compile(r"`(tests/\w+\.py)::([\w:]+)`")
# `path/to/file.py`, `Symbol` (the first name after a file is defined in it)
CODE_REF = re.compile(r"`((?:flax_transformer|train)/[\w/]+\.py)`,\s+`(\w+)")
FILE_REF = re.compile(r"`((?:flax_transformer|train|tests|docs)/[\w/.]+\.(?:py|md|html))")


def _snippets() -> list[tuple[str, str]]:
    """(section heading, code) for every python block, in page order."""
    text = TOUR.read_text("utf-8")
    headings = [(m.start(), m.group(1)) for m in HEADING.finditer(text)]
    found = []
    for match in SNIPPET.finditer(text):
        section = [title for start, title in headings if start < match.start()][-1]
        found.append((section, match.group(1)))
    return found


def test_tour_has_a_snippet_per_stop():
    assert len(_snippets()) >= 11


@pytest.mark.parametrize("section, code", _snippets(), ids=[s for s, _ in _snippets()])
def test_snippet_runs(section, code):
    """Each snippet runs on its own, in a fresh namespace."""
    exec(compile(code, f"docs/tour.md ({section})", "exec"), {"__name__": "tour"})


def _names_defined(path: pathlib.Path) -> set[str]:
    """Module-level functions and classes, and `Class::method` for methods."""
    names = set()
    for node in ast.parse(path.read_text("utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names.update(
                f"{node.name}::{item.name}"
                for item in node.body
                if isinstance(item, ast.FunctionDef)
            )
    return names


def test_every_named_file_symbol_and_test_exists():
    text = TOUR.read_text("utf-8")
    missing = [f for f in FILE_REF.findall(text) if not (ROOT / f).is_file()]
    tests = TEST_REF.findall(text)
    assert len(tests) >= 11
    for path, name in tests:
        if (ROOT / path).is_file() and name not in _names_defined(ROOT / path):
            missing.append(f"{path}::{name}")
    for path, symbol in CODE_REF.findall(text):
        if (ROOT / path).is_file() and symbol not in _names_defined(ROOT / path):
            missing.append(f"{path}: {symbol}")
    assert missing == [], f"docs/tour.md names what does not exist: {missing}"
