"""The language-model task: a decoder-only model of text lines or documents, trained with
token cross-entropy and reported in bits per character too."""

from __future__ import annotations

import logging

import jax.numpy as jnp

from flax_transformer import (
    DecoderOnlyTransformer,
    generate_text,
)
from train.data.batching import Side
from train.data.tokenizer import DEFAULT_SPECIALS, NUM_SPECIAL_IDS
from train.formats.corpora import corpora_for
from train.tasks.common import inference
from train.tasks.common.base import _INIT_BATCH_SHAPE, Task
from train.tasks.common.inference import cut_at_eos, sample_text


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
    reads_stores = True
    verbatim = True
    model_type = DecoderOnlyTransformer
    stacks = ("decoder",)
    decoder_input = "sequence"
    self_attention_label = "causal self-attention"

    def init_inputs(self):
        return (jnp.ones(_INIT_BATCH_SHAPE, jnp.int32),)

    def logits_and_labels(self, model, params, batch, *, deterministic, rngs=None):
        return self._outputs(model, params, batch, deterministic, rngs, model.__call__)

    def hidden_and_labels(self, model, params, batch, *, deterministic, rngs=None):
        return self._outputs(model, params, batch, deterministic, rngs, model.hidden_states)

    def _outputs(self, model, params, batch, deterministic, rngs, method):
        """The model's `method` (logits, or hidden states) over the batch, and the labels."""
        out = model.apply(
            {"params": params},
            batch["inputs"],
            segment_ids_BT=batch.get("segment_ids"),
            deterministic=deterministic,
            rngs=rngs,
            method=method,
        )
        return out, batch["targets"]

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
