"""The preference task (`--config.task=dpo`): TRL's pair formats read and refused, pairs
encoded through the chat template with their drops counted and refusals, and, marked slow,
runs end to end on a tiny random Llama with ChatML's template (`write_tiny_model(chat=True)`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import types

import numpy as np
import pytest

from train.config.tasks import read_task_options
from train.data.chat.encoding import ChatExample
from train.formats.corpora.preferences import (
    PreferencePair,
    kjv_web_preferences,
    read_preference_jsonl,
)
from train.tasks import get_task
from train.tasks.dpo.options import DpoOptions
from train.tasks.dpo.pairs import encode_pair, encode_pairs

USER = {"role": "user", "content": "Hi"}


def _write(path, records):
    path.write_text(
        "".join(r if isinstance(r, str) else json.dumps(r) + "\n" for r in records),
        encoding="utf-8",
    )
    return path


# Reading TRL's formats.


def test_reads_plain_conversational_and_implicit_prompt_pairs(tmp_path):
    path = _write(
        tmp_path / "p.jsonl",
        [
            {"prompt": "Hi", "chosen": "Hello!", "rejected": "Go away."},
            {
                "prompt": [{"role": "system", "content": "Be kind."}, USER],
                "chosen": [{"role": "assistant", "content": "Hello!"}],
                "rejected": [{"role": "assistant", "content": "No."}],
            },
            "\n",  # blank lines are skipped
            {
                "chosen": [USER, {"role": "assistant", "content": "Hello!"}],
                "rejected": [USER, {"role": "assistant", "content": "No."}],
            },
        ],
    )
    plain, conversational, implicit = read_preference_jsonl(path)
    assert plain.prompt == (USER,)
    assert plain.chosen == {"role": "assistant", "content": "Hello!"}
    assert plain.rejected["content"] == "Go away."
    assert [m["role"] for m in conversational.prompt] == ["system", "user"]
    assert implicit.prompt == (USER,) and implicit.rejected["content"] == "No."
    assert implicit.where == f"{path}:4"


@pytest.mark.parametrize(
    "record, message",
    [
        ("not json\n", r":2: not JSON"),
        ({"prompt": "Hi", "chosen": "a"}, r":2: field 'rejected' is missing"),
        ({"prompt": "Hi", "chosen": 3, "rejected": "b"}, r":2: field 'chosen' is a int"),
        ({"chosen": "a", "rejected": "b"}, r":2: field 'prompt' is missing and 'chosen'"),
        (
            {
                "prompt": "Hi",
                "chosen": [{"role": "user", "content": "a"}],
                "rejected": "b",
            },
            r":2: field 'chosen' must hold one assistant message",
        ),
        (
            {"prompt": [{"role": "wizard", "content": "x"}], "chosen": "a", "rejected": "b"},
            r":2: field 'prompt': messages\[0\] has role 'wizard'",
        ),
        (
            {
                "chosen": [{"role": "assistant", "content": "a"}],
                "rejected": [{"role": "assistant", "content": "b"}],
            },
            r":2: field 'prompt' is missing and 'chosen' and 'rejected' share no first message",
        ),
    ],
)
def test_a_bad_line_is_refused_naming_file_line_and_field(tmp_path, record, message):
    good = {"prompt": "Hi", "chosen": "a", "rejected": "b"}
    path = _write(tmp_path / "p.jsonl", [good, record])
    with pytest.raises(ValueError, match=str(path).replace(".", r"\.") + message):
        read_preference_jsonl(path)


def test_kjv_web_preferences_prefer_the_web_verse_to_the_kjv_copied():
    pairs = kjv_web_preferences()
    first = pairs[0]
    assert first.prompt[0]["content"].startswith("Rewrite this verse in modern English: ")
    assert first.prompt[0]["content"].endswith(first.rejected["content"])
    assert first.chosen["content"] != first.rejected["content"]
    assert len(pairs) > 30_000


# Encoding: drops, cuts and refusals, with a stand-in encoder whose ids are given.


class _Encoder:
    """Encodes [*prompt, reply] as given ids: the prompt's, then the reply's (all scored)."""

    def __init__(self, prompt_ids, reply_ids):
        self.prompt_ids, self.reply_ids = prompt_ids, reply_ids

    def encode(self, messages, where):
        del where
        reply = messages[-1]["content"]
        prompt = self.prompt_ids[reply] if isinstance(self.prompt_ids, dict) else self.prompt_ids
        ids = np.array([*prompt, *self.reply_ids[reply]], np.int32)
        mask = np.array([False] * len(prompt) + [True] * len(self.reply_ids[reply]))
        return ChatExample(ids, mask)


def _pair(chosen="good", rejected="bad"):
    return PreferencePair(
        (USER,),
        {"role": "assistant", "content": chosen},
        {"role": "assistant", "content": rejected},
        where="pairs.jsonl:7",
    )


def test_equal_replies_are_dropped_and_counted():
    encoder = _Encoder([1, 2, 3], {"good": [4, 5], "bad": [6]})
    examples, kept, counts = encode_pairs(encoder, [_pair(), _pair("same", "same")], 8, "train")
    assert len(examples) == len(kept) == 1 and counts.dropped["identical"] == 1
    assert counts.sizes("train")["train_dropped_identical"] == 1
    assert counts.first["identical"] == "pairs.jsonl:7"


def test_a_prompt_rendered_differently_before_each_reply_is_refused():
    encoder = _Encoder({"good": [1, 2, 3], "bad": [1, 2, 9]}, {"good": [4, 5], "bad": [6]})
    with pytest.raises(ValueError, match=r"pairs\.jsonl:7: its prompt renders to other tokens"):
        encode_pair(encoder, _pair(), 8, 0)


def test_replies_are_cut_at_their_end_and_an_empty_one_dropped():
    encoder = _Encoder([1, 2, 3], {"good": [4, 5, 6, 7], "bad": [8, 9]})
    # max_len 4: a row holds 5 tokens, the prompt's 3 and 2 of each reply.
    example, dropped, cut = encode_pair(encoder, _pair(), 4, 0)
    assert dropped is None and cut
    assert example.chosen.ids.tolist() == [1, 2, 3, 4, 5]
    assert example.rejected.ids.tolist() == [1, 2, 3, 8, 9]
    # max_len 2: the prompt fills the row, no reply token is left to score.
    _, dropped, _ = encode_pair(encoder, _pair(), 2, 0)
    assert dropped == "truncated"


def test_every_pair_dropped_is_refused_naming_why():
    encoder = _Encoder([1, 2, 3], {"same": [4]})
    with pytest.raises(ValueError, match=r"Every train preference pair was dropped, 2 chosen"):
        encode_pairs(encoder, [_pair("same", "same")] * 2, 8, "train")


# The task's options.


def _data(**fields):
    """What `configured` reads of a data section: the tasks' options, `dpo` given."""
    return types.SimpleNamespace(tasks=read_task_options({"dpo": fields}))


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"beta": 0.0}, r"--config.tasks.dpo.beta=0.0: must be > 0"),
        ({"beta": -0.5}, r"--config.tasks.dpo.beta=-0.5: must be > 0"),
        ({"beta": "0.1"}, r"--config.tasks.dpo.beta='0.1': must be a number"),
        ({"loss": "kto"}, r"--config.tasks.dpo.loss='kto': must be one of"),
        ({"reference": "copy"}, r"--config.tasks.dpo.reference='copy': must be one of"),
        ({"label_smoothing": 0.7}, r"--config.tasks.dpo.label_smoothing=0.7"),
        ({"loss": "ipo", "label_smoothing": 0.1}, r"--config.tasks.dpo.label_smoothing=0.1"),
        ({"gamma": 0.5}, r"--config.tasks.dpo.gamma=0.5: is not an option; it has \['beta'"),
    ],
)
def test_options_are_checked_in_one_line(fields, message):
    with pytest.raises(ValueError, match=message):
        get_task("dpo").configured(_data(**fields))


