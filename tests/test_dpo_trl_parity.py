"""Parity of the preference task with TRL's `DPOTrainer` (trl 1.16, requirements-torch.txt):
on a tiny random Llama with ChatML's template, the same conversational pairs and a reference
that differs from the policy, the first step's loss, `rewards/*`, `logps/*`, `logits/*` and
gradient norm equal TRL's to 1e-4 relative, for the objectives both have ('sigmoid', 'ipo';
TRL's SimPO lives in its experimental CPO trainer and is not compared).

Ours goes the run's way: pairs read as records (`train.formats.corpora.preferences.pair_of`),
rendered by our chat encoder, batched by the task's sides, loaded with
`flax_transformer.load_llama`, through `DpoTask.loss`.
"""

from __future__ import annotations

import copy
import types

import jax
import numpy as np
import optax
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

from flax_transformer import DecoderOnlyTransformer, load_llama  # noqa: E402
from train.config.tasks import read_task_options  # noqa: E402
from train.data.batching import bucketed_batches  # noqa: E402
from train.data.chat.examples import run_chat_encoder  # noqa: E402
from train.data.tokenizers import source_tokenizer  # noqa: E402
from train.formats.corpora.preferences import pair_of  # noqa: E402
from train.formats.sources import read_source  # noqa: E402
from train.tasks import get_task  # noqa: E402
from train.tasks.common.objective import LossSetup  # noqa: E402
from train.tasks.dpo.objective import PAIR_METRICS  # noqa: E402
from train.tiny_pretrained import write_tiny_model  # noqa: E402

# The goal of issue 61.
RTOL = 1e-4
BETA = 0.1
# How far the reference's weights are moved from the policy's (random normal, this std):
# enough that the rewards' margin is not a near-cancelling difference (at 0.05 it was 0.005,
# where float32 sums of ~-120 nats leave 3e-4 of it uncertain in either implementation).
REFERENCE_NOISE = 0.3

VERSES = [
    ("In the beginning God created the heaven and the earth.",
     "In the beginning, God created the heavens and the earth."),
    ("And God said, Let there be light: and there was light.",
     "God said, \"Let there be light,\" and there was light."),
    ("Jesus wept.", "Jesus wept!"),
    ("And the evening and the morning were the first day.",
     "There was evening and there was morning, the first day."),
]  # fmt: skip


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(model directory, policy, reference): the reference is the policy with noise added."""
    texts = [text for pair in VERSES for text in pair] * 10
    root = tmp_path_factory.mktemp("parity_model")
    model_dir = write_tiny_model(root, "llama", texts=texts, vocab_size=300, max_len=256, chat=True)
    policy = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    reference = copy.deepcopy(policy)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in reference.parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            parameter.add_(REFERENCE_NOISE * noise)
    return model_dir, policy, reference


def _records():
    return [
        {
            "prompt": [{"role": "user", "content": "Modernize: " + kjv}],
            "chosen": [{"role": "assistant", "content": web}],
            "rejected": [{"role": "assistant", "content": kjv}],
        }
        for kjv, web in VERSES
    ]


def _trl_first_step(models, loss_type, tmp_path):
    model_dir, policy, reference = models
    policy, reference = copy.deepcopy(policy), copy.deepcopy(reference)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    args = trl.DPOConfig(
        output_dir=str(tmp_path),
        beta=BETA,
        loss_type=[loss_type],
        per_device_train_batch_size=len(VERSES),
        max_length=None,
        report_to=[],
        use_cpu=True,
        bf16=False,
        learning_rate=0.0,
    )
    trainer = trl.DPOTrainer(
        model=policy,
        ref_model=reference,
        args=args,
        train_dataset=datasets.Dataset.from_list(_records()),
        processing_class=tokenizer,
    )
    batch = next(iter(trainer.get_train_dataloader()))
    trainer.model.train()
    loss = trainer.compute_loss(trainer.model, batch)
    loss.backward()
    grad_norm = torch.sqrt(
        sum((p.grad**2).sum() for p in policy.parameters() if p.grad is not None)
    )
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    ids = [
        (row["prompt_ids"] + row["chosen_ids"], row["prompt_ids"] + row["rejected_ids"])
        for row in trainer.train_dataset
    ]
    return float(loss), float(grad_norm), metrics, ids


def _our_first_step(models, loss_type):
    model_dir, policy, reference = models
    source = read_source(model_dir)
    encoder = run_chat_encoder(source_tokenizer(source), model_dir, train_on="last")
    pairs = [pair_of(record, f"pair {i}") for i, record in enumerate(_records())]
    task = get_task("dpo").configured(
        types.SimpleNamespace(tasks=read_task_options({"dpo": dict(loss=loss_type, beta=BETA)}))
    )
    from train.tasks.dpo.pairs import encode_pairs

    examples, _, _ = encode_pairs(encoder, pairs, 256, "train")
    config, variables = load_llama(policy)
    _, reference_variables = load_llama(reference)
    longest = max(task.example_length(x) for x in examples)
    (batch,) = bucketed_batches(
        task.sides,
        [task.to_sides(x) for x in examples],
        bucket_lengths=(longest,),
        batch_size=len(examples),
        pad_id=config.pad_id,
    )
    model = DecoderOnlyTransformer(config)
    setup = LossSetup(config.pad_id, 0.0, drop_pad_logit=True)
    chosen, rejected = task._logps(
        model, reference_variables["params"], batch, setup, deterministic=True
    )
    batch["reference"] = np.stack([np.asarray(chosen[0]), np.asarray(rejected[0])], axis=1)

    def loss_fn(params):
        return task.loss(model, params, batch, setup, deterministic=True)

    (loss, sums), grads = jax.value_and_grad(loss_fn, has_aux=True)(variables["params"])
    metrics = {k: float(sums[k]) / float(sums["tokens"]) for k in PAIR_METRICS}
    ids = [(x.chosen.ids.tolist(), x.rejected.ids.tolist()) for x in examples]
    return float(loss), float(optax.global_norm(grads)), metrics, ids


@pytest.mark.slow  # ~30 s a loss type on 2 cores (TRL's trainer set up each time)
@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo"])
def test_first_step_equals_trl(models, loss_type, tmp_path):
    trl_loss, trl_norm, trl_metrics, trl_ids = _trl_first_step(models, loss_type, tmp_path)
    loss, norm, metrics, ids = _our_first_step(models, loss_type)
    # The same tokens: each side is the prompt, the reply and its end of turn.
    assert sorted(ids) == sorted(trl_ids)
    assert loss == pytest.approx(trl_loss, rel=RTOL)
    assert norm == pytest.approx(trl_norm, rel=RTOL)
    for key in PAIR_METRICS:
        assert metrics[key] == pytest.approx(trl_metrics[key], rel=RTOL), key
    # A reference apart from the policy: the rewards are not all zero.
    assert abs(metrics["rewards/margins"]) > 1e-3
