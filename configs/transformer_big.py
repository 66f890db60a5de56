"""The paper's big model (Vaswani et al. 2017, Table 3 "big"): d_model=1024, h=16,
d_ff=4096, dropout 0.3, 300k steps; the rest of the recipe as transformer_base.

    python -m train.main --config configs/transformer_big.py --workdir runs/big
"""

import ml_collections

from configs import transformer_base

D_MODEL = 1024


def get_config() -> ml_collections.ConfigDict:
    """Transformer big: every field not set here is as in configs/transformer_base.py."""
    config = transformer_base.get_config()
    config.model.d_model = D_MODEL  # model width (paper: 1024)
    config.model.num_heads = 16  # attention heads (paper: 16)
    config.model.d_ff = 4096  # feed-forward width (paper: 4096)
    config.model.dropout_rate = 0.3  # paper: P_drop = 0.3 for EN-DE (0.1 for EN-FR)
    config.model.scan_layers = True  # nn.scan: compile time flat in depth at this size
    # Paper eq. 3 with d_model = 1024: peak (d_model * warmup)^-0.5 ~= 4.9e-4.
    config.learning_rate = (D_MODEL * transformer_base.WARMUP_STEPS) ** -0.5  # peak lr
    config.num_train_steps = 300_000  # paper: 300k steps (3.5 days on 8 P100s)
    return config
