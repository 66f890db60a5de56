"""TransformerConfig: every size and switch of the model, validated once at construction."""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

import jax.numpy as jnp
import numpy as np

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
# Choices of the fields one layer reads (LayerConfig and TransformerConfig).
_LAYER_CHOICES = {
    "norm_position": ("pre", "post"),
    "norm": ("layernorm", "rmsnorm"),
    "activation": ("relu", "gelu", "gelu_tanh", "relu2", "swiglu", "geglu"),
    "attention_impl": ("xla", "jax_nn", "splash", "cudnn", "blocked"),
}
_CHOICES = {**_LAYER_CHOICES, "positional": ("sinusoidal", "learned", "rope")}
# LoRA targets: the projections an adapter may sit on, by the name a user writes, and the
# kernel each one adapts (layers/attention.py, layers/feed_forward.py).
LORA_TARGETS = {
    "q": "queries: the q part of qkv_kernel, or query_kernel",
    "k": "keys: the k part of qkv_kernel or kv_kernel",
    "v": "values: the v part of qkv_kernel or kv_kernel",
    "o": "attention output: out_kernel",
    "up": "feed-forward up projection: wi_kernel",
    "gate": "feed-forward gate (swiglu, geglu only): wg_kernel",
    "down": "feed-forward down projection: wo_kernel",
}
# Defaults of the LoRA fields. alpha 8 is PEFT's LoraConfig default (with its default rank 8
# the scale alpha / rank is 1); targets q and v are the LoRA paper's choice (Hu et al. 2021,
# section 7.1) and PEFT's default for Llama.
DEFAULT_LORA_ALPHA = 8.0
DEFAULT_LORA_TARGETS = ("q", "v")


def _as_dtype(owner: str, field: str, value: Any) -> Any:
    if isinstance(value, str):
        if value not in _DTYPES:
            raise ValueError(
                f"{owner}.{field}={value!r} is not a known dtype; use one of {sorted(_DTYPES)}."
            )
        return _DTYPES[value]
    try:
        name = jnp.dtype(value).name
    except TypeError as err:
        raise ValueError(f"{owner}.{field}={value!r} is not a dtype.") from err
    if name not in _DTYPES:
        raise ValueError(
            f"{owner}.{field}={value!r} is not a floating dtype we support; "
            f"use one of {sorted(_DTYPES)}."
        )
    return _DTYPES[name]


def _check_layer_fields(config: Any, choices: dict[str, tuple[str, ...]]) -> None:
    """Validate (and convert the dtypes of) a layer's fields; errors name `config`'s class."""
    owner = type(config).__name__
    object.__setattr__(config, "dtype", _as_dtype(owner, "dtype", config.dtype))
    object.__setattr__(config, "param_dtype", _as_dtype(owner, "param_dtype", config.param_dtype))
    for name in ("d_model", "num_heads", "d_ff"):
        _check_positive(config, name)
    if config.d_model % config.num_heads:
        raise ValueError(
            f"{owner}.num_heads={config.num_heads} does not divide "
            f"d_model={config.d_model}; pick num_heads among the divisors of d_model."
        )
    for name in ("dropout_rate", "attention_dropout_rate"):
        _check_real(config, name, "in [0, 1)", lambda v: 0.0 <= v < 1.0)
    for name in ("init_std", "layer_norm_eps"):
        _check_real(config, name, "> 0", lambda v: v > 0)
    _check_bool(config, "use_bias")
    _check_bool(config, "qk_norm")
    for name in ("attention_bias", "ffn_bias", "norm_bias"):
        if getattr(config, name) is not None:
            _check_bool(config, name)
    for name, allowed in choices.items():
        if getattr(config, name) not in allowed:
            raise ValueError(f"{owner}.{name}={getattr(config, name)!r} is not one of {allowed}.")
    if config.attention_impl in ("splash", "cudnn") and config.attention_dropout_rate:
        raise ValueError(
            f"{owner}.attention_impl={config.attention_impl!r} is a fused kernel with no "
            f"dropout on the attention weights, but attention_dropout_rate="
            f"{config.attention_dropout_rate}; set it to 0.0 or use attention_impl='xla'."
        )
    kv_heads = config.num_kv_heads
    if kv_heads is not None:
        _check_positive(config, "num_kv_heads")
        if config.num_heads % kv_heads:
            raise ValueError(
                f"{owner}.num_kv_heads={kv_heads} does not divide num_heads={config.num_heads}; "
                "pick a divisor of num_heads (num_heads: multi-head, 1: multi-query attention)."
            )
    _check_lora(config)
    _check_softcapping(config, "attention_impl")
    base = config.rope_base
    if isinstance(base, bool) or not isinstance(base, int | float) or not math.isfinite(base):
        raise ValueError(f"{owner}.rope_base={base!r} must be a finite number > 0.")
    if base <= 0:
        raise ValueError(f"{owner}.rope_base={base!r} must be a finite number > 0.")
    head_dim = config.d_model // config.num_heads
    if config.rope and head_dim % 2:
        raise ValueError(
            f"{owner}: rotary positions turn pairs of features, so the head width "
            f"d_model / num_heads = {config.d_model} / {config.num_heads} = {head_dim} must be "
            "even; change d_model or num_heads."
        )


