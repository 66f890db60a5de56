"""A pretrained source is opened once per process: the config's model, the tokenizer, the
chat template and the weights all get the same `Source` while its files are unchanged
(`train.formats.sources.read_source`)."""

from train.formats import sources


def _counting(monkeypatch):
    calls = []

    def fake_read(path, directory, need_weights):
        calls.append(need_weights)
        return object()

    monkeypatch.setattr(sources, "_read_source", fake_read)
    monkeypatch.setattr(sources, "_OPENED", {})
    return calls


def test_a_source_is_read_once_while_its_files_are_unchanged(tmp_path, monkeypatch):
    calls = _counting(monkeypatch)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    first = sources.read_source(model, need_weights=False)
    assert sources.read_source(str(model), need_weights=False) is first
    assert sources.read_source(tmp_path / "." / "model", need_weights=False) is first
    assert calls == [False]
    # The weights were not checked: a read that needs them reads again, and then serves both.
    with_weights = sources.read_source(model)
    assert with_weights is not first and calls == [False, True]
    assert sources.read_source(model, need_weights=False) is with_weights


def test_a_changed_file_is_read_again(tmp_path, monkeypatch):
    calls = _counting(monkeypatch)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    first = sources.read_source(model, need_weights=False)
    (model / "config.json").write_text('{"model_type": "llama"}')
    assert sources.read_source(model, need_weights=False) is not first
    (model / "tokenizer.json").write_text("{}")  # a file added
    sources.read_source(model, need_weights=False)
    assert len(calls) == 3


def test_a_missing_path_is_never_cached(tmp_path, monkeypatch):
    calls = _counting(monkeypatch)
    sources.read_source(tmp_path / "nothing", need_weights=False)
    sources.read_source(tmp_path / "nothing", need_weights=False)
    assert len(calls) == 2
