#!/usr/bin/env bash
# One prepared run for an NVIDIA GPU machine: GPT-2-small training throughput in bf16 with
# cuDNN flash attention and with our XLA attention (tokens/s, model FLOPs utilisation), then
# train.compile's prediction for the same model on this GPU, compiled without it (as on a
# CPU host), printed beside what was measured: the first GPU lent tests the predictions.
#
#   bash benchmarks/gpu.sh            # needs a CUDA build of jax (pip install "jax[cuda12]")
#
# Peak for MFU: by default a large bf16 matmul measured in the same process; pass
# PEAK_TFLOPS=989 (H100/H200 dense bf16 spec sheet) to divide by the datasheet figure.
set -euo pipefail
cd "$(dirname "$0")/.."
python - <<'PY'
import jax
platform = jax.devices()[0].platform
if platform != "gpu":
    raise SystemExit(f"benchmarks/gpu.sh needs a GPU; jax sees {jax.devices()}")
print("devices:", jax.devices())
PY
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
out=$(mktemp -d)
peak=()
[ -n "${PEAK_TFLOPS:-}" ] && peak=(--peak-tflops "$PEAK_TFLOPS")
for attention in cudnn xla; do
  python -m benchmarks.train_throughput --sizes gpt2_small --dtype bfloat16 \
    --attention "$attention" --batch "${BATCH:-16}" --steps "${STEPS:-10}" "${peak[@]}" \
    --json "$out/measured_$attention.json"
done

# train.compile's report for this GPU (nvidia-smi's name -> h100 / h200 / a100), for the
# GPT-2-small model of the runs above (benchmarks/common.py: gpt2_small) as a config.
name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 || true)
case "$name" in
  *H100*) kind=h100 ;;
  *H200*) kind=h200 ;;
  *A100*) kind=a100 ;;
  *) echo "train.compile has no target config for '$name' (h100, h200, a100): no prediction"
     exit 0 ;;
esac
gpt2=(--config=configs/lm_kjv.py --config.vocab_size=50257 --config.model.d_model=768
  --config.model.num_heads=12 --config.model.d_ff=3072 --config.model.num_layers=12
  --config.max_len=1024 --config.batch_size="${BATCH:-16}" --config.model.dtype=bfloat16
  --config.model.dropout_rate=0.1)
for attention in cudnn xla; do
  JAX_PLATFORMS=cpu python -m train.compile --topology="$kind:1x1" "${gpt2[@]}" \
    --config.model.attention_impl="$attention" --json "$out/predicted_$attention.json" \
    > "$out/predicted_$attention.txt" || true
done
python - "$out" "$kind" <<'PY'
import json, pathlib, sys

out, kind = pathlib.Path(sys.argv[1]), sys.argv[2]
print(f"\n# predicted by train.compile --topology={kind}:1x1 (deviceless) against measured")
print("# (the steps differ a little: train.main's AdamW with clipping, the benchmark's Adam)")
print(f"{'attention':<10} {'predicted GiB':>14} {'measured peak GiB':>18} "
      f"{'bound ms':>9} {'measured ms':>12} {'bound/measured':>15}")
for attention in ("cudnn", "xla"):
    try:
        predicted = json.loads((out / f"predicted_{attention}.json").read_text())
        (measured,) = json.loads((out / f"measured_{attention}.json").read_text())
    except (OSError, ValueError) as err:
        print(f"{attention:<10} missing: {err}")
        continue
    need = predicted["bytes_per_chip"]["total"] / 2**30 if predicted["bytes_per_chip"] else 0
    peak = (measured["peak_bytes_in_use"] or 0) / 2**30
    bound = 1e3 * (predicted["step_time_lower_bound_s"] or 0)
    print(f"{attention:<10} {need:14.2f} {peak:18.2f} {bound:9.2f} "
          f"{measured['step_ms']:12.2f} {bound / measured['step_ms']:15.2f}")
PY
