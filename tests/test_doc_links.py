"""Every relative markdown link in the README, docs/ and benchmarks/RESULTS.md opens: the
file exists and, for a `#heading` link into a markdown page, that page has the heading.

Sections move between pages; a link left pointing at the old place fails here.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "benchmarks" / "RESULTS.md",
]
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
HEADING = re.compile(r"^#+ (.+)$", re.M)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _prose(path: Path) -> str:
    """The page without its code blocks (a `# comment` there is no heading)."""
    return FENCE.sub("", path.read_text("utf-8"))


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _links(path: Path) -> list[str]:
    return [t for t in LINK.findall(_prose(path)) if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_open(page):
    broken = []
    for target in _links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md":
            if anchor not in {_anchor(h) for h in HEADING.findall(_prose(dest))}:
                broken.append(f"{target} (no such heading)")
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


def test_anchor_rule():
    assert _anchor("Bad inputs, and what `jit` cannot check") == (
        "bad-inputs-and-what-jit-cannot-check"
    )
    assert _anchor("22. See it: the attention explorer") == "22-see-it-the-attention-explorer"