def _check_lora(config: Any) -> None:
    """The LoRA fields: rank >= 0, alpha finite > 0, targets a tuple of known names (a list
    is stored as a tuple, so the config stays hashable); checked whatever the rank."""
    owner = type(config).__name__
    rank = config.lora_rank
    if isinstance(rank, bool) or not isinstance(rank, numbers.Integral) or rank < 0:
        raise ValueError(
            f"{owner}.lora_rank={rank!r} must be an integer >= 0 (0 = no LoRA adapters)."
        )
    _check_real(config, "lora_alpha", "> 0", lambda v: v > 0)
    targets = config.lora_targets
    if isinstance(targets, str) or not isinstance(targets, tuple | list):
        raise ValueError(
            f"{owner}.lora_targets={targets!r} must be a tuple of projection names, e.g. "
            f"('q', 'v'); choose among {tuple(LORA_TARGETS)}."
        )
    targets = tuple(targets)
    for name in targets:
        if name not in LORA_TARGETS:
            raise ValueError(
                f"{owner}.lora_targets has {name!r}, which is not a projection LoRA can "
                f"adapt; choose among {tuple(LORA_TARGETS)}."
            )
    twice = sorted({name for name in targets if targets.count(name) > 1})
    if twice:
        raise ValueError(f"{owner}.lora_targets={targets!r} names {twice} more than once.")
    if rank > 0 and not targets:
        raise ValueError(
            f"{owner}.lora_rank={rank} asks for adapters but lora_targets is empty; name "
            f"the projections to adapt among {tuple(LORA_TARGETS)}, or set lora_rank=0."
        )
    if "gate" in targets and config.activation not in ("swiglu", "geglu"):
        raise ValueError(
            f"{owner}.lora_targets has 'gate', but activation={config.activation!r} has no "
            "gate kernel (only 'swiglu' and 'geglu' do); remove 'gate' or use 'up'/'down'."
        )
    object.__setattr__(config, "lora_targets", targets)


def check_attention_attributes(module: Any) -> None:
    """The checks of the config fields a `MultiHeadAttention` takes as attributes, run on
    the module's own values, with the config's messages naming the attribute
    (`MultiHeadAttention.qk_norm_eps=0.0 must be > 0.`): a module built without a config
    is refused what a config would refuse. (Head counts and the dropout rate are checked
    by the module's call, the LoRA fields by `layers.lora`.)"""
    owner = type(module).__name__
    for name in ("cross", "use_bias", "rope", "qk_norm"):
        _check_bool(module, name)
    _check_real(module, "init_std", "> 0", lambda v: v > 0)
    _check_real(module, "qk_norm_eps", "> 0", lambda v: v > 0)
    _check_real(module, "rope_base", "> 0", lambda v: v > 0)
    impls = _LAYER_CHOICES["attention_impl"]
    if module.impl not in impls:
        raise ValueError(f"{owner}.impl={module.impl!r} is not one of {impls}.")
    _check_softcapping(module, "impl")


