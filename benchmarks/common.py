"""Shared pieces of the benchmark scripts: the model sizes (training and decoding), timing,
machine facts. Timing and worker processes live in `benchmarks.processes` (no jax there, so a
torch worker does not import it) and are named here too."""

from __future__ import annotations

import dataclasses
import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.processes import WorkerProcess, median, time_steps  # noqa: F401 (re-exported)
from flax_transformer import TransformerConfig


@dataclasses.dataclass(frozen=True)
class Size:
    """One benchmark configuration (the sizes every benchmark compares at)."""

    name: str
    kind: str  # 'encdec' or 'deconly'
    vocab: int
    d_model: int
    heads: int
    d_ff: int
    layers: int
    batch: int
    src_len: int  # 0 for decoder-only
    tgt_len: int

    @property
    def tokens_per_step(self) -> int:
        """Tokens processed per step: source plus target tokens for the encoder-decoder."""
        return self.batch * (self.src_len + self.tgt_len)


SIZES = {
    "encdec": Size("encdec", "encdec", 8000, 256, 4, 1024, 3, 16, 64, 64),
    "dec_small": Size("dec_small", "deconly", 8000, 256, 4, 1024, 4, 16, 0, 128),
    "dec_base": Size("dec_base", "deconly", 32000, 512, 8, 2048, 6, 8, 0, 256),
    # GPT-2 small, for accelerators (benchmarks/gpu.sh).
    "gpt2_small": Size("gpt2_small", "deconly", 50257, 768, 12, 3072, 12, 16, 0, 1024),
}


# The decoding benchmarks' model and lengths (benchmarks.generation measures tokens per
# second with them, benchmarks.memory_bandwidth the bytes each decoded token reads).
DECODE_PROMPT_LEN = 16
DECODE_NEW_TOKENS = 128
DECODE_SIZE = dict(vocab=8000, d_model=256, heads=4, d_ff=1024, layers=4, max_len=256)
DECODE_CONFIG = TransformerConfig(
    vocab_size=DECODE_SIZE["vocab"],
    d_model=DECODE_SIZE["d_model"],
    num_heads=DECODE_SIZE["heads"],
    d_ff=DECODE_SIZE["d_ff"],
    num_layers=DECODE_SIZE["layers"],
    max_len=DECODE_SIZE["max_len"],
)


def model_flops_per_step(size: Size) -> float:
    """Training FLOPs of one step by the usual count: 6 per parameter-token for the matmuls
    (forward 2, backward 4) plus 12 * layers * D * context per token for attention scores
    and values (PaLM appendix B). Embedding lookups count nothing; the tied output
    projection counts as a matmul."""
    d, f, v = size.d_model, size.d_ff, size.vocab
    attn, ffn = 4 * d * d, 2 * d * f
    if size.kind == "encdec":
        enc = size.layers * (attn + ffn)
        dec = size.layers * (2 * attn + ffn)
        dense = 6 * (size.batch * size.src_len * enc + size.batch * size.tgt_len * (dec + d * v))
        scores = (
            12
            * size.layers
            * d
            * size.batch
            * (size.src_len**2 + size.tgt_len**2 + size.tgt_len * size.src_len)
        )
        return float(dense + scores)
    per_token = 6 * (size.layers * (attn + ffn) + d * v)
    scores = 12 * size.layers * d * size.tgt_len * size.batch * size.tgt_len
    return float(per_token * size.batch * size.tgt_len + scores)


def matmul_peak_flops(n: int = 1024, dtype=jnp.float32, steps: int = 10) -> float:
    """Achieved FLOP/s of one large jitted square matmul: this machine's practical peak."""
    a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n)), dtype)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    t = median(time_steps(lambda: f(a).block_until_ready(), steps))
    return 2 * n**3 / t


def machine_line() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return (
        f"{cpu}, {os.cpu_count()} cores, {jax.devices()[0].platform}, "
        f"jax {jax.__version__}, {time.strftime('%Y-%m-%d')}"
    )


def random_tokens(shape, vocab: int, seed: int = 0) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).integers(1, vocab, shape), jnp.int32)


def pretrained_program(experiment, task, source, vocab_size: int, unk_id: int):
    """The training program `train.main` builds for `experiment` and `task`, its state
    holding `source`'s weights placed as the program places them: (program, state, mesh). Used by
    the peer benchmarks (smollm2_peer, dpo_peer), which time that program's step."""
    import flax

    from train.program import loop as train_lib
    from train.program import steps, weights

    mesh = train_lib.make_mesh(experiment.run.mesh_shape)
    program = train_lib.build_program(experiment, task, mesh, vocab_size, unk_id=unk_id)
    placement = flax.traverse_util.flatten_dict(program.state_shapes.params)
    loaded, _ = weights.load_weights(source, experiment.model, placement)
    state = steps.create_train_state(
        program.model,
        task,
        program.tx,
        mesh,
        experiment.run.seed,
        experiment.run.rng_impl,
        pretrained=loaded,
    )
    return program, state, mesh
