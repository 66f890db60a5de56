"""The compute dtype chosen per CPU host (`train.core.compute_dtype`), with made-up flag
sets: float32 without bfloat16 matrix instructions (this project's AMD EPYC), bfloat16 only
with them and a measurement that says faster, and the user's dtype always."""

from __future__ import annotations

import jax.numpy as jnp
import pytest

from train.core import compute_dtype
from train.core.compute_dtype import choose_compute_dtype, cpu_flags

EPYC = {"fpu", "sse4_2", "avx", "avx2", "fma", "f16c"}  # no AVX-512, no AMX
XEON_AMX = EPYC | {"avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"}


def test_no_bf16_matrix_instructions_gives_float32_even_if_measured_faster():
    choice = choose_compute_dtype(EPYC, bf16_measured_faster=True)
    assert choice.dtype == "float32"
    assert "no bfloat16 matrix instructions" in choice.reason


@pytest.mark.parametrize("flags", [XEON_AMX, EPYC | {"avx512_bf16"}, EPYC | {"amx_bf16"}])
def test_bf16_matrix_instructions_and_faster_gives_bfloat16(flags):
    choice = choose_compute_dtype(flags, bf16_measured_faster=True)
    assert choice.dtype == "bfloat16" and "measured faster" in choice.reason


@pytest.mark.parametrize("measured, words", [(None, "was not measured"), (False, "slower")])
def test_bf16_instructions_without_a_faster_measurement_give_float32(measured, words):
    choice = choose_compute_dtype(XEON_AMX, bf16_measured_faster=measured)
    assert choice.dtype == "float32" and words in choice.reason
    assert "amx_bf16" in choice.reason


@pytest.mark.parametrize("flags", [EPYC, XEON_AMX])
def test_the_users_dtype_wins(flags):
    choice = choose_compute_dtype(flags, user_dtype="bfloat16", bf16_measured_faster=False)
    assert choice.dtype == "bfloat16" and "--config.model.dtype" in choice.reason


def test_cpu_flags_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 amx_bf16\n\nprocessor\t: 1\n")
    assert cpu_flags(str(info)) == {"fpu", "avx2", "amx_bf16"}
    assert cpu_flags(str(tmp_path / "missing")) == frozenset()


def test_this_machine_without_bf16_units_gets_float32():
    flags = cpu_flags()
    if {"amx_bf16", "avx512_bf16"} & flags:
        pytest.skip("this CPU has bfloat16 matrix instructions")
    assert choose_compute_dtype(flags, bf16_measured_faster=True).dtype == "float32"


# --config.model.dtype='auto'.


def _no_measure(*shape):
    raise AssertionError(f"measured {shape}: nothing should be timed here")


def test_auto_on_accelerators_is_bfloat16_unmeasured():
    for backend in ("gpu", "tpu"):
        choice = compute_dtype.resolve_dtype(
            "auto", backend=backend, shape=(8, 4, 4), measure=_no_measure
        )
        assert choice.dtype == "bfloat16" and backend in choice.reason


def test_auto_on_a_cpu_without_bf16_units_is_float32_unmeasured():
    choice = compute_dtype.resolve_dtype(
        "auto", backend="cpu", shape=(8, 4, 4), flags={"avx2", "fma"}, measure=_no_measure
    )
    assert choice.dtype == "float32" and "no bfloat16 matrix instructions" in choice.reason


@pytest.mark.parametrize("f32_s, bf16_s, dtype", [(3.0, 1.0, "bfloat16"), (1.0, 3.0, "float32")])
def test_auto_on_a_cpu_with_bf16_units_follows_the_measurement(f32_s, bf16_s, dtype):
    asked = []

    def measure(*shape):
        asked.append(shape)
        return f32_s, bf16_s

    choice = compute_dtype.resolve_dtype(
        "auto", backend="cpu", shape=(16, 32, 64), flags={"amx_bf16"}, measure=measure
    )
    assert asked == [(16, 32, 64)] and choice.dtype == dtype
    assert "float32 3000.00 ms" in choice.reason or "float32 1000.00 ms" in choice.reason


def test_a_dtype_the_user_set_is_kept_unmeasured():
    choice = compute_dtype.resolve_dtype(
        "bfloat16", backend="cpu", shape=(8, 4, 4), flags=set(), measure=_no_measure
    )
    assert choice.dtype == "bfloat16" and "set by --config.model.dtype" in choice.reason


def test_measure_dot_times_both_dots():
    f32_s, bf16_s = compute_dtype.measure_dot(64, 32, 48)
    assert 0 < f32_s < 10 and 0 < bf16_s < 10


def test_auto_in_a_config_builds_the_hosts_dtype(monkeypatch):
    """validate_config turns 'auto' into the host's choice (here a made-up CPU with bf16
    units whose measurement favours bfloat16); the config itself keeps 'auto'."""
    from configs import default
    from train.config import config_lib, dtype_choice

    dtype_choice._choice.cache_clear()
    monkeypatch.setattr(compute_dtype, "cpu_flags", lambda path=None: frozenset({"amx_bf16"}))
    monkeypatch.setattr(compute_dtype, "measure_dot", lambda *shape: (2.0, 1.0))
    config = default.get_config()
    config.model.dtype = "auto"
    experiment = config_lib.validate_config(config)
    assert experiment.model.dtype == jnp.bfloat16
    assert config.model.dtype == "auto"
    dtype_choice._choice.cache_clear()
    monkeypatch.setattr(compute_dtype, "cpu_flags", lambda path=None: frozenset({"avx2"}))
    assert config_lib.validate_config(config).model.dtype == jnp.float32
    dtype_choice._choice.cache_clear()
