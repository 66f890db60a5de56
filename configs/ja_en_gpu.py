"""Japanese -> English on one GPU: the paper's base model in bf16, for a short run.

    pip install -U "jax[cuda12]"   # the GPU build of JAX, after requirements.txt
    python -m train.main --config configs/ja_en_gpu.py --workdir runs/ja_en_gpu

Transformer base (configs/transformer_base.py: N 6, d 512, h 8, d_ff 2048, dropout 0.1,
bf16 compute with float32 parameters) with a batch of ~32k padded tokens per side, which an
80 GB-class GPU holds without remat, and a short-run schedule: 1,000 warm-up steps, then a
cosine decay to zero at the last step (the paper's inverse square root suits 100k steps,
not a few thousand). Unmeasured: it has never run on a GPU here (none was lent), so its
wall time and results are unknown; the README's results table records only what ran.
"""

import ml_collections

from configs import transformer_base


def get_config() -> ml_collections.ConfigDict:
    """Base model on one GPU: every field not set here is as in transformer_base.py."""
    config = transformer_base.get_config()
    config.tokens_per_batch = 32768  # padded tokens per batch (paper: ~25k per side)
    config.learning_rate = 1e-3  # peak learning rate (the paper's schedule peaks at 7e-4)
    config.schedule = "cosine"  # warm-up then cosine to 0: a run of a few thousand steps
    config.warmup_steps = 1000  # linear warm-up steps
    config.grad_clip_norm = 1.0  # clip the global gradient norm (safety in bf16)
    config.num_train_steps = 6000  # training steps (wall time unmeasured: never run on a GPU)
    config.eval_every_steps = 1000  # validation period
    config.checkpoint_every_steps = 1000  # checkpoint period
    config.bleu_every_steps = 2000  # validation BLEU during training
    config.bleu_examples = 300  # validation sentences translated for BLEU
    return config
