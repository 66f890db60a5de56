"""benchmarks/dpo_peer.py's two sides on a tiny Llama with ChatML's template: one batch of
the config's pairs, the same tokens through our step and TRL's `DPOTrainer`, two steps each,
their first step's metrics equal (no timing is asserted: the figures are the benchmark's,
benchmarks/RESULTS.md)."""

import math

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("trl")
pytest.importorskip("datasets")

from benchmarks import dpo_peer  # noqa: E402
from train.tiny_pretrained import write_tiny_model  # noqa: E402

# A tokenizer large enough that the verse pairs fit the config's max_len whole.
TINY_VOCAB = 2048


# About 15 s on 2 shared cores (the corpus split, our step compiled, TRL's trainer set up):
# under the suite's 20 s mark for slow tests.
def test_both_sides_step_on_the_same_pairs(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("BENCH_CPU_DEVICES", "1")  # JAX has started in this process
    model = write_tiny_model(
        tmp_path / "model", "llama", vocab_size=TINY_VOCAB, max_len=256, chat=True
    )
    spec = dpo_peer.make_spec(str(model), dpo_peer.PAIRS)
    assert len(spec["records"]) == dpo_peer.PAIRS
    assert spec["optimizer"]["learning_rate"] == 1e-5 and spec["beta"] == 0.1

    ours, our_about = dpo_peer.our_step(spec)
    our_times = [ours(), ours()]
    theirs, their_about = dpo_peer.their_step(spec)
    capsys.readouterr()
    try:
        their_times = [theirs(), theirs()]
        their_records = theirs.records()
    finally:
        theirs.close()
    # Nothing on stdout while TRL steps and logs: it is the worker's answer channel.
    assert capsys.readouterr().out == ""

    # One batch: the pairs' chosen and rejected rows, the same tokens on both sides; ours
    # padded to the bucket the pairs were chosen from, TRL's to their longest row (TRL feeds
    # a row's every token, ours all but the last: a bucket of L positions holds L + 1).
    assert our_about["rows"] == their_about["rows"] == 2 * dpo_peer.PAIRS
    assert our_about["tokens"] == their_about["tokens"]
    assert our_about["padded"] == spec["bucket"] >= their_about["padded"] - 1
    # The reference is the starting weights': the first step's loss is ln 2.
    assert ours.losses[0] == pytest.approx(math.log(2), rel=1e-5)
    assert ours.losses[1] != ours.losses[0]  # the first step moved the weights
    assert all(t > 0 for t in our_times + their_times)
    # The first step's logged metrics equal on both sides (the same weights and pairs), as
    # the benchmark reports them for SmolLM2; the parity bound.
    compared = dpo_peer.parity(ours.records(), their_records)
    assert compared["steps"] == 1
    assert set(compared["max_relative"]) == set(dpo_peer.COMPARED)
    for key, worst in compared["max_relative"].items():
        assert worst < 1e-4, (key, worst, ours.records(), their_records)
    # Each side recorded both steps; ours moved at step 1, TRL's warmup starts at rate 0.
    assert len(ours.records()) == len(their_records) == 2
    assert their_records[1]["loss"] == pytest.approx(math.log(2), rel=1e-6)


def test_ours_overrides_set_config_fields_and_refuse_unknown_ones():
    config = dpo_peer._config("smollm2", ["cpu_devices=1", "model.remat=True", "seed=7"])
    assert (config.cpu_devices, config.model.remat, config.seed) == (1, True, 7)
    with pytest.raises(ValueError, match="'model.nope' is not a field of the config"):
        dpo_peer._config("smollm2", ["model.nope=1"])
    with pytest.raises(ValueError, match="write KEY=VALUE"):
        dpo_peer._config("smollm2", ["cpu_devices"])
