"""The one place that picks an attention implementation: `attention_op`.

`MultiHeadAttention` projects queries, keys and values, writes the KV cache, and hands the
heads here; nothing else knows which kernel runs. The implementations (`attention_impl`):

  xla      our vmapped formula (`functional.grouped_heads_attention`): every mask, dropout
           on the weights, and the weights themselves (sown by the layer).
  jax_nn   `jax.nn.dot_product_attention` with the dense mask (XLA picks the kernel);
           calls that need dropout or the weights run `xla` instead (same result).
  splash   Pallas splash attention (TPU flash attention): causal flag and segment ids,
           never a dense mask; grouped-query heads natively.
  cudnn    `jax.nn.dot_product_attention(implementation='cudnn')` (GPU flash attention):
           causal flag plus the dense padding/segment mask.
  blocked  the flash algorithm in `jax.lax`
           (`functional.blocked_attention.blocked_attention`): key blocks scanned with an
           online softmax, masks built per block from an `AttentionMask`,
           no `(T, S)` array in the forward or the backward pass; any platform; attention
           dropout drawn per key block. Calls that need the weights or pass a dense mask
           array run `xla` instead.

The fused kernels (`splash`, `cudnn`) return no weights and have no attention dropout; a
call that needs either, or a mask they cannot express, raises a ValueError naming the
option rather than silently dropping it. Decoding over a KV cache always runs `xla`.
"""

from __future__ import annotations

import contextlib
import contextvars
import math

import jax
import jax.numpy as jnp
from flax import linen as nn

from flax_transformer import axes
from flax_transformer.functional import AttentionMask, broadcast_mask
from flax_transformer.functional.attention import grouped_heads_attention
from flax_transformer.functional.blocked_attention import blocked_attention
from flax_transformer.functional.masks import as_dense, check_causal_lengths
from flax_transformer.layers.platform_guard import refuse_on_cpu

IMPLEMENTATIONS = ("xla", "jax_nn", "splash", "cudnn", "blocked")
# The implementations that soft-cap attention logits (Gemma 2's attn_logit_softcapping):
# the fused kernels take no such option.
SOFTCAP_IMPLEMENTATIONS = ("xla", "blocked")


def softcap_refusal(owner: str, impl: str) -> str:
    """The message refusing attention-logit soft-capping with a fused kernel."""
    return (
        f"{owner}: attention_impl={impl!r} is a fused kernel that cannot soft-cap the "
        f"attention logits, but attn_logit_softcapping is set; use attention_impl in "
        f"{SOFTCAP_IMPLEMENTATIONS}, or set attn_logit_softcapping=None."
    )


_SPLASH_INTERPRET = contextvars.ContextVar("splash_interpret", default=False)


@contextlib.contextmanager
def splash_interpret():
    """Run `attention_impl='splash'` in Pallas's interpret mode: on a CPU, slowly (tests).

    Applies to what is traced inside the block (a function jitted outside it keeps the
    program it compiled there). Pallas's own `force_tpu_interpret_mode()` simulates TPU
    memory more closely, but its interpreter cannot batch a kernel with `vmap`, which is
    how splash attention runs over the examples of a batch; this one can.
    """
    token = _SPLASH_INTERPRET.set(True)
    try:
        yield
    finally:
        _SPLASH_INTERPRET.reset(token)


# Splash attention's tiles must be multiples of a TPU vector register's 128 lanes; the
# largest of these that divides both sequence lengths is used (bigger tiles, fewer steps).
SPLASH_BLOCKS = (512, 256, 128)
# The named scope around the splash kernels, by causal flag (see `_splash`).
SPLASH_SCOPES = {False: "splash_full_mask", True: "splash_causal_mask"}


