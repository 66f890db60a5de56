"""Issue 12: the training program's failure modes each end in one line and a documented exit
status (2 = usage: flag, config, data file; 1 = runtime: I/O, damaged checkpoint, lock held)."""

import math
import pathlib
import subprocess
import sys

import pytest
from train_helpers import tiny_config

from train import config_lib
from train.cli import USAGE_ERROR

REPO = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("field", ["learning_rate", "label_smoothing", "model.dropout_rate"])
def test_non_finite_config_floats_are_rejected(field, value, tmp_path):
    config = tiny_config(tmp_path / "pairs.tsv", **{field: value})
    with pytest.raises(ValueError, match=rf"--config\.{field}={value!r}: must be a finite"):
        config_lib.validate_config(config)


def _run_main(*args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "train.main", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=timeout,
    )


def _one_error_line(result) -> str:
    """The single `error: ...` line a failing run prints, checked to be alone on stderr."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr, result.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_missing_config_file_with_an_override_is_a_usage_error(tmp_path):
    result = _run_main(
        "--config", "nope.py", "--config.num_train_steps=3", "--workdir", str(tmp_path)
    )
    assert result.returncode == USAGE_ERROR
    assert _one_error_line(result).startswith("error: --config nope.py: no such file ; ")


@pytest.mark.parametrize("override", [[], ["--config.num_train_steps=3"]])
def test_config_file_with_a_syntax_error_is_a_usage_error(override, tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def get_config(:\n")
    result = _run_main("--config", str(bad), *override, "--workdir", str(tmp_path / "w"))
    assert result.returncode == USAGE_ERROR
    line = _one_error_line(result)
    assert line.startswith(f"error: --config {bad}: invalid syntax at line 1")
    assert "; fix the file" in line
