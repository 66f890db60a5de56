"""What differs between translation, language modelling and chat fine-tuning, in one class
each.

A task owns what its examples are made of (a (source, target) pair of sentences, one line,
or a conversation), how they become token ids, the sides they fill in a batch, the model it
trains, the inputs that initialise it, the logits and labels of a batch, and what a run
decodes and reports at the end. The rest of `train/` asks `get_task(config.task)` and never
branches on a task's name or on the shape of its examples: adding a task means adding one
class to `TASKS`.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from flax_transformer import (
    DecoderOnlyTransformer,
    Transformer,
    TransformerConfig,
    generate_text,
    generate_translation,
    segment_positions,
)
from train.config.sections import DataConfig, EvalConfig
from train.core import distributed
from train.data.batching import MaskedTokens, Side, SideTokens, example_slots
from train.data.chat.encoding import ChatExample
from train.data.chat.examples import (
    HeldOut,
    encode_conversations,
    held_out,
    run_chat_encoder,
)
from train.data.tokenizer import DEFAULT_SPECIALS, NUM_SPECIAL_IDS, PAD_ID, SpecialIds, Tokenizer
from train.formats.corpora import corpora_for
from train.formats.corpora.conversations import Conversation
from train.program import inference
from train.program.inference import cut_at_eos, sample_text

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


def drop_target_tokens(
    tgt_in_BT: jax.Array,
    rate: float,
    key: jax.Array,
    *,
    unk_id: int,
    pad_id: int,
    segment_ids_BT: jax.Array | None = None,
) -> jax.Array:
    """Replaces decoder-input tokens by `unk_id` with probability `rate` (word dropout).

    The decoder can then predict less from its own prefix and must read the source: it
    learns cross-attention sooner (word dropout: Bowman et al. 2016, sec. 3.2; on the target
    side of low-resource NMT: Sennrich & Zhang 2019). Each example's first token (BOS) and
    padding are kept; the labels are untouched.

    Args:
        tgt_in_BT: int `(B, T)` decoder inputs (BOS, then the target shifted right).
        rate: replacement probability in [0, 1).
        key: PRNG key.
        unk_id, pad_id: the tokenizer's unknown and padding ids.
        segment_ids_BT: int `(B, T)` of packed rows, whose examples start (with BOS) at the
            first token of each segment; None: one example per row, starting at 0.

    Returns:
        `(B, T)` ids of the same dtype.
    """
    drop_BT = jax.random.bernoulli(key, rate, tgt_in_BT.shape)
    if segment_ids_BT is None:
        first_BT = (jnp.arange(tgt_in_BT.shape[1]) == 0)[None, :]
    else:
        first_BT = segment_positions(segment_ids_BT) == 0
    drop_BT &= (tgt_in_BT != pad_id) & ~first_BT
    return jnp.where(drop_BT, jnp.asarray(unk_id, tgt_in_BT.dtype), tgt_in_BT)


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
    model_type: type[nn.Module]
    stacks: tuple[str, ...]
    decoder_input: str
    self_attention_label: str

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
        source_dir: str | os.PathLike,
        examples: Sequence,
        split: str,
    ) -> Encoded:
        """One split's examples as token ids (`encode` of each), the texts of those kept,
        and what the task counted on the way.

        Args:
            data: the data section.
            tokenizer: the run's tokenizer.
            source_dir: the run's copy of its pretrained source (`RunDir.pretrained`), for
                a task that needs more of it than the tokenizer.
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