# The attention implementations that soft-cap attention logits (layers.attention_op has
# the same tuple; the config cannot import layers).
_SOFTCAP_IMPLS = ("xla", "blocked")


def _check_softcapping(config: Any, impl_field: str) -> None:
    """`attn_logit_softcapping`: None (off) or a finite number > 0, and an implementation
    that runs it (the fused kernels cannot)."""
    if config.attn_logit_softcapping is None:
        return
    _check_real(config, "attn_logit_softcapping", "> 0 (None = off)", lambda v: v > 0)
    impl = getattr(config, impl_field)
    if impl not in _SOFTCAP_IMPLS:
        raise ValueError(
            f"{type(config).__name__}.attn_logit_softcapping={config.attn_logit_softcapping!r} "
            f"needs an attention that soft-caps its scores, but {impl_field}={impl!r} is a "
            f"fused kernel that cannot; use {impl_field} in {_SOFTCAP_IMPLS}, or set "
            "attn_logit_softcapping=None."
        )


def _check_real(config: Any, name: str, bounds: str, within) -> None:
    """A finite real number (not a bool or a string) for which `within` holds."""
    value = getattr(config, name)
    owner = type(config).__name__
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(
            f"{owner}.{name}={value!r} must be a number {bounds}, got {type(value).__name__}."
        )
    if not math.isfinite(value):
        raise ValueError(f"{owner}.{name}={value!r} must be a finite number {bounds}.")
    if not within(value):
        raise ValueError(f"{owner}.{name}={value!r} must be {bounds}.")


def _check_bool(config: Any, name: str) -> None:
    value = getattr(config, name)
    if not isinstance(value, bool | np.bool_):
        raise ValueError(
            f"{type(config).__name__}.{name}={value!r} must be True or False, got "
            f"{type(value).__name__}."
        )


def _check_positive(config: Any, name: str) -> None:
    value = getattr(config, name)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{type(config).__name__}.{name}={value!r} must be a positive integer.")


