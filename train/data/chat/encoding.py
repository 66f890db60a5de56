"""Conversations as token ids and a loss mask: the model's chat template
(`train.data.chat.template`), the model's tokenizer, and which tokens are trained.

A conversation is rendered to text by its template once and tokenized once as a whole, with
no special token added beyond what the template writes (a template that writes
`{{ bos_token }}` gets one BOS; none is prepended), so the ids are the ones transformers'
`apply_chat_template(tokenize=True)` gives.

**The mask** (`ChatExample.mask[t]`: token t is a target of the loss; the caller shifts it
with the ids) follows `train_on`:

    'assistant'  every assistant turn: its content and the end of its turn (default)
    'last'       the last assistant turn only
    'all'        every token

An assistant turn is found in one of two ways:
- the template's `{% generation %}` blocks, where it has them: every token overlapping a
  block's characters is trained (transformers' `return_assistant_tokens_mask`, exactly);
- else by rendering prefixes: for the assistant message k, messages[:k] with the generation
  prompt (P) and messages[:k+1] (F); the ids of P and of F must each be a prefix of the whole
  conversation's ids (a template or a BPE merge across the turn's edges that breaks this is
  refused, naming the turn), and the turn is the tokens between them; where a reasoning
  template's P or F does not begin the whole (a prompt that opens the turn with `<think>`,
  a turn rewritten once more follows), `train.data.chat.turns` finds the turn's edges from
  the finished conversation's own renderings, with the same checks. For ChatML that is
  `content<|im_end|>\\n`; for Llama 3 `content<|eot_id|>`: the content, the end-of-turn token,
  and the separator the template writes after it up to the next turn. This is what TRL's
  training templates wrap in `{% generation %}` for assistant-only loss (qwen2_5, lfm2, gemma:
  content and `<|im_end|>\\n` / `<end_of_turn>\\n`; llama3: content and `<|eot_id|>`): the
  model learns to write the end of turn and stop there; the separator after it is never
  sampled (sampling stops at the end of turn) and costs nothing to learn.

**Tools**: `encode(..., tools=...)` hands the conversation's tool schemas to the template
(transformers' `apply_chat_template(tools=...)`); any error the template raises is one
`ChatError` line naming the conversation, the template and the fix.

**The end of turn** is the first special token the template writes after an assistant's
content (found once, by rendering a probe conversation): `<|im_end|>` for ChatML,
`<|eot_id|>` for Llama 3, `<end_of_turn>` for Gemma, the EOS for Mistral; where the template
writes none, the EOS. Sampling stops at it or at the EOS (`ChatEncoder.stop_ids`).

**Refused** (`ChatError`, a ValueError naming the conversation, the message and the fix): a
message that is not `{role, content}` with a known role and string content; a template that
fails on the conversation; a double BOS at the start; prefixes that are not token prefixes; a
mask that trains fewer end-of-turn tokens than it trains assistant turns (a template whose
`{% generation %}` block leaves `<|eot_id|>` out: the model would never learn to stop).
**Dropped** (`ChatExample.drop_reason`, for the caller to count): a conversation with nothing
to train (no assistant message), and one whose text holds a control token the template
writes (a literal '<|im_end|>' in a message would be read as the end of a turn).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import jinja2
import jinja2.meta
import numpy as np

from train.data.chat import jinja as chat_jinja
from train.data.chat.template import ChatTemplate
from train.data.chat.turns import TurnFinder, common_prefix
from train.data.chat.types import ChatExample, ChatTokenizer
from train.formats.corpora.conversations import TRAIN_ON, ChatError, check_messages, check_tools

# The reply of the conversations that find a template's end-of-turn token: plain letters,
# which no template trims or escapes.
_PROBE_REPLY = "Zqx7probeReplyZqx7"
_PROBES = (
    ({"role": "user", "content": "Hi"}, {"role": "assistant", "content": _PROBE_REPLY}),
    (
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": _PROBE_REPLY},
    ),
)
# The reply of an assistant turn that is not the last (gpt-oss ends it with '<|end|>', the
# last with '<|return|>').
_PROBE_EARLIER = "Zqx7probeEarlierZqx7"
# The longest template error quoted in a refusal (a template may raise a whole paragraph).
_MAX_ERROR_CHARS = 300


class ChatEncoder:
    """Renders, tokenizes and masks conversations for one template and tokenizer.

    Attributes:
        template: the chat template.
        tokenizer: the model's tokenizer.
        train_on: 'assistant', 'last' or 'all' (see the module docstring).
        end_of_turn_ids: the end-of-turn token(s) (one id): the one after the last reply.
        turn_end_ids: the tokens that end an assistant turn: the end of turn, and the one
            the template writes after an earlier reply where it differs (gpt-oss ends the
            last turn with '<|return|>' and the earlier ones with '<|end|>').
    """

    def __init__(
        self, template: ChatTemplate, tokenizer: ChatTokenizer, train_on: str = "assistant"
    ):
        """Checks `train_on` and finds the template's end-of-turn token.

        Raises:
            ValueError: an unknown `train_on`.
        """
        if train_on not in TRAIN_ON:
            raise ValueError(f"--config.train_on={train_on!r}: must be one of {TRAIN_ON}.")
        self.template, self.tokenizer, self.train_on = template, tokenizer, train_on
        self.uses_generation_blocks = template.has_generation_blocks
        literal = template.literal_text()
        named = set(template.special_tokens.values())
        self._bos_ids = {tokenizer.bos_id} | {
            tokenizer.added_tokens[t]
            for t in [template.special_tokens.get("bos_token")]
            if t in tokenizer.added_tokens
        }
        # The special tokens the template writes: found in a message, they would end or
        # open turns. (Plain added tokens, as Qwen's '<think>', belong in messages.)
        specials = tokenizer.special_token_ids
        control = [
            t
            for t, i in tokenizer.added_tokens.items()
            if i in specials and t.strip() and (t in literal or t in named)
        ]
        control.sort(key=len, reverse=True)
        self._control = re.compile("|".join(map(re.escape, control))) if control else None
        self._reads_tools = "tools" in jinja2.meta.find_undeclared_variables(
            chat_jinja.parse(template.source)
        )
        self.end_of_turn_ids, self._after_reply, earlier = self._find_end_of_turn()
        self.turn_end_ids = tuple(dict.fromkeys((*self.end_of_turn_ids, *earlier)))
        self._tail, self._no_prompt = self._find_tail()

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """The ids sampling stops at: the end of turn, and the EOS."""
        return tuple(dict.fromkeys((*self.end_of_turn_ids, self.tokenizer.eos_id)))

    def _probe(self, messages, add_generation_prompt: bool = False) -> str | None:
        """The text of a probe conversation, or None where the template fails on it (a
        template that loops over `tools` is given an empty list)."""
        for tools in (None, []) if self._reads_tools else (None,):
            try:
                return self.template.render(
                    messages, add_generation_prompt=add_generation_prompt, tools=tools
                ).text
            except Exception:  # noqa: BLE001, PERF203 - a template may refuse a probe
                continue
        return None

    def _first_special_after(self, text: str) -> int | None:
        specials = self.tokenizer.special_token_ids
        return next((i for i in self.tokenizer.encode(text) if i in specials), None)

    def _find_end_of_turn(self) -> tuple[tuple[int, ...], str | None, tuple[int, ...]]:
        """The first special token written after the last assistant's content (the EOS where
        none is), the text written after the probe's reply (for errors), and the first
        special token written after an earlier assistant reply (where one is)."""
        for probe in _PROBES:
            text = self._probe(probe)
            at = -1 if text is None else text.rfind(_PROBE_REPLY)
            if at < 0:
                continue
            after = text[at + len(_PROBE_REPLY) :]
            final = self._first_special_after(after)
            final = self.tokenizer.eos_id if final is None else final
            longer = (*probe[:-1], {"role": "assistant", "content": _PROBE_EARLIER}, *probe[-2:])
            text = self._probe(longer)
            earlier = None
            if text is not None and _PROBE_EARLIER in text:
                rest = text[text.index(_PROBE_EARLIER) :]
                earlier = self._first_special_after(rest)
                # A token that ends messages: the first after the next user's content too,
                # and followed by another before it (the one that opens the user's turn,
                # which is all a template that ends earlier replies bare writes there).
                user = probe[-2]["content"]
                between = rest[: rest.find(user)]
                specials = self.tokenizer.special_token_ids
                if (
                    user not in rest
                    or sum(i in specials for i in self.tokenizer.encode(between)) < 2
                    or earlier != self._first_special_after(rest[len(between) + len(user) :])
                ):
                    earlier = None
            return (final,), after, () if earlier is None else (earlier,)
        return (self.tokenizer.eos_id,), None, ()

    def _find_tail(self) -> tuple[str, bool]:
        """What the template writes at the end of a conversation rendered without the
        generation prompt and not with it (Phi-3.5 ends every conversation with
        '<|endoftext|>'), which is no part of the last turn; and whether its generation
        prompt is missing: `add_generation_prompt` changes nothing while a finished
        assistant turn opens with a role header (as '<|im_start|>assistant\\n'; Mistral's
        turns open with nothing, and need no prompt)."""
        for probe in _PROBES:
            plain, prompted = self._probe(probe[:-1]), self._probe(probe[:-1], True)
            finished = self._probe(probe)
            if plain is None or prompted is None:
                continue
            # the shared text, cut back to a token edge (a character-wise prefix of
            # '<|endoftext|>' and '<|assistant|>' is '<|')
            a, offsets = self.tokenizer.encode_with_offsets(plain)
            b = self.tokenizer.encode(prompted)
            n = len(common_prefix(a, b))
            shared = offsets[n - 1][1] if n else 0
            tail, opened = plain[shared:], prompted[shared:]
            opening = None
            if finished is not None and _PROBE_REPLY in finished:
                head = finished[: finished.rindex(_PROBE_REPLY)]
                before = plain[: len(plain) - len(tail)]
                opening = head[len(before) :] if head.startswith(before) else None
            return tail, not opened and (opening is None or bool(opening.strip()))
        return "", False

    def open_text(self, text: str) -> str:
        """A rendered conversation without the template's end-of-conversation tail
        (`_find_tail`): where the next message's turn would begin."""
        return text[: -len(self._tail)] if self._tail and text.endswith(self._tail) else text

    def _render(self, messages, where, add_generation_prompt=False, tools=None):
        """The rendered conversation; any error the template raises becomes a one-line
        `ChatError` naming the conversation, the template and the fix."""
        try:
            return self.template.render(
                messages, add_generation_prompt=add_generation_prompt, tools=tools
            )
        except Exception as err:  # noqa: BLE001 - whatever a template from the Hub raises
            detail = " ".join(str(err).split())
            if len(detail) > _MAX_ERROR_CHARS:
                detail = detail[:_MAX_ERROR_CHARS] + "..."
            if isinstance(err, jinja2.TemplateError):
                what = f"refused the conversation ({detail})"
            else:
                what = f"failed on the conversation ({type(err).__name__}: {detail})"
            fix = "fix the conversation, or give a template that takes it"
            if tools is None and self._reads_tools:
                fix = (
                    "the template reads `tools`: give the conversation its tools (a 'tools' "
                    "list of JSON schemas beside 'messages', as TRL's datasets hold them), or "
                    "give a template that takes it"
                )
            raise ChatError(
                f"{where}: {self.template.where} {what}; {fix} (--config.chat_template=FILE)."
            ) from None

    def _check_bos(self, ids: Sequence[int], where: str) -> None:
        if len(ids) >= 2 and ids[0] in self._bos_ids and ids[1] in self._bos_ids:
            pieces = self.tokenizer.id_to_piece(ids[0]) + self.tokenizer.id_to_piece(ids[1])
            raise ChatError(
                f"{where}: the rendered conversation starts with two BOS tokens "
                f"({pieces!r}): {self.template.where} "
                "writes the BOS twice; remove one {{ bos_token }} (--config.chat_template=FILE)."
            )

    def prompt_ids(
        self, messages: Any, *, where: str = "the prompt", tools: Any = None
    ) -> list[int]:
        """The ids of `messages` (and `tools`) followed by the template's generation
        prompt: what the model continues to reply (`train.sample --chat`).

        Raises:
            ChatError: as `check_messages` and `check_tools`, a template that fails, a
                double BOS.
        """
        messages = check_messages(messages, where)
        tools = check_tools(tools, where)
        ids = self.tokenizer.encode(self._render(messages, where, True, tools).text)
        self._check_bos(ids, where)
        return ids

    def _control_token(self, messages: Sequence[Mapping[str, str]]) -> str | None:
        """Why checked `messages` cannot be trained on as they are, or None: a control token
        the template writes found in a message."""
        if self._control is None:
            return None
        for i, message in enumerate(messages):
            found = self._control.search(message["content"])
            if found:
                return (
                    f"messages[{i}] ({message['role']}) holds the control token "
                    f"{found.group()!r}, which would be read as the template's own"
                )
        return None

    def encode(
        self, messages: Any, *, where: str = "the conversation", tools: Any = None
    ) -> ChatExample:
        """The ids and loss mask of one conversation (see the module docstring).

        Args:
            messages: a list of `{role, content}` dicts.
            where: the conversation as errors name it ('train.jsonl:17').
            tools: the conversation's tools (a list of JSON schemas, `check_tools`), handed
                to the template as transformers' `apply_chat_template(tools=...)` does.

        Returns:
            A `ChatExample`; its `drop_reason` is set (and it holds no ids) where the
            conversation has nothing to train or holds a control token.

        Raises:
            ChatError: see the module docstring.
        """
        messages = check_messages(messages, where)
        tools = check_tools(tools, where)
        reason = self._control_token(messages)
        if reason:
            return ChatExample.dropped(reason)
        whole = self._render(messages, where, tools=tools)
        ids, offsets = self.tokenizer.encode_with_offsets(whole.text)
        self._check_bos(ids, where)
        assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        turns = assistant[-1:] if self.train_on == "last" else assistant
        if self.train_on == "all":
            mask = np.ones(len(ids), bool)
        elif self.uses_generation_blocks:
            mask = self._mask_from_blocks(messages, whole, offsets, turns, where, tools)
        else:
            if turns and self._no_prompt:
                raise ChatError(self._no_generation_prompt(where))
            mask = np.zeros(len(ids), bool)
            turns_of = TurnFinder(self, messages, tools, whole.text, ids, offsets, where)
            for k in turns:
                begin, end = turns_of.turn(k)
                mask[begin:end] = True
        ids = np.asarray(ids, np.int32)
        trained_ends = int(np.isin(ids[mask], self.turn_end_ids).sum())
        if trained_ends < len(turns):
            raise ChatError(self._no_end_of_turn(where, f"{len(turns)} assistant turn(s)"))
        if not mask.any():
            return ChatExample.dropped(
                "no assistant message to train on"
                if not turns
                else "the template marks no token of the assistant's turns"
            )
        return ChatExample(ids, mask)

    def _no_generation_prompt(self, where: str) -> str:
        return (
            f"{where}: {self.template.where} writes nothing for add_generation_prompt (no "
            "{% if add_generation_prompt %} clause), so the role header that opens an "
            "assistant turn cannot be told from the reply and would be trained (and sampling "
            f"would not open the assistant's turn); train_on={self.train_on!r} needs the "
            "clause (e.g. {% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
            "{% endif %}) or {% generation %} blocks in the template (--config.chat_template="
            "FILE); or use --config.train_on='all'."
        )

    def _no_end_of_turn(self, where: str, what: str) -> str:
        eot = self.tokenizer.id_to_piece(self.end_of_turn_ids[0])
        if self._after_reply is not None and not (
            set(self.tokenizer.encode(self._after_reply)) & set(self.end_of_turn_ids)
        ):
            fix = (
                f"the template writes {self._after_reply!r} after the assistant's content and "
                "no end-of-turn token, so the model would never learn to stop; write "
                "{{ eos_token }} after it (--config.chat_template=FILE)"
            )
        elif self.uses_generation_blocks and self.train_on != "all":
            fix = (
                f"its {{% generation %}} blocks leave the end of turn {eot!r} out, so the model "
                "would never learn to stop; move it inside the block (--config.chat_template="
                "FILE)"
            )
        else:
            ends = " or ".join(repr(self.tokenizer.id_to_piece(i)) for i in self.turn_end_ids)
            fix = (
                f"the template ends some assistant turns with {ends} and the others with no "
                "end-of-turn token (it writes it after the last reply only), so the model "
                "would not learn to stop after those; give a template that ends every "
                "assistant turn with it (--config.chat_template=FILE), or use "
                "--config.train_on='last'"
            )
        return (
            f"{where}: the loss mask (train_on={self.train_on!r}) leaves the end of turn out "
            f"of {what}: {fix}."
        )

    def _mask_from_blocks(self, messages, whole, offsets, turns, where, tools) -> np.ndarray:
        """Tokens overlapping the `{% generation %}` spans (for 'last': those of the last
        assistant message: the spans after the rendering of the messages before it)."""
        spans = whole.generation_spans
        if self.train_on == "last" and turns:
            k = turns[-1]
            before = self.open_text(self._render(messages[:k], where, tools=tools).text)
            if not whole.text.startswith(before):
                raise ChatError(
                    f"{where}: {self.template.where} writes messages[:{k}] differently from "
                    f"how it begins the whole conversation, so the last assistant turn "
                    f"messages[{k}] cannot be told from the ones before; use "
                    "--config.train_on='assistant' or 'all'."
                )
            spans = [s for s in spans if s[1] > len(before)]
        if not spans or not offsets:
            return np.zeros(len(offsets), bool)
        chars_T2, spans_S2 = np.asarray(offsets), np.asarray(spans)
        overlap_TS = (chars_T2[:, :1] < spans_S2[None, :, 1]) & (
            chars_T2[:, 1:] > spans_S2[None, :, 0]
        )
        return overlap_TS.any(axis=1)

    def _token_prefix(self, text: str, ids: Sequence[int], k: int, where: str) -> int:
        """The number of tokens of `text`, checked to begin `ids`."""
        prefix = self.tokenizer.encode(text)
        if list(ids[: len(prefix)]) == prefix:
            return len(prefix)
        at = next(
            (j for j, (a, b) in enumerate(zip(prefix, ids, strict=False)) if a != b),
            min(len(prefix), len(ids)),
        )
        alone = self.tokenizer.id_to_piece(prefix[at]) if at < len(prefix) else "(end)"
        inside = self.tokenizer.id_to_piece(ids[at]) if at < len(ids) else "(end)"
        raise ChatError(
            f"{where}: at an edge of the assistant turn messages[{k}], the text up to the edge "
            f"does not tokenize as the start of the whole conversation (token {at}: {alone!r} "
            f"alone, {inside!r} in the whole): a BPE merge across the turn's edge. Trim the "
            f"whitespace at the edge of messages[{k}], give a template with {{% generation %}} "
            "blocks (--config.chat_template=FILE), or use --config.train_on='all'."
        )
