"""Memory of the DPO step, the replies' log-probabilities from whole logits against through
the head in blocks, from XLA.

    python -m benchmarks.dpo_loss_memory [--pairs 8] [--length 160] [--vocab 49152]
        [--width 576] [--block-rows 512] [--dtypes float32,bfloat16] [--model [--remat]]

At configs/dpo_smollm2.py's step (8 pairs, so 2B = 16 rows of T = 160 positions, N = 2,560
rows; D = 576; V = 49,152 ids plus the added pad id, left out of the softmax), the value and
gradient of the mean DPO (sigmoid) loss with a precomputed reference is compiled two ways:
whole (the `(2B, T, V + 1)` logits, then `train.tasks.dpo.objective.sequence_logps`, the
DPO task before this change) and blocked (`functional.blocked_label_logps`, about
`block_rows` rows a scan step, as `train.tasks.dpo.logps.pair_logps` computes them). By
default over the hidden states and the head (the part that differs); with `--model` the whole
step of a SmolLM2-135M-shaped model (30 layers, 9 heads, 3 key/value heads, d_ff 1,536),
through `DpoTask.loss` over all parameters, float32 only (`--remat`: each layer
rematerialised, `config.model.remat`). The compiled program's `memory_analysis()` gives its
temporary bytes (buffers besides arguments and outputs). Nothing runs.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
from flax import linen as nn

from benchmarks.common import machine_line
from flax_transformer import DecoderOnlyTransformer, TransformerConfig
from flax_transformer.functional import blocked_label_logps
from flax_transformer.functional.precision import mixed_einsum
from train.tasks.common.objective import LossSetup
from train.tasks.dpo.objective import PreferenceLoss, preference_objective, sequence_logps
from train.tasks.dpo.reference import REFERENCE_KEY
from train.tasks.dpo.task import DpoTask

OBJECTIVE = PreferenceLoss("sigmoid", beta=0.1)
# SmolLM2-135M's shape (its config.json): layers, heads, key/value heads, feed-forward width.
SMOLLM2_LAYERS, SMOLLM2_HEADS, SMOLLM2_KV_HEADS, SMOLLM2_FF = 30, 9, 3, 1536


def _dpo_loss(both, pairs, reference_B2):
    chosen = tuple(x[:pairs] for x in both)
    rejected = tuple(x[pairs:] for x in both)
    reference = (reference_B2[:, 0], reference_B2[:, 1])
    return preference_objective(OBJECTIVE, chosen, rejected, reference)[0]


def _head_loss(blocked: bool, block_rows: int, pad_id: int, dtype):
    """The DPO loss of hidden states `(2B, T, D)` and a head `(D, V + 1)`."""

    def loss(hidden_BTD, head_DV, labels_BT, reference_B2):
        if blocked:
            sums = blocked_label_logps(
                hidden_BTD,
                head_DV,
                labels_BT,
                (labels_BT != pad_id).astype(jnp.float32),
                block_rows=block_rows,
                num_scored_ids=pad_id,
                dtype=dtype,
            )
            both = (sums["logps"], sums["tokens"], sums["mean_logits"])
        else:
            logits_BTV = mixed_einsum("btd,dv->btv", hidden_BTD, head_DV, dtype=dtype)
            both = sequence_logps(logits_BTV, labels_BT, pad_id, drop_pad_logit=True)
        return _dpo_loss(both, reference_B2.shape[0], reference_B2)

    return loss


def head_temp_bytes(args, blocked: bool, dtype) -> int:
    rows, vocab = 2 * args.pairs, args.vocab + 1
    loss = _head_loss(blocked, args.block_rows, args.vocab, dtype)
    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    program = step.lower(
        jax.ShapeDtypeStruct((rows, args.length, args.width), dtype),
        jax.ShapeDtypeStruct((args.width, vocab), jnp.float32),
        jax.ShapeDtypeStruct((rows, args.length), jnp.int32),
        jax.ShapeDtypeStruct((args.pairs, 2), jnp.float32),
    ).compile()
    return program.memory_analysis().temp_size_in_bytes


class _WholeLogitsDpoTask(DpoTask):
    """The DPO task as it was: the model's whole logits, then `sequence_logps`."""

    def _logps(self, model, params, batch, setup, *, deterministic, rngs=None):
        rows = batch["chosen"].shape[0]
        inputs = jnp.concatenate([batch["chosen"], batch["rejected"]])
        labels = jnp.concatenate([batch["chosen_labels"], batch["rejected_labels"]])
        logits = model.apply({"params": params}, inputs, deterministic=deterministic, rngs=rngs)
        both = sequence_logps(logits, labels, setup.pad_id, drop_pad_logit=setup.drop_pad_logit)
        return tuple(x[:rows] for x in both), tuple(x[rows:] for x in both)


