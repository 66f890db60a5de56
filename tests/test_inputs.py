"""The one token-id range check (`flax_transformer.checks.tokens.check_token_range`), shared by the
models, generation and the training program's data."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_transformer import DecoderOnlyTransformer, TransformerConfig, generate_text
from flax_transformer.checks.tokens import check_token_range


def test_accepts_valid_and_empty_ids():
    check_token_range(np.array([[0, 5], [9, 1]]), 10, "batch")
    check_token_range([], 10, "empty")


@pytest.mark.parametrize(
    ("ids", "bad", "where"), [([[0, 3], [10, 2]], 10, r"\(1, 0\)"), ([4, -1], -1, r"\(1,\)")]
)
def test_names_the_id_its_position_and_the_vocabulary(ids, bad, where):
    with pytest.raises(
        ValueError, match=rf"src holds token id {bad} at {where}, outside the vocabulary \[0, 10\)"
    ):
        check_token_range(ids, 10, "src")


def test_rejects_float_ids():
    with pytest.raises(ValueError, match=r"src: token ids must be integers, got dtype float"):
        check_token_range([1.0, 2.0], 10, "src")


def test_models_and_generation_give_the_same_message():
    cfg = TransformerConfig(vocab_size=10, d_model=8, num_heads=2, d_ff=16, num_layers=1, max_len=8)
    model = DecoderOnlyTransformer(cfg)
    params = model.init(jax.random.key(0), jnp.ones((1, 3), jnp.int32))
    tokens = jnp.array([[1, 12, 3]])
    message = r"holds token id 12 at \(0, 1\), outside the vocabulary \[0, 10\)"
    with pytest.raises(ValueError, match="tokens " + message):
        model.apply(params, tokens)
    with pytest.raises(ValueError, match="generate_text: prompt_tokens " + message):
        generate_text(model, params, tokens, eos_id=None, max_new_tokens=2)
