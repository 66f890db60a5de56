"""The paper's base model and recipe (Vaswani et al. 2017, Table 3 "base", section 5).

N=6 layers, d_model=512, h=8, d_ff=2048, dropout 0.1, label smoothing 0.1, Adam(0.9, 0.98,
1e-9), 4000 warm-up steps then inverse-square-root decay, ~25k source + 25k target tokens per
batch, 100k steps, beam 4 with length penalty 0.6. Sized for an accelerator:

    python -m train.main --config configs/transformer_base.py --workdir runs/base

The paper trained on WMT14 En-De (4.5M pairs, 37k shared BPE); offline we default to the
Japanese-English Bible, whose 60k sentences support a smaller vocabulary. For WMT, pass
`--config.corpus=tsv --config.corpus_path=wmt.tsv --config.vocab_size=37000`.
"""

import ml_collections

from configs import default

D_MODEL = 512
WARMUP_STEPS = 4000


def get_config() -> ml_collections.ConfigDict:
    """Transformer base: every field not set here is as in configs/default.py."""
    config = default.get_config()
    config.corpus = "bible"  # the Japanese-English Bible (configs/default.py is KJV -> WEB)
    config.corpora.bible.direction = "ja-en"  # source Japanese, target English
    config.copy_baseline = False  # copying Japanese into English is no baseline
    config.copied_targets = 0.0  # the paper trains on real pairs only
    config.vocab_size = 16000  # shared SentencePiece vocabulary (paper: 37000 BPE on WMT)
    config.max_len = 256  # longest example in tokens (model max_len)
    config.bucket_lengths = ()  # powers of two from 8 up to max_len
    config.tokens_per_batch = 24576  # padded tokens per batch (paper: ~25k per side); 3 x 8192
    # so that every bucket's rows (3072 at length 8 ... 96 at 256) split over 8 or 16 GPUs

    config.model.d_model = D_MODEL  # model width (paper: 512)
    config.model.num_heads = 8  # attention heads (paper: 8)
    config.model.d_ff = 2048  # feed-forward width (paper: 2048)
    config.model.num_layers = 6  # layers per stack (paper: N = 6)
    config.model.dropout_rate = 0.1  # residual and embedding dropout (paper: P_drop = 0.1)
    config.model.norm_position = "post"  # the paper's LayerNorm(x + Sublayer(x))
    config.model.dtype = "bfloat16"  # compute dtype on accelerators (params stay float32)

    config.optimizer.name = "adam"  # paper: Adam
    # Paper eq. 3: lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), whose peak at
    # step = warmup is (d_model * warmup)^-0.5 ~= 7.0e-4.
    config.learning_rate = (D_MODEL * WARMUP_STEPS) ** -0.5  # peak learning rate
    config.schedule = "rsqrt"  # warm-up then inverse square root (paper)
    config.warmup_steps = WARMUP_STEPS  # paper: 4000
    config.b1 = 0.9  # paper: beta1 = 0.9
    config.b2 = 0.98  # paper: beta2 = 0.98
    config.eps = 1e-9  # paper: epsilon = 1e-9
    config.grad_clip_norm = 0.0  # the paper does not clip
    config.label_smoothing = 0.1  # paper: eps_ls = 0.1
    config.num_train_steps = 100_000  # paper: 100k steps (12 hours on 8 P100s)

    config.log_every_steps = 100  # train metrics period
    config.eval_every_steps = 1000  # validation period
    config.checkpoint_every_steps = 1000  # checkpoint period
    config.keep_checkpoints = 5  # the paper averages the last 5 checkpoints
    config.bleu_every_steps = 10_000  # BLEU/chrF during training
    config.bleu_examples = 1000  # sentences translated for BLEU
    config.decode_batch_size = 128  # sentences decoded together
    config.beam_size = 4  # paper: beam 4
    config.length_penalty = 0.6  # paper: alpha = 0.6
    return config
