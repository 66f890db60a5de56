"""Shared test fixtures: small configs that build and run fast on a CPU."""

import importlib.util
import os

# The tests run on the CPU. Where libtpu is installed (requirements-tpu.txt, for
# train.compile) and no TPU is attached, jax would still start its TPU plugin in every
# process the tests start, and libtpu prints five lines of warnings each time; set before
# jax is imported, here and in the tests' subprocesses.
if importlib.util.find_spec("libtpu") is not None:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

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
