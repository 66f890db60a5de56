"""What a conversation's encoding takes and gives: the tokenizer it needs (`ChatTokenizer`) and
one encoded conversation (`ChatExample`: ids and the loss mask), made by
`train.data.chat.encoding.ChatEncoder`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Protocol

import numpy as np


class ChatTokenizer(Protocol):
    """What a chat needs of a tokenizer (`train.data.hf_tokenizer.PretrainedTokenizer`)."""

    bos_id: int
    eos_id: int

    def encode(self, text: str) -> list[int]: ...

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]: ...

    @property
    def added_tokens(self) -> Mapping[str, int]: ...

    @property
    def special_token_ids(self) -> frozenset[int]: ...

    def id_to_piece(self, token_id: int) -> str: ...


@dataclasses.dataclass(frozen=True, eq=False)
class ChatExample:
    """One conversation as ids and a loss mask.

    Attributes:
        ids: (T,) int32, the whole conversation (empty where dropped).
        mask: (T,) bool, True where the token is a target of the loss.
        drop_reason: why the conversation should not be trained on (None: keep it).
    """

    ids: np.ndarray
    mask: np.ndarray
    drop_reason: str | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.ids.shape[0])

    @property
    def num_trained(self) -> int:
        return int(self.mask.sum())

    @classmethod
    def dropped(cls, reason: str) -> ChatExample:
        return cls(np.zeros((0,), np.int32), np.zeros((0,), bool), reason)
