"""benchmarks/speedrun.py's own pieces (its runs are long: not run here): the peer scores
the very windows our program validates on, nanoGPT's schedule, the clocks and the recipes."""

import json
import math

import numpy as np
import pytest
from train_helpers import dataset_of, tiny_config

from benchmarks import speedrun
from train.core.rundir import RunDir


def test_the_peer_validates_on_our_programs_windows(tmp_path):
    """char_lm's data settings (one verbatim document per file, byte tokenizer, stream
    packing, every window): the windows and the scored targets are ours, byte for byte."""
    text = "In the beginning God created the heaven and the earth.\nAnd the earth was\n"
    train, valid = tmp_path / "train.txt", tmp_path / "valid.txt"
    train.write_text(text * 3, encoding="utf-8")
    valid.write_text(text + "Let there be light: é.\n", encoding="utf-8")  # a 2-byte char too
    config = tiny_config(
        train,
        task="lm",
        corpus="text",
        valid_path=str(valid),
        **{"corpora.text.documents": "file"},
        valid_fraction=0.0,
        packing="stream",
        max_len=16,
        bucket_lengths=(),
        batch_size=4,
    )
    dataset = dataset_of(config, RunDir(tmp_path / "run"))
    ours = {
        key: np.concatenate([b[key] for b in dataset.eval_batches]) for key in ("inputs", "targets")
    }
    inputs, targets = speedrun.validation_windows(valid, 16)
    rows = len(inputs)
    np.testing.assert_array_equal(ours["inputs"][:rows], inputs)
    np.testing.assert_array_equal(ours["targets"][:rows], targets)
    assert not ours["targets"][rows:].any()  # our last batch's padding rows score nothing
    assert (targets != speedrun.PAD).sum() == len(valid.read_bytes()) + 1  # bytes and EOS


def test_peer_schedule_is_nanogpts():
    rates = [speedrun.peer_lr(it, 2000) for it in (0, 99, 100, 1050, 2000, 2001)]
    assert rates[0] == pytest.approx(1e-3 / 101) and rates[1] == pytest.approx(1e-3 * 100 / 101)
    assert rates[2] == pytest.approx(1e-3)
    assert rates[3] == pytest.approx(1e-4 + 0.5 * (1 + math.cos(math.pi * 0.5)) * 9e-4)
    assert rates[4] == pytest.approx(1e-4) and rates[5] == 1e-4


def test_clocks_leave_out_the_evaluations():
    curve = [
        {"step": 10, "loss": 3.0, "wall_s": 12.0, "eval_s": 2.0},
        {"step": 20, "loss": 2.5, "wall_s": 20.0, "eval_s": 2.0},
        {"step": 30, "loss": 2.0, "wall_s": 30.0, "eval_s": 4.0},
    ]
    assert speedrun.training_clock(curve) == [10.0, 16.0, 22.0]
    assert speedrun.time_to(curve, 2.5) == 16.0 and speedrun.time_to(curve, 2.5, "wall") == 20.0
    assert speedrun.time_to(curve, 1.0) is None
    assert speedrun.loss_at(curve, 17.0) == 2.5 and speedrun.loss_at(curve, 5.0) is None
    peer = {"curve": [{"step": 30, "loss": 2.4, "wall_s": 40.0, "eval_s": 10.0}]}
    summary = speedrun.summarise({"peer": [peer], "baseline": [{"curve": curve}]})
    assert summary["target"] == 2.4
    assert summary["baseline"]["to_target_s"] == 22.0
    assert summary["baseline"]["ratio_to_peer"] == pytest.approx(22.0 / 30.0)
    assert summary["baseline"]["loss_at_peer_time"] == 2.0
    assert "| baseline | 1/1 | 22.0 | 0.73 |" in speedrun.table(summary, ["baseline"])


def test_recipes_compose_and_conflicts_are_named():
    assert speedrun.recipe_overrides("baseline", 2000) == {}
    both = speedrun.recipe_overrides("muon+qk_norm", 2000)
    assert both == {"optimizer": "muon", "muon_learning_rate": 0.02, "model.qk_norm": True}
    assert speedrun.recipe_overrides("batch24", 2000)["num_train_steps"] == 1000
    assert set(speedrun.recipe_overrides("speedrun", 2000)) >= {"optimizer", "model.qk_norm"}
    tried = speedrun.recipe_overrides("muon+muon_learning_rate=0.04+model.norm=rmsnorm", 2000)
    assert tried == {"optimizer": "muon", "muon_learning_rate": 0.04, "model.norm": "rmsnorm"}
    with pytest.raises(ValueError, match="model.activation is 'swiglu' in one part"):
        speedrun.recipe_overrides("swiglu+relu2", 2000)
    with pytest.raises(ValueError, match="'nope': not one of"):
        speedrun.recipe_overrides("nope", 2000)


@pytest.mark.parametrize("name", sorted(speedrun.RECIPES))
def test_every_recipe_is_a_valid_config(name, tmp_path):
    """Each recipe on char_lm's config passes the program's checks (a typo'd field would
    otherwise fail minutes into a long measurement)."""
    from benchmarks import char_lm
    from train.config import config_lib

    (tmp_path / "t.txt").write_text("ab\n")
    config = char_lm.recipe(2000, tmp_path / "t.txt", tmp_path / "t.txt")
    from train.core.cli import RENAMED_FIELDS

    for key, value in speedrun.recipe_overrides(name, 2000).items():
        target = config
        *parents, leaf = RENAMED_FIELDS.get(key, key).split(".")  # old names as today's
        for parent in parents:
            target = target[parent]
        target[leaf] = value
    config_lib.validate_config(config)


def test_time_to_quality_reads_both_clocks_of_a_run(tmp_path, capsys):
    from benchmarks import time_to_quality

    records = [
        {"step": 10, "split": "train", "loss": 5.0, "wall_s": 10.0},
        {"step": 20, "split": "valid", "nll": 4.0, "wall_s": 22.0, "eval_s": 2.0},
        {"step": 20, "split": "bleu", "bleu": 30.0, "wall_s": 30.0, "eval_s": 8.0},
        {"step": 40, "split": "valid", "nll": 3.0, "wall_s": 52.0, "eval_s": 2.0},
        {"step": 40, "split": "bleu", "bleu": 65.0, "wall_s": 60.0, "eval_s": 8.0},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    bleu = time_to_quality.curve(tmp_path, "bleu", "bleu")
    assert [(p["step"], p["wall_s"], p["train_s"]) for p in bleu] == [
        (20, 30.0, 20.0),
        (40, 60.0, 40.0),
    ]
    time_to_quality.main([str(tmp_path), "--bleu", "64"])
    assert "target bleu >= 64: at step 40: 60.0 s wall, 40.0 s training" in capsys.readouterr().out
