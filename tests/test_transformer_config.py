"""TransformerConfig validation."""

import jax.numpy as jnp
import pytest

from flax_transformer import TransformerConfig


def test_defaults_and_derived_fields():
    cfg = TransformerConfig(d_model=512, num_heads=8, num_layers=6, num_decoder_layers=2)
    assert cfg.head_dim == 64
    assert (cfg.encoder_layers, cfg.decoder_layers) == (6, 2)
    assert cfg.dtype == jnp.float32 and cfg.param_dtype == jnp.float32
    assert TransformerConfig(dtype="bfloat16").dtype == jnp.bfloat16
    assert TransformerConfig(dtype=jnp.bfloat16).dtype == jnp.bfloat16
    assert hash(cfg) == hash(
        TransformerConfig(d_model=512, num_heads=8, num_layers=6, num_decoder_layers=2)
    )


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"d_model": 10, "num_heads": 4}, r"num_heads=4 does not divide d_model=10"),
        ({"d_model": 0}, r"d_model=0 must be a positive integer"),
        ({"num_layers": -1}, r"num_layers=-1 must be a positive integer"),
        ({"vocab_size": 2.5}, r"vocab_size=2.5 must be a positive integer"),
        ({"max_len": True}, r"max_len=True must be a positive integer"),
        ({"dropout_rate": 1.0}, r"dropout_rate=1.0 must be in \[0, 1\)"),
        ({"norm_position": "middle"}, r"norm_position='middle' is not one of \('pre', 'post'\)"),
        ({"positional": "alibi"}, r"positional='alibi' is not one of"),
        ({"num_kv_heads": 3}, r"num_kv_heads=3 does not divide num_heads=4"),
        ({"num_kv_heads": 0}, r"num_kv_heads=0 must be a positive integer"),
        ({"rope_base": 0.0}, r"rope_base=0.0 must be a finite number > 0"),
        ({"rope_base": float("nan")}, r"rope_base=nan must be a finite number > 0"),
        ({"positional": "rope", "d_model": 12}, r"head width .* = 3 must be even"),
        ({"positional": "rope", "d_model": 6, "num_heads": 3, "d_ff": 4}, None),
        ({"activation": "tanh"}, r"activation='tanh' is not one of"),
        ({"dtype": "float8"}, r"dtype='float8' is not a known dtype"),
        ({"param_dtype": jnp.int32}, r"param_dtype=.* not a floating dtype"),
        ({"pad_id": 9000}, r"pad_id=9000 must be a token id in \[0, vocab_size=8000\)"),
        ({"d_model": 6, "num_heads": 3, "positional": "sinusoidal", "d_ff": 4}, None),
        ({"target_vocab_size": 10}, r"share_embeddings=True needs one vocabulary"),
        ({"layer_norm_eps": 0.0}, r"layer_norm_eps=0.0 must be > 0"),
    ],
)
def test_bad_values_name_field_value_and_constraint(changes, message):
    if message is None:
        TransformerConfig(**changes)  # a valid corner: even width, 3 heads
        return
    with pytest.raises(ValueError, match=message):
        TransformerConfig(**changes)


def test_odd_width_rejected_for_sinusoidal_only():
    with pytest.raises(ValueError, match="must be even for sinusoidal"):
        TransformerConfig(d_model=9, num_heads=3)
    TransformerConfig(d_model=9, num_heads=3, positional="learned")


def test_check_length():
    cfg = TransformerConfig(max_len=8)
    cfg.check_length(8)
    with pytest.raises(ValueError, match="source length 9 exceeds TransformerConfig.max_len=8"):
        cfg.check_length(9, "source")
