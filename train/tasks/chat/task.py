"""The chat task: instruction fine-tuning of a pretrained decoder-only model on
conversations rendered by its own chat template, trained on the tokens `train_on` marks,
scored by BLEU and chrF of its replies to held-out prompts."""

from __future__ import annotations

import dataclasses

import numpy as np

from train.core import distributed
from train.data.batching import MaskedTokens
from train.data.chat.encoding import ChatExample
from train.data.chat.examples import (
    HeldOut,
    encode_conversations,
    held_out,
    run_chat_encoder,
)
from train.data.tokenizer import DEFAULT_SPECIALS, NUM_SPECIAL_IDS
from train.formats.corpora import corpora_for
from train.formats.corpora.conversations import Conversation
from train.tasks.common import inference
from train.tasks.common.base import Encoded
from train.tasks.lm.task import LanguageModelTask


class ChatTask(LanguageModelTask):
    """Instruction and chat fine-tuning of a pretrained decoder-only model: conversations
    rendered by the model's own chat template, trained on the tokens `--config.train_on`
    marks (the assistant's replies and their end of turn), scored by BLEU and chrF of its
    replies to held-out prompts.

    A language model underneath (the model, its inputs and logits are the 'lm' task's); what differs
    is the example (a conversation, `train.formats.corpora.conversations`), how it becomes ids
    (`train.data.chat.examples`: the template's ids as they are, no BOS or EOS added, and a loss
    mask carried into the batch as `MaskedTokens`) and what the run ends with.
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
    # Its text is collapsed where collapse_whitespace is None, as before tasks had facts.
    verbatim = False
    conversations = True

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
