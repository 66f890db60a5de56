"""Every setting the end of a run uses is checked before its first step (issue 41, item 4).

Each case here used to fail after the whole run had trained (a language model of
max_len=64 with configs/lm_kjv.py's prompts and max_decode_len=60 died after 2,000 steps).
Now a setting that would fail is refused before step 1 and before any checkpoint, in one
line naming the fields; one whose intent is clear (fewer new tokens for a long prompt) is
adjusted with a warning, and the run completes.
"""

import logging
import pathlib
import subprocess
import sys

import pytest
from train_helpers import tiny_config, write_tiny_text, write_tiny_tsv

from train.core.failures import USAGE_ERROR
from train.core.rundir import RunDir
from train.program import loop as train_lib


def _refused_before_step_1(config, workdir) -> str:
    """The run's error message; asserts that no step ran and no checkpoint was written."""
    steps = []
    with pytest.raises(ValueError) as err:
        train_lib.train_and_evaluate(config, str(workdir), step_callback=steps.append)
    assert steps == []
    assert not list(RunDir(workdir).checkpoints.glob("*"))
    assert not RunDir(workdir).results.exists()
    return str(err.value)


def _lm_config(tmp_path, **overrides):
    return tiny_config(
        write_tiny_text(tmp_path), task="lm", corpus="text", num_train_steps=2, **overrides
    )


def test_a_long_prompt_is_continued_by_fewer_tokens_with_a_warning(tmp_path, caplog):
    # Byte tokenizer: 'ab cd ef gh' is 11 tokens + BOS, leaving 4 of max_len=16, not 12.
    config = _lm_config(tmp_path, sample_prompts=("ab", "ab cd ef gh"), max_decode_len=12)
    warned_at_step_1 = []

    def on_step(step):
        if step == 1:
            warned_at_step_1.append([r.getMessage() for r in caplog.records])

    with caplog.at_level(logging.WARNING):
        results = train_lib.train_and_evaluate(config, str(tmp_path / "run"), step_callback=on_step)
    (before,) = warned_at_step_1
    assert any(
        "--config.max_decode_len=12" in m and "'ab cd ef gh' (11 tokens)" in m and "by 4." in m
        for m in before
    ), before
    short, long = results["samples"]
    assert long["model"].startswith("ab cd ef gh") and len(long["model"].encode()) <= 11 + 4
    assert short["model"].startswith("ab")
    assert RunDir(tmp_path / "run").results.exists()


def test_a_prompt_that_leaves_no_room_is_refused_before_step_1(tmp_path):
    config = _lm_config(tmp_path, sample_prompts=("ab", "ab cd ef gh ij kl"), max_decode_len=4)
    message = _refused_before_step_1(config, tmp_path / "run")
    assert "--config.sample_prompts=" in message
    assert "Prompt 1 has 17 tokens" in message and "max_len=16" in message
    assert "shorten it to at most 14 tokens or raise max_len" in message


def test_top_k_above_the_vocabulary_is_refused_before_step_1(tmp_path):
    config = _lm_config(tmp_path, sample_prompts=("ab",), temperature=0.8, top_k=1000)
    message = _refused_before_step_1(config, tmp_path / "run")
    assert "--config.top_k=1000 (vocabulary 260)" in message


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"bleu_tokenize": "nope"}, "--config.bleu_tokenize='nope': not a sacrebleu tokenizer"),
        (
            {"report_beam_size": 2, "length_penalty": 100.0},
            "--config.report_beam_size=2 with --config.length_penalty=100.0",
        ),
        (  # the interim BLEU's beam search
            {"bleu_every_steps": 4, "beam_size": 2, "length_penalty": 100.0},
            "--config.beam_size=2 with --config.length_penalty=100.0",
        ),
    ],
)
def test_bad_scoring_settings_are_refused_before_step_1(tmp_path, overrides, message):
    config = tiny_config(write_tiny_tsv(tmp_path), **overrides)
    assert message in _refused_before_step_1(config, tmp_path / "run")


def test_no_bleu_means_no_bleu_checks(tmp_path):
    config = tiny_config(write_tiny_tsv(tmp_path), bleu_examples=0, bleu_tokenize="nope")
    config.num_train_steps = 1
    results = train_lib.train_and_evaluate(config, str(tmp_path / "run"))
    assert results["samples"] == [] and "bleu" not in results


def test_the_program_refuses_in_one_line_with_status_2(tmp_path):
    corpus = write_tiny_text(tmp_path)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "train.main",
            "--config=configs/lm_kjv.py",
            f"--workdir={tmp_path / 'run'}",
            "--config.corpus=text",
            f"--config.corpus_path={corpus}",
            "--config.tokenizer=byte",
            "--config.max_len=16",
            "--config.max_decode_len=8",
            "--config.model.num_layers=1",
            "--config.model.d_model=32",
            "--config.model.d_ff=64",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=pathlib.Path(__file__).resolve().parent.parent,
    )
    assert result.returncode == USAGE_ERROR, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    # configs/lm_kjv.py's first prompt, 'In the beginning', is 16 bytes.
    assert "--config.sample_prompts=" in result.stderr and "Prompt 0 has 16 tokens" in result.stderr
    assert not list((tmp_path / "run" / "checkpoints").glob("*"))