def test_options_reach_the_objective():
    task = get_task("dpo").configured(_data(loss="ipo", beta=0.5))
    assert task.objective.loss_type == "ipo" and task.objective.beta == 0.5
    assert task.reference == "precomputed"
    assert get_task("dpo").objective.loss_type == "sigmoid"  # the registry's is unchanged


def test_the_options_section_is_the_tasks_own():
    """The config's `tasks.dpo` section is made from the task's dataclass (no line of
    configs/default.py names a field), validated into `data.tasks.dpo`, and refused, naming
    the field, for a run of another task."""
    from configs import default
    from train.config import config_lib

    config = default.get_config()
    assert config.tasks.dpo.to_dict() == dataclasses.asdict(DpoOptions())
    experiment = config_lib.validate_config(config)
    assert experiment.data.tasks.dpo == DpoOptions()
    config.tasks.dpo.beta = 0.2
    with pytest.raises(ValueError, match=r"--config.tasks.dpo.beta=0.2: applies to task='dpo'"):
        config_lib.validate_config(config)


# End to end on a tiny model (slow: a run each).


@pytest.fixture(scope="module")
def verses():
    from train.formats.corpora.bibles import load_kjv_web_pairs

    return [(k, w) for k, w in load_kjv_web_pairs()[:2000] if len(k) + len(w) < 120][:60]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, verses):
    pytest.importorskip("transformers")
    from train.tiny_pretrained import write_tiny_model

    texts = [text for pair in verses for text in pair]
    root = tmp_path_factory.mktemp("dpo_model")
    return write_tiny_model(root, "llama", texts=texts, vocab_size=400, max_len=256, chat=True)


@pytest.fixture(scope="module")
def files(tmp_path_factory, verses):
    """40 train pairs (the WEB verse preferred to the KJV one; two equal), 8 validation."""
    root = tmp_path_factory.mktemp("dpo_data")
    records = [{"prompt": "Modernize: " + k, "chosen": w, "rejected": k} for k, w in verses]
    same = {"prompt": "Say it.", "chosen": "Amen.", "rejected": "Amen."}
    train = _write(root / "train.jsonl", [*records[:40], same, same])
    valid = _write(root / "valid.jsonl", records[40:48])
    return train, valid


