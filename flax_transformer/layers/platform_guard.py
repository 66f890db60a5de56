"""`refuse_on_cpu(x, message)`: `x` unchanged, unless the program is compiled for a CPU.

Which platform a program is compiled for is decided when jax lowers it, after tracing: a
function traced on a CPU host may be compiled for a TPU (`python -m train.compile`), so
`jax.default_backend()` at trace time cannot tell. This identity has a lowering rule for
the CPU alone that raises `ValueError(message)`, so a kernel that cannot run there (a
Pallas TPU kernel outside interpret mode) is refused with the library's words before the
kernel's own lowering refuses it with Pallas's; on every other platform it lowers to
nothing. Eagerly it runs as a one-operation program on its input's device, so the same
rule applies there.
"""

from __future__ import annotations

import functools

import jax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

_refuse_p = Primitive("flax_transformer_refuse_on_cpu")


def _refuse_lowering(ctx, x, *, message: str):
    raise ValueError(message)


def _identity_lowering(ctx, x, *, message: str):
    return [x]


def _eager(x, *, message: str):
    return jax.jit(functools.partial(_refuse_p.bind, message=message))(x)


_refuse_p.def_impl(_eager)
_refuse_p.def_abstract_eval(lambda x, *, message: x)
mlir.register_lowering(_refuse_p, _identity_lowering)
mlir.register_lowering(_refuse_p, _refuse_lowering, platform="cpu")
# Differentiation and batching pass through: tangents and batch axes are unchanged.
ad.primitive_jvps[_refuse_p] = lambda primals, tangents, *, message: (
    _refuse_p.bind(*primals, message=message),
    tangents[0],
)
batching.primitive_batchers[_refuse_p] = lambda args, dims, *, message: (
    _refuse_p.bind(*args, message=message),
    dims[0],
)


def refuse_on_cpu(x: jax.Array, message: str) -> jax.Array:
    """`x`, in a program that raises `ValueError(message)` when lowered for a CPU."""
    return _refuse_p.bind(x, message=message)
