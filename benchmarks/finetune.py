"""Fine-tuning figures, offline: parity with transformers, loss before and after, and what
LoRA saves against full fine-tuning.

    python -m benchmarks.finetune                  # GPT-2 and Llama, tiny random models
    python -m benchmarks.finetune --steps 300

For each family, a random model written by `train.tiny_pretrained` (width 64, 4 layers,
byte-level BPE of 1,000 ids trained on KJV verses) is fine-tuned on KJV verses through
`train.train_and_evaluate`:

- parity: the first training batch's loss against transformers' on the same ids, and the
  exported directory's logits (transformers) against the run's own;
- the validation loss before (learning rate 0) and after `--steps` steps of full
  fine-tuning, and after LoRA (rank 8 on q, v, o, up, down) of as many steps;
- trainable parameters and optimizer-state bytes, full against LoRA.

Needs torch and transformers (requirements-torch.txt).
"""

from __future__ import annotations

import argparse
import logging
import pathlib
import platform
import tempfile

import jax
import numpy as np


def _config(model_dir, corpus, **overrides):
    from configs import finetune_gpt2

    config = finetune_gpt2.get_config()
    config.init_from = str(model_dir)
    config.corpus, config.corpus_path = "text", str(corpus)
    config.max_len, config.batch_size = 64, 16
    config.valid_fraction, config.test_fraction = 0.05, 0.0
    config.model.dropout_rate = 0.0
    config.schedule, config.warmup_steps = "cosine", 10
    config.eval_every_steps = config.checkpoint_every_steps = 10_000
    config.num_eval_batches = 0
    config.sample_prompts = ()
    for key, value in overrides.items():
        target = config.model if key.startswith("model.") else config
        target[key.removeprefix("model.")] = value
    return config


def _first_batch(config, workdir):
    """(our first-batch loss, transformers' on the same ids, trainable, optimizer bytes)."""
    import torch
    import transformers

    from train.config import config_lib
    from train.core.rundir import RunDir, prepare_workdir
    from train.program import finetune
    from train.program import loop as train_lib
    from train.program.checkpoint import Checkpointer

    experiment = config_lib.validate_config(config)
    run = RunDir(prepare_workdir(str(workdir)))
    checkpointer = Checkpointer(run.path, keep=1, asynchronous=False)
    try:
        start = train_lib._start(experiment, run, checkpointer)
    finally:
        checkpointer.close()
    batch = next(iter(start.stream))
    _, metrics = start.program.train_step(start.state, start.program.put_batch(batch))
    ours = float(metrics["loss"] / metrics["tokens"])
    vocab = experiment.model.pad_id
    inputs, targets = np.asarray(batch["inputs"]), np.asarray(batch["targets"])
    real = targets != vocab
    hf = transformers.AutoModelForCausalLM.from_pretrained(config.init_from, dtype=torch.float32)
    with torch.no_grad():
        logits = hf(torch.as_tensor(np.where(inputs == vocab, 0, inputs))).logits[..., :vocab]
    logp = torch.log_softmax(logits, -1).numpy()
    nll = -np.take_along_axis(logp, np.where(real, targets, 0)[..., None], -1)[..., 0]
    labels = finetune.param_labels(experiment.optimizer, experiment.model)(start.state.params)
    trainable = sum(
        x.size
        for x, g in zip(jax.tree.leaves(start.state.params), jax.tree.leaves(labels), strict=True)
        if g != "frozen"
    )
    state_bytes = sum(x.nbytes for x in jax.tree.leaves(start.state.opt_state))
    total = sum(x.size for x in jax.tree.leaves(start.state.params))
    return ours, float(nll[real].mean()), trainable, total, state_bytes


def _export_gap(workdir, out) -> float:
    import torch
    import transformers

    from train.export import export_run
    from train.program.trained import load_trained

    export_run(workdir, out)
    trained = load_trained(workdir)
    vocab = trained.model.config.pad_id
    ids = np.asarray([trained.tokenizer.encode("And God said, Let there be light")])
    ours = np.asarray(trained.model.apply({"params": trained.params}, ids))[..., :vocab]
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    with torch.no_grad():
        theirs = hf(torch.as_tensor(ids)).logits[..., :vocab].numpy()
    return float(np.abs(ours - theirs).max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    logging.disable(logging.INFO)
    from train.formats.corpora.bibles import load_kjv_lines
    from train.program import loop as train_lib
    from train.tiny_pretrained import write_tiny_model

    lines = load_kjv_lines()
    print(f"machine: {platform.processor() or platform.machine()}; jax {jax.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        corpus = tmp / "kjv.txt"
        corpus.write_text("\n".join(lines[:8000]) + "\n", encoding="utf-8")
        rows = []
        for family in ("gpt2", "llama"):
            model_dir = write_tiny_model(
                tmp / family, family, texts=lines[8000:14000], vocab_size=1000, d_model=64,
                num_layers=4, max_len=128,
            )  # fmt: skip
            ours, theirs, full_trainable, total, full_bytes = _first_batch(
                _config(model_dir, corpus), tmp / f"{family}-probe"
            )
            before = train_lib.train_and_evaluate(
                _config(model_dir, corpus, learning_rate=0.0, num_train_steps=1),
                str(tmp / f"{family}-lr0"),
            )["valid"]["loss"]
            after = train_lib.train_and_evaluate(
                _config(model_dir, corpus, learning_rate=1e-3, num_train_steps=args.steps),
                str(tmp / f"{family}-full"),
            )["valid"]["loss"]
            gap = _export_gap(tmp / f"{family}-full", tmp / f"{family}-export")
            lora = {"model.lora_rank": 8, "model.lora_targets": ("q", "v", "o", "up", "down")}
            _, _, lora_trainable, _, lora_bytes = _first_batch(
                _config(model_dir, corpus, **lora), tmp / f"{family}-lora-probe"
            )
            lora_after = train_lib.train_and_evaluate(
                _config(model_dir, corpus, learning_rate=3e-3, num_train_steps=args.steps, **lora),
                str(tmp / f"{family}-lora"),
            )["valid"]["loss"]
            rows.append(
                f"| {family} | {abs(ours - theirs):.1e} | {gap:.1e} | {before:.3f} | "
                f"{after:.3f} | {lora_after:.3f} | {full_trainable:,} / {total:,} | "
                f"{lora_trainable:,} | {full_bytes / 2**10:,.0f} KiB | "
                f"{lora_bytes / 2**10:,.0f} KiB |"
            )
        print(
            f"| family | first-batch loss vs transformers | export logits vs ours | valid loss "
            f"before | after {args.steps} steps full | after LoRA | trainable full / all | "
            "trainable LoRA | optimizer state full | LoRA |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|")
        print("\n".join(rows))


if __name__ == "__main__":
    main()
