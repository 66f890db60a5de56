"""Conversations as a run's data, without a model: the corpora (`chat` JSON lines, `hf-chat`,
`kjv-web-chat` on the default run's split), the run-level handling of
`train.data.chat.examples` (drops counted, all-dropped refused, refusals kept, cuts at a turn
boundary), and batches that carry the loss mask (`MaskedTokens`: no BOS or EOS added, labels
padded where nothing is trained, the mask kept by packing).

The tiny tokenizers and templates are test_chat_template.py's.
"""

from __future__ import annotations

import json
import logging
import sys
import types

import numpy as np
import pytest
from test_chat_template import (
    CHATML,
    CHATML_SPECIALS,
    CHATML_TOKENS,
    CONVERSATIONS,
    LLAMA3,
    LLAMA3_EOT_OUTSIDE,
    LLAMA3_SPECIALS,
    LLAMA3_TOKENS,
    Case,
    tiny_tokenizer,
)

from train.data.batching import MaskedTokens, Side, bucketed_batches
from train.data.chat.encoding import ChatError, ChatExample
from train.data.chat.examples import HeldOut, encode_conversations, held_out
from train.data.chat.template import ChatTemplate
from train.data.packing import segment_batches
from train.formats.corpora.chats import KJV_WEB_INSTRUCTION, kjv_web_conversations, read_chat_jsonl
from train.formats.corpora.conversations import Conversation, conversation_of
from train.formats.corpora.splits import split_examples
from train.tasks import get_task

SIDES = get_task("chat").sides


@pytest.fixture(scope="module")
def chatml():
    return Case(CHATML, CHATML_TOKENS, tiny_tokenizer(CHATML_SPECIALS))


@pytest.fixture(scope="module")
def llama3_case():
    rust = tiny_tokenizer(LLAMA3_SPECIALS, pre="llama3", bos="<|begin_of_text|>")
    return Case(LLAMA3, LLAMA3_TOKENS, rust)


def _conversations(*names: str) -> list[Conversation]:
    return [Conversation(tuple(CONVERSATIONS[n]), f"c.jsonl:{i + 1}") for i, n in enumerate(names)]


# Reading conversations ---------------------------------------------------------------------


def test_jsonl_records_messages_and_prompt_completion(tmp_path):
    path = tmp_path / "chat.jsonl"
    system = {"role": "system", "content": "Be brief."}
    lines = [
        {"messages": CONVERSATIONS["one_turn"], "id": 7},
        {"prompt": "Hi", "completion": "Hello!"},
        {"prompt": [system, {"role": "user", "content": "Hi"}], "completion": "Hello!"},
        {
            "prompt": [{"role": "user", "content": "Hi"}],
            "completion": [{"role": "assistant", "content": "Hello!", "extra": 1}],
        },
    ]
    path.write_text(
        "\n".join(json.dumps(x) for x in lines[:2])
        + "\n\n  \n"
        + "\n".join(json.dumps(x) for x in lines[2:])
        + "\n",
        encoding="utf-8",
    )
    read = read_chat_jsonl(path)
    assert [c.where for c in read] == [f"{path}:{n}" for n in (1, 2, 5, 6)]
    assert read[0].messages == tuple(CONVERSATIONS["one_turn"])
    hello = ({"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"})
    assert read[1].messages == read[3].messages == hello
    assert read[2].messages == (system, *hello)
    assert read[1].reply == "Hello!" and read[1].prompt == hello[:1]
    assert read[1].split_key == read[3].split_key != read[2].split_key


