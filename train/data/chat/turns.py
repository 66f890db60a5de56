"""Where each assistant turn of a rendered conversation begins and ends, for a template
without `{% generation %}` blocks (`train.data.chat.encoding`, train_on 'assistant' and
'last').

A turn is found from renderings of the conversation cut short, each checked to be a prefix
of the whole rendering W (so that no text outside the turn can fall inside it):

- **its beginning**: messages[:k] with the generation prompt (G). Where W begins with G,
  the turn begins after it, and the ids of G alone must be the first ids of W (what the
  model is given when it samples is what it was trained after). Where it does not (a
  reasoning template's prompt opens the turn with `<think>` or a channel marker that a
  finished turn does not have: DeepSeek-R1, QwQ, gemma-4, GLM...), the turn begins after
  the text G and W share past messages[:k] (the role header the prompt and the finished
  turn both write, e.g. '<｜Assistant｜>'); that must not be empty.
- **its end**: messages[:k+1] (E). Where W begins with E, the turn ends there. Where it
  does not (Qwen3 writes the last assistant turn with a `<think></think>` block the same
  turn lacks once a user message follows; gpt-oss ends the last turn with '<|return|>',
  the others with '<|end|>'), the turn ends where the next message's rendering begins:
  messages[:k+2] minus the rendering of message k+1 (found by rendering it right after
  messages[:k]), checked to end W's prefix with that same text.

Text the template writes only at the very end of a conversation rendered without the
generation prompt (Phi-3.5's '<|endoftext|>', `ChatEncoder.open_text`) is cut from each
rendering before it is compared, and is not part of the last turn.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Mapping, Sequence
from typing import Any

from train.formats.corpora.conversations import ChatError


def common_prefix(a: Sequence, b: Sequence) -> Sequence:
    """The longest string (or list) both `a` and `b` begin with."""
    return os.path.commonprefix([a, b])


class TurnFinder:
    """The [begin, end) token span of each assistant turn of one conversation.

    Attributes:
        encoder: the `ChatEncoder` (its template, tokenizer and end-of-turn tokens).
        messages, tools: the conversation, checked.
        whole: the conversation's rendered text; ids, offsets: its tokens and their
            character spans.
        where: the conversation, as errors name it.
    """

    def __init__(
        self,
        encoder,
        messages: Sequence[Mapping[str, str]],
        tools: Sequence[Mapping[str, Any]] | None,
        whole: str,
        ids: Sequence[int],
        offsets: Sequence[tuple[int, int]],
        where: str,
    ):
        self.encoder, self.messages, self.tools = encoder, list(messages), tools
        self.whole, self.ids, self.where = whole, ids, where
        self._starts = [start for start, _ in offsets]
        self._ends = [end for _, end in offsets]
        self._texts: dict[tuple, str] = {}

    def _text(self, upto: int, prompt: bool = False, skip: int | None = None) -> str:
        """The rendering of messages[:upto] (with the generation prompt where `prompt`;
        without message `skip`), cached."""
        key = (upto, prompt, skip)
        if key not in self._texts:
            messages = [m for i, m in enumerate(self.messages[:upto]) if i != skip]
            self._texts[key] = self.encoder._render(messages, self.where, prompt, self.tools).text
        return self._texts[key]

    def _open(self, upto: int, skip: int | None = None) -> str:
        return self.encoder.open_text(self._text(upto, skip=skip))

    def _name(self) -> str:
        return self.encoder.template.where

    def turn(self, k: int) -> tuple[int, int]:
        """The token span of the assistant turn messages[k]: its reply and end of turn.

        Raises:
            ChatError: a turn that cannot be told from its neighbours (naming the cause),
                a BPE merge across its edge, or one without its end-of-turn token.
        """
        begin_char, begin = self._begin(k)
        end = self._end(k, begin_char)
        if not set(self.ids[begin:end]) & set(self.encoder.turn_end_ids):
            raise ChatError(
                self.encoder._no_end_of_turn(self.where, f"the assistant turn messages[{k}]")
            )
        return begin, end

    def _begin(self, k: int) -> tuple[int, int]:
        prompted = self._text(k, prompt=True)
        if self.whole.startswith(prompted):
            return len(prompted), self.encoder._token_prefix(prompted, self.ids, k, self.where)
        before = self._open(k)
        if not (self.whole.startswith(before) and prompted.startswith(before)):
            raise ChatError(
                f"{self.where}: {self._name()} writes messages[:{k}] differently from how it "
                f"begins the whole conversation (it rewrites earlier turns), so the assistant "
                f"turn messages[{k}] cannot be told from its prompt; give a template with "
                "{% generation %} blocks (--config.chat_template=FILE) or use "
                "--config.train_on='all'."
            )
        opening = prompted[len(before) :]
        header = common_prefix(opening, self.whole[len(before) :])
        if not header:
            written = self.whole[len(before) : len(before) + len(opening)]
            raise ChatError(
                f"{self.where}: the generation prompt of {self._name()} ({opening!r}) shares "
                f"nothing with the assistant turn messages[{k}] as the conversation writes it "
                f"({written!r}), so the turn's role header cannot be told from its reply; give "
                "a template with {% generation %} blocks (--config.chat_template=FILE) or use "
                "--config.train_on='all'."
            )
        # The turn begins at the first token not wholly inside the shared header: a token
        # holding its last characters and the next ones ('\n\n' where the prompt ends
        # '<think>\n') is trained, as long as it starts inside the turn.
        char = len(before) + len(header)
        begin = bisect.bisect_right(self._ends, char)
        if begin < len(self.ids) and self._starts[begin] < len(before):
            self._boundary(len(before), k)  # raises: a merge across the turn's start
        return char, begin

    def _end(self, k: int, begin_char: int) -> int:
        if k + 1 == len(self.messages):
            end = len(self.encoder.open_text(self.whole))
            return len(self.ids) if end == len(self.whole) else self._boundary(end, k)
        finished = self._text(k + 1)
        if self.whole.startswith(finished):
            return self.encoder._token_prefix(finished, self.ids, k, self.where)
        finished = self._open(k + 1)
        if self.whole.startswith(finished):
            return self._boundary(len(finished), k)
        end = self._next_message_start(k)
        if end is None or end < begin_char:
            raise ChatError(
                f"{self.where}: {self._name()} writes messages[:{k + 1}] differently from how "
                f"it begins the whole conversation, and the next message's turn could not be "
                f"found, so the end of the assistant turn messages[{k}] is not known; give a "
                "template with {% generation %} blocks (--config.chat_template=FILE) or use "
                "--config.train_on='all'."
            )
        return self._boundary(end, k)

    def _next_message_start(self, k: int) -> int | None:
        """Where message k+1 (a system, user or tool message) begins in the whole: the end
        of messages[:k+2], less message k+1 as the template writes it right after
        messages[:k]; None where that cannot be checked."""
        if self.messages[k + 1]["role"] == "assistant":
            return None
        try:
            through = self._open(k + 2)
            spliced = self._open(k + 2, skip=k)
        except ChatError:  # a template that wants roles to alternate refuses the splice
            return None
        before = self._open(k)
        if not (self.whole.startswith(through) and spliced.startswith(before)):
            return None
        piece = spliced[len(before) :]
        if not piece or not through.endswith(piece):
            return None
        return len(through) - len(piece)

    def _boundary(self, char: int, k: int) -> int:
        """The index of the token that starts at character `char` of the whole (the
        number of tokens where `char` is its end).

        Raises:
            ChatError: a token holds characters on both sides of `char`.
        """
        if char >= len(self.whole):
            return len(self.ids)
        index = bisect.bisect_left(self._starts, char)
        if index == 0 or self._ends[index - 1] <= char:
            return index
        piece = self.encoder.tokenizer.id_to_piece(self.ids[index - 1])
        raise ChatError(
            f"{self.where}: at an edge of the assistant turn messages[{k}], the token "
            f"{piece!r} (token {index - 1}) holds text on both sides of the edge: a BPE merge "
            f"across the turn's edge. Trim the whitespace at the edge of messages[{k}], give a "
            "template with {% generation %} blocks (--config.chat_template=FILE), or use "
            "--config.train_on='all'."
        )