class TranslationTask(Task):
    """Encoder-decoder translation of (source, target) pairs, scored by BLEU and chrF."""

    name = "translation"
    corpora = corpora_for("translation")
    hf_fields = 2
    own_fields = ("copied_targets", "target_token_dropout", "target_bleu")
    file_corpus = "tsv"
    packings = ("none", "segments")
    sides = (
        Side("src", None, segment_key="src_segment_ids"),
        Side("tgt_in", "tgt_out", segment_key="tgt_segment_ids"),
    )
    model_inputs = ("src", "tgt_in")
    tool = "train.translate"
    models = "translation models"
    model_type = Transformer
    stacks = ("encoder", "decoder")
    decoder_input = "decoder input"
    self_attention_label = "decoder causal self-attention"

    def init_inputs(self):
        dummy = jnp.ones(_INIT_BATCH_SHAPE, jnp.int32)
        return dummy, dummy

    def logits_and_labels(self, model, params, batch, *, deterministic, rngs=None):
        logits = model.apply(
            {"params": params},
            batch["src"],
            batch["tgt_in"],
            src_segment_ids_BS=batch.get("src_segment_ids"),
            tgt_segment_ids_BT=batch.get("tgt_segment_ids"),
            deterministic=deterministic,
            rngs=rngs,
        )
        return logits, batch["tgt_out"]

    def fields(self, example):
        source, target = example
        return source, target

    def encode(self, tokenizer, example):
        source, target = example
        return tokenizer.encode(source), tokenizer.encode(target)

    def synthetic_example(self, length):
        return [NUM_SPECIAL_IDS] * length, [NUM_SPECIAL_IDS] * (length - 1)

    def to_sides(self, example, specials=DEFAULT_SPECIALS):
        source, target = example
        return source, [specials.bos, *target, specials.eos]

    def targets(self, examples):
        return [target for _, target in examples]

    def drop_decoder_inputs(self, batch, rate, key, *, unk_id, pad_id):
        batch = dict(batch)
        batch["tgt_in"] = drop_target_tokens(
            batch["tgt_in"],
            rate,
            key,
            unk_id=unk_id,
            pad_id=pad_id,
            segment_ids_BT=batch.get("tgt_segment_ids"),
        )
        return batch

    def interim_scores(self, evaluation, dataset, model, params):
        if not evaluation.bleu_examples:
            return None
        scores, _ = inference.validation_bleu(
            evaluation,
            dataset,
            model,
            distributed.host_copy(params),
            beam_size=evaluation.decode.beam_size,
        )
        return (
            "bleu",
            {k: scores[k] for k in ("bleu", "chrf")},
            f"validation BLEU {scores['bleu']:.2f}, chrF {scores['chrf']:.2f} "
            f"({scores['examples']} sentences, {scores['decoding']})",
        )

    def final_outputs(self, evaluation, dataset, model, params):
        """On the first `bleu_examples` validation pairs: BLEU/chrF and the share of looping
        outputs for greedy decoding and for beam search (`report_beam_size`), the
        copy-the-source baseline where the config asks for it, and `num_samples` pairs side
        by side.

        Returns:
            {'bleu': greedy scores, 'bleu_beam': beam scores (if report_beam_size > 1),
            'copy_baseline': {bleu, chrf} (if copy_baseline), 'samples': [{source,
            reference, model[, model_beam]}]}; no scores when bleu_examples is 0.
        """
        pairs = dataset.valid_examples[: evaluation.bleu_examples]
        if not pairs:
            return {"samples": []}
        results = {}
        results["bleu"], greedy = inference.validation_bleu(evaluation, dataset, model, params)
        shown = range(min(evaluation.num_samples, len(pairs)))
        samples = [
            {"source": pairs[i][0], "reference": pairs[i][1], "model": greedy[i]} for i in shown
        ]
        if evaluation.report_beam_size > 1:
            results["bleu_beam"], beam = inference.validation_bleu(
                evaluation, dataset, model, params, beam_size=evaluation.report_beam_size
            )
            for i in shown:
                samples[i]["model_beam"] = beam[i]
        if evaluation.copy_baseline:
            sources, references = [s for s, _ in pairs], [t for _, t in pairs]
            results["copy_baseline"] = {
                **inference.bleu_and_chrf(sources, references, evaluation.bleu_tokenize),
                "repeated_4gram": inference.repeated_ngram_share(sources),
            }
        return {**results, "samples": samples}

    def check_outputs(self, evaluation, tokenizer, *, interim):
        """BLEU's tokenizer, and the beam searches of the interim (`beam_size`) and final
        (`report_beam_size`) scores, against the vocabulary and decoding length."""
        if not evaluation.bleu_examples:
            return  # nothing is decoded or scored
        inference.check_bleu_tokenize(evaluation.bleu_tokenize)
        decode = evaluation.decode
        beams = {evaluation.report_beam_size: "--config.report_beam_size"}
        if interim:
            beams[decode.beam_size] = "--config.beam_size"
        for size, field in beams.items():
            inference.check_strategy(
                inference.translation_strategy(dataclasses.replace(decode, beam_size=size)),
                vocab_size=tokenizer.vocab_size,
                max_new_tokens=decode.max_decode_len or decode.max_len - 1,
                fields=f"{field}={size} with --config.length_penalty={decode.length_penalty}",
            )

    def shown_prompt(self, tokenizer, encoded):
        return encoded, [tokenizer.bos_id]

    def greedy_continuation(self, model, variables, tokenizer, source, prompt, max_new_tokens):
        del prompt  # BOS, which generate_translation starts with
        rows = generate_translation(
            model, variables, jnp.asarray([source]), bos_id=tokenizer.bos_id,
            eos_id=tokenizer.eos_id, max_new_tokens=max_new_tokens,
        )  # fmt: skip
        return cut_at_eos(rows[0], tokenizer.eos_id)

    def given_target(self, tokenizer, text, target):
        return tokenizer.encode(text), [tokenizer.bos_id, *tokenizer.encode(target)]

    def shown_inputs(self, src_ids, tgt_ids):
        if src_ids is None:
            raise ValueError(f"{self.model_type.__name__} takes src_ids=a list of ids, got None.")
        return jnp.asarray([list(src_ids)], jnp.int32), jnp.asarray([list(tgt_ids)], jnp.int32)


