#!/usr/bin/env bash
# One prepared run for an NVIDIA GPU machine: GPT-2-small training throughput in bf16 with
# the cuDNN attention kernel (jax.nn.dot_product_attention), tokens/s and model FLOPs
# utilisation, plus the same in float32 with our XLA attention for comparison.
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
peak=()
[ -n "${PEAK_TFLOPS:-}" ] && peak=(--peak-tflops "$PEAK_TFLOPS")
python -m benchmarks.train_throughput --sizes gpt2_small --dtype bfloat16 \
  --attention jax_nn --batch "${BATCH:-16}" --steps "${STEPS:-10}" "${peak[@]}"
python -m benchmarks.train_throughput --sizes gpt2_small --dtype bfloat16 \
  --attention xla --batch "${BATCH:-16}" --steps "${STEPS:-10}" "${peak[@]}"