@pytest.mark.parametrize(
    "line, match",
    [
        ("{not json", r"chat.jsonl:2: not JSON \(Expecting property name"),
        ("[1, 2]", r"chat.jsonl:2: a JSON list, not an object with 'messages'"),
        ('{"text": "hi"}', r"chat.jsonl:2: no field 'messages'.*it has \['text'\]"),
        ('{"prompt": "hi"}', r"chat.jsonl:2: no field 'completion'"),
        ('{"messages": [], "prompt": "a"}', r"chat.jsonl:2: holds both 'messages' and"),
        ('{"messages": []}', r"chat.jsonl:2: field 'messages': 'messages' must be a non-empty"),
        (
            '{"messages": [{"role": "bot", "content": "x"}]}',
            r"chat.jsonl:2: field 'messages': messages\[0\] has role 'bot'",
        ),
        ('{"prompt": 3, "completion": "x"}', r"chat.jsonl:2: field 'prompt' is a int"),
        (
            '{"prompt": "x", "completion": [{"role": "assistant", "content": null}]}',
            r"chat.jsonl:2: field 'completion': messages\[0\] \(assistant\) has content of type",
        ),
    ],
)
def test_a_bad_line_is_refused_naming_the_file_line_and_field(tmp_path, line, match):
    path = tmp_path / "chat.jsonl"
    path.write_text('{"prompt": "a", "completion": "b"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=match):
        read_chat_jsonl(path)


def test_hf_chat_reads_messages_or_prompt_completion_columns(monkeypatch):
    rows = [
        {"messages": CONVERSATIONS["one_turn"], "source": "x"},
        {"prompt": "Hi", "completion": "Hello!"},
    ]
    fake = types.ModuleType("datasets")
    fake.load_dataset = lambda name, config, split: rows if name == "ok" else [{"text": "t"}]
    monkeypatch.setitem(sys.modules, "datasets", fake)
    from train.formats.corpora.hugging_face import load_hf_conversations

    read = load_hf_conversations("ok", "", "train")
    assert read[0].messages == tuple(CONVERSATIONS["one_turn"]) and read[1].reply == "Hello!"
    with pytest.raises(ValueError, match=r"bad\[train\] row 0: no field 'messages'"):
        load_hf_conversations("bad", "", "train")


def test_kjv_web_chat_holds_out_the_default_runs_verses():
    """The chat task's validation verses are configs/default.py's, in its order: the split
    hashes each conversation as the verse pair it is made of."""
    from configs import default
    from train.config import config_lib
    from train.formats.corpora.splits import read_splits

    data = config_lib.validate_config(default.get_config()).data  # kjv-web, 1% / 1%
    pairs = read_splits(data, "tsv")  # the shipped corpus, no file of the user's
    chats = split_examples(kjv_web_conversations(), data.valid_fraction, data.test_fraction)
    for theirs, ours in zip(pairs, chats, strict=True):
        assert len(theirs) == len(ours)
    assert len(chats.valid) == 310
    for (kjv, web), conversation in zip(pairs.valid, chats.valid, strict=True):
        assert conversation.messages[0]["content"] == KJV_WEB_INSTRUCTION + kjv
        assert conversation.reply == web


# A run's conversations ---------------------------------------------------------------------


def test_empty_masks_are_dropped_and_counted_and_all_dropped_is_refused(chatml, caplog):
    """marin#7237, trl#4879: a conversation with nothing to train is never trained on
    silently; a split with nothing left refuses the run."""
    conversations = _conversations("one_turn", "user_only", "several_turns", "user_only")
    with caplog.at_level(logging.INFO):
        examples, kept, counts = encode_conversations(chatml.encoder(), conversations, 96, "train")
    assert [c.where for c in kept] == ["c.jsonl:1", "c.jsonl:3"]
    assert counts.kept == 2 and counts.dropped == {"no_assistant": 2}
    assert counts.sizes("train")["train_dropped_no_assistant"] == 2
    assert counts.trained == sum(int(e.mask[1:].sum()) for e in examples)
    assert counts.tokens == sum(e.num_tokens - 1 for e in examples)
    assert "Conversations (train): 2 kept (0 cut to fit max_len), 2 dropped: 2 no assistant" in (
        caplog.text
    )
    assert "(first: c.jsonl:2: no assistant message to train on)" in caplog.text
    with pytest.raises(
        ValueError,
        match="Every valid conversation was dropped, 2 no assistant message.*nothing to validate",
    ):
        encode_conversations(
            chatml.encoder(), _conversations("user_only", "user_only"), 96, "valid"
        )


def test_a_template_that_marks_no_assistant_token_is_refused(chatml):
    """A template whose {% generation %} blocks hold nothing of the assistant's (an empty
    mask where assistant turns are): refused for the end of turn it leaves out, before any
    step, rather than dropped conversation by conversation."""
    blocks = CHATML + "{% generation %}{% endgeneration %}"
    encoder = type(chatml.encoder())(ChatTemplate(blocks, CHATML_TOKENS), chatml.tokenizer)
    with pytest.raises(ChatError, match="c.jsonl:1: the loss mask .* leaves the end of turn"):
        encode_conversations(encoder, _conversations("one_turn"), 96, "train")


def test_a_control_token_in_a_message_is_dropped_and_counted(chatml):
    bad = Conversation(
        ({"role": "user", "content": "Say <|im_end|> now"}, CONVERSATIONS["one_turn"][1]), "x:9"
    )
    _, _, counts = encode_conversations(
        chatml.encoder(), [bad, *_conversations("one_turn")], 96, "train"
    )
    assert counts.dropped == {"control_token": 1} and counts.first["control_token"].startswith(
        "x:9: messages[0] (user) holds the control token '<|im_end|>'"
    )


def test_refusals_stop_the_run_naming_the_conversation(chatml, llama3_case):
    """End of turn left out (trl#1623), prefixes that are not token prefixes: refused, not
    dropped (part 1's decision: a defect of the template or a fix the message names)."""
    outside = type(llama3_case.encoder())(
        ChatTemplate(LLAMA3_EOT_OUTSIDE, LLAMA3_TOKENS), llama3_case.tokenizer
    )
    with pytest.raises(ChatError, match="c.jsonl:1: .*leaves the end of turn out"):
        encode_conversations(outside, _conversations("one_turn"), 96, "train")
    merge = Conversation(
        (CONVERSATIONS["one_turn"][0], {"role": "assistant", "content": "\n\n    x"}), "m:4"
    )
    with pytest.raises(ChatError, match=r"m:4: at an edge of the assistant turn messages\[1\]"):
        encode_conversations(chatml.encoder(), [merge], 96, "train")


def test_a_long_conversation_is_cut_after_its_last_assistant_turn_that_fits(chatml):
    whole = chatml.encoder().encode(CONVERSATIONS["several_turns"])
    turns = [
        chatml.encoder().encode(CONVERSATIONS["several_turns"][:end]) for end in (3, 5)
    ]  # up to the first and the second assistant turn
    max_len = turns[1].num_tokens - 1  # the second turn fits exactly, the third does not
    assert whole.num_tokens - 1 > max_len
    conversations = _conversations("several_turns", "one_turn")
    examples, kept, counts = encode_conversations(chatml.encoder(), conversations, max_len, "v")
    assert counts.cut == 1 and counts.kept == 2 and not counts.dropped
    cut = examples[0]
    assert cut.ids.tolist() == whole.ids[: cut.num_tokens].tolist() == turns[1].ids.tolist()
    assert cut.mask.tolist() == whole.mask[: cut.num_tokens].tolist()
    assert chatml.text(cut.ids[cut.mask]).endswith("3, 2, 1.<|im_end|>\n")
    assert kept[0].messages == tuple(CONVERSATIONS["several_turns"][:5])
    # one row short of the first turn: dropped as too long
    short = turns[0].num_tokens - 2
    with pytest.raises(
        ValueError,
        match="dropped, 2 no assistant turn fits --config.max_len.*raise --config.max_len",
    ):
        encode_conversations(chatml.encoder(), conversations, short, "v")


def test_held_out_prompts_are_the_conversation_without_its_reply(chatml):
    encoder = chatml.encoder()
    held = held_out(encoder, _conversations("system", "ends_with_user"))
    messages = CONVERSATIONS["system"]
    assert held[0].prompt_ids == tuple(encoder.prompt_ids(messages[:-1]))
    assert (
        held[0].reference == messages[-1]["content"] and held[0].question == messages[1]["content"]
    )
    assert held[1].prompt_ids == () and held[1].reference is None  # nothing to score against
    assert held[0].stop_ids == encoder.stop_ids
    assert isinstance(held[0], HeldOut)


# Batches ----------------------------------------------------------------------------------


def _sides(example: ChatExample):
    return get_task("chat").to_sides(example)


def test_a_conversations_batch_row_is_its_ids_with_masked_labels(llama3_case):
    """No BOS or EOS added (trl#1400: the template's own BOS once); the labels are the next
    token where the mask trains it and the pad id elsewhere; the end of turn is a label."""
    encoder = llama3_case.encoder()
    example = encoder.encode(CONVERSATIONS["several_turns"])
    bos, pad = llama3_case.tokenizer.bos_id, llama3_case.tokenizer.pad_id
    (batch,) = bucketed_batches(
        SIDES, [_sides(example)], bucket_lengths=(128,), batch_size=1, pad_id=pad
    )
    n = example.num_tokens - 1
    inputs, targets = batch["inputs"][0], batch["targets"][0]
    assert inputs[:n].tolist() == example.ids[:-1].tolist() and (inputs[n:] == pad).all()
    assert int((inputs == bos).sum()) == 1 and inputs[0] == bos
    trained = example.mask[1:]
    assert targets[:n][trained].tolist() == example.ids[1:][trained].tolist()
    assert (targets[:n][~trained] == pad).all() and (targets[n:] == pad).all()
    eot = encoder.end_of_turn_ids[0]
    assert int((targets == eot).sum()) == 3  # each assistant turn's <|eot_id|> is a label


def test_packing_keeps_each_conversations_mask(chatml):
    encoder, pad = chatml.encoder(), chatml.tokenizer.pad_id
    names = ("one_turn", "system", "several_turns", "unicode", "empty_content", "code_and_braces")
    examples = [encoder.encode(CONVERSATIONS[n]) for n in names]
    alone = [
        bucketed_batches(SIDES, [_sides(e)], bucket_lengths=(128,), batch_size=1, pad_id=pad)[0]
        for e in examples
    ]
    rng = np.random.default_rng(0)
    batches = segment_batches(
        SIDES, [_sides(e) for e in examples], length=128, batch_size=2, rng=rng, pad_id=pad
    )
    # Each conversation alone: its inputs -> its labels.
    labels = {}
    for one in alone:
        n = int((one["inputs"][0] != pad).sum())
        labels[tuple(one["inputs"][0][:n])] = one["targets"][0][:n].tolist()
    packed = {}
    for batch in batches:
        for inputs, targets, segments in zip(
            batch["inputs"], batch["targets"], batch["segment_ids"], strict=True
        ):
            for segment in range(1, segments.max() + 1):
                at = segments == segment
                packed[tuple(inputs[at])] = targets[at].tolist()
    assert packed == labels and len(packed) == len(examples)
    assert max(b["segment_ids"].max() for b in batches) > 1  # rows hold several


def test_masked_tokens_need_a_side_with_labels_and_one_shape():
    with pytest.raises(ValueError, match="one shape"):
        MaskedTokens(np.arange(3), np.ones(2, bool))
    with pytest.raises(ValueError, match="no labels"):
        Side("src", None, "src_segment_ids").sequences(MaskedTokens(np.arange(3), np.ones(3, bool)))


def test_conversation_of_names_the_record():
    with pytest.raises(ChatError, match="r7: a JSON str"):
        conversation_of("hello", "r7")


def test_packed_conversations_do_not_see_each_other(chatml):
    """trl#805, #1230, #3728: in a packed row every conversation gets the logits, labels and
    loss it gets alone (attention within it, positions restarting), and no label crosses
    into the next one."""
    import jax

    from flax_transformer import TransformerConfig
    from flax_transformer.functional import label_smoothed_cross_entropy

    task, encoder, pad = get_task("chat"), chatml.encoder(), chatml.tokenizer.pad_id
    config = TransformerConfig(
        vocab_size=chatml.tokenizer.vocab_size, d_model=32, num_heads=4, num_kv_heads=2,
        d_ff=64, num_layers=2, max_len=256, dropout_rate=0.0, pad_id=pad, positional="rope",
        norm="rmsnorm", activation="swiglu", use_bias=False,
    )  # fmt: skip
    model = task.make_model(config)
    params = model.init(jax.random.key(0), *task.init_inputs())["params"]
    names = ("one_turn", "system", "several_turns", "unicode")
    examples = [_sides(encoder.encode(CONVERSATIONS[n])) for n in names]
    (packed,) = segment_batches(SIDES, examples, length=256, batch_size=1, pad_id=pad)
    assert packed["segment_ids"].max() == len(names)  # all four in one row

    def run(batch):
        logits, labels = task.logits_and_labels(model, params, batch, deterministic=True)
        loss, _ = label_smoothed_cross_entropy(logits, labels, pad_id=pad)
        return np.asarray(logits), np.asarray(loss)

    logits, loss = run(packed)
    segments = packed["segment_ids"][0]
    for example in examples:
        # packing puts the longest first: the segment holding this conversation's inputs
        inputs = example[0].ids[:-1].tolist()
        (s,) = [
            s
            for s in range(1, len(names) + 1)
            if packed["inputs"][0][segments == s].tolist() == inputs
        ]
        (alone,) = bucketed_batches(
            SIDES, [example], bucket_lengths=(256,), batch_size=1, pad_id=pad
        )
        alone_logits, alone_loss = run(alone)
        n = len(example[0]) - 1
        at = segments == s
        np.testing.assert_allclose(logits[0][at], alone_logits[0][:n], atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(loss[0][at], alone_loss[0][:n], atol=1e-5, rtol=1e-5)
        assert packed["targets"][0][at].tolist() == alone["targets"][0][:n].tolist()