class LanguageModelTask(Task):
    """Decoder-only language modelling of text lines, reported in bits per character too."""

    name = "lm"
    corpora = corpora_for("lm")
    hf_fields = 1
    own_fields = ()
    file_corpus = "text"
    packings = ("none", "segments", "stream")
    sides = (Side("inputs", "targets", segment_key="segment_ids"),)
    model_inputs = ("inputs",)
    tool = "train.sample"
    models = "language models"
    reports_bits_per_char = True
    fine_tunes = True
    model_type = DecoderOnlyTransformer
    stacks = ("decoder",)
    decoder_input = "sequence"
    self_attention_label = "causal self-attention"

    def init_inputs(self):
        return (jnp.ones(_INIT_BATCH_SHAPE, jnp.int32),)

    def logits_and_labels(self, model, params, batch, *, deterministic, rngs=None):
        logits = model.apply(
            {"params": params},
            batch["inputs"],
            segment_ids_BT=batch.get("segment_ids"),
            deterministic=deterministic,
            rngs=rngs,
        )
        return logits, batch["targets"]

    def fields(self, example):
        return (example,)

    def encode(self, tokenizer, example):
        return tokenizer.encode(example)

    def synthetic_example(self, length):
        return [NUM_SPECIAL_IDS] * (length - 1)

    def to_sides(self, example, specials=DEFAULT_SPECIALS):
        return (specials.document(example),)

    def targets(self, examples):
        return list(examples)

    def final_outputs(self, evaluation, dataset, model, params):
        """The `sample_prompts` continued by the model: {'samples': [{prompt, model}]}."""
        prompts = list(evaluation.sample_prompts)
        if not prompts:
            return {"samples": []}
        outputs = sample_text(model, params, dataset.tokenizer, prompts, evaluation.decode)
        return {
            "samples": [{"prompt": p, "model": o} for p, o in zip(prompts, outputs, strict=True)]
        }

    def check_outputs(self, evaluation, tokenizer, *, interim):
        """Each sample prompt against max_len and max_decode_len (a prompt that leaves less
        room is continued by fewer tokens, with a warning), and the sampling settings
        against the vocabulary."""
        del interim  # a language model scores nothing during training
        prompts, decode = evaluation.sample_prompts, evaluation.decode
        if not prompts:
            return
        lengths = [len(tokenizer.specials.prompt(tokenizer.encode(p))) for p in prompts]
        try:
            budgets = inference.continuation_budgets(lengths, decode.max_len, decode.max_decode_len)
        except ValueError as err:
            raise ValueError(f"--config.sample_prompts={prompts!r}: {err}") from None
        for prompt, budget in zip(prompts, budgets, strict=True):
            if decode.max_decode_len and budget < decode.max_decode_len:
                logging.warning(
                    "--config.max_decode_len=%d: the sample prompt %r (%d tokens) leaves room "
                    "for %d new tokens within --config.max_len=%d; it will be continued by %d.",
                    decode.max_decode_len, prompt, len(tokenizer.encode(prompt)), budget,
                    decode.max_len, budget,
                )  # fmt: skip
        inference.check_strategy(
            inference.text_strategy(decode),
            vocab_size=tokenizer.vocab_size,
            max_new_tokens=max(budgets),
            fields=f"--config.top_k={decode.top_k} (vocabulary {tokenizer.vocab_size})",
        )

    def shown_prompt(self, tokenizer, encoded):
        return None, tokenizer.specials.prompt(encoded)

    def greedy_continuation(self, model, variables, tokenizer, source, prompt, max_new_tokens):
        del source  # None
        rows = generate_text(
            model, variables, jnp.asarray([prompt]), eos_id=tokenizer.eos_id,
            max_new_tokens=max_new_tokens,
        )  # fmt: skip
        return cut_at_eos(rows[0], tokenizer.eos_id)

    def given_target(self, tokenizer, text, target):
        raise ValueError(
            "--target is for translation runs; a language model's --text is the whole "
            "sequence: put the continuation into --text."
        )

    def shown_inputs(self, src_ids, tgt_ids):
        if src_ids is not None:
            raise ValueError(
                f"{self.model_type.__name__} takes src_ids=None, got {len(src_ids)} ids."
            )
        return (jnp.asarray([list(tgt_ids)], jnp.int32),)


