"""The reference of a preference run: the starting weights' log-probability of every pair's
two replies, computed once before step 1 (TRL's `precompute_ref_log_probs`), kept in the run
directory (`RunDir.reference_logps`) and carried in each batch as `reference` `(B, 2)`
float32 (chosen, rejected), looked up by the pair's row index (the batch key `pair`).

So the run holds one model, not two: the reference costs one forward pass over the data
before training and 8 bytes a pair. A resumed run reads the file back (its params are the
checkpoint's, no longer the starting ones).
"""

from __future__ import annotations

import dataclasses
import logging

import jax
import jax.numpy as jnp
import numpy as np

from train.core import distributed
from train.tasks.common.objective import LossSetup
from train.tasks.dpo.logps import pair_logps

# The batch keys: the pair's index among its split's pairs (column 0 of `PAIR_KEY`), and the
# reference's log-probabilities the loss reads.
PAIR_KEY, REFERENCE_KEY = "pair", "reference"
# A seed for the one epoch of batches the train table is computed over (any order will do:
# every pair is in one epoch once).
_TABLE_SEED = 0
# Progress lines logged per split during the reference pass.
_PROGRESS_LINES = 10


def _table(batches, compute, pad_id: int, split: str) -> np.ndarray:
    """float32 `(N, 2)`: the reference of each of a split's N pairs (a log line at every
    tenth of the batches: on a CPU the pass over a large split takes minutes)."""
    found: dict[int, np.ndarray] = {}
    tenth = max(len(batches) // _PROGRESS_LINES, 1)
    for number, batch in enumerate(batches, start=1):
        if number % tenth == 0:
            logging.info("Reference (%s): batch %d of %d.", split, number, len(batches))
        ref = np.asarray(jax.device_get(compute(batch)))
        real = np.any(batch["chosen_labels"] != pad_id, axis=1)
        for row in np.flatnonzero(real):
            found[int(batch[PAIR_KEY][row, 0])] = ref[row]
    table = np.zeros((len(found), 2), np.float32)
    if sorted(found) != list(range(len(found))):
        raise RuntimeError("The reference pass did not see every pair exactly once.")
    for index, value in found.items():
        table[index] = value
    return table


def with_reference(batch: dict, table: np.ndarray, pad_id: int) -> dict:
    """The batch with its rows' reference log-probabilities (`REFERENCE_KEY`); padding
    rows get zeros (the loss counts them nowhere)."""
    real = np.any(batch["chosen_labels"] != pad_id, axis=1)
    index = np.where(real, batch[PAIR_KEY][:, 0], 0)
    reference = np.where(real[:, None], table[index], 0.0).astype(np.float32)
    return {**batch, REFERENCE_KEY: reference}


class _ReferenceStream:
    """A training stream whose batches carry their reference; checkpointed as the stream."""

    def __init__(self, stream, table: np.ndarray, pad_id: int):
        self.stream, self.table, self.pad_id = stream, table, pad_id

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        return with_reference(next(self.stream), self.table, self.pad_id)

    def state_dict(self):
        return self.stream.state_dict()


def precomputed(dataset, model, params, put_batch, run, *, resuming: bool):
    """The dataset with each batch's reference: computed with `params` (the starting
    weights) over one epoch of training batches and the validation batches, and saved; or
    on resume read back.

    Raises:
        ValueError: several processes (not supported yet), or a resumed run without its
            reference file (the data fingerprint, checked before, keeps its pairs the same).
    """
    if jax.process_count() > 1:
        raise ValueError(
            "--config.tasks.dpo.reference=precomputed runs in one process for now; use "
            "--config.tasks.dpo.reference=adapters_off (with LoRA) on several hosts."
        )
    config = model.config
    pad_id = config.pad_id
    # An imported checkpoint's added pad id (the last) is no class of its softmax.
    drop_pad_logit = pad_id == config.vocab_size - 1
    path = run.reference_logps
    if resuming:
        if not path.exists():
            raise ValueError(
                f"{path} is missing: a resumed preference run reads its reference from it ; "
                "start the run again in a new --workdir."
            )
        with np.load(path) as saved:
            train, valid = saved["train"], saved["valid"]
    else:
        # The training step's head in blocks (its default block_rows), without dropout.
        setup = LossSetup(pad_id, drop_pad_logit=drop_pad_logit)

        @jax.jit
        def logps(params, batch):
            chosen, rejected = pair_logps(model, params, batch, setup, deterministic=True)
            return jnp.stack([chosen[0], rejected[0]], axis=1)

        def compute(batch):
            keys = ("chosen", "rejected", "chosen_labels", "rejected_labels")
            return logps(params, put_batch({k: batch[k] for k in keys}))

        epoch = dataset.build_epoch(np.random.default_rng(_TABLE_SEED))
        train = _table(epoch, compute, pad_id, "train")
        valid = _table(dataset.eval_batches, compute, pad_id, "validation")
        if distributed.is_primary():
            np.savez(path, train=train, valid=valid)
        logging.info(
            "Reference log-probabilities of %d train and %d validation pairs computed with "
            "the starting weights (%s).",
            len(train),
            len(valid),
            path,
        )
    return dataclasses.replace(
        dataset,
        eval_batches=[with_reference(b, valid, pad_id) for b in dataset.eval_batches],
        make_stream=lambda seed, saved, start: _ReferenceStream(
            dataset.make_stream(seed, saved, start), train, pad_id
        ),
    )
