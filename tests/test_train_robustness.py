"""Issue 12: the training program's failure modes each end in one line and a documented exit
status (2 = usage: flag, config, data file; 1 = runtime: I/O, damaged checkpoint, lock held)."""

import math

import pytest
from train_helpers import tiny_config

from train import config_lib


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("field", ["learning_rate", "label_smoothing", "model.dropout_rate"])
def test_non_finite_config_floats_are_rejected(field, value, tmp_path):
    config = tiny_config(tmp_path / "pairs.tsv", **{field: value})
    with pytest.raises(ValueError, match=rf"--config\.{field}={value!r}: must be a finite"):
        config_lib.validate_config(config)
