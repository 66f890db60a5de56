"""docs/tour.md stays true: every snippet runs and prints what the page shows under it, and
every file, function and test a stop names exists.

After changing a snippet, `python tests/test_tour.py --update` reruns every snippet and
writes what it prints into the page's output blocks; read the diff before committing it.
"""

from __future__ import annotations

import ast
import contextlib
import io
import os
import pathlib
import re
import sys
import tempfile
import types

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOUR = ROOT / "docs" / "tour.md"
STOP = re.compile(r"^## (\d+)\. (.+)$", re.M)
PYTHON = re.compile(r"^```python\n(.*?)^```\n", re.S | re.M)
# The output block that follows a snippet, after the prose that says what it prints.
OUTPUT = re.compile(r"((?:(?!```).)*?)^```text\n(.*?)^```\n", re.S | re.M)
BULLET = re.compile(r"^- (Code|Tests): (.*?)(?=^- |^$|^```)", re.S | re.M)
TICKED = re.compile(r"`([^`]+)`")
SOURCE_FILE = re.compile(r"(?:flax_transformer|train|tests)/[\w/]+\.(?:py|html)")
SYMBOL = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?")
# `tests/test_x.py::test_name` or `tests/test_x.py::Class::test_name`, anywhere on the page.
TEST_REF = re.compile(r"`(tests/\w+\.py)::([\w:]+)`")
FILE_REF = re.compile(r"`((?:flax_transformer|train|tests|docs)/[\w/.]+\.(?:py|md|html))")
# Numbers in printed output, compared to the decimals printed (see `_same_output`).
NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
PRINT_DECIMALS = 3  # the tour's printing precision: what "1." stands for in an array


def _stops() -> list[dict]:
    """Each stop of the page: number, title, its text, Code/Tests bullets, snippet, output."""
    text = TOUR.read_text("utf-8")
    starts = list(STOP.finditer(text))
    stops = []
    for i, match in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(text)
        body = text[match.end() : end]
        bullets = {kind: " ".join(value.split()) for kind, value in BULLET.findall(body)}
        snippet = PYTHON.search(body)
        after = OUTPUT.match(body[snippet.end() :]) if snippet else None
        stops.append(
            {
                "number": int(match.group(1)),
                "title": match.group(2),
                "body": body,
                "code": bullets.get("Code", ""),
                "tests": bullets.get("Tests", ""),
                "snippet": snippet.group(1) if snippet else None,
                "prose": after.group(1).strip() if after else "",
                "output": after.group(2) if after else None,
            }
        )
    return stops


STOPS = _stops()
IDS = [f"{s['number']}-{s['title']}" for s in STOPS]


def _names_defined(path: pathlib.Path) -> set[str]:
    """Module-level functions and classes, and `Class::method` for methods and properties."""
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


def _code_refs(bullet: str) -> list[tuple[str, str | None]]:
    """(file, symbol) for every ticked name of a Code bullet; a name belongs to the last
    file before it (`file.py`: `a`, `B.c`; `other.py`: `d`). A file without names gives
    (file, None)."""
    refs, current, named = [], None, True
    for item in TICKED.findall(bullet):
        if SOURCE_FILE.fullmatch(item):
            if current is not None and not named:
                refs.append((current, None))
            current, named = item, False
        elif current is not None and SYMBOL.fullmatch(item):
            refs.append((current, item))
            named = True
        else:
            refs.append((current or "?", f"not a file or a name: {item!r}"))
    if current is not None and not named:
        refs.append((current, None))
    return refs


def test_the_tour_has_the_stops_a_learner_needs_in_order():
    assert [s["number"] for s in STOPS] == list(range(1, len(STOPS) + 1))
    titles = " | ".join(s["title"].lower() for s in STOPS)
    order = [
        "tokens",
        "embedding",
        "positions",
        "without weights",
        "queries, keys and values",
        "scores",
        "masks",
        "softmax",
        "weighted sum",
        "multi-head",
        "dropout",
        "layer normalisation",
        "residual",
        "feed-forward",
        "encoder",
        "encoder-only",
        "cross-attention",
        "decoder",
        "loss",
        "generation",
        "course notes",
        "explorer",
    ]
    found = [titles.find(word) for word in order]
    assert -1 not in found, [w for w, at in zip(order, found, strict=True) if at < 0]
    assert found == sorted(found), "stops out of the learner's order"


@pytest.mark.parametrize("stop", STOPS, ids=IDS)
def test_every_stop_names_code_and_tests_and_shows_its_output(stop):
    assert _code_refs(stop["code"]), f"stop {stop['number']} names no code"
    assert TEST_REF.search(stop["tests"]), f"stop {stop['number']} names no test"
    assert stop["snippet"], f"stop {stop['number']} has no snippet"
    assert "print(" in stop["snippet"] and "assert " in stop["snippet"]
    assert stop["output"] is not None, f"stop {stop['number']}: no ```text block after it"
    assert len(stop["prose"]) > 40, f"stop {stop['number']}: say in prose what it prints"


