"""The corpora's own options (train/formats/corpora/options.py): one sub-section per reader
module, `--config.corpora.<section>.<field>`, made from the table so that a new reader with
options is its module and its name in READERS; the old flat fields (`hf_*`, `text_*`,
`direction`) read as today's on the command line and in config.json, and refused in one
line where a config file still sets them."""

import dataclasses
import json
import os
import pathlib
import re
import subprocess
import sys
import types

import pytest

from configs import default
from train.config import config_lib
from train.config import tasks as task_registry
from train.config.sections import DataConfig
from train.core import cli
from train.formats import corpora

ROOT = pathlib.Path(__file__).resolve().parents[1]


PAGE = ROOT / "docs" / "training.md"


def _example_module() -> types.ModuleType:
    """docs/training.md's "A corpus format of your own" reader, read from the page."""
    text = PAGE.read_text(encoding="utf-8")
    (code,) = re.findall(r"```python\n(# train/formats/corpora/csv_pairs.py\n.*?)```", text, re.S)
    module = types.ModuleType("csv_pairs")
    exec(compile(code, str(PAGE), "exec"), module.__dict__)
    return module


def test_the_docs_reader_with_options_needs_no_line_outside_its_module(monkeypatch, tmp_path):
    module = _example_module()
    # Its name in READERS registers its entries and its options; done by hand here.
    for entry in module.CORPORA:
        monkeypatch.setitem(corpora.CORPORA, entry.name, entry)
    for name, kind in module.OPTIONS.items():
        monkeypatch.setitem(corpora.OPTIONS, name, kind)
    # The tasks read the table when train.tasks is imported (after READERS, in a real run).
    facts = task_registry.task_facts("translation")
    with_csv = dataclasses.replace(facts, corpora=(*facts.corpora, "csv"))
    monkeypatch.setitem(task_registry._REGISTERED, "translation", with_csv)
    config = default.get_config()
    assert config.corpora.csv.to_dict() == {"delimiter": ","}
    path = tmp_path / "pairs.csv"
    path.write_text("in the beginning;at  first\nlight;day\n")
    config.update(corpus="csv", corpus_path=str(path))
    config.corpora.csv.delimiter = ";"
    experiment = config_lib.validate_config(config)
    assert experiment.data.corpora.csv == module.CsvOptions(";")
    pairs = corpora.CORPORA["csv"].read(experiment.data)
    assert pairs == [("in the beginning", "at first"), ("light", "day")]
    config.corpora.csv.delimiter = ";;"
    with pytest.raises(ValueError, match=r"^--config.corpora.csv.delimiter=';;': must be one"):
        config_lib.validate_config(config)


def test_the_options_are_one_frozen_hashable_value():
    data = DataConfig.from_config(default.get_config())
    assert data.corpora == corpora.read_options(corpora.config_section().to_dict())
    assert hash(data) == hash(DataConfig.from_config(default.get_config()))
    with pytest.raises(dataclasses.FrozenInstanceError):
        data.corpora.hf = None
    with pytest.raises(AttributeError, match="no corpus options section 'csv'"):
        _ = data.corpora.csv


@pytest.mark.parametrize(
    "argv, today",
    [
        (["--config.hf_dataset=wmt14"], ["--config.corpora.hf.dataset=wmt14"]),
        (["--config.hf_fields", "a,b"], ["--config.corpora.hf.fields", "a,b"]),
        (["--config.direction=en-ja"], ["--config.corpora.bible.direction=en-ja"]),
        (["--config.text_documents=file"], ["--config.corpora.text.documents=file"]),
        (["--config.text_in_memory=True"], ["--config.corpora.text.in_memory=True"]),
        (["--config.corpora.text.field=body"], ["--config.corpora.text.field=body"]),
    ],
)
def test_old_flags_are_read_as_todays(argv, today):
    assert cli.renamed_overrides(list(argv)) == today


def test_an_old_flag_reaches_the_option_on_the_command_line(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "train.main", "--config.corpus=bible", "--config.direction=de"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 2, result.stderr
    assert "--config.corpora.bible.direction='de': must be one of ('ja-en', 'en-ja')" in (
        result.stderr
    )
    assert "Traceback" not in result.stderr


def test_a_config_setting_an_old_field_is_refused_naming_the_new_one():
    config = default.get_config()
    config.text_documents = "file"  # read by nobody: refused, not ignored
    with pytest.raises(
        ValueError,
        match=r"^--config.text_documents='file': is now --config.corpora.text.documents; set",
    ):
        config_lib.validate_config(config)


def test_an_old_config_json_reads_its_flat_corpus_fields(tmp_path):
    saved = default.get_config().to_dict()
    del saved["corpora"]
    saved.update(corpus="bible", direction="en-ja", text_field="body")
    (tmp_path / "config.json").write_text(json.dumps(saved))
    config, experiment = config_lib.read_saved(tmp_path)
    assert experiment.data.corpora.bible.direction == "en-ja"
    assert experiment.data.corpora.text.field == "body"
    assert experiment.data.corpora.hf == corpora.OPTIONS["hf"]()  # absent: the defaults
    assert "direction" not in config
