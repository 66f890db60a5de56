"""Shared test fixtures: small configs that build and run fast on a CPU."""

import pytest

from flax_transformer import TransformerConfig


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
