#!/usr/bin/env bash
# How long the README's test commands take here, from a cold compilation cache, with the
# machine's 2048x2048 float32 matmul rate (numpy) measured just before and just after.
#
#   bash benchmarks/test_time.sh quick        # python -m pytest -q -n 2 -m "not slow"
#   bash benchmarks/test_time.sh full         # python -m pytest -q -n 2 (what CI runs)
#   bash benchmarks/test_time.sh quick 0.75   # the same in a cgroup holding 75% of the CPUs
#
# The third form stands in for a slower machine: it needs root and a cgroup v1 `cpu` or a
# cgroup v2 hierarchy, and the matmul lines then show the rate the tests ran at. Run it with
# nothing else busy; the machine's own speed drifts, so compare runs made one after another.
# The cgroup (flax-transformer-test-time) is left in place for the next run; rmdir removes it.
set -euo pipefail
cd "$(dirname "$0")/.."
suite="${1:-quick}"
share="${2:-}"
case "$suite" in
  quick) args=(-q -n 2 -m "not slow") ;;
  full) args=(-q -n 2) ;;
  *) echo "error: the suite is 'quick' or 'full', not '$suite'" >&2; exit 2 ;;
esac

matmul='import time, numpy as np
a = np.random.rand(2048, 2048).astype(np.float32); a @ a
start = time.perf_counter()
for _ in range(10): a @ a
print(f"matmul: {2 * 2048**3 * 10 / (time.perf_counter() - start) / 1e9:.0f} GFLOP/s")'

if [ -n "$share" ]; then
  if ! python3 -c "import sys; sys.exit(not 0 < float('$share') <= 1)" 2>/dev/null; then
    echo "error: the CPU share is a number in (0, 1], e.g. 0.75, not '$share'" >&2
    exit 2
  fi
  period=100000
  quota=$(python3 -c "import os; print(int($share * os.cpu_count() * $period))")
  if [ -d /sys/fs/cgroup/cpu ] && [ -w /sys/fs/cgroup/cpu ]; then
    group=/sys/fs/cgroup/cpu/flax-transformer-test-time
    mkdir -p "$group"
    echo "$period" >"$group/cpu.cfs_period_us"
    echo "$quota" >"$group/cpu.cfs_quota_us"
  elif [ -f /sys/fs/cgroup/cgroup.controllers ] && [ -w /sys/fs/cgroup ]; then
    group=/sys/fs/cgroup/flax-transformer-test-time
    mkdir -p "$group"
    echo "$quota $period" >"$group/cpu.max"
  else
    echo "error: a CPU share needs root and a writable cgroup v1 'cpu' or v2 hierarchy" >&2
    exit 2
  fi
  echo $$ >"$group/cgroup.procs"  # this shell, and so everything it starts from here on
  echo "in a cgroup holding $share of $(nproc) CPUs"
fi

cache=$(mktemp -d)
trap 'rm -rf "$cache"' EXIT
python -c "$matmul"
start=$(date +%s)
status=0
JAX_COMPILATION_CACHE_DIR="$cache" python -m pytest "${args[@]}" -p no:cacheprovider | tail -1 \
  || status=$?
echo "$suite: $(($(date +%s) - start)) s"
python -c "$matmul"
exit "$status"