def model_temp_bytes(args, blocked: bool) -> int:
    config = TransformerConfig(
        vocab_size=args.vocab + 1,
        pad_id=args.vocab,
        d_model=args.width,
        num_heads=SMOLLM2_HEADS,
        num_kv_heads=SMOLLM2_KV_HEADS,
        d_ff=SMOLLM2_FF,
        num_layers=SMOLLM2_LAYERS,
        max_len=args.length,
        dropout_rate=0.0,
        norm="rmsnorm",
        positional="rope",
        activation="swiglu",
        use_bias=False,
        scan_layers=True,
        remat=args.remat,
    )
    model = DecoderOnlyTransformer(config)
    tokens = jax.ShapeDtypeStruct((args.pairs, args.length), jnp.int32)
    variables = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros(tokens.shape, int)))
    params = nn.unbox(variables)["params"]
    task = DpoTask(OBJECTIVE) if blocked else _WholeLogitsDpoTask(OBJECTIVE)
    setup = LossSetup(config.pad_id, drop_pad_logit=True, block_rows=args.block_rows)

    def loss(params, batch):
        return task.loss(model, params, batch, setup, deterministic=True)[0]

    batch = {
        "chosen": tokens,
        "rejected": tokens,
        "chosen_labels": tokens,
        "rejected_labels": tokens,
        REFERENCE_KEY: jax.ShapeDtypeStruct((args.pairs, 2), jnp.float32),
    }
    program = jax.jit(jax.value_and_grad(loss)).lower(params, batch).compile()
    return program.memory_analysis().temp_size_in_bytes


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--length", type=int, default=160)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--width", type=int, default=576)
    parser.add_argument("--block-rows", type=int, default=512)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--model", action="store_true")
    parser.add_argument(
        "--remat", action="store_true", help="with --model: each layer rematerialised"
    )
    args = parser.parse_args(argv)
    rows = 2 * args.pairs * args.length
    logits_bytes = rows * (args.vocab + 1) * 4
    print(
        f"# {machine_line()}; 2B x T = {2 * args.pairs} x {args.length} = N={rows} rows, "
        f"D={args.width}, V={args.vocab}+1 (pad left out), DPO sigmoid loss; one (N, V) "
        f"float32 array = {logits_bytes / 2**20:.0f} MiB"
    )
    if args.model:
        part = "model+remat" if args.remat else "model"
        parts = [(part, "float32", lambda blocked: model_temp_bytes(args, blocked))]
    else:
        parts = [
            ("head", name, lambda blocked, n=name: head_temp_bytes(args, blocked, jnp.dtype(n)))
            for name in args.dtypes.split(",")
        ]
    for part, dtype_name, temp_bytes in parts:
        whole, blocked = temp_bytes(False), temp_bytes(True)
        print(
            f"{part:11s} {dtype_name:8s} whole temp {whole / 2**20:8.1f} MiB "
            f"({whole / logits_bytes:.2f}x one (N, V) float32 array), "
            f"blocked({args.block_rows}) {blocked / 2**20:8.1f} MiB ({blocked / logits_bytes:.2f}x)"
            f", blocked / whole {blocked / whole:.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
