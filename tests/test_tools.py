"""The programs that read a trained run (train.translate, train.sample) check their flags as
training checks its config, and still read run directories of older versions.

Most cases call the programs' functions in this process: a bad flag is refused before the
checkpoint is read, so a work directory holding only config.json is enough for them.
"""

import json
import pathlib
import shutil
import subprocess
import sys

import pytest
from train_helpers import tiny_config

from train import sample, translate
from train.config import config_lib
from train.config.sections import DecodeOptions
from train.program.trained import load_trained

REPO = pathlib.Path(__file__).parent.parent
OLD_RUNS = pathlib.Path(__file__).parent / "data" / "old_runs"


def _config_only_run(directory: pathlib.Path, **overrides) -> pathlib.Path:
    """A work directory with a config.json (tiny_config and `overrides`) and nothing else."""
    workdir = directory / "run"
    workdir.mkdir()
    config = tiny_config(directory / "corpus.txt", **overrides)
    (workdir / "config.json").write_text(json.dumps(config.to_dict()))
    return workdir


def _lm_run(directory):
    return _config_only_run(directory, task="lm", corpus="text", packing="stream")


def _refused(capsys, program, *args, **flags) -> str:
    """The one error line of `program(*args, **flags)`, which must exit with status 2."""
    with pytest.raises(SystemExit) as exit_:
        program(*args, **flags)
    assert exit_.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("error: "), err
    return err.strip()


@pytest.mark.parametrize(
    "flags, message",
    [
        ({"beam_size": -2}, "error: --beam_size=-2: must be a positive integer."),
        ({"beam_size": 0}, "error: --beam_size=0: must be a positive integer."),
        ({"batch_size": 0}, "error: --batch_size=0: must be a positive integer."),
        ({"length_penalty": -1.0}, "error: --length_penalty=-1.0: must be >= 0 (0 = none)."),
        (
            {"length_penalty": float("nan")},
            "error: --length_penalty=nan: must be a finite number >= 0 (0 = none).",
        ),
        ({"max_decode_len": 16}, "error: --max_decode_len=16: must be < max_len=16 or 0."),
    ],
)
def test_bad_translate_flags_are_refused_before_decoding(tmp_path, capsys, flags, message):
    workdir = _config_only_run(tmp_path)  # no checkpoint: the refusal comes before reading one
    assert _refused(capsys, translate.translate_sentences, workdir, ["ab"], **flags) == message


@pytest.mark.parametrize(
    "flags, message",
    [
        ({"temperature": -1.0}, "error: --temperature=-1.0: must be >= 0 (0 = greedy)."),
        ({"top_p": 1.5}, "error: --top_p=1.5: must be in (0, 1]."),
        ({"top_k": -1}, "error: --top_k=-1: must be a non-negative integer."),
        ({"max_new_tokens": -3}, "error: --max_new_tokens=-3: must be a non-negative integer."),
        ({"num_samples": 0}, "error: --num_samples=0: must be a positive integer."),
        ({"seed": -1}, "error: --seed=-1: must be a non-negative integer."),
    ],
)
def test_bad_sample_flags_are_refused_before_decoding(tmp_path, capsys, flags, message):
    workdir = _lm_run(tmp_path)
    assert _refused(capsys, sample.sample_prompts, workdir, ["ab"], **flags) == message


def test_a_tool_of_the_other_task_is_refused(tmp_path, capsys):
    workdir = _lm_run(tmp_path)
    line = _refused(capsys, translate.translate_sentences, workdir, ["ab"])
    assert line == (
        f"error: {workdir} holds a task='lm' model; use `python -m train.sample` for "
        "language models."
    )


def test_a_config_json_that_fails_todays_checks_names_the_file_and_field(tmp_path, capsys):
    workdir = _config_only_run(tmp_path, top_p=0.0)
    line = _refused(capsys, translate.translate_sentences, workdir, ["ab"])
    assert line.startswith(f"error: {workdir / 'config.json'} records --config.top_p=0.0: ")
    assert line.endswith("; correct the value in the file (this version of the program "
                         "refuses it), or retrain.")  # fmt: skip


@pytest.mark.parametrize(
    "module, args, message",
    [
        ("train.translate", ["--beam_size=-2", "ab"], "--beam_size=-2: must be a positive"),
        ("train.sample", ["--temperature=-1", "--prompt", "ab"], "--temperature=-1.0: must be"),
    ],
)
def test_bad_tool_flags_exit_with_the_usage_status(tmp_path, module, args, message):
    # The programs as run from the shell (~10 s each: a fresh process imports jax).
    workdir = _config_only_run(tmp_path) if module == "train.translate" else _lm_run(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", module, "--workdir", str(workdir), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    [line] = [line for line in result.stderr.splitlines() if line.strip()]
    assert line.startswith(f"error: {message}") and result.stdout == "", result.stderr


@pytest.fixture
def old_runs(tmp_path):
    """Copies of the run directories an earlier version of the program wrote."""
    shutil.copytree(OLD_RUNS, tmp_path / "old_runs")
    return tmp_path / "old_runs"


def test_old_run_directories_still_translate_and_sample(old_runs, capsys):
    translation = old_runs / "translation-segments"
    trained = load_trained(translation)
    assert trained.step == 4 and trained.experiment.data.packing == "segments"
    assert trained.experiment.eval.decode == DecodeOptions.from_config(trained.config)
    [line] = translate.translate_sentences(translation, ["ab cd"], beam_size=2)
    assert isinstance(line, str)
    [text] = sample.sample_prompts(old_runs / "lm-stream", ["In"], max_new_tokens=3)
    assert text.startswith("In")


def test_a_config_json_without_newer_fields_gets_the_defaults(old_runs):
    path = old_runs / "lm-stream" / "config.json"
    saved = json.loads(path.read_text())
    # As written before `packing` replaced `packed`, and before the decoding fields existed.
    del saved["packing"], saved["length_penalty"], saved["top_p"]
    saved["packed"] = True
    path.write_text(json.dumps(saved))
    config, experiment = config_lib.read_saved(path.parent)
    assert experiment.data.packing == "stream" and "packed" not in config
    assert experiment.eval.decode.length_penalty == 0.6 and experiment.eval.decode.top_p == 1.0
