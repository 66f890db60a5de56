"""Tiny corpora and configs for the training-program tests (no corpus package needed)."""

import pathlib
import random

import ml_collections
import numpy as np

from configs import default
from train.config.sections import DataConfig
from train.data import dataset
from train.data.pipeline import in_memory
from train.data.tokenizer import model_vocab_size
from train.data.tokenizers import Vocabulary, vocabulary
from train.tasks import get_task

# A learnable toy translation: the source words reversed and upper-cased.
WORDS = ("ab", "cd", "ef", "gh", "ij", "kl", "mn", "op")
NUM_PAIRS = 300
MAX_WORDS = 4


def write_tiny_tsv(directory: pathlib.Path, num_pairs: int = NUM_PAIRS) -> pathlib.Path:
    """A parallel TSV of `num_pairs` toy pairs, deterministic."""
    rng = random.Random(0)
    lines = []
    for _ in range(num_pairs):
        words = [rng.choice(WORDS) for _ in range(rng.randint(1, MAX_WORDS))]
        lines.append(" ".join(words) + "\t" + " ".join(w.upper() for w in reversed(words)))
    path = directory / "pairs.tsv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_tiny_text(directory: pathlib.Path, num_lines: int = 200) -> pathlib.Path:
    """A plain-text corpus of toy lines for the language model."""
    rng = random.Random(1)
    lines = [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6))) for _ in range(num_lines)
    ]
    path = directory / "lines.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def tiny_config(corpus_path: pathlib.Path, **overrides) -> ml_collections.ConfigDict:
    """The default config shrunk to seconds: byte tokenizer, one bucket, a 1-layer model."""
    config = default.get_config()
    config.corpus = "tsv"
    config.corpus_path = str(corpus_path)
    config.tokenizer = "byte"
    config.valid_fraction = 0.1
    config.test_fraction = 0.0
    config.max_len = 16
    config.bucket_lengths = (16,)
    config.batch_size = 16
    config.tokens_per_batch = 0
    config.model.update(d_model=32, num_heads=2, d_ff=64, num_layers=1)
    config.learning_rate = 3e-3
    config.warmup_steps = 5
    config.num_train_steps = 8
    config.log_every_steps = 2
    config.eval_every_steps = 4
    config.checkpoint_every_steps = 4
    config.bleu_examples = 4
    config.decode_batch_size = 4
    config.max_decode_len = 12
    config.num_samples = 2
    # The default recipe's extras off: no BLEU during training, no beam pass, no copies.
    config.bleu_every_steps = 0
    config.report_beam_size = 1
    config.copied_targets = 0.0
    config.copy_baseline = False
    for key, value in overrides.items():
        target = config
        *parents, leaf = key.split(".")
        for parent in parents:
            target = target[parent]
        target[leaf] = value
    return config


def dataset_of(config: ml_collections.ConfigDict, run, **options) -> dataset.Dataset:
    """`in_memory.build_dataset` as the program calls it: the config's data section and
    seed (`options`: num_devices, share, make_tokenizer)."""
    data = DataConfig.from_config(config)
    return in_memory.build_dataset(data, run, task=get_task(data.task), seed=config.seed, **options)


def random_pairs(n: int, max_len: int, seed: int = 0) -> list:
    """n (source, target) id lists of random lengths (source 1..max_len, target 1..max_len-1)."""
    rng = np.random.default_rng(seed)
    return [
        (
            list(rng.integers(3, 50, rng.integers(1, max_len + 1))),
            list(rng.integers(3, 50, rng.integers(1, max_len))),
        )
        for _ in range(n)
    ]


def vocabulary_of(data: DataConfig) -> Vocabulary:
    """The `Vocabulary` a run of this data section resolves (no pretrained model): what the
    token store functions take."""
    return vocabulary(data, model_vocab_size(data.tokenizer, data.vocab_size))
