"""End-to-end tests of the training program on tiny corpora written by the tests."""

import json
import math
import pathlib
import shutil
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from train_helpers import tiny_config, write_tiny_text, write_tiny_tsv

from train.config.sections import DecodeOptions
from train.core.rundir import RunDir
from train.program import loop as train_lib
from train.program import metrics
from train.program.trained import load_trained
from train.tasks.common import inference

# A failed orbax restore (test_corrupt_checkpoint_is_reported) leaves a callback for its closed
# asyncio loop; it surfaces later, at garbage collection, as an unraisable "Exception ignored
# in: None ... Event loop is closed" that is orbax's, not ours.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. None:pytest.PytestUnraisableExceptionWarning"
)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A 300-step run of the toy translation task (~10 s), shared by the tests that read it."""
    tmp = tmp_path_factory.mktemp("trained")
    config = tiny_config(
        write_tiny_tsv(tmp),
        num_train_steps=300,
        log_every_steps=10,
        eval_every_steps=150,
        checkpoint_every_steps=150,
        learning_rate=5e-3,
        warmup_steps=30,
        schedule="cosine",
        bleu_examples=30,
        bleu_every_steps=200,
        report_beam_size=4,
        copy_baseline=True,
        **{"model.d_model": 64, "model.d_ff": 128, "model.num_layers": 2},
    )
    workdir = tmp / "run"
    results = train_lib.train_and_evaluate(config, str(workdir))
    return config, workdir, results


def test_toy_translation_is_learned_and_outputs_are_written(trained_run):
    _, workdir, results = trained_run
    records = metrics.read_metrics(RunDir(workdir).metrics)
    train = [r for r in records if r["split"] == "train"]
    assert [r["step"] for r in train] == list(range(10, 301, 10))
    assert train[-1]["loss"] < 0.5 * train[0]["loss"]
    assert {"learning_rate", "tokens_per_sec", "grad_norm", "accuracy"} <= set(train[-1])
    valid = [r for r in records if r["split"] == "valid"]
    assert [r["step"] for r in valid] == [150, 300]
    # Learned by the first evaluation: an untrained model scores about ln V (ln 260 = 5.6 nats
    # with the byte tokenizer); both evaluations are far below it. (After step 150 the
    # validation nll only wobbles: 0.113 -> 0.119 on an AMD EPYC on 2026-12-06, down on the
    # Xeons before, so its direction is not asserted.)
    assert all(r["nll"] < 0.05 * math.log(260) for r in valid)
    # The toy task (reverse the words, upper-case them) is learned, not just its statistics.
    assert valid[-1]["accuracy"] > 0.8 and results["bleu"]["bleu"] > 30
    assert results["valid"]["perplexity"] == pytest.approx(math.exp(results["valid"]["nll"]))
    assert {"bleu", "chrf"} <= set(results["bleu"]) and len(results["samples"]) == 2
    # The final report scores greedy and beam-4 decoding and the copy-the-source baseline
    # (far below the model here: the toy target reverses and upper-cases the source).
    assert results["bleu"]["decoding"] == "greedy"
    assert results["bleu_beam"]["decoding"] == "beam 4" and results["bleu_beam"]["bleu"] > 30
    assert results["copy_baseline"]["bleu"] < 10 < results["bleu"]["bleu"]
    assert all("model_beam" in sample for sample in results["samples"])
    assert 0.0 <= results["bleu"]["repeated_4gram"] <= 1.0
    # BLEU during training (step 200) and at the end.
    assert [r["step"] for r in records if r["split"] == "bleu"] == [200, 300]
    for name in ("loss_curve.png", "results.json", "config.json"):
        assert (workdir / name).is_file()
    assert list((workdir / "tensorboard").glob("events.out.tfevents.*"))
    assert sorted(int(p.name) for p in RunDir(workdir).checkpoints.iterdir()) == [150, 300]


def test_report_prints_both_decodings_and_the_copy_baseline(trained_run):
    _, _, results = trained_run
    report = metrics.format_report(results)
    assert "model, greedy: BLEU" in report and "model, beam 4: BLEU" in report
    assert "copy the source unchanged (baseline): BLEU" in report
    assert "model (beam):" in report and "% of outputs repeat a 4-gram" in report


def test_repeated_ngram_share():
    looping = "to the king of Israel, and to the king of Israel, and"
    texts = [looping, "In the beginning God created the heavens and the earth.", "a a a"]
    assert inference.repeated_ngram_share(texts) == pytest.approx(1 / 3)
    assert inference.repeated_ngram_share(["a a a a a"]) == 1.0  # (a a a a) twice
    assert inference.repeated_ngram_share(texts, n=2) == pytest.approx(2 / 3)  # "a a" twice
    assert inference.repeated_ngram_share([]) == 0.0


def test_translate_from_checkpoint(trained_run):
    config, workdir, results = trained_run
    trained = load_trained(workdir)
    assert trained.step == 300 and trained.config.task == "translation"
    assert trained.experiment.data.task == "translation"
    sample = results["samples"][0]
    options = trained.experiment.eval.decode  # the run's, as its report decoded
    assert options == DecodeOptions.from_config(trained.config)
    outputs = inference.translate(
        trained.model, trained.params, trained.tokenizer, [sample["source"], "ab"], options
    )
    assert outputs[0] == sample["model"] and isinstance(outputs[1], str)


class _Killed(Exception):
    pass


def _kill_at(step_to_die):
    def callback(step):
        if step == step_to_die:
            raise _Killed(step)

    return callback


def _saved_state(workdir, step):
    """The raw checkpointed TrainState tree (params, opt state, rng, step) as numpy."""
    with ocp.StandardCheckpointer() as checkpointer:
        return checkpointer.restore(RunDir(workdir).checkpoints / str(step) / "state")


@pytest.mark.slow  # three short runs
def test_resume_after_kill_is_bit_identical(tmp_path):
    # Dropout and gradient accumulation on: the PRNG and MultiSteps state must resume too.
    config = tiny_config(
        write_tiny_tsv(tmp_path),
        grad_accum_steps=2,
        **{"model.dropout_rate": 0.1},
        bleu_examples=0,
    )
    straight = tmp_path / "straight"
    train_lib.train_and_evaluate(config, str(straight))

    interrupted = tmp_path / "interrupted"
    with pytest.raises(_Killed):  # dies at step 6, after the checkpoint of step 4
        train_lib.train_and_evaluate(config, str(interrupted), step_callback=_kill_at(6))
    assert sorted(p.name for p in RunDir(interrupted).checkpoints.iterdir()) == ["4"]
    train_lib.train_and_evaluate(config, str(interrupted))  # the same call again: resumes

    a, b = _saved_state(straight, 8), _saved_state(interrupted, 8)
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))  # bitwise

    def logged(workdir):
        records = metrics.read_metrics(RunDir(workdir).metrics)
        for record in records:  # the clock's fields differ between any two runs
            for name in ("tokens_per_sec", "wall_s", "eval_s"):
                record.pop(name, None)
        return records

    assert logged(straight) == logged(interrupted)  # no duplicates from the lost steps 5-6


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
    # A huge learning rate without clipping: step 1's update overflows the parameters.
    config = tiny_config(
        write_tiny_tsv(tmp_path),
        learning_rate=1e30,
        grad_clip_norm=0.0,
        warmup_steps=0,
        checkpoint_every_steps=1,
        log_every_steps=1,
    )
    with pytest.raises(train_lib.TrainingDivergedError, match=r"at step 2\b") as err:
        train_lib.train_and_evaluate(config, str(tmp_path / "run"))
    assert "last good checkpoint (step 1)" in str(err.value)
    assert [p.name for p in RunDir(tmp_path / "run").checkpoints.iterdir()] == ["1"]


def test_language_model_run_reports_bits_per_char(tmp_path):
    config = tiny_config(
        write_tiny_text(tmp_path),
        task="lm",
        corpus="text",
        num_train_steps=4,
        sample_prompts=("ab cd",),
        max_decode_len=0,
        temperature=0.5,
        top_k=5,
    )
    results = train_lib.train_and_evaluate(config, str(tmp_path / "lm"))
    valid = results["valid"]
    # Byte tokenizer, ASCII text: one token per character, and one EOS label per line that
    # is no character (tests/test_bits_per_char.py checks the counts exactly).
    assert valid["bits_per_char"] > valid["nll"] / math.log(2)
    assert results["samples"][0]["model"].startswith("ab cd")


def test_greedy_sample_text_leaves_out_the_config_top_k_top_p():
    """generate_text refuses top_k/top_p with temperature 0; the program's greedy samples
    (configs/lm_kjv.py has top_k=40) pass them only when it samples."""
    from flax_transformer import DecoderOnlyTransformer, TransformerConfig, generate_text
    from train.data.tokenizer import ByteTokenizer

    tokenizer = ByteTokenizer()
    model = DecoderOnlyTransformer(
        TransformerConfig(
            vocab_size=tokenizer.vocab_size,
            d_model=16,
            num_heads=2,
            d_ff=32,
            num_layers=1,
            max_len=16,
        )
    )
    params = jax.jit(model.init)(jax.random.key(0), np.ones((1, 4), np.int32))["params"]
    options = DecodeOptions(
        max_len=16, max_decode_len=5, temperature=0.0, top_k=40, top_p=0.9, seed=0
    )
    (text,) = inference.sample_text(model, params, tokenizer, ["ab"], options)
    prompt = np.array([[tokenizer.bos_id, *tokenizer.encode("ab")]])
    greedy = generate_text(
        model, {"params": params}, prompt, eos_id=tokenizer.eos_id, max_new_tokens=5
    )
    assert text == tokenizer.decode(tokenizer.encode("ab") + np.asarray(greedy)[0].tolist())


def test_resume_refuses_a_changed_model(trained_run, tmp_path):
    config, workdir, _ = trained_run
    copy = tmp_path / "copy"
    shutil.copytree(workdir, copy)
    changed = config.copy_and_resolve_references()
    changed.model.d_model = 128
    with pytest.raises(ValueError, match=r"different model\.d_model \("):
        train_lib.train_and_evaluate(changed, str(copy))


def test_corrupt_checkpoint_is_reported(trained_run, tmp_path):
    config, workdir, _ = trained_run
    copy = tmp_path / "copy"
    shutil.copytree(workdir, copy)
    # Both checkpoints: a damaged latest one alone is moved aside and the run resumes from
    # the one before (tests/test_train_robustness.py).
    for path in RunDir(copy).checkpoints.rglob("*"):
        if path.is_file() and "manifest" in path.name:
            path.write_bytes(b"garbage")
    longer = config.copy_and_resolve_references()  # the fixture's config stays as it is
    longer.num_train_steps = 301
    with pytest.raises(ValueError, match="damaged or from a different config"):
        train_lib.train_and_evaluate(longer, str(copy))


# Its own run; test_toy_translation_is_learned_and_outputs_are_written keeps the program in
# the quick run.
@pytest.mark.slow
def test_rerunning_a_finished_run_prints_its_results(trained_run, capsys):
    config, workdir, results = trained_run
    records = (RunDir(workdir).metrics).read_text()
    assert train_lib.train_and_evaluate(config, str(workdir)) == results
    assert "BLEU" in capsys.readouterr().out
    assert (RunDir(workdir).metrics).read_text() == records  # nothing re-logged


def test_config_json_records_the_run(trained_run):
    config, workdir, _ = trained_run
    saved = json.loads((workdir / "config.json").read_text())
    assert saved["corpus_path"] == config.corpus_path and saved["model"]["d_model"] == 64


def test_translate_cli_reads_stdin(trained_run):
    _, workdir, _ = trained_run
    result = subprocess.run(
        [sys.executable, "-m", "train.translate", "--workdir", str(workdir)],
        input="ab cd\nef\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 2  # one translation per input line
    assert result.stderr == "", result.stderr  # no orbax notices before the translations


_DATA_PARALLEL_SCRIPT = """
import json, os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
import jax
sys.path.insert(0, {tests!r})
from train_helpers import tiny_config
from train.program import loop as train_lib
from train.program import metrics
assert jax.device_count() == 4
config = tiny_config({corpus!r}, num_train_steps=4, bleu_examples=0)
train_lib.train_and_evaluate(config, {workdir!r})
"""


@pytest.mark.slow
def test_data_parallel_matches_one_device(tmp_path):
    # The same run on 4 simulated devices (batch rows split 4 ways) and on this process's one
    # device: the same losses up to float reduction order.
    corpus = write_tiny_tsv(tmp_path)
    one = tmp_path / "one"
    train_lib.train_and_evaluate(tiny_config(corpus, num_train_steps=4, bleu_examples=0), str(one))
    four = tmp_path / "four"
    script = _DATA_PARALLEL_SCRIPT.format(
        tests=str(pathlib.Path(__file__).parent), corpus=str(corpus), workdir=str(four)
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]

    def losses(workdir):
        return [
            (r["step"], r["split"], r["nll"]) for r in metrics.read_metrics(RunDir(workdir).metrics)
        ]

    for (step_a, split_a, a), (step_b, split_b, b) in zip(losses(one), losses(four), strict=True):
        assert (step_a, split_a) == (step_b, split_b)
        assert a == pytest.approx(b, rel=1e-4)


def test_decode_options_come_from_the_config_once():
    import dataclasses

    from configs import default

    config = default.get_config()
    options = DecodeOptions.from_config(config)
    assert options == DecodeOptions(
        max_len=config.max_len,
        bucket_lengths=tuple(config.bucket_lengths),
        batch_size=config.decode_batch_size,
        max_decode_len=config.max_decode_len,
        beam_size=config.beam_size,
        length_penalty=config.length_penalty,
        temperature=config.temperature,
        top_k=config.top_k,
        top_p=config.top_p,
        seed=config.seed,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.beam_size = 4  # a flag makes a changed copy instead
    wider = dataclasses.replace(options, beam_size=4)
    assert wider.beam_size == 4 and options.beam_size == config.beam_size
