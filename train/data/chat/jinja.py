"""The Jinja environment chat templates are rendered in: the one transformers'
`apply_chat_template` builds (transformers/utils/chat_template_utils.py, 5.x), written again
here so that a template writes the same text in this program (which does not import
transformers) as there:

- jinja2's `ImmutableSandboxedEnvironment` (a template from the Hub cannot change its inputs
  or reach the interpreter), with `trim_blocks` and `lstrip_blocks`;
- the `loopcontrols` extension (`{% break %}`, `{% continue %}`);
- a `tojson` filter that keeps key order and escapes no HTML (`<`, `>`, `&` stay themselves;
  jinja2's own sorts keys and escapes them), with `json.dumps`' `indent`, `separators`,
  `sort_keys` and `ensure_ascii` (False by default: 'Zürich' stays 'Zürich');
- the globals `raise_exception(message)` (a template refuses a conversation),
  `strftime_now(format)` (today's date, as Llama 3.1's template writes it), a `namespace`
  that refuses attribute names starting with '_', and a `dict` that only builds dicts;
- the `{% generation %}...{% endgeneration %}` block, which writes its body and records the
  body's [start, end) character span in the rendered text (`render`): the text the model
  generates, as transformers' `return_assistant_tokens_mask` finds it.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import functools
import json
from collections.abc import Iterator
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment


class _Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: writes its body, and while a render tracks
    (`tracking`) records the body's character span in the rendered text."""

    tags = {"generation"}

    def __init__(self, environment: jinja2.Environment):
        super().__init__(environment)
        # (the characters written so far as a one-item list, the spans found): set only
        # while `ChatTemplate.render` consumes the template's output piece by piece.
        self.tracking: contextvars.ContextVar = contextvars.ContextVar("chat_generation")

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_write", []), [], [], body).set_lineno(
            lineno
        )

    def _write(self, caller) -> str:
        text = caller()
        state = self.tracking.get(None)
        if state is not None:
            written, spans = state
            # The template's output is consumed as jinja2 yields it, so everything before
            # this block has been counted when its body is evaluated (as transformers counts).
            spans.append((written[0], written[0] + len(text)))
        return text

    @contextlib.contextmanager
    def track(self, written: list[int], spans: list[tuple[int, int]]) -> Iterator[None]:
        token = self.tracking.set((written, spans))
        try:
            yield
        finally:
            self.tracking.reset(token)


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    # jinja2's own tojson sorts keys and escapes <, >, &, ' for HTML; a chat template writes
    # JSON for a model to read (a tool's schema), so neither.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


class _Namespace(jinja2.utils.Namespace):
    """jinja2's `namespace()` refusing attribute names that start with '_' (no way to the
    interpreter's internals through a template from the Hub)."""

    def __init__(*args, **kwargs):
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"a chat template may not set {name!r} on a namespace (names starting with '_')"
            )


class _Dict:
    """`dict(...)` and `dict.fromkeys(...)` for templates, and nothing more of the type."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


@functools.lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    """A chat template compiled in transformers' environment (see the module docstring);
    cached by its text, so a template is compiled once per process.

    Raises:
        jinja2.TemplateSyntaxError: the text is not a Jinja template.
    """
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _Dict()
    env.globals["namespace"] = _Namespace
    return env.from_string(source)


def render(source: str, variables: dict[str, Any]) -> tuple[str, tuple[tuple[int, int], ...]]:
    """The text a template writes with `variables`, and the spans of its generation blocks.

    Raises:
        jinja2.TemplateError: the template refused the variables or failed on them.
    """
    template = compile_template(source)
    extension = template.environment.extensions[_Generation.identifier]
    written, spans, pieces = [0], [], []
    with extension.track(written, spans):
        for piece in template.generate(**variables):
            pieces.append(piece)
            written[0] += len(piece)
    return "".join(pieces), tuple(spans)


def parse(source: str) -> jinja2.nodes.Template:
    """A template's syntax tree, parsed in transformers' environment."""
    return compile_template(source).environment.parse(source)


def has_generation_blocks(source: str) -> bool:
    """Whether a template holds a `{% generation %}` block."""
    ast = parse(source)
    return any(
        isinstance(node.call.node, jinja2.nodes.ExtensionAttribute)
        and node.call.node.identifier == _Generation.identifier
        for node in ast.find_all(jinja2.nodes.CallBlock)
    )


def literal_text(source: str) -> str:
    """A template's literal strings (its text and its string constants), '\\0'-joined: the
    control tokens it can write are found in it."""
    ast = parse(source)
    parts = {node.data for node in ast.find_all(jinja2.nodes.TemplateData)}
    parts |= {n.value for n in ast.find_all(jinja2.nodes.Const) if isinstance(n.value, str)}
    return "\0".join(sorted(parts))
