"""Muon's partition of the models' parameters: which leaves are matrices that Muon should
orthogonalise, and along which axes (`optax.contrib.muon`).

Why the partition is needed: `optax.contrib.muon` given no `muon_weight_dimension_numbers`
orthogonalises every 2-D leaf and sends every other leaf to its Adam. On these models that
is wrong both ways: the token embedding `(V, D)`, a learned position table and an untied
head are 2-D and would go to Muon (a table of rows looked up one at a time is no linear map
to orthogonalise; the speedrun keeps them on Adam), while the fused Q/K/V kernel
`(D, 3, N, H)`, the attention output `(N, H, D)` and every kernel of a scanned stack
`(L, ...)` are not 2-D and would go to Adam. `muon_dimension_numbers` names, for each hidden
matrix of the layers (attention and feed-forward kernels, and the LoRA adapters A `(*in, r)`
and B `(r, *out)` beside them), its reduction and output axes as stored; every other axis
is a batch axis, so each part of a fused kernel and each layer of a scanned stack is its own
matrix. `muon_partition` gives the matching labels for `optax.multi_transform`.
"""

from __future__ import annotations

from typing import Any

import jax
from optax.contrib import MuonDimensionNumbers

# Labels of `muon_partition`: Muon's matrices, and the rest (AdamW in the speedrun's split).
MUON = "muon"
OTHER = "adamw"

# The kernels of the layers' attention and feed-forward, by parameter name, with their
# (reduction, output) axes as stored in one layer (`layers_i`); under `nn.scan` (`layers`)
# a leading layer axis comes first. The heads of a projection stay one matrix, as the
# speedrun's.
_KERNELS = {
    "qkv_kernel": ((0,), (2, 3)),  # (D, 3, N, H): part axis 1 is a batch axis
    "kv_kernel": ((0,), (2, 3)),  # (De, 2, K, H)
    "query_kernel": ((0,), (1, 2)),  # (D, N, H)
    "out_kernel": ((0, 1), (2,)),  # (N, H, D)
    "wi_kernel": ((0,), (1,)),  # (D, F)
    "wg_kernel": ((0,), (1,)),  # (D, F)
    "wo_kernel": ((0,), (1,)),  # (F, D)
}


def _names(path) -> tuple[str, ...]:
    """The dict keys of a tree path: the same for boxed parameters (`nn.Partitioned`, whose
    `.value` adds an attribute key) and unboxed ones, so the labels of init and update agree."""
    return tuple(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey))


def _axes(path, leaf) -> MuonDimensionNumbers | None:
    names = _names(path)
    scanned = "layers" in names
    if not names or not (scanned or any(n.startswith("layers_") for n in names)):
        return None
    ndim, first = len(getattr(leaf, "shape", ())), int(scanned)
    if names[-1] == "lora_a":  # (*in, r)
        return MuonDimensionNumbers(tuple(range(first, ndim - 1)), (ndim - 1,))
    if names[-1] == "lora_b":  # (r, *out)
        return MuonDimensionNumbers((first,), tuple(range(first + 1, ndim)))
    if names[-1] not in _KERNELS:
        return None
    reduction, output = _KERNELS[names[-1]]
    shift = ndim - (max(*reduction, *output) + 1)  # 1 under nn.scan, else 0
    return MuonDimensionNumbers(
        tuple(a + shift for a in reduction), tuple(a + shift for a in output)
    )


def muon_dimension_numbers(params: Any) -> Any:
    """The tree `optax.contrib.muon` takes as `muon_weight_dimension_numbers`.

    Args:
      params: a `Transformer` or `DecoderOnlyTransformer` parameter tree (boxed or plain,
        scanned or not, with or without LoRA adapters), or a part of it.

    Returns:
      The same structure: each hidden matrix's `MuonDimensionNumbers(reduction_axis,
      output_axis)` as stored (a scanned stack's layer axis and a fused kernel's part axis
      are batch axes), None on every other leaf (embeddings, positions, norms, biases,
      QK-norm scales, an untied head).
    """
    return jax.tree_util.tree_map_with_path(_axes, params)


def muon_partition(params: Any) -> Any:
    """The labels of the speedrun's split: `'muon'` on the leaves `muon_dimension_numbers`
    gives axes, `'adamw'` on the rest; for `optax.multi_transform`.

    Args:
      params: as `muon_dimension_numbers`.

    Returns:
      A tree of strings with the structure of `params`.
    """
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: OTHER if _axes(path, leaf) is None else MUON, params
    )
