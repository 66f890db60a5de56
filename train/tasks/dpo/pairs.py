"""Preference pairs as token ids: each side (the prompt and one reply) rendered by the model's
chat template with the chat task's encoder (`train.data.chat.encoding.ChatEncoder`, `train_on=
'last'`: the reply's content and its end of turn are scored, nothing else), cut to
`--config.max_len` or dropped, counted and logged.

What happens to a pair, per split:

- **kept**: both sides fit a row (`len(ids) - 1 <= max_len`);
- **cut**: a side longer than that is cut at its end (the prompt is never cut: a cut prompt
  changes what the reply answers, so the cut falls in the reply, whose end of turn is then
  not scored); the pair is kept if each reply keeps a scored token;
- **dropped and counted** (`DROPS`): chosen equal to rejected (nothing to prefer), a reply
  with no scored token left after the cut (the prompt fills the row), and what the chat
  encoder drops (a control token inside a message). A split whose every pair is dropped is
  refused, naming the reasons;
- **refused** (ValueError, the run stops before its first step): a pair whose prompt renders
  to other tokens in the chosen conversation than in the rejected one (the template or a
  BPE merge joins the prompt's last token to the reply: the two log-probabilities would not
  be of replies to one prompt), and what the chat encoder refuses (`ChatError`).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Sequence

import numpy as np

from train.data.chat.encoding import ChatEncoder, ChatExample
from train.formats.corpora.preferences import PreferencePair

# Why a pair is dropped: its count's name in the data sizes (`dropped_<name>`) -> what the
# log calls it.
DROPS = {
    "identical": "chosen equal to rejected",
    "truncated": "a reply with no scored token within --config.max_len",
    "control_token": "a control token inside a message",
}


@dataclasses.dataclass(frozen=True, eq=False)
class PairExample:
    """One pair as ids: each side the whole conversation (prompt, reply, end of turn).

    Attributes:
        chosen, rejected: the two sides (`ChatExample`: `(T,)` ids and a `(T,)` mask that
            is True on the reply's scored tokens).
        index: the pair's position among its split's kept pairs (the reference's row).
    """

    chosen: ChatExample
    rejected: ChatExample
    index: int


@dataclasses.dataclass
class PairCounts:
    """What became of one split's pairs.

    Attributes:
        kept: pairs kept (cut ones included).
        cut: pairs with a side cut at its end to fit max_len.
        dropped: drop name (`DROPS`) -> pairs.
        first: drop name -> the first dropped pair's `where`.
    """

    kept: int = 0
    cut: int = 0
    dropped: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    first: dict[str, str] = dataclasses.field(default_factory=dict)

    def drop(self, name: str, where: str) -> None:
        self.dropped[name] += 1
        self.first.setdefault(name, where)

    def sizes(self, split: str) -> dict[str, int]:
        """The counts as the run's data sizes, prefixed by `split`."""
        counts = {"pairs": self.kept, "pairs_cut": self.cut}
        counts |= {f"dropped_{name}": self.dropped[name] for name in DROPS}
        return {f"{split}_{name}": n for name, n in counts.items()}

    def reasons(self) -> str:
        return "; ".join(
            f"{n} {DROPS[name]} (first: {self.first[name]})"
            for name, n in self.dropped.most_common()
        )

    def describe(self, split: str) -> str:
        dropped = sum(self.dropped.values())
        line = f"Preference pairs ({split}): {self.kept} kept ({self.cut} cut to fit max_len), "
        line += f"{dropped} dropped"
        return line + (f": {self.reasons()}." if dropped else ".")


def _first_scored(example: ChatExample) -> int:
    return int(np.argmax(example.mask))


def _cut(example: ChatExample, max_len: int) -> ChatExample:
    """The side cut to a row's max_len + 1 tokens (inputs and labels one apart)."""
    keep = max_len + 1
    return ChatExample(example.ids[:keep], example.mask[:keep])


def encode_pair(
    encoder: ChatEncoder, pair: PreferencePair, max_len: int, index: int
) -> tuple[PairExample | None, str | None, bool]:
    """One pair as ids (see the module docstring).

    Returns:
        (the example or None, the drop name where dropped, whether a side was cut).

    Raises:
        ValueError: the prompt renders to other tokens before each reply; ChatError as the
            encoder refuses.
    """
    if pair.chosen["content"] == pair.rejected["content"]:
        return None, "identical", False
    sides = []
    for reply in (pair.chosen, pair.rejected):
        example = encoder.encode([*pair.prompt, reply], where=pair.where)
        if example.drop_reason:
            if example.drop_reason.startswith("messages["):
                return None, "control_token", False
            raise ValueError(f"{pair.where}: {example.drop_reason}.")
        sides.append(example)
    chosen, rejected = sides
    start_c, start_r = _first_scored(chosen), _first_scored(rejected)
    if start_c != start_r or not np.array_equal(chosen.ids[:start_c], rejected.ids[:start_r]):
        raise ValueError(
            f"{pair.where}: its prompt renders to other tokens before the chosen reply "
            f"({start_c} tokens) than before the rejected one ({start_r}): the chat template "
            "or a token merge joins the prompt to the reply, so the two replies would not "
            "answer one prompt ; end the prompt where the template starts the reply, or fix "
            "the pair."
        )
    cut = False
    if max(chosen.num_tokens, rejected.num_tokens) - 1 > max_len:
        cut = True
        chosen, rejected = _cut(chosen, max_len), _cut(rejected, max_len)
        if not (chosen.mask[1:].any() and rejected.mask[1:].any()):
            return None, "truncated", True
    return PairExample(chosen, rejected, index), None, cut


def encode_pairs(
    encoder: ChatEncoder, pairs: Sequence[PreferencePair], max_len: int, split: str
) -> tuple[list[PairExample], list[PreferencePair], PairCounts]:
    """One split's pairs as examples, logged.

    Returns:
        (the kept examples, their pairs, the counts).

    Raises:
        ValueError: a pair refused (see the module docstring), or every pair dropped
            (naming why and the fix).
    """
    examples, kept, counts = [], [], PairCounts()
    for pair in pairs:
        example, dropped, cut = encode_pair(encoder, pair, max_len, len(examples))
        if dropped:
            counts.drop(dropped, pair.where)
            continue
        examples.append(example)
        kept.append(pair)
        counts.kept += 1
        counts.cut += cut
    logging.info(counts.describe(split))
    if not examples:
        fixes = ["fix the data"]
        if counts.dropped["truncated"]:
            fixes.append(f"raise --config.max_len={max_len}")
        raise ValueError(
            f"Every {split} preference pair was dropped, {counts.reasons()}: nothing to "
            f"{'train' if split == 'train' else 'validate'} on ; {' or '.join(fixes)}."
        )
    return examples, kept, counts