def attention_op(
    q_BTNH: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mask: jax.Array | AttentionMask | None,
    *,
    impl: str,
    kv_head_axis: int = 2,
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
    need_weights: bool = False,
    fn: str = "MultiHeadAttention",
    logit_softcap: float | None = None,
) -> tuple[jax.Array, jax.Array | None]:
    """Attention of every head: `(B, T, N, H)` queries over K key/value heads.

    Args:
      q_BTNH: queries, unscaled.
      k, v: `(B, S, K, H)` (`kv_head_axis=2`), or head-major `(B, K, L, H)` from a KV
        cache (`kv_head_axis=1`, always run by `xla`).
      mask: a bool array (rank 2 `(T, S)` or rank 4), an `AttentionMask`, or None.
      impl: one of `IMPLEMENTATIONS`.
      dropout_rate, dropout_rng: attention dropout, active when the key is given.
      need_weights: the caller sows the weights (a mutable 'intermediates' collection).
      fn: the caller's name, for error messages.
      logit_softcap: Gemma 2's attention-logit soft-capping (`attn_logit_softcapping`),
        run by `SOFTCAP_IMPLEMENTATIONS` (and decoding over a cache); the fused kernels
        refuse it. None: off.

    Returns:
      `(out (B, T, N, H), weights (B, N, T, S) or None)`; weights come from `xla` only.
    """
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"{fn}: attention_impl={impl!r} is not one of {IMPLEMENTATIONS}.")
    if logit_softcap is not None and impl not in SOFTCAP_IMPLEMENTATIONS:
        raise ValueError(softcap_refusal(fn, impl))
    if isinstance(mask, AttentionMask) and mask.causal:
        # Every implementation, the fused ones included (their causal flag would silently
        # align the mask top-left): the rule of `AttentionMask.dense`.
        kv_len = k.shape[3 - kv_head_axis]
        check_causal_lengths(f"{fn}: a causal AttentionMask", q_BTNH.shape[1], kv_len)
    dropout = dropout_rng is not None and dropout_rate > 0.0
    dense = mask is not None and not isinstance(mask, AttentionMask)
    falls_back = (dropout and impl != "blocked") or need_weights or (impl == "blocked" and dense)
    if kv_head_axis == 1 or impl == "xla" or (impl in ("jax_nn", "blocked") and falls_back):
        return grouped_heads_attention(
            q_BTNH,
            k,
            v,
            mask,
            kv_head_axis=kv_head_axis,
            dropout_rate=dropout_rate,
            dropout_rng=dropout_rng,
            fn=fn,
            logit_softcap=logit_softcap,
        )
    _refuse_unsupported(impl, fn, dropout, need_weights)
    if impl == "blocked":
        rate = dropout_rate if dropout else 0.0
        key = dropout_rng if dropout else None
        return _blocked(q_BTNH, k, v, mask, rate, key, logit_softcap), None
    if impl == "jax_nn":
        return _jax_nn(q_BTNH, k, v, mask, fn), None
    if impl == "cudnn":
        return _cudnn(q_BTNH, k, v, mask, fn), None
    return _splash(q_BTNH, k, v, mask, fn), None


def _refuse_unsupported(impl: str, fn: str, dropout: bool, need_weights: bool) -> None:
    if impl in ("jax_nn", "blocked"):
        return
    if dropout:
        raise ValueError(
            f"{fn}: attention_impl={impl!r} has no dropout on the attention weights; set "
            "attention_dropout_rate=0.0 (dropout on the residual branches still works), or "
            "use attention_impl='xla'."
        )
    if need_weights:
        raise ValueError(
            f"{fn}: attention_impl={impl!r} returns no attention weights, but the "
            "'intermediates' collection is mutable (weights are sown there); use "
            "attention_impl='xla' to read the weights, or do not make 'intermediates' mutable."
        )


