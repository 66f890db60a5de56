"""Public generation functions: `generate_translation` and `generate_text`.

Both validate their inputs (ValueError before any compute), then run one jitted program:
prefill, then a `jax.lax.while_loop` of single-token steps over the KV cache. How the
tokens are chosen is one value, the strategy (`strategies.py`: `Greedy`, `Sample`, `Beam`),
which runs its own loop (`Strategy.decode`); it is given as `strategy=` (the primary form)
or built from the older keywords by `strategy_from_keywords`. The program is compiled once
per input shape, strategy structure and `DecodeProgram` (the other static options).
`use_cache=False` runs the same loop with the full model recomputed over the whole sequence
at every step: the reference the cache is tested against.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import checkify

from flax_transformer.checks.arguments import is_concrete, is_int
from flax_transformer.checks.generation import (
    check_eos_and_length,
    check_logits_hook,
    check_prompt_lengths,
    unbox_params,
)
from flax_transformer.checks.tokens import check_tokens
from flax_transformer.checks.traced import functionalizing
from flax_transformer.decoding.search import LogitsHook
from flax_transformer.decoding.steppers import text_stepper, translation_stepper
from flax_transformer.decoding.strategies import (
    Strategy,
    check_penalty_range,
    check_strategy,
    strategy_from_keywords,
)

# Dtypes `decode_dtype` may name: the compute dtypes `TransformerConfig.dtype` accepts.
DECODE_DTYPES = ("float32", "bfloat16", "float16")


class Prompt(NamedTuple):
    """What a generation starts from and stops at: traced, so new ids reuse the program.

    Attributes:
      tokens: int32 prompts `(B, P)` (text) or sources `(B, S)` (translation).
      lengths: int32 `(B,)`, the prompts' real lengths (text); None for translation.
      bos_id: int32 `()`, the decoder's start token (translation); None for text.
      eos_id: int32 `()`, the token that ends a sequence; None: none does.
    """

    tokens: jax.Array
    lengths: jax.Array | None
    bos_id: jax.Array | None
    eos_id: jax.Array | None


@dataclasses.dataclass(frozen=True)
class DecodeProgram:
    """The static options of one generation: one compiled program per distinct value.

    Attributes:
      kind: 'text' (`DecoderOnlyTransformer`) or 'translation' (`Transformer`).
      max_new_tokens: N, the loop's length and the cache's room.
      use_cache: the KV cache, or full recomputation every step.
      return_logits: also return each step's logits (not with beam search).
      logits_hook: None or `(logits, tokens, step) -> logits`, compared by identity.
      decode_dtype: None or the name of the dtype the weights are cast to (`_in_dtype`).
    """

    kind: str
    max_new_tokens: int
    use_cache: bool
    return_logits: bool
    logits_hook: LogitsHook | None
    decode_dtype: str | None


def _stepper(model, params, prompt: Prompt, program: DecodeProgram):
    n, cached = program.max_new_tokens, program.use_cache
    if program.kind == "translation":
        return translation_stepper(model, params, prompt.tokens, prompt.bos_id, n, cached)
    return text_stepper(model, params, prompt.tokens, prompt.lengths, n, cached)


def _generate_impl(
    model, params, prompt: Prompt, strategy: Strategy, rng, *, program: DecodeProgram
):
    """The whole generation, traced once per input shape, `program` and strategy structure.

    `model` and `program` are static. The strategy's class, top_k and beam size are static
    (its pytree structure); its temperature, top_p and length penalty are traced leaves, as
    are the token ids: changing them reuses the compiled program.
    """
    if program.decode_dtype is not None:
        model, params = _in_dtype(model, params, program.decode_dtype)
    return strategy.decode(
        _stepper(model, params, prompt, program),
        rng,
        max_new_tokens=program.max_new_tokens,
        eos_id=prompt.eos_id,
        pad_id=model.config.pad_id,
        logits_hook=program.logits_hook,
        return_logits=program.return_logits,
    )


_generate = jax.jit(_generate_impl, static_argnames=("model", "program"))


@functools.lru_cache(maxsize=32)
def _checked_generate(model, program: DecodeProgram):
    """`_generate` for one model and `program`, its checkify checks functionalized.

    The model's `config.debug_checks` puts checks on traced values into the program
    (token ids, cache room, prompt lengths); `checkify.checkify` turns them into an error
    value that `_run` raises. Cached per static options, as `jax.jit` caches `_generate`.
    """
    bound = functools.partial(_generate_impl, model, program=program)
    return jax.jit(checkify.checkify(bound, errors=checkify.user_checks))


def _in_dtype(model, params, dtype: str):
    """The model computing in `dtype` with its floating-point weights cast to it, once.

    The cast runs inside the jitted program ahead of the decoding loop, so the loop reads
    the narrow copy every step: at batch 1 a step reads every weight once, so decoding is
    bound by the bytes read, and half the bytes is the point. The cache follows
    `config.dtype`, so it narrows too; norms, softmax and the logits stay float32 as for any
    `dtype` (the precision convention at the top of docs/api.md).
    """
    cfg = model.config.replace(dtype=dtype, param_dtype=dtype)

    def cast(x):
        return x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x

    return model.clone(config=cfg), jax.tree.map(cast, params)


def _check_decode_dtype(fn: str, decode_dtype) -> str | None:
    """`decode_dtype` as a dtype name, or ValueError naming the allowed ones."""
    if decode_dtype is None:
        return None
    try:
        name = jnp.dtype(decode_dtype).name
    except TypeError:
        name = None
    if name not in DECODE_DTYPES:
        raise ValueError(
            f"{fn}: decode_dtype={decode_dtype!r} must be None (the weights as given) or one "
            f"of {DECODE_DTYPES}."
        )
    return name


def _run(model, params, prompt: Prompt, strategy: Strategy, rng, program: DecodeProgram):
    """Call the jitted program; through checkify where `model.config.debug_checks` asks."""
    # Traced leaves in float32, the loops' dtype, whatever float type the user gave.
    strategy = jax.tree.map(jnp.float32, strategy)
    rng = rng if strategy.draws else None  # greedy and beams draw nothing
    concrete = is_concrete(*jax.tree.leaves((prompt.tokens, prompt.lengths, params)))
    if model.config.debug_checks and concrete:
        with functionalizing():  # a first call traces the program here
            err, out = _checked_generate(model, program)(params, prompt, strategy, rng)
        err.throw()
        return out
    return _generate(model, params, prompt, strategy, rng, program=program)


class Keywords(NamedTuple):
    """The older way to say the strategy, as the generation functions were given it (None:
    not given); `strategies.strategy_from_keywords` reads them."""

    beam_size: int | None
    length_penalty: float | None
    temperature: float | None
    top_k: int | None
    top_p: float | None


def _resolve_strategy(
    fn: str,
    config,
    strategy: Strategy | None,
    keywords: Keywords,
    *,
    max_new_tokens: int,
    rng,
    return_logits: bool,
) -> Strategy:
    """`strategy`, or the one the older keywords describe; checked against the model.

    Giving both a strategy and any of the keywords is refused.
    """
    given = {name: value for name, value in keywords._asdict().items() if value is not None}
    if strategy is None:
        strategy = strategy_from_keywords(fn, **keywords._asdict())
        if "length_penalty" in given:  # checked as before, even where greedy ignores it
            check_penalty_range(fn, given["length_penalty"], max_new_tokens)
    elif given:
        listed = ", ".join(f"{name}={value!r}" for name, value in given.items())
        raise ValueError(
            f"{fn}: strategy={strategy!r} and {listed} both say how to decode; pass one: "
            "the strategy alone (Greedy(), Sample(temperature, top_k, top_p) or "
            "Beam(size, length_penalty)), or the keywords without it."
        )
    check_strategy(
        fn, config, strategy, max_new_tokens=max_new_tokens, rng=rng, return_logits=return_logits
    )
    return strategy


def _program(fn, kind, max_new_tokens, use_cache, return_logits, logits_hook, decode_dtype):
    return DecodeProgram(
        kind=kind,
        max_new_tokens=max_new_tokens,
        use_cache=use_cache,
        return_logits=return_logits,
        logits_hook=check_logits_hook(fn, logits_hook),
        decode_dtype=_check_decode_dtype(fn, decode_dtype),
    )


def generate_translation(
    model,
    params,
    src_tokens,
    *,
    bos_id: int,
    eos_id: int,
    max_new_tokens: int,
    strategy: Strategy | None = None,
    beam_size: int | None = None,
    length_penalty: float | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    rng: jax.Array | None = None,
    use_cache: bool = True,
    return_logits: bool = False,
    logits_hook: LogitsHook | None = None,
    decode_dtype=None,
):
    """Translate a batch of source sentences with an encoder-decoder `Transformer`.

    The encoder runs once; the decoder starts from BOS and emits one token per step over the
    KV cache (cross-attention keys/values cached too) until every sentence has produced EOS
    or `max_new_tokens` tokens.

    Args:
      model: a `Transformer`.
      params: its variables (`model.init(...)` or a checkpoint), boxed or unboxed.
      src_tokens: int source ids `(B, S)`, right-padded with `config.pad_id`.
      bos_id: the decoder's start token.
      eos_id: the end token; each sentence stops after it.
      max_new_tokens: N, the most tokens generated; `1 + N <= config.max_len`.
      strategy: how each token is chosen: `Greedy()`, `Sample(temperature, top_k, top_p)`
        or `Beam(size, length_penalty)` (`decoding.strategies`). None (the default): the
        keywords below say it, and without them decoding is greedy. Passing a strategy and
        any of those keywords raises ValueError. A new temperature, top_p or length
        penalty reuses the compiled program; a new class, top_k or beam size compiles anew.
      beam_size: the older way to say the strategy, with the four keywords after it (None:
        not given). 1 (default) for greedy decoding or sampling; K > 1 for beam search,
        `Beam(K, length_penalty)`.
      length_penalty: beam search's GNMT exponent alpha (default 0.6), finite, >= 0 (0: raw
        log-probability), small enough that the penalty stays finite in float32.
      temperature: 0.0 (default) for greedy; > 0 (finite) samples from softmax(logits /
        temperature): `Sample(temperature, top_k, top_p)`.
      top_k: when sampling, keep only the k most likely tokens (default 0: all). Sampling
        only: with temperature=0 a top_k or top_p other than off raises ValueError.
      top_p: when sampling, keep only the nucleus of mass top_p (default 1.0: all).
      rng: one PRNG key (`jax.random.key(0)` or a legacy `PRNGKey`), required when
        sampling. Greedy decoding and beam search draw nothing and ignore it; one key
        serves the whole batch (not one key per row).
      use_cache: False recomputes the full model every step (slow; the reference).
      return_logits: also return each step's logits `(B, N, V)` (not with beam search).
      logits_hook: None, or a jittable function `(logits, tokens, step) -> logits` applied
        to every step's logits inside the compiled loop, before argmax, sampling (and its
        temperature, top-k, top-p) or beam scoring: constrained or banned-token decoding.
        It receives float32 `logits (R, V)`; int32 `tokens (R, N)`, the tokens generated so
        far (BOS or prompt excluded), `config.pad_id` from column `step` on; and `step`, an
        int32 scalar, the index of the token being chosen (0 for the first). R = B for
        greedy decoding and sampling; R = B * K for beam search, row `b * K + k` holding
        hypothesis k of sequence b. It returns logits of the same shape (ValueError
        otherwise). To forbid a token, set its logit to `decoding.MASKED_LOGIT` (finite:
        -inf can turn beam scores into NaN); padding is forbidden after the hook. The hook
        is a static argument of the jitted program, compared by identity: pass the same
        function object to reuse the compiled program (a new lambda compiles anew).
      decode_dtype: None runs with the weights and `config.dtype` as they are; 'bfloat16'
        (or 'float16', 'float32') casts the floating-point weights to it once, ahead of
        the loop, and computes and caches keys/values in it (norms, softmax and logits stay
        float32). bfloat16 halves the bytes each step reads; its logits differ from float32
        by rounding (about 1e-2 relative), so near-ties may pick other tokens.

    With `model.config.debug_checks` the whole program runs through checkify, and a bad
    value inside it (a token id, a cache overflow) raises `checkify.JaxRuntimeError` after
    the call; the tokens are the same as without.

    Returns:
      int32 `(B, N)`: the generated tokens after BOS, EOS included where produced, then
      `config.pad_id`. With `return_logits`, the pair `(tokens, logits (B, N, V) float32)`,
      row i holding the logits that chose token i (after `logits_hook`).

    Example:
      tokens = generate_translation(model, params, src, bos_id=1, eos_id=2,
                                    max_new_tokens=64, strategy=Beam(4, length_penalty=0.6))
    """
    fn = "generate_translation"
    if not hasattr(model, "encode") or not hasattr(model, "config"):
        raise ValueError(
            f"{fn} needs an encoder-decoder Transformer, got {type(model).__name__}; use "
            "generate_text for a DecoderOnlyTransformer."
        )
    cfg = model.config
    params = unbox_params(params, ("encoder", "decoder"), fn)
    src = check_tokens(src_tokens, cfg.vocab_size, None, f"{fn}: src_tokens")
    cfg.check_length(src.shape[1], "src_tokens")
    check_eos_and_length(fn, cfg, eos_id, max_new_tokens)
    keywords = Keywords(beam_size, length_penalty, temperature, top_k, top_p)
    strategy = _resolve_strategy(
        fn,
        cfg,
        strategy,
        keywords,
        max_new_tokens=max_new_tokens,
        rng=rng,
        return_logits=return_logits,
    )
    if eos_id is None:
        raise ValueError(f"{fn}: eos_id is required (the token that ends a translation).")
    if not is_int(bos_id) or not 0 <= bos_id < cfg.output_vocab_size:
        raise ValueError(
            f"{fn}: bos_id={bos_id!r} must be a token id in [0, {cfg.output_vocab_size})."
        )
    if bos_id == cfg.pad_id:
        # The decoder masks pad_id keys: model.apply (and teacher-forced training) would hide
        # the BOS slot while the cache attends to it, so the two paths would disagree.
        raise ValueError(
            f"{fn}: bos_id={bos_id} equals pad_id={cfg.pad_id}; the decoder masks padding, "
            "so BOS must be a real token: pass another bos_id (the tokenizer's BOS)."
        )
    if 1 + max_new_tokens > cfg.max_len:
        raise ValueError(
            f"{fn}: BOS + max_new_tokens={max_new_tokens} tokens exceed TransformerConfig."
            f"max_len={cfg.max_len}; lower max_new_tokens to at most {cfg.max_len - 1}."
        )
    program = _program(
        fn, "translation", max_new_tokens, use_cache, return_logits, logits_hook, decode_dtype
    )
    prompt = Prompt(src, None, jnp.int32(bos_id), jnp.int32(eos_id))
    return _run(model, params, prompt, strategy, rng, program)


def generate_text(
    model,
    params,
    prompt_tokens,
    prompt_lengths=None,
    *,
    eos_id: int | None,
    max_new_tokens: int,
    strategy: Strategy | None = None,
    beam_size: int | None = None,
    length_penalty: float | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    rng: jax.Array | None = None,
    use_cache: bool = True,
    return_logits: bool = False,
    logits_hook: LogitsHook | None = None,
    decode_dtype=None,
):
    """Continue a batch of prompts with a `DecoderOnlyTransformer`.

    The prompts run through the model in one pass (parallel prefill) that fills the KV cache;
    then one token per step, each sequence at its own position, until every sequence has
    produced EOS or `max_new_tokens` tokens.

    Args:
      model: a `DecoderOnlyTransformer`.
      params: its variables, boxed or unboxed.
      prompt_tokens: int ids `(B, P)`, right-padded with `config.pad_id`.
      prompt_lengths: int `(B,)`, each prompt's real length in [1, P] (None: all P). Real
        tokens must not be `pad_id`, which the model masks.
      eos_id: stop a sequence after this token; None runs every sequence N tokens.
      max_new_tokens: N; `P + N <= config.max_len`.
      strategy, beam_size, length_penalty, temperature, top_k, top_p, rng, use_cache,
      return_logits, logits_hook, decode_dtype: as in `generate_translation` (`tokens`
        holds the continuation only, not the prompt).

    Returns:
      int32 `(B, N)`: the continuation tokens, EOS included where produced, then pad; with
      `return_logits`, also the logits `(B, N, V)`, as in `generate_translation`.

    Example:
      tokens = generate_text(model, params, prompts, lengths, eos_id=2, max_new_tokens=100,
                             strategy=Sample(0.8, top_p=0.95), rng=jax.random.key(0))
    """
    fn = "generate_text"
    if hasattr(model, "encode") or not hasattr(model, "config"):
        raise ValueError(
            f"{fn} needs a DecoderOnlyTransformer, got {type(model).__name__}; use "
            "generate_translation for an encoder-decoder Transformer."
        )
    cfg = model.config
    params = unbox_params(params, ("decoder",), fn)
    prompt = check_tokens(prompt_tokens, cfg.vocab_size, None, f"{fn}: prompt_tokens")
    prompt_len = prompt.shape[1]
    lengths = check_prompt_lengths(fn, prompt, prompt_lengths, cfg.pad_id)
    check_eos_and_length(fn, cfg, eos_id, max_new_tokens)
    keywords = Keywords(beam_size, length_penalty, temperature, top_k, top_p)
    strategy = _resolve_strategy(
        fn,
        cfg,
        strategy,
        keywords,
        max_new_tokens=max_new_tokens,
        rng=rng,
        return_logits=return_logits,
    )
    if prompt_len + max_new_tokens > cfg.max_len:
        raise ValueError(
            f"{fn}: prompt length P={prompt_len} + max_new_tokens={max_new_tokens} exceeds "
            f"TransformerConfig.max_len={cfg.max_len}; shorten the prompt or lower "
            "max_new_tokens."
        )
    program = _program(
        fn, "text", max_new_tokens, use_cache, return_logits, logits_hook, decode_dtype
    )
    eos = None if eos_id is None else jnp.int32(eos_id)
    return _run(model, params, Prompt(prompt, lengths, None, eos), strategy, rng, program)
