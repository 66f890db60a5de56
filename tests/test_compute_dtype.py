"""The compute dtype chosen per CPU host (`train.core.compute_dtype`), with made-up flag
sets: float32 without bfloat16 matrix instructions (this project's AMD EPYC), bfloat16 only
with them and a measurement that says faster, and the user's dtype always."""

from __future__ import annotations

import pytest

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