def _blocked(q_BTNH, k_BSKH, v_BSKH, mask: AttentionMask | None, dropout_rate, dropout_rng, cap):
    drop = dict(dropout_rate=dropout_rate, dropout_rng=dropout_rng, logit_softcap=cap)
    if mask is None:
        return blocked_attention(q_BTNH, k_BSKH, v_BSKH, **drop)
    return blocked_attention(
        q_BTNH,
        k_BSKH,
        v_BSKH,
        key_valid_BS=mask.key_valid_BS,
        q_segments_BT=mask.q_segments_BT,
        kv_segments_BS=mask.kv_segments_BS,
        causal=mask.causal,
        **drop,
    )


def _jax_nn(q_BTNH, k_BSKH, v_BSKH, mask, fn):
    batch, q_len, num_heads, _ = q_BTNH.shape
    if mask is None:
        # It groups query heads over K < N key/value heads as we do (i // (N // K)).
        return jax.nn.dot_product_attention(q_BTNH, k_BSKH, v_BSKH)
    mask = broadcast_mask(mask, batch, num_heads, q_len, k_BSKH.shape[1], fn=fn)
    # Keys no query of any head sees (padding) are zeroed first, as in 'xla': jax.nn
    # multiplies them by zero weights, and a zero weight times NaN or inf is NaN.
    seen_BS11 = jnp.any(mask, axis=(1, 2))[:, :, None, None]
    k_BSKH, v_BSKH = (jnp.where(seen_BS11, x, jnp.zeros((), x.dtype)) for x in (k_BSKH, v_BSKH))
    out_BTNH = jax.nn.dot_product_attention(q_BTNH, k_BSKH, v_BSKH, mask=mask)
    # A query that sees no key (a packed row's padding) gets zeros, as with 'xla'; jax.nn
    # would give it the mean of all values.
    visible_BTN1 = jnp.any(mask, axis=-1).transpose(0, 2, 1)[..., None]
    return jnp.where(visible_BTN1, out_BTNH, jnp.zeros((), out_BTNH.dtype))


def _target_platform() -> tuple[str, str]:
    """(platform, device kind) of the devices the caller compiles for: those of the mesh in
    scope (e.g. GPUs compiled for from a CPU host by train.compile), else jax's default."""
    device = getattr(jax.sharding.get_abstract_mesh(), "abstract_device", None)
    if device is not None:
        return device.platform, device.device_kind
    return jax.default_backend(), jax.devices()[0].device_kind


def _cudnn(q_BTNH, k_BSKH, v_BSKH, mask, fn):
    platform, kind = _target_platform()
    if platform != "gpu":
        raise ValueError(
            f"{fn}: attention_impl='cudnn' runs cuDNN flash attention, which needs a GPU; this "
            f"step is compiled for {platform!r} ({kind}). Use attention_impl='xla' (or "
            "'splash' on a TPU)."
        )
    batch, q_len, num_heads, _ = q_BTNH.shape
    kv_len = k_BSKH.shape[1]
    causal = isinstance(mask, AttentionMask) and mask.causal
    if isinstance(mask, AttentionMask):
        # The causal part is cuDNN's own mask type; padding and segments go as a dense mask.
        mask = AttentionMask(mask.key_valid_BS, mask.q_segments_BT, mask.kv_segments_BS)
    dense = as_dense(mask, q_len, kv_len)
    if dense is not None:
        dense = broadcast_mask(dense, batch, num_heads, q_len, kv_len, fn=fn)
    return jax.nn.dot_product_attention(
        q_BTNH, k_BSKH, v_BSKH, mask=dense, is_causal=causal, implementation="cudnn"
    )


def _splash_block(fn: str, q_len: int, kv_len: int) -> int:
    for block in SPLASH_BLOCKS:
        if q_len % block == 0 and kv_len % block == 0:
            return block
    raise ValueError(
        f"{fn}: attention_impl='splash' needs query and key lengths that are multiples of "
        f"128 (its TPU tiles), got T={q_len}, S={kv_len}; pad the sequences (e.g. "
        "max_len or the packed row length) to a multiple of 128, or use attention_impl='xla'."
    )


