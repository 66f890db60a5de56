"""The task a run trains, as one class: `Task`, which every task folder under
`train/tasks/` subclasses (`translation/`, `lm/`, `chat/`).

A task owns what its examples are made of (a (source, target) pair of sentences, one line,
or a conversation), how they become token ids, the sides they fill in a batch, the model it
trains, the inputs that initialise it, its objective (the loss of a batch and the metric sums
the step reports: `Task.loss`, `Task.eval_sums`; token cross-entropy by default,
`train.tasks.common.objective`), and what a run decodes and reports at the end. The rest of `train/`
asks `get_task(config.task)` and never branches on a task's name or on the shape of its
examples; data/ and store/ receive a task as a value and never import this package.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np
from flax import linen as nn

from flax_transformer import (
    TransformerConfig,
)
from train.config.sections import DataConfig, EvalConfig
from train.config.tasks import TaskFacts
from train.data.batching import Side, SideTokens, example_slots
from train.data.tokenizer import DEFAULT_SPECIALS, PAD_ID, SpecialIds, Tokenizer
from train.formats.sources import Source
from train.tasks.common.objective import LossSetup, head_cross_entropy, head_eval_sums

# Shape of the dummy batch used to initialise parameters (no parameter depends on it).
_INIT_BATCH_SHAPE = (1, 8)

Batch = dict[str, np.ndarray]


class Encoded(NamedTuple):
    """A split's examples as token ids (`Task.encode_split`).

    Attributes:
        examples: the tokenized examples kept, in order.
        texts: their texts as the run reports them, in step with `examples`.
        sizes: counts the run adds to its data sizes (dropped examples by reason, tokens
            trained); {} where the task drops nothing.
    """

    examples: list
    texts: list
    sizes: dict[str, int]


class Task:
    """One kind of training run; subclasses fill in every member.

    Attributes:
        name: the `config.task` value.
        corpora: the `config.corpus` values whose examples this task reads (the corpus
            table's, `train.formats.corpora.corpora_for`).
        hf_fields: how many fields of a Hugging Face row make one example.
        own_fields: config fields that apply to this task only (0 / False for the others).
        file_corpus: the `config.corpus` the user's own validation and test files
            (`valid_path`, `test_path`) are read as, when the corpus itself reads no files.
        packings: the `config.packing` values this task batches with.
        sides: what each side of an example fills in a batch (`batching.Side`), in the
            order of `to_sides`.
        model_inputs: the batch keys fed to the model (the tokens a step processes).
        tool: the command-line program that decodes a trained model of this task.
        models: what such models are called, for messages ("translation models").
        reports_bits_per_char: whether validation adds bits per character.
        fine_tunes: whether a run may start from pretrained weights (`--config.init_from`:
            a decoder-only model).
        needs_pretrained: whether a run must (its examples need the model's chat template).
        stores_masks: whether its examples carry a loss mask, so that its token store keeps
            one beside the ids and is read as whole examples packed in rows
            (`train.data.chat.store`, `train.data.chat.rows`).
        reads_stores: whether a token store can feed it (`--config.store_dir`).
        verbatim: whether its text is kept verbatim where `collapse_whitespace` is None.
        conversations: whether its examples are conversations, read through a chat
            template.
        options: the frozen dataclass of the options it owns (`--config.tasks.<name>.<field>`,
            read in `configured` as `data.tasks.<name>`), or None.
        model_type: the class of the model it trains.
        stacks: the top-level parameter trees of that model (what its params must hold).
        decoder_input: what the pictures call the decoder's ids.
        self_attention_label: what they call the decoder's self-attention.
    """

    name: str
    corpora: tuple[str, ...]
    hf_fields: int
    own_fields: tuple[str, ...]
    file_corpus: str
    packings: tuple[str, ...]
    sides: tuple[Side, ...]
    model_inputs: tuple[str, ...]
    tool: str
    models: str
    reports_bits_per_char: bool = False
    fine_tunes: bool = False
    needs_pretrained: bool = False
    stores_masks: bool = False
    reads_stores: bool = False
    verbatim: bool = False
    conversations: bool = False
    options: type | None = None
    model_type: type[nn.Module]
    stacks: tuple[str, ...]
    decoder_input: str
    self_attention_label: str

    def facts(self) -> TaskFacts:
        """What the config's checks know of this task (`train.config.tasks`)."""
        # Every fact is the attribute of the same name.
        return TaskFacts(**{f.name: getattr(self, f.name) for f in dataclasses.fields(TaskFacts)})

    def configured(self, data: DataConfig) -> Task:
        """This task with the options it owns read from the data section (its `options`
        section, `data.tasks.<name>`, and its `own_fields`),
        checked: what a run trains with. A task without options returns itself.

        Raises:
            ValueError: an option out of range, naming its config field.
        """
        del data
        return self

    def before_training(
        self, dataset, model: nn.Module, params: Any, put_batch, run, *, resuming: bool
    ):
        """The dataset a run trains on, given the starting weights: where a task's batches
        carry what those weights compute (a preference task's reference log-probabilities),
        it computes that once here, before step 1, and keeps it in `run` for a resumed run,
        whose params are no longer the starting ones. By default the dataset as it is.

        Args:
            dataset: the run's `train.data.dataset.Dataset`.
            model: the model; `params`: its starting parameters (placed), or on resume the
                checkpoint's.
            put_batch: places a numpy batch on the mesh (`train.program.steps.jit_steps`).
            run: the run directory (`train.core.rundir.RunDir`).
            resuming: whether the run resumes from a checkpoint.
        """
        del model, params, put_batch, run, resuming
        return dataset

    def make_model(self, model_config: TransformerConfig) -> nn.Module:
        return self.model_type(model_config)

    def init_inputs(self) -> tuple[jax.Array, ...]:
        """Dummy inputs for `model.init`."""
        raise NotImplementedError

    def logits_and_labels(
        self, model: nn.Module, params: Any, batch, *, deterministic: bool, rngs=None
    ) -> tuple[jax.Array, jax.Array]:
        """The loss inputs of a batch: `(B, L, V)` logits and `(B, L)` labels.

        A packed batch (segment id keys, `train.data.packing`) gives every example the logits
        it has alone; its labels are padding wherever no example is.
        """
        raise NotImplementedError

    def hidden_and_labels(
        self, model: nn.Module, params: Any, batch, *, deterministic: bool, rngs=None
    ) -> tuple[jax.Array, jax.Array]:
        """`logits_and_labels` before the head: `(B, L, D)` final hidden states (the
        model's `hidden_states`) and `(B, L)` labels, for the default objective, which
        applies the head block by block."""
        raise NotImplementedError

    # The objective: what the step differentiates and reports (`train.program.steps`).

    def loss(
        self,
        model: nn.Module,
        params: Any,
        batch,
        setup: LossSetup,
        *,
        deterministic: bool,
        rngs=None,
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """The mean loss of a batch (what the step differentiates) and the metric sums it
        reports; by default label-smoothed token cross-entropy of `hidden_and_labels`
        through the model's head, block by block
        (`train.tasks.common.objective.head_cross_entropy`). A task with another objective
        (pairs of replies, a reference model) overrides this and `eval_sums`."""
        hidden, labels = self.hidden_and_labels(
            model, params, batch, deterministic=deterministic, rngs=rngs
        )
        return head_cross_entropy(model, params, hidden, labels, setup)

    def eval_sums(
        self, model: nn.Module, params: Any, batch, setup: LossSetup
    ) -> dict[str, jax.Array]:
        """Metric sums of one validation batch, without dropout or label smoothing."""
        hidden, labels = self.hidden_and_labels(model, params, batch, deterministic=True)
        return head_eval_sums(model, params, hidden, labels, setup)

    def fields(self, example) -> tuple:
        """The sentences (texts, or their token ids) an example is made of, in file order."""
        raise NotImplementedError

    def encode(self, tokenizer: Tokenizer, example):
        """The example with each sentence replaced by its token ids."""
        raise NotImplementedError

    def encode_split(
        self,
        data: DataConfig,
        tokenizer: Tokenizer,
        source_dir: str | os.PathLike | Source,
        examples: Sequence,
        split: str,
    ) -> Encoded:
        """One split's examples as token ids (`encode` of each), the texts of those kept,
        and what the task counted on the way.

        Args:
            data: the data section.
            tokenizer: the run's tokenizer.
            source_dir: the run's pretrained source, for a task that needs more of it than
                the tokenizer: open (the `Source` the run opened once), or the path of the
                run's copy of it (`RunDir.pretrained`).
            examples: the split's examples, as text.
            split: 'train' or 'valid'.

        Raises:
            ValueError: an example the task refuses, or none left to train on.
        """
        del data, source_dir, split
        return Encoded([self.encode(tokenizer, x) for x in examples], list(examples), {})

    def synthetic_example(self, length: int):
        """A tokenized example of padded length `length` (every id the first ordinary piece):
        batched, it has the shapes and keys of real batches, without reading data
        (`train.compile` builds its abstract batches so)."""
        raise NotImplementedError

    def to_sides(self, example, specials: SpecialIds = DEFAULT_SPECIALS) -> SideTokens:
        """A tokenized example's ids on each of `sides`, with the tokenizer's BOS and EOS
        (`specials`) around a side that has labels."""
        raise NotImplementedError

    def targets(self, examples: Sequence) -> list:
        """The target side of each example (ids or text): what the model is scored on."""
        raise NotImplementedError

    def sentences(self, examples: Iterable) -> list:
        """Every sentence (text or ids) of the examples, example by example: to train a
        tokenizer on, or to check the ids of."""
        return list(itertools.chain.from_iterable(map(self.fields, examples)))

    def example_length(self, example) -> int:
        """The padded length a tokenized example needs: its longest side's slots."""
        return example_slots(self.sides, self.to_sides(example))

    def tokens_in(self, batch: Batch, pad_id: int = PAD_ID) -> int:
        """Non-padding tokens fed to the model by a numpy batch (`pad_id`: the tokenizer's)."""
        return int(sum(np.count_nonzero(batch[key] != pad_id) for key in self.model_inputs))

    def drop_decoder_inputs(self, batch, rate: float, key, *, unk_id: int, pad_id: int):
        """The batch with word dropout applied to its decoder inputs, where the task has any."""
        del rate, key, unk_id, pad_id
        return batch

    def interim_scores(
        self, evaluation: EvalConfig, dataset, model: nn.Module, params: Any
    ) -> tuple[str, dict, str] | None:
        """Scores computed during training: (metrics split, record, line to print), or None.

        Every process of a run calls it (any decoding is shared), with the placed params.
        `evaluation` is the run's eval section (`train.config.sections.EvalConfig`).
        """
        del evaluation, dataset, model, params
        return None

    def final_outputs(self, evaluation: EvalConfig, dataset, model: nn.Module, params: Any) -> dict:
        """What a run ends with besides the validation loss (scores, samples)."""
        raise NotImplementedError

    def check_outputs(self, evaluation: EvalConfig, tokenizer: Tokenizer, *, interim: bool):
        """Checks every setting that `final_outputs` (and `interim_scores`, when `interim`)
        will use, with the run's tokenizer, before the first step: so that a run never fails
        at its end, after the compute is spent.

        Raises:
            ValueError: a setting that would fail, naming its config fields and the fix.
        A setting whose intent is clear is adjusted where it is used, with a warning logged
        here.
        """
        del evaluation, tokenizer, interim

    # One example shown by a tool (train.visualize): source ids where the task has a source
    # (else None), and the decoder's ids.

    def shown_prompt(self, tokenizer: Tokenizer, encoded: list[int]) -> tuple[list | None, list]:
        """`(source ids or None, decoder prompt)` of a text's ids: a source sentence and BOS,
        or BOS + a prompt."""
        raise NotImplementedError

    def greedy_continuation(
        self, model, variables, tokenizer: Tokenizer, source, prompt, max_new_tokens: int
    ) -> list[int]:
        """The ids the model decodes greedily after `prompt` (given `source`), EOS cut."""
        raise NotImplementedError

    def given_target(self, tokenizer: Tokenizer, text: str, target: str) -> tuple[list, list]:
        """`(source ids, BOS + target ids)` of an example whose target is given.

        Raises:
            ValueError: the task has no target apart from its text.
        """
        raise NotImplementedError

    def shown_inputs(self, src_ids, tgt_ids) -> tuple[jax.Array, ...]:
        """The model's inputs for one example: int `(1, S)` source ids where the task has a
        source, and `(1, T)` decoder ids.

        Raises:
            ValueError: `src_ids` is None for a task with a source, or given for one without.
        """
        raise NotImplementedError
