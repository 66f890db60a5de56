"""Shared test fixtures: small configs that build and run fast on a CPU."""

import importlib.metadata
import importlib.util
import os
import tempfile

# The tests run on the CPU. Where libtpu is installed (requirements-tpu.txt, for
# train.compile) and no TPU is attached, jax would still start its TPU plugin in every
# process the tests start, and libtpu prints five lines of warnings each time; where jax's
# CUDA plugin is installed (requirements-gpu.txt, for train.compile's GPU topologies) and no
# NVIDIA driver is loaded, jax would start it and log a traceback ('Unable to load CUDA').
# Set before jax is imported, here and in the tests' subprocesses. (A machine with an
# NVIDIA driver keeps the GPU for the tests that need one.)
_NVIDIA_DRIVER = os.path.exists("/proc/driver/nvidia/version")
if importlib.util.find_spec("libtpu") is not None or (
    importlib.util.find_spec("jax_cuda12_plugin") is not None and not _NVIDIA_DRIVER
):
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

# Compile time, not compute, is where a test of a tiny model spends its time: an eager
# `model.init` alone compiles a couple of hundred small XLA programs (about 33 ms each on
# 2 cores). Three settings, made here for the tests and the processes they start (never for
# the library or train.main):
# - XLA's CPU backend without its expensive LLVM passes (level 0): such programs compile about
#   twice as fast, and no test's compute got measurably slower (the suite took 9 min, not
#   16.5, the same day on one machine; no test more than 1.1 s slower);
# - from jaxlib 0.10, XLA's CPU backend with its older fusion emitters, not the MLIR ones: a
#   small program compiles in about 60% of the time (2026-12-02, one machine: 300 eager ops
#   6.6 s against 11.2 s, the quick run 4 min 21 s against 6 min 22 s, the full suite 979
#   tests passing either way). Older jaxlibs do not know the flag, and XLA aborts on a flag
#   it does not know, so it is set by version;
# - jax's persistent compilation cache, shared by the test processes and kept between runs
#   (a second run skips most compiles). Its entries are keyed by the program, the jax
#   version and these flags, so a stale entry is never used; set JAX_COMPILATION_CACHE_DIR
#   to put it elsewhere, or to "" for none. It has no size limit: jax's limit would take a
#   file lock and list the whole directory on every write, which stalls the test workers;
#   delete the directory to reclaim it. An entry read while another worker still writes it
#   fails to decompress, and jax then warns and compiles instead.
_FAST_COMPILE_FLAGS = (
    "--xla_backend_optimization_level=0",
    "--xla_llvm_disable_expensive_passes=true",
)


def _jaxlib_at_least(major: int, minor: int) -> bool:
    try:
        release = importlib.metadata.version("jaxlib").split(".")[:2]
        return tuple(int(part) for part in release) >= (major, minor)
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return False


if _jaxlib_at_least(0, 10):
    _FAST_COMPILE_FLAGS += ("--xla_cpu_use_fusion_emitters=false",)
_flags = os.environ.get("XLA_FLAGS", "").split()
_named = {flag.split("=")[0] for flag in _flags}  # a flag the caller set is kept as set
os.environ["XLA_FLAGS"] = " ".join(
    _flags + [f for f in _FAST_COMPILE_FLAGS if f.split("=")[0] not in _named]
)
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR",
    os.path.join(tempfile.gettempdir(), f"flax-transformer-tests-jax-cache-{os.getuid()}"),
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")


def _write_cache_entries_whole() -> None:
    """jax writes a cache entry in place (`LRUCache.put`: `path.write_bytes`), so another test
    worker compiling the same program can read it half-written. Twice a full run died in
    `compilation_cache.get_executable_and_time` (a segfault, each time in a Muon test that
    another worker's file compiles alike); the cause is not proven, but a whole-file write
    rules this one out: the entry is written beside its name and renamed into place, which
    a reader sees all at once or not at all. Only the unlimited cache the tests use (no
    eviction, no lock) is changed; anything unexpected falls back to jax's own write."""
    try:
        from jax._src import lru_cache
    except ImportError:  # another jax: its own writes
        return
    original = getattr(lru_cache.LRUCache, "put", None)
    suffix = getattr(lru_cache, "_CACHE_SUFFIX", None)
    if original is None or suffix is None:
        return

    def put(self, key, value):
        if not key or getattr(self, "eviction_enabled", True):
            return original(self, key, value)
        path = os.path.join(os.fspath(self.path), f"{key}{suffix}")
        if os.path.exists(path):
            return None
        partial = f"{path}.{os.getpid()}.partial"
        try:
            with open(partial, "wb") as f:
                f.write(value)
            os.replace(partial, path)
        except OSError:
            return original(self, key, value)
        return None

    lru_cache.LRUCache.put = put


_write_cache_entries_whole()

import pytest  # noqa: E402

from flax_transformer import TransformerConfig  # noqa: E402


@pytest.fixture
def tiny_config() -> TransformerConfig:
    return TransformerConfig(
        vocab_size=37,
        d_model=16,
        num_heads=4,
        d_ff=32,
        num_layers=2,
        max_len=24,
        dropout_rate=0.0,
    )


# Module fixtures that train or compile for many seconds. With `-n 2` pytest-xdist hands out
# tests one by one, so both workers would build each of them; `--dist loadgroup` (set in
# pyproject.toml) keeps the tests of one such fixture on one worker, and the other worker
# runs other tests meanwhile. Grouping needs pytest < 9.2 (requirements.txt): pytest 9.2's node
# ids ignore the group suffix xdist 3.8 writes (pytest-dev/pytest-xdist#1386), and the tests
# then run ungrouped, as before.
_EXPENSIVE_MODULE_FIXTURES = (
    "finished_run",  # test_train_robustness.py
    "runs",  # test_precision.py
    "sharded_results",  # test_sharding.py, 80 s
    "tiny",  # test_bad_inputs.py
    "tiny_v5e",  # test_compile.py
    "trained_run",  # test_train.py
)


@pytest.hookimpl(tryfirst=True)  # before xdist's hook reads the marks
def pytest_collection_modifyitems(config, items):
    for item in items:
        for name in _EXPENSIVE_MODULE_FIXTURES:
            if name in item.fixturenames:
                item.add_marker(pytest.mark.xdist_group(f"{item.path.stem}.{name}"))
    # The files with a slow test first, each file whole and in its own order (so a module
    # fixture is built once): xdist hands tests out in this order, so the minutes-long ones
    # start while both workers are busy, and the run ends on short tests rather than on one
    # worker finishing a SmolLM2 test while the other waits.
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)