def _splash_ids(mask: AttentionMask | None, batch: int, q_len: int, kv_len: int):
    """Segment ids for splash attention that give the reference mask on every query that
    sees a key, and `visible_BT`, the queries that see one (the rest get zeros).

    Splash lets query t see key s where their ids are equal (and s <= t if causal); a row
    that sees no key at all is an invalid softmax (0 / 0) inside the kernel, so no query
    may be left without one. Without packing, keys get id 1 (real) or 0 (padding) and
    queries id 1, which is the reference padding mask; a query with no real key to see
    gets id 0 instead, points at padding keys (such a query sees its own position), and is
    zeroed afterwards. Packed, the ids are the segment ids; a padding query (id 0), which
    the reference gives zeros, points at the first key's segment, and is zeroed too.
    """
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    if mask is None or (mask.key_valid_BS is None and mask.q_segments_BT is None):
        return None, None
    causal = mask.causal
    key_valid_BS = mask.key_valid_BS
    if key_valid_BS is None:
        key_valid_BS = jnp.ones((batch, kv_len), jnp.bool_)
    if mask.q_segments_BT is None:
        kv_ids_BS = key_valid_BS.astype(jnp.int32)
        if causal:
            # The first real key's position; query t sees a real key iff it is <= t.
            first_B = jnp.where(key_valid_BS.any(1), jnp.argmax(key_valid_BS, axis=1), kv_len)
            visible_BT = jnp.arange(q_len)[None, :] >= first_B[:, None]
        else:
            visible_BT = jnp.broadcast_to(key_valid_BS.any(1)[:, None], (batch, q_len))
        q_ids_BT = visible_BT.astype(jnp.int32)
    else:
        kv_ids_BS = jnp.where(key_valid_BS, mask.kv_segments_BS, 0).astype(jnp.int32)
        visible_BT = mask.q_segments_BT != 0
        q_ids_BT = jnp.where(visible_BT, mask.q_segments_BT, kv_ids_BS[:, :1]).astype(jnp.int32)
    return splash.SegmentIds(q=q_ids_BT, kv=kv_ids_BS), visible_BT


def _splash(q_BTNH, k_BSKH, v_BSKH, mask, fn):
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    if mask is not None and not isinstance(mask, AttentionMask):
        raise ValueError(
            f"{fn}: attention_impl='splash' takes the mask as an AttentionMask (padding keys, "
            "causal flag, segment ids), which the models build; a dense bool mask of shape "
            f"{jnp.shape(mask)} cannot be expressed as its tiles. Pass an AttentionMask, or "
            "use attention_impl='xla' for arbitrary masks."
        )
    batch, q_len, num_heads, head_dim = q_BTNH.shape
    kv_len, kv_heads = k_BSKH.shape[1], k_BSKH.shape[2]
    block = _splash_block(fn, q_len, kv_len)
    if not _SPLASH_INTERPRET.get():  # Pallas would say only "Only interpret mode ... on CPU"
        q_BTNH = refuse_on_cpu(
            q_BTNH,
            f"{fn}: attention_impl='splash' is a Pallas TPU kernel, and this program is "
            "compiled for a CPU; use attention_impl='xla' (or 'jax_nn') there, or trace the "
            "call inside flax_transformer.layers.attention_op.splash_interpret() to run it "
            "in Pallas's interpreter (slow: for tests).",
        )
    causal = mask is not None and mask.causal
    shape = (q_len, kv_len)
    head_mask = splash.CausalMask(shape) if causal else splash.FullMask(shape)
    sizes = dict.fromkeys(
        (
            "block_q",
            "block_kv",
            "block_kv_compute",
            "block_q_dkv",
            "block_kv_dkv",
            "block_kv_dkv_compute",
            "block_q_dq",
            "block_kv_dq",
        ),
        block,
    )
    ids, visible_BT = _splash_ids(mask, batch, q_len, kv_len)
    # Splash does not scale the scores: scale the queries by 1/sqrt(H) first.
    q_BNTH = (q_BTNH * (1.0 / math.sqrt(head_dim))).astype(q_BTNH.dtype).transpose(0, 2, 1, 3)
    k_BKSH, v_BKSH = k_BSKH.transpose(0, 2, 1, 3), v_BSKH.transpose(0, 2, 1, 3)

    def one_shard(q_BNTH, k_BKSH, v_BKSH, ids):
        heads = q_BNTH.shape[1]
        kernel = splash.make_splash_mha(
            splash.MultiHeadMask([head_mask] * heads),
            block_sizes=splash.BlockSizes(**sizes),
            head_shards=1,
            q_seq_shards=1,
            interpret=_SPLASH_INTERPRET.get(),
        )
        id_axes = None if ids is None else splash.SegmentIds(0, 0)
        return jax.vmap(kernel, in_axes=(0, 0, 0, id_axes))(q_BNTH, k_BKSH, v_BKSH, ids)

    # The scope names the mask in the traced program, where `train.compile` counts the
    # kernel's cost (the kernels' own operands cannot tell a causal mask from a full one).
    with jax.named_scope(SPLASH_SCOPES[causal]):
        out_BNTH = _over_mesh(one_shard, q_BNTH, k_BKSH, v_BKSH, ids, num_heads, kv_heads)
    out_BTNH = out_BNTH.transpose(0, 2, 1, 3)
    if visible_BT is not None:
        out_BTNH = jnp.where(visible_BT[:, :, None, None], out_BTNH, 0.0).astype(q_BTNH.dtype)
    return out_BTNH


