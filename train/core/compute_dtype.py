"""The compute dtype a CPU host should train in, and why: `choose_compute_dtype`.

bfloat16 pays on a CPU only where it has bfloat16 matrix instructions: XLA then runs a
bfloat16 dot that accumulates in float32 on them (issue 58, a Xeon with `amx_bf16` and
`avx512_bf16`: 566 GFLOP/s against 158 in float32). Elsewhere (this project's AMD EPYC:
AVX2/FMA/F16C, no AVX-512, no AMX) a bfloat16 dot is emulated, slower than float32, so the
choice is float32. Even with the instructions the choice is bfloat16 only when it was
measured faster on the step; a dtype the user set (`--config.model.dtype`) always wins.

Nothing here runs on import, and the library (`flax_transformer`) never chooses: the
program asks, once per run, and logs the answer with its reason.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

# /proc/cpuinfo flags that mean bfloat16 matrix instructions (Intel AMX, AVX512-BF16).
BF16_MATRIX_FLAGS = ("amx_bf16", "avx512_bf16")
CPUINFO = "/proc/cpuinfo"


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


__all__ = ["BF16_MATRIX_FLAGS", "DtypeChoice", "choose_compute_dtype", "cpu_flags"]