@dataclasses.dataclass(frozen=True)
class LayerConfig:
    """What one `EncoderLayer` or `DecoderLayer` reads: no vocabulary, length or depth.

    `TransformerConfig.layer_config` gives the one a model's layers use; build one directly
    to use a layer on its own (e.g. over patch or audio embeddings). The fields mean what
    the `TransformerConfig` fields of the same names mean, with the same defaults.
    """

    d_model: int  # width D of the layer's input and output
    num_heads: int  # attention heads N; must divide d_model
    d_ff: int  # feed-forward width F
    dropout_rate: float = 0.1  # on every residual branch
    attention_dropout_rate: float = 0.0  # on attention weights
    norm_position: str = "pre"  # 'pre' (Happy-LLM ch. 2, GPT-2) or 'post' (the 2017 paper)
    norm: str = "layernorm"  # 'layernorm' (paper) or 'rmsnorm' (Llama: no centring, no bias)
    # Feed-forward nonlinearity: 'relu', 'gelu', 'gelu_tanh', 'relu2' (ReLU squared), or
    # gated (three kernels, hidden width d_ff): 'swiglu' (Llama), 'geglu'
    activation: str = "relu"
    use_bias: bool = True  # biases in projections, feed-forward and LayerNorm
    attention_bias: bool | None = None  # biases of the Q/K/V/output projections; None = use_bias
    ffn_bias: bool | None = None  # biases of the feed-forward kernels; None = use_bias
    norm_bias: bool | None = None  # LayerNorm shift (RMSNorm has none); None = use_bias
    layer_norm_eps: float = 1e-5
    init_std: float = 0.02  # normal init std of every projection kernel
    attention_impl: str = "xla"  # 'xla', 'jax_nn', 'splash', 'cudnn' or 'blocked'
    dtype: Any = "float32"  # compute dtype
    param_dtype: Any = "float32"  # parameter storage dtype
    num_kv_heads: int | None = None  # key/value heads K (see TransformerConfig); None = num_heads
    rope: bool = False  # rotary positions on self-attention (TransformerConfig.positional='rope')
    rope_base: float = 10000.0  # rotary frequency base (see TransformerConfig)
    lora_rank: int = 0  # LoRA adapter rank r (see TransformerConfig); 0 = no adapters
    lora_alpha: float = DEFAULT_LORA_ALPHA  # LoRA scale alpha / r (see TransformerConfig)
    lora_targets: tuple[str, ...] = DEFAULT_LORA_TARGETS  # adapted projections
    qk_norm: bool = False  # RMSNorm on each head's queries and keys (see TransformerConfig)
    attn_logit_softcapping: float | None = None  # attention-score cap (see TransformerConfig)

    def __post_init__(self):
        _check_layer_fields(self, _LAYER_CHOICES)

    @property
    def kv_heads(self) -> int:
        """K, the key/value heads: `num_kv_heads`, or `num_heads` where it is None."""
        return self.num_kv_heads or self.num_heads

    def replace(self, **changes) -> LayerConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Sizes and options of `Transformer` and `DecoderOnlyTransformer`.

    Defaults are a small model; `configs/` holds the paper's sizes. Dtypes may be given as
    strings ('float32', 'bfloat16') and are stored as jnp dtypes.
    """

    vocab_size: int = 8000  # shared source/target vocabulary (ids 0..vocab_size-1)
    target_vocab_size: int | None = None  # separate target vocabulary; None = vocab_size
    d_model: int = 256  # model width D
    num_heads: int = 4  # attention heads N; must divide d_model
    # Key/value heads K (grouped-query attention; 1 = multi-query); must divide num_heads.
    # Query head i reads key/value head i // (num_heads // K), as Hugging Face's Llama.
    # None = num_heads (multi-head attention, the paper)
    num_kv_heads: int | None = None
    d_ff: int = 1024  # feed-forward width F
    num_layers: int = 3  # layers per stack
    num_encoder_layers: int | None = None  # override for the encoder; None = num_layers
    num_decoder_layers: int | None = None  # override for the decoder; None = num_layers
    max_len: int = 256  # longest sequence the position table covers
    dropout_rate: float = 0.1  # on embeddings and every residual branch
    attention_dropout_rate: float = 0.0  # on attention weights
    pad_id: int = 0  # padding token id, masked everywhere
    norm_position: str = "pre"  # 'pre' (Happy-LLM ch. 2, GPT-2) or 'post' (the 2017 paper)
    norm: str = "layernorm"  # 'layernorm' (paper) or 'rmsnorm' (Llama: no centring, no bias)
    final_norm: bool | None = None  # LayerNorm after each stack; None = only for pre-norm
    # 'sinusoidal' (paper) or 'learned' (GPT-2), both added to the token embeddings; or 'rope'
    # (rotary, Llama): nothing added, self-attention rotates its queries and keys instead
    positional: str = "sinusoidal"
    # Rotary frequency base, read with positional='rope' (10000: RoFormer, Llama 2; Llama 3
    # uses 500000)
    rope_base: float = 10000.0
    # Feed-forward nonlinearity: 'relu', 'gelu', 'gelu_tanh', 'relu2' (ReLU squared,
    # max(0, x)**2: So et al. 2021, the modded-nanogpt speedrun), or gated (three kernels,
    # hidden width d_ff): 'swiglu' (Llama), 'geglu'
    activation: str = "relu"
    use_bias: bool = True  # biases in projections, feed-forward and LayerNorm
    attention_bias: bool | None = None  # biases of the Q/K/V/output projections; None = use_bias
    ffn_bias: bool | None = None  # biases of the feed-forward kernels; None = use_bias
    norm_bias: bool | None = None  # LayerNorm shift (RMSNorm has none); None = use_bias
    output_bias: bool = False  # a bias on the logits (the Flax lm1b example has one)
    layer_norm_eps: float = 1e-5
    share_embeddings: bool = True  # one embedding for source and target tokens
    tie_output_embedding: bool = True  # logits = x @ target_embedding^T
    scale_embeddings: bool = True  # multiply token embeddings by sqrt(d_model) (paper 3.4)
    # Normal init std of token embeddings. 0.02 (GPT-2) times sqrt(d_model) gives
    # token vectors ~0.3 per dimension at d 256, small beside sinusoidal positions (~0.7);
    # d_model ** -0.5 makes them comparable (std 1 after scaling, as the Flax wmt example).
    embed_init_std: float = 0.02
    # Normal init std of every projection kernel. 0.02 (GPT-2) is small beside
    # d_model ** -0.5 (0.0625 at d 256, the scale of Xavier/LeCun init that the Flax wmt
    # example and tensor2tensor use): attention starts nearly uniform.
    init_std: float = 0.02
    # 'xla' (our vmapped attention), 'jax_nn' (jax.nn.dot_product_attention; calls with
    # attention dropout or a mutable 'intermediates' collection run 'xla', which has
    # weights), 'splash' (Pallas flash attention, TPU; sequence lengths multiples of 128) or
    # 'cudnn' (cuDNN flash attention, GPU). The fused two have no attention dropout and no
    # weights: asking for either raises (layers/attention_op.py)
    attention_impl: str = "xla"
    dtype: Any = "float32"  # compute dtype
    param_dtype: Any = "float32"  # parameter storage dtype
    scan_layers: bool = False  # stack layers with nn.scan (compile time flat in depth)
    remat: bool = False  # rematerialise each layer in the backward pass
    # Check, inside jitted calls, what only the values can tell: token ids in [0, V),
    # positions in [0, max_len), room in the KV cache, prompt lengths. Run the jitted call
    # through `flax_transformer.checked` (jax's checkify) to get the error raised. Off: no
    # check costs anything, and such inputs give NaN (docs/api.md, "What jit does not check")
    debug_checks: bool = False
    # LoRA (Hu et al. 2021, arXiv:2106.09685): rank r of the low-rank adapters; 0 = none (the
    # parameter tree of a model without them). With r > 0 every targeted kernel W is used as
    # W + (lora_alpha / r) * A @ B, A `(in, r)` uniform(+-1/sqrt(in)) as PEFT, B `(r, out)`
    # zeros, both float32 whatever param_dtype (`flax_transformer.lora`)
    lora_rank: int = 0
    # Numerator of the adapters' scale alpha / r (8: PEFT's default, scale 1 at r = 8)
    lora_alpha: float = DEFAULT_LORA_ALPHA
    # Projections that get adapters, in every layer of both stacks: attention 'q', 'k', 'v',
    # 'o' (self- and cross-attention), feed-forward 'up', 'down', and 'gate' (swiglu, geglu).
    # ('q', 'v'): the paper's choice
    lora_targets: tuple[str, ...] = DEFAULT_LORA_TARGETS
    # QK-norm, per head (Dehghani et al. 2023; Qwen3's form, the modded-nanogpt speedrun;
    # not OLMo 2's, which normalizes q and k across all heads with (N*H,) weights): every
    # attention (self and cross) puts each head's queries and keys through RMSNorm over the
    # head width H before the scores (before rotary positions, so cached keys are stored
    # normalised), with learned scales `query_norm_scale`, `key_norm_scale` `(H,)` shared
    # by the heads (init 1, as Qwen3's q_norm/k_norm) and eps `layer_norm_eps`. False: the
    # paper's attention, no such parameters
    qk_norm: bool = False
    # Logit soft-capping (Gemma 2, the speedrun): logits = cap * tanh(logits / cap), applied
    # to the output logits (after `output_bias`), so every logit lies in (-cap, cap); 0 = off
    logits_soft_cap: float = 0.0
    # Attention-logit soft-capping (Gemma 2's `attn_logit_softcapping`, 50.0 there): in every
    # attention the scaled scores become c * tanh(scores / c) before the mask and softmax.
    # None = off. attention_impl 'xla' and 'blocked' run it (and cached decoding); the fused
    # 'jax_nn', 'splash', 'cudnn' cannot, and are refused with it
    attn_logit_softcapping: float | None = None

    def __post_init__(self):
        _check_layer_fields(self, _CHOICES)
        _check_real(self, "logits_soft_cap", ">= 0 (0 = off)", lambda v: v >= 0)
        for name in ("vocab_size", "num_layers", "max_len"):
            _check_positive(self, name)
        for name in ("scan_layers", "remat", "share_embeddings", "tie_output_embedding"):
            _check_bool(self, name)
        for name in ("scale_embeddings", "output_bias", "debug_checks"):
            _check_bool(self, name)
        for name in ("target_vocab_size", "num_encoder_layers", "num_decoder_layers"):
            if getattr(self, name) is not None:
                _check_positive(self, name)
        _check_real(self, "embed_init_std", "> 0", lambda v: v > 0)
        if self.final_norm is not None:
            _check_bool(self, "final_norm")
        if self.positional == "sinusoidal" and self.d_model % 2:
            raise ValueError(
                f"TransformerConfig.d_model={self.d_model} must be even for sinusoidal positions."
            )
        if isinstance(self.pad_id, bool) or not isinstance(self.pad_id, numbers.Integral):
            raise ValueError(
                f"TransformerConfig.pad_id={self.pad_id!r} must be an int token id, got "
                f"{type(self.pad_id).__name__}."
            )
        if not 0 <= self.pad_id < self.vocab_size:
            raise ValueError(
                f"TransformerConfig.pad_id={self.pad_id} must be a token id in "
                f"[0, vocab_size={self.vocab_size})."
            )
        if self.target_vocab_size not in (None, self.vocab_size) and self.share_embeddings:
            raise ValueError(
                f"TransformerConfig.share_embeddings=True needs one vocabulary, but "
                f"target_vocab_size={self.target_vocab_size} != vocab_size={self.vocab_size}; "
                "set share_embeddings=False."
            )

    @property
    def layer_config(self) -> LayerConfig:
        """The fields every encoder and decoder layer of the model reads."""
        names = [field.name for field in dataclasses.fields(LayerConfig)]
        return LayerConfig(**{name: getattr(self, name) for name in names})

    @property
    def head_dim(self) -> int:
        """Width H of one head: d_model / num_heads."""
        return self.d_model // self.num_heads

    @property
    def kv_heads(self) -> int:
        """K, the key/value heads: `num_kv_heads`, or `num_heads` where it is None."""
        return self.num_kv_heads or self.num_heads

    @property
    def rope(self) -> bool:
        """Whether self-attention uses rotary positions (`positional == 'rope'`)."""
        return self.positional == "rope"

    @property
    def use_final_norm(self) -> bool:
        """Whether each stack ends with a LayerNorm (torch.nn.Transformer always has one)."""
        return self.norm_position == "pre" if self.final_norm is None else self.final_norm

    @property
    def encoder_layers(self) -> int:
        return self.num_encoder_layers or self.num_layers

    @property
    def decoder_layers(self) -> int:
        return self.num_decoder_layers or self.num_layers

    @property
    def output_vocab_size(self) -> int:
        return self.target_vocab_size or self.vocab_size

    def replace(self, **changes) -> TransformerConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def check_length(self, length: int, name: str = "sequence") -> None:
        """Raise ValueError if a sequence of `length` tokens exceeds `max_len`."""
        if length > self.max_len:
            raise ValueError(
                f"{name} length {length} exceeds TransformerConfig.max_len={self.max_len}; "
                "shorten the input or raise max_len."
            )
