"""A run's conversations as training examples: each encoded by the model's chat template
(`train.data.chat.encoding.ChatEncoder`), cut to `--config.max_len` or dropped, counted and logged.

What happens to a conversation, per split:

- **kept**: it has tokens to train and fits a row (its ids but one, `len(ids) - 1 <=
  max_len`: the inputs are the ids but the last);
- **cut**: longer than `max_len`, it is cut after its last assistant turn that still fits
  (the messages up to that turn, encoded again: a prefix of the conversation, so its
  tokens are the ones the whole had and that turn ends with its end of turn); the
  messages after it are not trained on. With `train_on='last'` the turn it is cut after is
  the last, and trained;
- **dropped and counted** (`DROPS`): no assistant turn to train (an empty mask: the
  template marks none, or there is no assistant message), a control token inside a
  message, or no assistant turn fits `max_len`. A split whose every conversation is
  dropped is refused, naming the reasons;
- **refused** (`train.data.chat.encoding.ChatError`, the run stops before its first step): a
  conversation the template cannot be trusted on, as part 1 decided: a mask that leaves
  out the end of turn (the model would never learn to stop), prefixes that are not token
  prefixes (the mask would be wrong), a double BOS, a template error. These are defects
  of the template, or of data that a fix (named in the message) repairs, never noise to
  skip: dropping them would train silently on what is left.

The run logs, per split, the conversations kept, cut and dropped (by reason, with the
first of each), and the share of the tokens the model reads that are trained.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import logging
import os
from collections.abc import Sequence

from train.data.chat.encoding import TRAIN_ON, ChatEncoder, ChatExample
from train.data.chat.template import source_chat_template
from train.data.tokenizer import Tokenizer
from train.formats import sources
from train.formats.corpora.conversations import Conversation

# Why a conversation is dropped: the `ChatExample.drop_reason` it starts with -> its count's
# name in the data sizes (`dropped_<name>`) and what the log calls it.
DROPS = {
    "no assistant message": ("no_assistant", "no assistant message to train on"),
    "the template marks no token": ("empty_mask", "the template marks no assistant token"),
    "messages[": ("control_token", "a control token inside a message"),
}
TOO_LONG = ("too_long", "no assistant turn fits --config.max_len")


def run_chat_encoder(
    tokenizer: Tokenizer,
    source_dir: str | os.PathLike | sources.Source,
    *,
    train_on: str = "assistant",
    chat_template: str = "",
    init_from: str = "",
) -> ChatEncoder:
    """The encoder of a run's conversations: the chat template of its pretrained source (a
    run's snapshot, `workdir/pretrained/`), or `chat_template` (`--config.chat_template`, a
    Jinja file) with the source's special tokens, and the run's tokenizer.

    Args:
        tokenizer: the run's tokenizer.
        source_dir: the pretrained source, open (the run's `Source`: not read again), or
            the path of it or of the run's snapshot of it.
        train_on, chat_template: `--config.train_on`, `--config.chat_template`.
        init_from: `--config.init_from`, as errors name the source ('' : its path).

    Raises:
        ValueError: no template (a base model, a run trained from scratch), a file that
            does not read or is not Jinja, an unknown `train_on`.
    """
    if train_on not in TRAIN_ON:
        raise ValueError(f"--config.train_on={train_on!r}: must be one of {TRAIN_ON}.")
    source = source_dir
    if not isinstance(source, sources.Source):
        source = sources.read_source(source_dir, need_weights=False)
    where = f"--config.init_from={init_from!r}" if init_from else None
    template = source_chat_template(source, chat_template or None, where=where)
    return ChatEncoder(template, tokenizer, train_on)


@dataclasses.dataclass
class ChatCounts:
    """What became of one split's conversations.

    Attributes:
        kept: conversations trained on (cut ones included).
        cut: conversations cut after an assistant turn to fit max_len.
        dropped: drop name (`DROPS`, `TOO_LONG`) -> conversations.
        first: drop name -> the first dropped conversation's `where` and reason.
        tokens: tokens the model reads (each kept conversation's ids but the last).
        trained: of them, tokens whose next token is a label (the mask's tokens but the
            first).
    """

    kept: int = 0
    cut: int = 0
    dropped: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    first: dict[str, str] = dataclasses.field(default_factory=dict)
    tokens: int = 0
    trained: int = 0

    def drop(self, name: str, where: str, reason: str) -> None:
        self.dropped[name] += 1
        self.first.setdefault(name, f"{where}: {reason}")

    def sizes(self, split: str) -> dict[str, int]:
        """The counts as the run's data sizes, prefixed by `split` ('train', 'valid')."""
        counts = {"cut": self.cut, "tokens": self.tokens, "trained_tokens": self.trained}
        counts |= {f"dropped_{name}": n for name, n in sorted(self.dropped.items())}
        return {f"{split}_{name}": n for name, n in counts.items()}

    def reasons(self) -> str:
        """The drops by reason, most first, each with its first conversation."""
        labels = dict(DROPS.values()) | dict([TOO_LONG])
        return "; ".join(
            f"{n} {labels.get(name, name)} (first: {self.first[name]})"
            for name, n in self.dropped.most_common()
        )

    def describe(self, split: str) -> str:
        """One log line: kept, cut, dropped by reason, the share trained."""
        dropped = sum(self.dropped.values())
        share = self.trained / max(self.tokens, 1)
        line = (
            f"Conversations ({split}): {self.kept} kept ({self.cut} cut to fit max_len), "
            f"{dropped} dropped"
        )
        if dropped:
            line += f": {self.reasons()}"
        return (
            f"{line}. Trained tokens: {self.trained:,} of the {self.tokens:,} the model reads "
            f"({100 * share:.1f}%)."
        )


@dataclasses.dataclass(frozen=True)
class HeldOut:
    """A validation conversation as the end of a run asks the model to answer it.

    Attributes:
        conversation: the conversation (as encoded: cut where it was cut).
        prompt_ids: the ids of its messages before the reply, with the template's
            generation prompt (`ChatEncoder.prompt_ids`); () where it does not end with an
            assistant reply (nothing to compare an answer with).
        stop_ids: the ids decoding stops at (`ChatEncoder.stop_ids`).
    """

    conversation: Conversation
    prompt_ids: tuple[int, ...]
    stop_ids: tuple[int, ...]

    @property
    def reference(self) -> str | None:
        """The reply the model's answer is scored against."""
        return self.conversation.reply

    @property
    def question(self) -> str:
        """The last message before the reply (the user's, usually), as samples show it."""
        prompt = self.conversation.prompt
        return prompt[-1]["content"] if prompt else ""


def held_out(encoder: ChatEncoder, conversations: Sequence[Conversation]) -> list[HeldOut]:
    """Each validation conversation with its prompt ids (see `HeldOut`).

    Raises:
        ChatError: the template refuses a prompt (as `ChatEncoder.prompt_ids`).
    """
    return [
        HeldOut(
            c,
            tuple(encoder.prompt_ids(c.prompt, where=c.where, tools=c.tools))
            if c.reply is not None and c.prompt
            else (),
            encoder.stop_ids,
        )
        for c in conversations
    ]


def _drop_name(reason: str) -> str:
    for start, (name, _) in DROPS.items():
        if reason.startswith(start):
            return name
    return reason  # a reason this module does not know yet: counted under itself


def _fits(example: ChatExample, max_len: int) -> bool:
    return example.num_tokens - 1 <= max_len


def _cut(
    encoder: ChatEncoder, conversation: Conversation, max_len: int
) -> tuple[ChatExample, Conversation] | None:
    """The conversation cut after its last assistant turn that fits `max_len` (a binary
    search over the turns: a longer prefix has more tokens), or None."""
    messages = conversation.messages
    ends = [k + 1 for k, m in enumerate(messages) if m["role"] == "assistant"]
    ends = [end for end in ends if end < len(messages)]  # proper prefixes only
    encoded: dict[int, ChatExample] = {}

    def too_long(i: int) -> bool:
        if i not in encoded:
            encoded[i] = encoder.encode(
                messages[: ends[i]], where=conversation.where, tools=conversation.tools
            )
        return not _fits(encoded[i], max_len)

    # The first prefix that does not fit; the one before it is the longest that does.
    i = bisect.bisect_left(range(len(ends)), True, key=too_long) - 1
    if i < 0 or encoded[i].drop_reason:
        return None
    return encoded[i], dataclasses.replace(conversation, messages=messages[: ends[i]])


def encode_conversations(
    encoder: ChatEncoder, conversations: Sequence[Conversation], max_len: int, split: str
) -> tuple[list[ChatExample], list[Conversation], ChatCounts]:
    """One split's conversations as examples (see the module docstring), logged.

    Args:
        encoder: the run's `ChatEncoder` (`run_chat_encoder`).
        conversations: the split's conversations, in order.
        max_len: `--config.max_len`, the slots of a row.
        split: 'train' or 'validation', for the log and errors.

    Returns:
        (the kept examples, their conversations as encoded (cut ones cut), the counts).

    Raises:
        ChatError: a conversation refused (see the module docstring).
        ValueError: every conversation of the split dropped (names why).
    """
    examples, kept, counts = [], [], ChatCounts()
    for conversation in conversations:
        example = encoder.encode(
            conversation.messages, where=conversation.where, tools=conversation.tools
        )
        if example.drop_reason:
            counts.drop(_drop_name(example.drop_reason), conversation.where, example.drop_reason)
            continue
        if not _fits(example, max_len):
            cut = _cut(encoder, conversation, max_len)
            if cut is None:
                counts.drop(
                    TOO_LONG[0],
                    conversation.where,
                    f"{example.num_tokens} tokens (a row holds max_len + 1 = {max_len + 1}), "
                    "and no assistant turn before its last ends within them",
                )
                continue
            (example, conversation), counts.cut = cut, counts.cut + 1
        examples.append(example)
        kept.append(conversation)
        counts.kept += 1
        counts.tokens += example.num_tokens - 1
        counts.trained += int(example.mask[1:].sum())
    logging.info(counts.describe(split))
    if not examples:
        fixes = ["fix the data"]
        if TOO_LONG[0] in counts.dropped:
            fixes.append(f"raise --config.max_len={max_len}")
        raise ValueError(
            f"Every {split} conversation was dropped, {counts.reasons()}: nothing to "
            f"{'train' if split == 'train' else 'validate'} on ; {' or '.join(fixes)}."
        )
    return examples, kept, counts
