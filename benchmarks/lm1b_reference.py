"""The Flax lm1b example's cached decoding, loaded from a checkout of Flax's examples/.

Nothing of the example is copied here: `load_lm1b(examples_dir)` imports its `models.py` and
`temperature_sampler.py` from `<examples_dir>/lm1b` with importlib (they import only flax,
jax and numpy, and run unchanged on flax 0.12), and this module drives them as the example's
`train.predict_step` does: `TransformerLM` with `decode=True`, its 'cache' collection made by
`init` on a `(B, P + N)` input inside the jitted call, then one token per step through
`apply(..., mutable=['cache'])`, the prompt fed token by token after a leading 0.

Greedy decoding: `temperature_sample(..., topk=1)` keeps only the best logit, so it is the
argmax. That sampler works at batch 1 only (`next_token[None] * ~ended` turns `(B,)` into
`(B, B)`; `train.py` calls it per device with one prompt each), so `greedy_fn` runs the same
loop (same carry, same per-step work minus the random key, the token chosen by `lax.top_k(...,
1)` as the sampler does) with batch-safe shapes; at batch 1 it gives the sampler's tokens
exactly, which `load_lm1b` checks, at the sampler's speed (1,079 vs 1,059 tok/s, one
process, 2026-11-30; with `jnp.argmax` instead it ran 12% slower than the sampler, as XLA's
CPU argmax is slow: see `decoding.sampling.argmax_first`).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType

import jax
import jax.numpy as jnp
from jax import lax

# The environment variable that names a checkout of github.com/google/flax's examples/.
EXAMPLES_ENV = "FLAX_EXAMPLES"


def find_examples(path: str | None) -> str | None:
    """The lm1b directory under `path` (or $FLAX_EXAMPLES), or None if it is not there."""
    path = path or os.environ.get(EXAMPLES_ENV)
    if not path:
        return None
    lm1b = os.path.join(path, "lm1b")
    needed = ("models.py", "temperature_sampler.py")
    if all(os.path.isfile(os.path.join(lm1b, name)) for name in needed):
        return lm1b
    return None


def _import(lm1b_dir: str, name: str) -> ModuleType:
    """Import `<lm1b_dir>/<name>.py` as module `lm1b_<name>` (no sys.path change)."""
    spec = importlib.util.spec_from_file_location(f"lm1b_{name}", f"{lm1b_dir}/{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def config(models: ModuleType, size: dict, decode: bool):
    """The example's `TransformerConfig` for our sizes, deterministic, float32."""
    return models.TransformerConfig(
        vocab_size=size["vocab"],
        output_vocab_size=size["vocab"],
        emb_dim=size["d_model"],
        num_heads=size["heads"],
        num_layers=size["layers"],
        qkv_dim=size["d_model"],
        mlp_dim=size["d_ff"],
        max_len=size["max_len"],
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        deterministic=True,
        decode=decode,
    )


def greedy_fn(models: ModuleType, decode_config):
    """jitted `(params, sequences (B, P + N) with zeros after the prompt) -> sequences`."""
    lm = models.TransformerLM(decode_config)

    @jax.jit
    def run(params, seqs_BL):
        batch, length = seqs_BL.shape
        # As predict_step: the cache comes from init on a (B, L) input (XLA drops the rest).
        cache = lm.init(jax.random.PRNGKey(0), jnp.ones((batch, length), jnp.float32))["cache"]

        def cond(state):
            return state[0] < length - 1

        def body(state):
            i, seqs_BL, cache, token_B1 = state
            logits_B1V, new_vars = lm.apply(
                {"params": params, "cache": cache}, token_B1, mutable=["cache"]
            )
            # As the sampler with topk=1: the index of the top-1 logit (lax.top_k, not argmax).
            best_B = lax.top_k(logits_B1V[:, 0], 1)[1][:, 0].astype(jnp.int32)
            given_B = seqs_BL[:, i + 1]
            next_B1 = jnp.where(given_B == 0, best_B, given_B)[:, None]
            seqs_BL = lax.dynamic_update_slice(seqs_BL, next_B1, (0, i + 1))
            return i + 1, seqs_BL, new_vars["cache"], next_B1

        token_B1 = jnp.zeros((batch, 1), jnp.int32)
        return lax.while_loop(cond, body, (jnp.array(-1), seqs_BL, cache, token_B1))[1]

    return run


def sampler_fn(models: ModuleType, sampler: ModuleType, decode_config):
    """jitted `(params, sequences (1, L)) -> sequences` through the example's own sampler."""
    lm = models.TransformerLM(decode_config)

    @jax.jit
    def run(params, seqs_BL):
        cache = lm.init(jax.random.PRNGKey(0), jnp.ones(seqs_BL.shape, jnp.float32))["cache"]

        def tokens_to_logits(ids, cache):
            logits, new_vars = lm.apply({"params": params, "cache": cache}, ids, mutable=["cache"])
            return logits.squeeze(axis=1), new_vars["cache"]

        # eos_token=-1: never produced, so every run makes all N tokens.
        return sampler.temperature_sample(
            seqs_BL, cache, tokens_to_logits, jax.random.PRNGKey(1), topk=1, eos_token=-1
        )

    return run


def load_lm1b(lm1b_dir: str, size: dict, seed: int = 0):
    """`(params, greedy, sampler)`: random weights and both jitted decoders of the example.

    Raises RuntimeError if the greedy loop and the example's sampler disagree at batch 1.
    """
    models = _import(lm1b_dir, "models")
    sampler = _import(lm1b_dir, "temperature_sampler")
    init_tokens = jnp.ones((1, 16), jnp.int32)
    params = models.TransformerLM(config(models, size, False)).init(
        jax.random.PRNGKey(seed), init_tokens
    )["params"]
    decode_config = config(models, size, True)
    greedy, sample = greedy_fn(models, decode_config), sampler_fn(models, sampler, decode_config)
    probe = jnp.zeros((1, 24), jnp.int32).at[0, :8].set(jnp.arange(1, 9))
    if not bool(jnp.all(greedy(params, probe) == sample(params, probe))):
        raise RuntimeError("the lm1b greedy loop disagrees with the example's temperature_sample")
    return params, greedy, sample
