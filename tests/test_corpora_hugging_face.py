"""The optional Hugging Face `datasets` corpus path, with a stand-in module (no network)."""

import sys
import types

import pytest

from configs import default
from train.config import config_checks, config_lib
from train.formats.corpora.corpus import CorpusNotFoundError
from train.formats.corpora.hugging_face import load_hf_examples

RECORDS = [
    {"translation": {"de": "Guten  Morgen", "en": "Good morning"}, "id": 0},
    {"translation": {"de": "", "en": "dropped: empty source"}, "id": 1},
    {"translation": {"de": "Danke", "en": "Thank you"}, "id": 2},
]


@pytest.fixture
def fake_datasets(monkeypatch):
    calls = []
    module = types.ModuleType("datasets")

    def load_dataset(name, config_name, split):
        calls.append((name, config_name, split))
        return RECORDS

    module.load_dataset = load_dataset
    monkeypatch.setitem(sys.modules, "datasets", module)
    return calls


def test_pairs_and_lines_from_dotted_fields(fake_datasets):
    pairs = load_hf_examples("wmt14", "de-en", "train", ["translation.de", "translation.en"])
    assert pairs == [("Guten Morgen", "Good morning"), ("Danke", "Thank you")]
    assert fake_datasets == [("wmt14", "de-en", "train")]
    lines = load_hf_examples("wmt14", "", "validation", ["translation.en"])
    assert lines[0] == "Good morning" and len(lines) == 3
    assert fake_datasets[-1] == ("wmt14", None, "validation")


def test_bad_fields_are_named(fake_datasets):
    with pytest.raises(ValueError, match=r"no field 'translation.fr' \(at 'fr'; available"):
        load_hf_examples("wmt14", "", "train", ["translation.de", "translation.fr"])
    with pytest.raises(ValueError, match=r"field 'id' of record 0 is int, not text"):
        load_hf_examples("wmt14", "", "train", ["id"])
    with pytest.raises(ValueError, match="give one field"):
        load_hf_examples("wmt14", "", "train", ["a", "b", "c"])


def test_missing_datasets_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import raises ImportError
    with pytest.raises(CorpusNotFoundError, match="pip install datasets"):
        load_hf_examples("wmt14", "", "train", ["text"])


def test_config_checks_hf_fields():
    config = default.get_config()
    config.corpus = "hf"
    with pytest.raises(ValueError, match=r"--config.corpora.hf.dataset='': corpus='hf' needs"):
        config_lib.validate_config(config)
    config.corpora.hf.dataset = "wmt14"
    config.corpora.hf.fields = "translation.en"
    with pytest.raises(
        ValueError, match=r"--config.corpora.hf.fields='translation.en': task='translation' needs 2"
    ):
        config_lib.validate_config(config)
    config.corpora.hf.fields = "translation.de,translation.en"
    config_lib.validate_config(config)


# Preference pairs (`hf-preference`), read by the real `datasets` from a local directory.

PAIRS = [
    {"prompt": "Say hi.", "chosen": "Hi!", "rejected": "No."},
    {
        "prompt": [{"role": "user", "content": "Rewrite: thou art"}],
        "chosen": [{"role": "assistant", "content": "you are"}],
        "rejected": [{"role": "assistant", "content": "thou art"}],
    },
]


def test_preference_pairs_from_a_local_dataset_equal_the_json_lines_reader(tmp_path):
    """A directory of JSON-lines files is a `datasets` dataset: its rows give the pairs the
    `preference` corpus gives for the same file (both forms; a conversational row too)."""
    pytest.importorskip("datasets")
    import dataclasses
    import json

    from train.formats.corpora.hugging_face import load_hf_pairs
    from train.formats.corpora.preferences import read_preference_jsonl

    for name, rows in (("strings", PAIRS[:1]), ("messages", PAIRS[1:])):
        directory = tmp_path / name
        directory.mkdir()
        path = directory / "train.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        got, want = load_hf_pairs(str(directory), "", "train"), read_preference_jsonl(path)
        # The same pairs and split keys; only where each came from differs.
        assert [dataclasses.replace(p, where="") for p in got] == [
            dataclasses.replace(p, where="") for p in want
        ]
        assert got[0].where.endswith(f"{name}[train] row 0")


def test_a_row_that_is_not_a_pair_is_named(monkeypatch):
    module = types.ModuleType("datasets")
    module.load_dataset = lambda name, config_name, split: [PAIRS[0], {"chosen": "only"}]
    monkeypatch.setitem(sys.modules, "datasets", module)
    from train.formats.corpora.hugging_face import load_hf_pairs

    with pytest.raises(ValueError, match=r"prefs\[train\] row 1: field 'rejected' is missing"):
        load_hf_pairs("prefs", "", "train")


def test_the_dpo_task_reads_hf_preference():
    from configs import dpo_smollm2

    config = dpo_smollm2.get_config()
    config.corpus = "hf-preference"
    config.corpora.hf.dataset = "trl-lib/ultrafeedback_binarized"
    assert config_checks.check_task(config) is None  # the task accepts the corpus
    config.task = "chat"
    with pytest.raises(ValueError, match=r"--config.corpus='hf-preference': task='chat' reads"):
        config_checks.check_task(config)
