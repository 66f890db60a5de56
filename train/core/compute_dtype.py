"""The compute dtype a CPU host should train in, and why: `choose_compute_dtype`.

bfloat16 pays on a CPU only where it has bfloat16 matrix instructions: XLA then runs a
bfloat16 dot that accumulates in float32 on them (issue 58, a Xeon with `amx_bf16` and
`avx512_bf16`: 566 GFLOP/s against 158 in float32). Elsewhere (this project's AMD EPYC:
AVX2/FMA/F16C, no AVX-512, no AMX) a bfloat16 dot is emulated, slower than float32, so the
choice is float32. Even with the instructions the choice is bfloat16 only when it was
measured faster on the step; a dtype the user set (`--config.model.dtype`) always wins.

`--config.model.dtype='auto'` asks for the choice (`resolve_dtype`): on a GPU or TPU
bfloat16 (their matrix units take bfloat16 and accumulate in float32); on a CPU with
bfloat16 matrix instructions, bfloat16 if a bfloat16 dot with float32 accumulation at the
model's feed-forward shape measures faster than the float32 dot (`measure_dot`, about a
second, once per process and shape); on any other CPU float32, unmeasured.

Nothing here runs on import, and the library (`flax_transformer`) never chooses: the
program asks, once per run, and logs the answer with its reason.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Iterable

# /proc/cpuinfo flags that mean bfloat16 matrix instructions (Intel AMX, AVX512-BF16).
BF16_MATRIX_FLAGS = ("amx_bf16", "avx512_bf16")
CPUINFO = "/proc/cpuinfo"
# The config value that asks for the choice: `--config.model.dtype=auto`.
AUTO = "auto"
# Backends whose matrix units take bfloat16 operands and accumulate in float32.
MATRIX_UNIT_BACKENDS = ("gpu", "tpu", "cuda", "rocm")
# How many timed calls of each dot `measure_dot` takes the best of (after one warm-up).
MEASURE_REPEATS = 5


@dataclasses.dataclass(frozen=True)
class DtypeChoice:
    """A compute dtype ('float32' or 'bfloat16') and the sentence that says why."""

    dtype: str
    reason: str


def cpu_flags(path: str = CPUINFO) -> frozenset[str]:
    """The flags of the first processor in `path` (Linux's /proc/cpuinfo); empty if the
    file is missing or has no flags line (another OS: no bfloat16 choice is made)."""
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def choose_compute_dtype(
    flags: Iterable[str],
    *,
    user_dtype: str | None = None,
    bf16_measured_faster: bool | None = None,
) -> DtypeChoice:
    """The compute dtype for a CPU host with these `/proc/cpuinfo` flags.

    Args:
        flags: the CPU's flags (`cpu_flags()`, or a made-up set in tests).
        user_dtype: the dtype the user set (`--config.model.dtype`), or None: it wins.
        bf16_measured_faster: whether a bfloat16 step measured faster than a float32 one on
            this host; None: not measured (then float32: the instructions alone do not
            make the step faster, issue 58's bfloat16-out dots were slower).

    Returns:
        The choice and its reason, to log.
    """
    if user_dtype is not None:
        return DtypeChoice(user_dtype, f"{user_dtype}: set by --config.model.dtype")
    present = sorted(set(BF16_MATRIX_FLAGS) & set(flags))
    if not present:
        return DtypeChoice(
            "float32",
            f"float32: this CPU has no bfloat16 matrix instructions (none of "
            f"{', '.join(BF16_MATRIX_FLAGS)} in its flags), so bfloat16 would be emulated",
        )
    if not bf16_measured_faster:
        how = "was not measured" if bf16_measured_faster is None else "measured slower"
        return DtypeChoice(
            "float32",
            f"float32: this CPU has {', '.join(present)}, but a bfloat16 step {how} than "
            "float32 here",
        )
    return DtypeChoice(
        "bfloat16",
        f"bfloat16: this CPU has {', '.join(present)} and a bfloat16 step (float32 "
        "accumulation) measured faster than float32",
    )


@functools.lru_cache(maxsize=8)
def measure_dot(rows: int, d_in: int, d_out: int) -> tuple[float, float]:
    """Seconds of a jitted `(rows, d_in) @ (d_in, d_out)` dot on the default device: float32,
    and bfloat16 operands accumulated in float32 (`preferred_element_type`, the library's
    mixed-precision policy); the best of `MEASURE_REPEATS` calls each, after a warm-up.
    Cached per process and shape."""
    import jax
    import jax.numpy as jnp

    key_a, key_b = jax.random.split(jax.random.key(0))
    a = jax.random.normal(key_a, (rows, d_in), jnp.float32)
    b = jax.random.normal(key_b, (d_in, d_out), jnp.float32)

    def best(fn, *args) -> float:
        fn(*args).block_until_ready()
        times = []
        for _ in range(MEASURE_REPEATS):
            start = time.perf_counter()
            fn(*args).block_until_ready()
            times.append(time.perf_counter() - start)
        return min(times)

    f32 = jax.jit(lambda x, y: jnp.dot(x, y))
    bf16 = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32))
    return best(f32, a, b), best(bf16, a.astype(jnp.bfloat16), b.astype(jnp.bfloat16))


def resolve_dtype(
    requested: str,
    *,
    backend: str,
    shape: tuple[int, int, int],
    flags: Iterable[str] | None = None,
    measure: Callable[[int, int, int], tuple[float, float]] | None = None,
) -> DtypeChoice:
    """The compute dtype a run computes in, for `--config.model.dtype=requested`.

    Args:
        requested: the config's dtype: 'auto' asks for the choice; any other value is the
            user's and wins.
        backend: `jax.default_backend()` ('cpu', 'gpu', 'tpu').
        shape: (rows, d_in, d_out) of the dot to measure on a CPU with bfloat16 matrix
            instructions (the model's feed-forward at the batch's rows).
        flags: the CPU's flags (default: `cpu_flags()`).
        measure: times (float32 s, bfloat16 s) of that dot (default `measure_dot`; a
            stand-in in tests).

    Returns:
        The choice and its reason, to log.
    """
    if requested != AUTO:
        return DtypeChoice(str(requested), f"{requested}: set by --config.model.dtype")
    if backend in MATRIX_UNIT_BACKENDS:
        return DtypeChoice(
            "bfloat16",
            f"bfloat16 (auto): the {backend}'s matrix units take bfloat16 and accumulate in "
            "float32",
        )
    flags = cpu_flags() if flags is None else frozenset(flags)
    if not set(BF16_MATRIX_FLAGS) & set(flags):
        return choose_compute_dtype(flags)
    f32_s, bf16_s = (measure or measure_dot)(*shape)
    choice = choose_compute_dtype(flags, bf16_measured_faster=bf16_s < f32_s)
    timing = (
        f" (a {shape[0]}x{shape[1]} @ {shape[1]}x{shape[2]} dot: float32 {f32_s * 1e3:.2f} ms, "
        f"bfloat16 with float32 accumulation {bf16_s * 1e3:.2f} ms)"
    )
    return DtypeChoice(choice.dtype, choice.reason + timing)


__all__ = [
    "AUTO",
    "BF16_MATRIX_FLAGS",
    "DtypeChoice",
    "choose_compute_dtype",
    "cpu_flags",
    "measure_dot",
    "resolve_dtype",
]
