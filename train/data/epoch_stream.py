"""An endless stream of training batches of a corpus held in memory, reshuffled every epoch
and resumable exactly (`EpochStream`): epoch e's batches are a function of (seed, e)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Generic, TypeVar

import numpy as np

T = TypeVar("T")


def epoch_rng(seed: int, epoch: int) -> np.random.Generator:
    """The random generator for one epoch: a function of (seed, epoch) only.

    Args:
        seed: non-negative run seed.
        epoch: non-negative epoch number.

    Returns:
        A fresh numpy Generator seeded with [seed, epoch].
    """
    if seed < 0 or epoch < 0:
        raise ValueError(f"seed={seed} and epoch={epoch} must be non-negative.")
    return np.random.default_rng([seed, epoch])


class EpochStream(Generic[T]):
    """An endless stream of items (batches), reshuffled every epoch, resumable exactly.

    Epoch e's items are `build_epoch(epoch_rng(seed, e))`, so they depend only on the seed
    and the epoch. The state is {'epoch': e, 'position': p}: the next item is item p of epoch
    e. Restoring a saved state (e.g. from JSON) continues the stream exactly where it stopped.
    """

    def __init__(
        self,
        build_epoch: Callable[[np.random.Generator], Sequence[T]],
        *,
        seed: int,
        state: Mapping[str, int] | None = None,
    ):
        """Creates the stream.

        Args:
            build_epoch: makes one epoch's items from its generator; must be deterministic.
            seed: non-negative run seed.
            state: a `state_dict()` saved earlier; None starts at epoch 0, position 0.
        """
        self._build_epoch = build_epoch
        self._seed = seed
        self._epoch = 0
        self._position = 0
        self._items: Sequence[T] | None = None
        if state is not None:
            self.load_state_dict(state)

    def state_dict(self) -> dict[str, int]:
        """The position of the next item: {'epoch': int, 'position': int}."""
        return {"epoch": self._epoch, "position": self._position}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Moves the stream to a saved position.

        Args:
            state: {'epoch': e, 'position': p} with e, p non-negative integers.

        Raises:
            ValueError: the state is malformed.
        """
        epoch, position = state.get("epoch"), state.get("position")
        if set(state) != {"epoch", "position"} or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (epoch, position)
        ):
            raise ValueError(
                f"Stream state {dict(state)} must be {{'epoch': int >= 0, 'position': int >= 0}} "
                "as written by EpochStream.state_dict(); delete the saved state to start over."
            )
        self._epoch, self._position, self._items = epoch, position, None

    @property
    def epoch(self) -> int:
        """The epoch the next item comes from."""
        return self._epoch

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        if self._items is None:
            self._items = self._build_epoch(epoch_rng(self._seed, self._epoch))
            if not self._items:
                raise ValueError(
                    f"Epoch {self._epoch} has no items: the data set is empty or every batch "
                    "was dropped (check drop_remainder and the batch size)."
                )
        if self._position >= len(self._items):
            if self._position > len(self._items):
                raise ValueError(
                    f"Stream state position={self._position} is past the end of epoch "
                    f"{self._epoch} ({len(self._items)} items): the data or batching changed "
                    "since the state was saved; delete the saved state to start over."
                )
            self._epoch, self._position = self._epoch + 1, 0
            self._items = None
            return next(self)
        item = self._items[self._position]
        self._position += 1
        return item