class ChatTask(LanguageModelTask):
    """Instruction and chat fine-tuning of a pretrained decoder-only model: conversations
    rendered by the model's own chat template, trained on the tokens `--config.train_on`
    marks (the assistant's replies and their end of turn), scored by BLEU and chrF of its
    replies to held-out prompts.

    A language model underneath (the model, its inputs and logits are the 'lm' task's); what
    differs is the example (a conversation, `train.formats.corpora.conversations`), how it becomes ids
    (`train.data.chat.examples`: the template's ids as they are, no BOS or EOS added, and a
    loss mask carried into the batch as `MaskedTokens`) and what the run ends with.
    """

    name = "chat"
    corpora = corpora_for("chat")
    hf_fields = 0  # 'hf-chat' reads its columns by name
    own_fields = ("chat_template",)
    file_corpus = "chat"
    packings = ("none", "segments")
    models = "language models (chat)"
    reports_bits_per_char = False
    needs_pretrained = True
    stores_masks = True

    def fields(self, example):
        if isinstance(example, ChatExample):
            return (example.ids.tolist(),)
        conversation = example.conversation if isinstance(example, HeldOut) else example
        return tuple(text for m in conversation.messages for text in (m["role"], m["content"]))

    def encode(self, tokenizer, example):
        raise ValueError(
            "A conversation is encoded by the model's chat template: Task.encode_split."
        )

    def encode_split(self, data, tokenizer, source_dir, examples, split):
        """The conversations as `ChatExample`s (`train.data.chat.examples`: cut to max_len
        or dropped, counted and logged); the validation texts are `HeldOut` prompts."""
        encoder = run_chat_encoder(
            tokenizer,
            source_dir,
            train_on=data.train_on,
            chat_template=data.chat_template,
            init_from=data.init_from,
        )
        encoded, kept, counts = encode_conversations(encoder, examples, data.max_len, split)
        texts = held_out(encoder, kept) if split == "valid" else kept
        return Encoded(encoded, texts, counts.sizes(split))

    def synthetic_example(self, length):
        return ChatExample(
            np.full((length + 1,), NUM_SPECIAL_IDS, np.int32), np.ones(length + 1, bool)
        )

    def to_sides(self, example, specials=DEFAULT_SPECIALS):
        del specials  # the template wrote every special token the conversation has
        return (MaskedTokens(example.ids, example.mask),)

    def targets(self, examples):
        return [
            (x.reference if isinstance(x, HeldOut) else x.reply) or ""
            for x in examples
            if isinstance(x, (HeldOut, Conversation))
        ]

    def _replies(self, evaluation, dataset, model, params, count):
        """The first `count` held-out conversations that end with a reply, and the model's
        greedy answers to them (every process decodes its share)."""
        held = [h for h in dataset.valid_examples if h.prompt_ids][:count]
        if not held:
            return [], []
        mine = [held[i].prompt_ids for i in distributed.share_of(len(held))]
        greedy = dataclasses.replace(evaluation.decode, temperature=0.0)
        replies = inference.chat_replies(
            model, params, dataset.tokenizer, mine, greedy, held[0].stop_ids
        )
        return held, distributed.gather_texts(replies, len(held))

    def _scores(self, evaluation, held, replies):
        scored = held[: evaluation.bleu_examples]
        return {
            **inference.bleu_and_chrf(
                replies[: len(scored)], [h.reference for h in scored], evaluation.bleu_tokenize
            ),
            "repeated_4gram": inference.repeated_ngram_share(replies[: len(scored)]),
            "examples": len(scored),
            "decoding": "greedy",
            "of": "held-out conversations (the model's replies)",
        }

    def interim_scores(self, evaluation, dataset, model, params):
        if not evaluation.bleu_examples:
            return None
        held, replies = self._replies(
            evaluation, dataset, model, distributed.host_copy(params), evaluation.bleu_examples
        )
        if not held:
            return None
        scores = self._scores(evaluation, held, replies)
        return (
            "bleu",
            {k: scores[k] for k in ("bleu", "chrf")},
            f"replies BLEU {scores['bleu']:.2f}, chrF {scores['chrf']:.2f} "
            f"({scores['examples']} held-out conversations, greedy)",
        )

    def final_outputs(self, evaluation, dataset, model, params):
        """Greedy replies to the first `bleu_examples` held-out conversations (those that
        end with an assistant reply, without it), scored by BLEU and chrF against the
        replies they held, and `num_samples` of them side by side; the data's counts
        (conversations kept and dropped, tokens trained).

        Returns:
            {'bleu': scores (if bleu_examples), 'samples': [{prompt, reference, model}],
            'data': the data sizes}.
        """
        count = max(evaluation.bleu_examples, evaluation.num_samples)
        held, replies = self._replies(evaluation, dataset, model, params, count)
        results = {}
        if evaluation.bleu_examples and held:
            results["bleu"] = self._scores(evaluation, held, replies)
        samples = [
            {"prompt": h.question, "reference": h.reference, "model": reply}
            for h, reply in zip(held[: evaluation.num_samples], replies, strict=False)
        ]
        return {**results, "samples": samples, "data": dict(dataset.sizes)}

    def check_outputs(self, evaluation, tokenizer, *, interim):
        """BLEU's tokenizer where replies are scored; greedy decoding needs no other check
        (every held-out prompt is shorter than a conversation that fits max_len)."""
        del tokenizer, interim
        if evaluation.bleu_examples:
            inference.check_bleu_tokenize(evaluation.bleu_tokenize)


TASKS: dict[str, Task] = {
    task.name: task for task in (TranslationTask(), LanguageModelTask(), ChatTask())
}


def get_task(name: str) -> Task:
    """The registered task called `name`.

    Raises:
        ValueError: no task has that name (names the choices).
    """
    if name not in TASKS:
        raise ValueError(f"task={name!r} is not one of {tuple(TASKS)}.")
    return TASKS[name]


def task_of(model: nn.Module) -> Task:
    """The task that trains models of `model`'s kind (for code given a model, not a config).

    Raises:
        ValueError: no task trains such a model.
    """
    for task in TASKS.values():
        if isinstance(model, task.model_type):
            return task
    kinds = ", ".join(task.model_type.__name__ for task in TASKS.values())
    raise ValueError(f"{type(model).__name__} is not a model of any task; give one of {kinds}.")


def owners(field: str) -> str:
    """The tasks a task-specific config field applies to, for messages: "'lm'"."""
    return " or ".join(repr(name) for name, task in TASKS.items() if field in task.own_fields)
