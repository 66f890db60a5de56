"""Documents that a whitespace-normalising or lossy tokenizer would change: code with its
indentation, tabs, blank lines, runs of spaces, emoji, CJK, combining accents, the literal
SentencePiece meta symbol U+2581, and valid but unusual Unicode (issue 41). Shared by
tests/test_verbatim_text.py and benchmarks-style counts of how many round-trip."""

import random

HARD_DOCUMENTS = (
    "def f(x):\n    if x:\n        return x  # two  spaces\n    return None\n",
    "class A:\n\tdef g(self):\n\t\treturn 1\n",
    "First paragraph.\n\nSecond paragraph, after a blank line.\n\n\n\nThird.",
    "words  with   runs    of     spaces",
    "\tleading tab and trailing spaces   ",
    "   leading spaces",
    "trailing newline\n",
    "Windows line ends\r\nsecond line\r\n",
    "emoji 😀👍🏽 and a family 👨‍👩‍👧‍👦 (zero-width joiners)",
    "日本語の文章です。\n中文句子。한국어 문장.",
    "combining: e\u0301 a\u0308 n\u0303; precomposed: é ä ñ",
    "full-width\u3000space and no-break\u00a0space",
    "the meta symbol ▁ itself, and ▁▁ twice, and at the end▁",
    "▁leading meta symbol",
    "zero width\u200bspace, joiner\u200d, BOM\ufeffinside",
    "line\u2028separator and paragraph\u2029separator",
    "controls \x01\x07\x1b[0m and form\x0cfeed\x0bvtab",
    "noncharacters \ufffe \uffff \U0010ffff and private use \ue000",
    "right-to-left \u202eevil\u202c and Arabic العربية",
    "math 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ∑ x² ≤ ∞",
    "ligature ﬁ and Roman numeral Ⅻ (NFKC would change both)",
    '{\n  "json": [1, 2, 3],\n  "nested": {"a": null}\n}',
    "| a | b |\n|---|---|\n| 1 | 2 |",
    "https://example.com/path?q=a%20b&x=1#frag",
    "- item\n  - nested item\n\n```python\nprint('x')\n```",
    "> quoted\n>> twice",
    "  \n  mixed blank-looking lines  \n\t\n end",
    "NUL\x00inside",
    "Ελληνικά και кириллица",
    "Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǧ̗͚̚o̙̔ͮ̇͐̇ text",
)


def filler_lines(count: int, seed: int = 0) -> list[str]:
    """Plain English-like lines: enough text for a SentencePiece vocabulary of a few hundred
    pieces beside the hard documents."""
    rng = random.Random(seed)
    words = (
        "in the beginning god created heaven and earth light darkness waters day night "
        "firmament evening morning seed fruit tree grass herb living creature"
    ).split()
    return [" ".join(rng.choice(words) for _ in range(rng.randint(4, 14))) for _ in range(count)]
