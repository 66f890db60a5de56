"""The translation task: encoder-decoder translation of (source, target) pairs, trained
with label-smoothed cross-entropy and word dropout of the decoder inputs, scored by BLEU and
chrF of greedy and beam decoding."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from flax_transformer import (
    Transformer,
    generate_translation,
    segment_positions,
)
from train.core import distributed
from train.data.batching import Side
from train.data.tokenizer import DEFAULT_SPECIALS, NUM_SPECIAL_IDS
from train.formats.corpora import corpora_for
from train.tasks.common import inference
from train.tasks.common.base import _INIT_BATCH_SHAPE, Task
from train.tasks.common.inference import cut_at_eos


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
        return self._outputs(model, params, batch, deterministic, rngs, model.__call__)

    def hidden_and_labels(self, model, params, batch, *, deterministic, rngs=None):
        return self._outputs(model, params, batch, deterministic, rngs, model.hidden_states)

    def _outputs(self, model, params, batch, deterministic, rngs, method):
        """The model's `method` (logits, or hidden states) over the batch, and the labels."""
        out = model.apply(
            {"params": params},
            batch["src"],
            batch["tgt_in"],
            src_segment_ids_BS=batch.get("src_segment_ids"),
            tgt_segment_ids_BT=batch.get("tgt_segment_ids"),
            deterministic=deterministic,
            rngs=rngs,
            method=method,
        )
        return out, batch["tgt_out"]

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