def _config(model_dir, files, **overrides):
    from configs import dpo_smollm2

    config = dpo_smollm2.get_config()
    config.init_from = str(model_dir)
    config.corpus = "preference"
    config.corpus_path, config.valid_path = map(str, files)
    config.valid_fraction = config.test_fraction = 0.0
    config.max_len = 160
    config.batch_size = 8
    config.num_train_steps = 1
    config.warmup_steps = 0
    config.schedule = "constant"
    config.eval_every_steps = config.checkpoint_every_steps = 1000
    config.async_checkpoints = False
    config.bleu_examples = 0
    config.num_samples = 0
    config.update(overrides)
    return config


@pytest.mark.slow
def test_a_run_at_learning_rate_0_scores_ln2_and_logs_trl_metrics(tmp_path, model_dir, files):
    from train.program import loop

    results = loop.train_and_evaluate(_config(model_dir, files, learning_rate=0.0), tmp_path)
    valid = results["valid"]
    # The policy is its reference: every reward 0, the loss ln 2.
    assert valid["loss"] == pytest.approx(math.log(2), rel=1e-6)
    assert valid["tokens"] == 8  # pairs
    for key in ("rewards/chosen", "rewards/rejected", "rewards/margins"):
        assert valid[key] == pytest.approx(0.0, abs=1e-6)
    assert valid["logps/chosen"] < 0 and valid["logps/rejected"] < 0
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    splits = {r["split"]: r for r in records}
    for split in ("train", "valid"):
        assert {"rewards/accuracies", "logps/chosen", "logits/rejected"} <= set(splits[split])
    assert results["data"]["train_pairs"] == 40
    assert results["data"]["train_dropped_identical"] == 2
    saved = np.load(tmp_path / "reference_logps.npz")
    assert saved["train"].shape == (40, 2) and saved["valid"].shape == (8, 2)
    # The tuned model answers as a chat model (train.sample --chat).
    from train.sample import chat_replies

    (reply,) = chat_replies(tmp_path, ["Modernize: Jesus wept."], max_new_tokens=4)
    assert isinstance(reply, str)


@pytest.mark.slow
def test_training_raises_held_out_reward_accuracy(tmp_path, model_dir, files):
    from train.program import loop

    config = _config(model_dir, files, learning_rate=3e-3, num_train_steps=10)
    config.eval_every_steps = 10
    results = loop.train_and_evaluate(config, tmp_path)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["split"] == "train"]
    assert train[-1]["loss"] < math.log(2)
    assert results["valid"]["rewards/margins"] > 0


@pytest.mark.slow
def test_adapters_off_needs_adapters(tmp_path, model_dir, files):
    from train.program import loop

    config = _config(model_dir, files, tasks={"dpo": {"reference": "adapters_off"}})
    with pytest.raises(ValueError, match="tasks.dpo.reference=adapters_off: the model has no LoRA"):
        loop.train_and_evaluate(config, tmp_path)


@pytest.mark.slow
def test_adapters_off_is_the_base_model(tmp_path, model_dir, files):
    """With LoRA the reference can be the model with its adapters off: at step 0 (B = 0) it
    equals the policy, so the loss is ln 2 without any precomputed file."""
    from train.program import loop

    config = _config(
        model_dir, files, tasks={"dpo": {"reference": "adapters_off"}}, learning_rate=0.0
    )
    config.model.lora_rank = 4
    results = loop.train_and_evaluate(config, tmp_path)
    assert results["valid"]["loss"] == pytest.approx(math.log(2), rel=1e-6)
    assert not (tmp_path / "reference_logps.npz").exists()


@pytest.mark.slow
def test_a_resumed_run_reads_its_reference_back(tmp_path, model_dir, files):
    """Resuming after step 1 gives the run the reference of the starting weights (the file),
    not of the checkpoint's: the same validation as an uninterrupted run; without the file
    it is refused."""
    from train.program import loop

    config = _config(model_dir, files, learning_rate=3e-3, num_train_steps=2)
    whole = loop.train_and_evaluate(config, tmp_path / "whole")
    first = _config(model_dir, files, learning_rate=3e-3, num_train_steps=2)
    first.checkpoint_every_steps = 1
    stop = RuntimeError("stopped after step 1")

    def stop_after_1(step):
        if step == 1:
            raise stop

    with pytest.raises(RuntimeError, match="stopped after step 1"):
        loop.train_and_evaluate(first, tmp_path / "split", step_callback=stop_after_1)
    resumed = loop.train_and_evaluate(first, tmp_path / "split")
    assert resumed["valid"]["loss"] == pytest.approx(whole["valid"]["loss"], rel=1e-5)
    assert resumed["valid"]["rewards/margins"] == pytest.approx(
        whole["valid"]["rewards/margins"], rel=1e-4
    )
    (tmp_path / "split" / "reference_logps.npz").unlink()
    (tmp_path / "split" / "results.json").unlink()
    with pytest.raises(ValueError, match="reference_logps.npz is missing"):
        loop.train_and_evaluate(first, tmp_path / "split")
