"""Decoding strategies as values: `Greedy()`, `Sample(...)`, `Beam(...)`.

Each checks its own fields, is hashable and compares by value, and is a pytree whose
structure (class, top_k, whether top_p filters, beam size) is static under `jit` while its
real-valued fields are traced. The older generation keywords map onto them through
`strategy_from_keywords`, with their old error messages. Nothing here compiles a decoding
loop: the generation errors below are raised before any compute (the params are shapes
only); tests/test_decoding.py decodes with the strategies.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

import flax_transformer
from flax_transformer import (
    Beam,
    DecoderOnlyTransformer,
    Greedy,
    Sample,
    Transformer,
    TransformerConfig,
    decoding,
    generate_text,
    generate_translation,
)
from flax_transformer.decoding.strategies import strategy_from_keywords

V = 23
CONFIG = TransformerConfig(vocab_size=V, d_model=16, num_heads=2, d_ff=32, num_layers=1, max_len=32)
PROMPT = jnp.array([[3, 4, 5], [6, 7, 0]])
LENGTHS = jnp.array([3, 2])


def test_exported_from_the_package_and_from_decoding():
    for name in ("Greedy", "Sample", "Beam"):
        assert getattr(flax_transformer, name) is getattr(decoding, name)
        assert name in flax_transformer.__all__ and name in decoding.__all__


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: Sample(0.0), r"Sample: temperature=0.0 must be > 0 \(temperature 0 is Greedy"),
        (lambda: Sample(-1.0), "Sample: temperature=-1.0 must be > 0"),
        (lambda: Sample(float("nan")), "Sample: temperature=nan must be a finite number > 0"),
        (lambda: Sample(float("inf")), "Sample: temperature=inf must be a finite number"),
        (lambda: Sample(True), "Sample: temperature=True must be a finite number"),
        (lambda: Sample("0.8"), "Sample: temperature='0.8' must be a finite number"),
        (lambda: Sample(1.0, -1), r"Sample: top_k=-1 must be an int >= 0 \(0: off\)"),
        (lambda: Sample(1.0, top_p=0.0), r"Sample: top_p=0.0 must be in \(0, 1\]"),
        (lambda: Sample(1.0, top_p=1.5), r"Sample: top_p=1.5 must be in \(0, 1\]"),
        (lambda: Sample(1.0, top_p=float("nan")), r"Sample: top_p=nan must be in \(0, 1\]"),
        (lambda: Beam(0), "Beam: size=0 must be an int >= 1"),
        (lambda: Beam(4, -0.1), r"Beam: length_penalty=-0.1 must be >= 0 \(0: none\)"),
        (lambda: Beam(4, float("inf")), "Beam: length_penalty=inf must be a finite number"),
        (lambda: Beam(4, float("nan")), "Beam: length_penalty=nan must be a finite number"),
    ],
)
def test_each_strategy_refuses_its_bad_fields(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: Sample(1.0, 2.5), r"Sample: top_k=2.5 must be an int >= 0 \(0: off\), got float"),
        (lambda: Sample(1.0, True), "Sample: top_k=True must be an int"),
        (lambda: Beam(2.0), "Beam: size=2.0 must be an int >= 1, got float"),
        (lambda: Beam(True), "Beam: size=True must be an int"),
    ],
)
def test_a_count_of_another_type_is_a_type_error(make, message):
    # As every int check of the library (`checks.arguments.check_int`): TypeError for the
    # type, ValueError for the range.
    with pytest.raises(TypeError, match=message):
        make()


def test_fields_are_normalised_and_limits_accepted():
    s = Sample(np.float32(0.5), np.int64(3), 1)
    assert (s.temperature, s.top_k, s.top_p) == (0.5, 3, 1.0)
    assert type(s.temperature) is float and type(s.top_k) is int and type(s.top_p) is float
    assert s == Sample(0.5, 3, 1.0) and s.nucleus is None
    assert Sample(1e-6, 0, 1e-9).nucleus == 1e-9
    b = Beam(np.int32(1), 0)
    assert (b.size, b.length_penalty) == (1, 0.0) and type(b.size) is int
    assert Sample() == Sample(1.0, 0, 1.0) and Beam(4) == Beam(4, 0.6)


def test_hashable_frozen_and_equal_by_value():
    table = {Greedy(): "g", Sample(0.8): "s", Sample(0.8, top_k=5): "k", Beam(4): "b"}
    assert table[Greedy()] == "g" and table[Sample(0.8)] == "s" and table[Beam(4, 0.6)] == "b"
    assert table[Sample(temperature=0.8, top_k=5)] == "k"
    assert Sample(0.8) != Sample(0.9) and Beam(4) != Beam(4, 1.0) and Greedy() != Sample()
    assert hash(Sample(0.8, 5, 0.9)) == hash(Sample(0.8, 5, 0.9))
    with pytest.raises(dataclasses.FrozenInstanceError):
        Sample(0.8).temperature = 2.0
    # As a static argument of jax.jit, equal values share one compiled function.
    traces = []

    def scale(x, strategy):
        traces.append(strategy)
        return x * strategy.temperature

    scaled = jax.jit(scale, static_argnums=1)
    np.testing.assert_allclose(scaled(jnp.ones(2), Sample(0.5)), [0.5, 0.5])
    scaled(jnp.ones(2), Sample(0.5))
    assert traces == [Sample(0.5)]


def test_pytree_structure_is_static_and_the_real_fields_are_leaves():
    assert jax.tree.leaves(Greedy()) == []
    assert jax.tree.leaves(Sample(0.8, top_k=5)) == [0.8]  # top_p off: no leaf
    assert jax.tree.leaves(Sample(0.8, top_k=5, top_p=0.9)) == [0.8, 0.9]
    assert jax.tree.leaves(Beam(4, 1.0)) == [1.0]
    structure = jax.tree.structure
    assert structure(Sample(0.8)) == structure(Sample(1.7))
    assert structure(Sample(0.8, top_p=0.9)) == structure(Sample(1.7, top_p=0.3))
    assert structure(Sample(0.8)) != structure(Sample(0.8, top_p=0.9))
    assert structure(Sample(0.8, top_k=5)) != structure(Sample(0.8, top_k=6))
    assert structure(Beam(4, 0.6)) == structure(Beam(4, 1.0)) != structure(Beam(3, 0.6))
    for s in (Greedy(), Sample(0.8, 5, 0.9), Sample(2.0), Beam(3, 0.0)):
        assert jax.tree.map(lambda x: x, s) == s
    # Unflattening does not validate: leaves may be tracers or jax's placeholders.
    assert jax.tree.map(lambda x: -x, Beam(2, 1.0)).length_penalty == -1.0


def test_under_jit_the_real_fields_are_traced_and_the_rest_static():
    traces = []

    @jax.jit
    def seen(strategy):
        traces.append(jax.tree.structure(strategy))
        if isinstance(strategy, Sample):
            assert isinstance(strategy.temperature, jax.core.Tracer)
            assert isinstance(strategy.top_k, int)  # static: shapes may depend on it
            if strategy.nucleus is None:  # top_p off: the Python float, known while tracing
                assert strategy.top_p == 1.0 and type(strategy.top_p) is float
                return strategy.temperature
            assert isinstance(strategy.top_p, jax.core.Tracer)
            return strategy.temperature * strategy.top_p
        return strategy.length_penalty + strategy.size

    assert float(seen(Sample(0.5))) == 0.5
    assert float(seen(Sample(2.0))) == 2.0  # a new temperature: no new trace
    assert len(traces) == 1
    np.testing.assert_allclose(float(seen(Sample(2.0, top_p=0.25))), 0.5)
    assert len(traces) == 2  # a filtering top_p is a new structure
    assert float(seen(Beam(3, 0.5))) == 3.5 and float(seen(Beam(3, 1.5))) == 4.5
    assert len(traces) == 3
    assert float(seen(Beam(4, 1.5))) == 5.5 and len(traces) == 4  # a new size: a new trace


@pytest.mark.parametrize(
    "keywords, expected",
    [
        ({}, Greedy()),
        (dict(beam_size=1, temperature=0.0, top_k=0, top_p=1.0), Greedy()),
        (dict(length_penalty=1.0), Greedy()),  # checked, then unused, as before
        (dict(temperature=0.8), Sample(0.8)),
        (dict(temperature=0.8, top_k=5, top_p=0.9), Sample(0.8, 5, 0.9)),
        (dict(temperature=1.0, top_k=1), Sample(1.0, 1)),
        (dict(beam_size=4), Beam(4, 0.6)),
        (dict(beam_size=2, length_penalty=0.0), Beam(2, 0.0)),
    ],
)
def test_the_older_keywords_map_onto_strategies(keywords, expected):
    assert strategy_from_keywords("generate_text", **keywords) == expected


@pytest.mark.parametrize(
    "keywords, message",
    [
        (dict(beam_size=0), "generate_text: beam_size=0 must be an int >= 1"),
        (dict(temperature=-1.0), r"generate_text: temperature=-1.0 must be >= 0 \(0: greedy\)"),
        (dict(temperature=float("inf")), "generate_text: temperature=inf must be a finite"),
        (dict(length_penalty=float("nan")), "generate_text: length_penalty=nan must be a"),
        (dict(top_k=-1), "generate_text: top_k=-1 must be an int"),
        (dict(top_p=1.5), r"generate_text: top_p=1.5 must be in \(0, 1\]"),
        (dict(beam_size=2, temperature=0.8), r"beam search \(beam_size=2\) is deterministic"),
        (dict(beam_size=2, top_k=3), "beam search .* takes no temperature/top_k/top_p"),
        (dict(top_k=5), "top_k=5 / top_p=1.0 narrow .* do nothing with greedy decoding"),
        (dict(top_p=0.9), "top_p=0.9 narrow .* do nothing with greedy decoding"),
    ],
)
def test_the_older_keywords_keep_their_errors(keywords, message):
    with pytest.raises(ValueError, match=message):
        strategy_from_keywords("generate_text", **keywords)


@pytest.fixture(scope="module")
def shapes():
    """The models with parameter shapes only: every call below must raise before compute."""
    lm, mt = DecoderOnlyTransformer(CONFIG), Transformer(CONFIG)
    key = jax.random.key(0)
    return {
        "lm": lm,
        "lm_params": nn.unbox(jax.eval_shape(lm.init, key, PROMPT)),
        "mt": mt,
        "mt_params": nn.unbox(jax.eval_shape(mt.init, key, PROMPT, PROMPT)),
    }


def _text(shapes, **kwargs):
    kwargs = {"eos_id": 2, "max_new_tokens": 4, **kwargs}
    return generate_text(shapes["lm"], shapes["lm_params"], PROMPT, LENGTHS, **kwargs)


def _translate(shapes, **kwargs):
    kwargs = {"bos_id": 1, "eos_id": 2, "max_new_tokens": 4, **kwargs}
    return generate_translation(shapes["mt"], shapes["mt_params"], PROMPT, **kwargs)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(strategy=Sample(0.8), temperature=0.8),
            r"strategy=Sample\(temperature=0.8, top_k=0, top_p=1.0\) and temperature=0.8 "
            "both say how to decode; pass one",
        ),
        (dict(strategy=Greedy(), beam_size=1), "strategy=Greedy.* and beam_size=1 both say"),
        (
            dict(strategy=Beam(4), length_penalty=0.6, top_k=0),
            r"strategy=Beam\(size=4, length_penalty=0.6\) and length_penalty=0.6, top_k=0 both",
        ),
        (dict(strategy=Sample(0.8)), r"Sample\(.*\) samples and needs a PRNG key: pass rng="),
        (dict(temperature=0.8), r"needs a PRNG key: pass rng=jax.random.key\(0\)"),
        (dict(strategy=Sample(0.8, top_k=V + 1), rng=jax.random.key(0)), f"top_k={V + 1} must"),
        (dict(strategy=Beam(2), return_logits=True), "return_logits=True is for beam_size=1"),
        (dict(beam_size=2, return_logits=True), "return_logits=True is for beam_size=1"),
        (dict(strategy=Beam(2, 1000.0)), "length_penalty=1000.0 makes the length penalty"),
        (dict(length_penalty=1000.0), "length_penalty=1000.0 makes the length penalty"),
        (dict(strategy=Greedy(), rng=0), "rng must be one PRNG key"),
    ],
)
def test_generation_refuses_what_a_strategy_cannot_check_alone(shapes, kwargs, message):
    for run, fn in ((_text, "generate_text"), (_translate, "generate_translation")):
        with pytest.raises(ValueError, match=f"{fn}: .*{message}"):
            run(shapes, **kwargs)


def test_a_strategy_of_another_type_is_a_type_error(shapes):
    for bad in ("greedy", Sample, {"temperature": 0.8}):
        with pytest.raises(TypeError, match="must be Greedy.*, Sample.* or Beam"):
            _text(shapes, strategy=bad)


def test_the_program_decode_options_build_one_strategy():
    """train.tasks.common.inference: translation greedy or beam search, text greedy or
    sampling; a run's
    top_k/top_p go unused with temperature 0 (configs/lm_kjv.py has top_k=40)."""
    from train.config.sections import DecodeOptions
    from train.tasks.common.inference import text_strategy, translation_strategy

    options = DecodeOptions(max_len=16, beam_size=1, length_penalty=1.0, top_k=40, top_p=0.9)
    assert translation_strategy(options) == Greedy()
    assert text_strategy(options) == Greedy()
    wide = dataclasses.replace(options, beam_size=4)
    assert translation_strategy(wide) == Beam(4, 1.0)
    hot = dataclasses.replace(options, temperature=0.8)
    assert text_strategy(hot) == Sample(0.8, 40, 0.9)
    assert translation_strategy(hot) == Greedy()  # translation never samples
    with pytest.raises(ValueError, match=r"top_p=1.5: must be in \(0, 1\]"):
        dataclasses.replace(hot, top_p=1.5)  # the options check themselves when replaced
