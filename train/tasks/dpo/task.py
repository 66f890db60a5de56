"""The preference task (`--config.task=dpo`): DPO, IPO or SimPO on pairs of replies to one
prompt, each side rendered by the model's own chat template, scored on the reply's tokens and
its end of turn, logged under TRL's metric names."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from flax_transformer import lora_mask
from train.data.batching import MaskedTokens, Side
from train.data.chat.encoding import ChatExample
from train.data.chat.examples import HeldOut, run_chat_encoder
from train.data.tokenizer import DEFAULT_SPECIALS, NUM_SPECIAL_IDS
from train.formats.corpora import corpora_for
from train.formats.corpora.conversations import Conversation
from train.formats.corpora.preferences import PreferencePair
from train.tasks.chat.task import ChatTask
from train.tasks.common.base import Encoded
from train.tasks.dpo import reference as reference_lib
from train.tasks.dpo.logps import pair_logps
from train.tasks.dpo.objective import PreferenceLoss, preference_objective
from train.tasks.dpo.options import REFERENCES, DpoOptions
from train.tasks.dpo.pairs import PairExample, encode_pairs


class DpoTask(ChatTask):
    """Preference tuning of a pretrained chat model on (prompt, chosen, rejected) pairs.

    A chat model underneath (the model, its template, its held-out replies scored by BLEU
    and chrF at the end are the 'chat' task's); what differs is the example (a pair,
    `train.formats.corpora.preferences`, encoded by `train.tasks.dpo.pairs`), the batch (the
    chosen and rejected rows side by side, bucketed, one pair a row: `chosen`, `rejected`
    and their `_labels`, the pair's index in `pair`, and the reference in `reference`) and
    the objective (`train.tasks.dpo.objective`: both rows in one forward pass).

    Attributes:
        objective: the preference loss and its constants.
        reference: 'precomputed' or 'adapters_off' (`REFERENCES`).
    """

    name = "dpo"
    corpora = corpora_for("dpo")
    hf_fields = 0
    own_fields = ("chat_template",)
    options = DpoOptions
    file_corpus = "preference"
    packings = ("none",)
    sides = (
        Side("chosen", "chosen_labels", segment_key="chosen_segment_ids"),
        Side("rejected", "rejected_labels", segment_key="rejected_segment_ids"),
        Side(reference_lib.PAIR_KEY, None, segment_key="pair_segment_ids"),
    )
    model_inputs = ("chosen", "rejected")
    models = "language models (preference-tuned)"
    stores_masks = False
    reads_stores = False

    def __init__(self, objective: PreferenceLoss | None = None, reference: str = REFERENCES[0]):
        self.objective = objective or PreferenceLoss()
        self.reference = reference

    def configured(self, data):
        """The task with its options (`--config.tasks.dpo`, `DpoOptions`) read."""
        options = data.tasks.dpo
        objective = PreferenceLoss(
            options.loss,
            beta=options.beta,
            label_smoothing=options.label_smoothing,
            simpo_gamma=options.simpo_gamma,
        )
        return DpoTask(objective, options.reference)

    # The examples.

    def fields(self, example):
        if isinstance(example, PairExample):
            return (example.chosen.ids.tolist(), example.rejected.ids.tolist())
        if isinstance(example, PreferencePair):
            messages = (*example.prompt, example.chosen, example.rejected)
            return tuple(text for m in messages for text in (m["role"], m["content"]))
        return super().fields(example)

    def encode_split(self, data, tokenizer, source_dir, examples, split):
        """The pairs as `PairExample`s (`train.tasks.dpo.pairs`: cut or dropped, counted and
        logged); the validation texts are `HeldOut` prompts answered by the chosen reply."""
        encoder = run_chat_encoder(
            tokenizer,
            source_dir,
            train_on="last",
            chat_template=data.chat_template,
            init_from=data.init_from,
        )
        encoded, kept, counts = encode_pairs(encoder, examples, data.max_len, split)
        texts = kept
        if split == "valid":
            texts = [
                HeldOut(
                    Conversation((*p.prompt, p.chosen), where=p.where),
                    tuple(encoder.prompt_ids(list(p.prompt), where=p.where)),
                    encoder.stop_ids,
                )
                for p in kept
            ]
        return Encoded(encoded, texts, counts.sizes(split))

    def synthetic_example(self, length):
        side = ChatExample(
            np.full((length + 1,), NUM_SPECIAL_IDS, np.int32), np.ones(length + 1, bool)
        )
        return PairExample(side, side, 0)

    def to_sides(self, example, specials=DEFAULT_SPECIALS):
        del specials  # the template wrote every special token
        return (
            MaskedTokens(example.chosen.ids, example.chosen.mask),
            MaskedTokens(example.rejected.ids, example.rejected.mask),
            [example.index],
        )

    def targets(self, examples):
        return [
            x.chosen["content"] if isinstance(x, PreferencePair) else x.reference or ""
            for x in examples
            if isinstance(x, (PreferencePair, HeldOut))
        ]

    # The objective.

    def _logps(self, model, params, batch, setup, *, deterministic, rngs=None):
        return pair_logps(model, params, batch, setup, deterministic=deterministic, rngs=rngs)

    def _reference(self, model, params, batch, setup):
        if not self.objective.needs_reference:
            return None
        if self.reference == "adapters_off":
            # The base model: every adapter's A and B zero adds nothing to its kernel.
            base = jax.tree.map(
                lambda p, is_adapter: jnp.zeros_like(p) if is_adapter else p,
                params,
                lora_mask(params),
            )
            chosen, rejected = self._logps(
                model, jax.lax.stop_gradient(base), batch, setup, deterministic=True
            )
            return chosen[0], rejected[0]
        reference = batch[reference_lib.REFERENCE_KEY]
        return reference[:, 0], reference[:, 1]

    def loss(self, model, params, batch, setup, *, deterministic, rngs=None):
        """The mean preference loss over the batch's pairs and its sums
        (`train.tasks.dpo.objective.preference_objective`); the token loss's
        `--config.label_smoothing` does not apply (`--config.tasks.dpo.label_smoothing` does)."""
        chosen, rejected = self._logps(
            model, params, batch, setup, deterministic=deterministic, rngs=rngs
        )
        reference = self._reference(model, params, batch, setup)
        return preference_objective(self.objective, chosen, rejected, reference)

    def eval_sums(self, model, params, batch, setup):
        return self.loss(model, params, batch, setup, deterministic=True)[1]

    def before_training(self, dataset, model, params, put_batch, run, *, resuming):
        """The precomputed reference (`train.tasks.dpo.reference.precomputed`), or with
        'adapters_off' a check that the model has adapters to turn off."""
        if not self.objective.needs_reference:
            return dataset
        if self.reference == "adapters_off":
            if not any(jax.tree.leaves(lora_mask(params))):
                raise ValueError(
                    "--config.tasks.dpo.reference=adapters_off: the model has no LoRA adapters to "
                    "turn off ; set --config.model.lora_rank (e.g. 8), or use "
                    "--config.tasks.dpo.reference=precomputed."
                )
            return dataset
        return reference_lib.precomputed(dataset, model, params, put_batch, run, resuming=resuming)