def _over_mesh(one_shard, q_BNTH, k_BKSH, v_BKSH, ids, num_heads: int, kv_heads: int):
    """Run the kernel once per device on its shard of batch and heads (a Pallas call is
    opaque to XLA's partitioner), under the mesh and logical rules the caller set; with no
    mesh, or one device, directly."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or math.prod(mesh.shape.values()) == 1:
        return one_shard(q_BNTH, k_BKSH, v_BKSH, ids)
    spec = nn.logical_to_mesh_axes
    batch_axes, heads_axes = spec((axes.BATCH,))[0], spec((axes.HEADS,))[0]
    kv_name = axes.HEADS if kv_heads == num_heads else axes.KV_HEADS
    kv_axes = spec((kv_name,))[0]
    if heads_axes is not None and kv_axes is None and kv_heads != num_heads:
        # Query heads split, key/value heads whole (the tensor axis does not divide K): a
        # shard's query heads would be paired with the wrong key/value heads by position,
        # so give every query head its own copy of its key/value head first.
        group = num_heads // kv_heads
        k_BKSH, v_BKSH = (jnp.repeat(x, group, axis=1) for x in (k_BKSH, v_BKSH))
        kv_axes = heads_axes
    P = jax.sharding.PartitionSpec
    q_spec = P(batch_axes, heads_axes, None, None)
    kv_spec = P(batch_axes, kv_axes, None, None)
    id_spec = None if ids is None else type(ids)(P(batch_axes, None), P(batch_axes, None))
    in_specs = (q_spec, kv_spec, kv_spec, id_spec)
    if ids is None:
        return jax.shard_map(
            lambda q, k, v: one_shard(q, k, v, None),
            mesh=mesh,
            in_specs=in_specs[:3],
            out_specs=q_spec,
            check_vma=False,
        )(q_BNTH, k_BKSH, v_BKSH)
    return jax.shard_map(
        one_shard, mesh=mesh, in_specs=in_specs, out_specs=q_spec, check_vma=False
    )(q_BNTH, k_BKSH, v_BKSH, ids)


__all__ = [
    "IMPLEMENTATIONS",
    "SOFTCAP_IMPLEMENTATIONS",
    "SPLASH_BLOCKS",
    "attention_op",
    "splash_interpret",
]