@pytest.mark.parametrize("stop", STOPS, ids=IDS)
def test_every_function_and_test_a_stop_names_exists(stop):
    missing = []
    for path, symbol in _code_refs(stop["code"]):
        if not (ROOT / path).is_file():
            missing.append(path)
        elif symbol is not None and path.endswith(".py"):
            wanted = symbol.replace(".", "::")
            if wanted not in _names_defined(ROOT / path):
                missing.append(f"{path}: {symbol}")
        elif symbol is not None:
            missing.append(f"{path}: {symbol} (only Python files can name symbols)")
    for path, name in TEST_REF.findall(stop["body"]):
        if not (ROOT / path).is_file() or name not in _names_defined(ROOT / path):
            missing.append(f"{path}::{name}")
    assert missing == [], f"stop {stop['number']} names what does not exist: {missing}"


def test_every_file_the_page_names_exists():
    text = TOUR.read_text("utf-8")
    missing = sorted({f for f in FILE_REF.findall(text) if not (ROOT / f).is_file()})
    assert missing == []


def _run(code: str, title: str) -> str:
    """Runs a snippet in a fresh namespace and returns what it printed."""
    out = io.StringIO()
    # A real module, as `python` gives a pasted snippet (`__main__`): the dataclasses of
    # linen modules defined in a snippet look their module up in sys.modules.
    module = types.ModuleType("tour_snippet")
    sys.modules[module.__name__] = module
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, f"docs/tour.md ({title})", "exec"), module.__dict__)
    finally:
        del sys.modules[module.__name__]
    return out.getvalue()


def _decimals(number: str) -> int:
    mantissa = re.split("[eE]", number)[0]
    return len(mantissa.split(".")[1]) if "." in mantissa else 0


def _same_number(printed: str, shown: str) -> bool:
    """Equal to the printed precision: a value on a rounding boundary may print one last
    digit apart on another machine; integers (shapes, ids, counts) must match exactly."""
    if printed == shown:
        return True
    if not any(c in printed + shown for c in ".eE"):
        return False
    a, b = float(printed), float(shown)
    decimals = max(_decimals(printed), _decimals(shown)) or PRINT_DECIMALS
    if "e" in (printed + shown).lower():
        scale = abs(b) or 1.0
        return abs(a - b) <= 1.5 * 10.0**-decimals * scale
    return abs(a - b) <= 1.5 * 10.0**-decimals


def _same_output(printed: str, shown: str) -> bool:
    """Same text, whitespace runs aside, and the same numbers to the printed precision."""

    def skeleton(text):  # numpy pads array columns: no spaces inside brackets count
        return re.sub(r" ?([\[\]()]) ?", r"\1", " ".join(NUMBER.sub("#", text).split()))

    if skeleton(printed) != skeleton(shown):
        return False
    return all(
        _same_number(a, b)
        for a, b in zip(NUMBER.findall(printed), NUMBER.findall(shown), strict=True)
    )


def test_output_comparison_tolerates_the_last_digit_only():
    assert _same_output("[0.499 0.501]\n", "[0.5   0.5  ]")  # rounding boundary, reflowed
    assert not _same_output("[0.47 0.53]", "[0.5 0.5]")  # 3 units of the last place
    assert not _same_output("shape (1, 4, 16)", "shape (1, 4, 15)")
    assert not _same_output("1.", "2.")
    assert _same_output("2.4e-05", "2.5e-05") and not _same_output("2.4e-05", "3.4e-05")
    assert not _same_output("True", "False")


# Running the snippets checks the page against the code; the quick run leaves it to the full
# suite (the 21 snippets take about 30 s of compiles on 2 cores, the two slowest 35 s each) and
# keeps the checks that every stop names functions and tests that exist: the code each stop
# shows has its own quick tests, which the stop names.
@pytest.mark.slow
@pytest.mark.parametrize("stop", STOPS, ids=IDS)
def test_snippet_runs_and_prints_what_the_page_shows(stop, tmp_path, monkeypatch):
    """Each snippet runs on its own, in a fresh namespace (in an empty folder, for the files
    it writes), and prints the page's output block."""
    monkeypatch.chdir(tmp_path)
    printed = _run(stop["snippet"], stop["title"])
    assert printed.strip(), f"stop {stop['number']} prints nothing"
    assert _same_output(printed, stop["output"]), (
        f"stop {stop['number']} printed\n{printed}\nbut the page shows\n{stop['output']}"
        "(python tests/test_tour.py --update rewrites the page's output blocks)"
    )


def _update() -> None:
    """Rewrites every output block with what its snippet prints now."""
    text = TOUR.read_text("utf-8")
    pieces, last = [], 0
    with tempfile.TemporaryDirectory() as folder:
        home = os.getcwd()
        os.chdir(folder)
        try:
            for snippet in PYTHON.finditer(text):
                block = OUTPUT.match(text, snippet.end())
                if block is None:
                    continue
                try:
                    printed = _run(snippet.group(1), "update")
                except Exception as err:  # keep the old block; say which snippet failed
                    print(f"snippet at offset {snippet.start()} failed: {err!r}", file=sys.stderr)
                    continue
                start = block.start(2)
                pieces += [text[last:start], printed]
                last = block.end(2)
        finally:
            os.chdir(home)
    TOUR.write_text("".join(pieces) + text[last:], "utf-8")


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit("usage: python tests/test_tour.py --update")
    _update()
