"""Fine-tune a pretrained GPT-2 or Llama-family model on the King James Bible: needs a local
Hugging Face model directory (`save_pretrained`: config.json, model.safetensors,
tokenizer.json); nothing is downloaded.

    python -m train.tiny_pretrained --out /tmp/tiny-gpt2       # a tiny stand-in, offline
    python -m train.main --config configs/finetune_gpt2.py \\
        --config.init_from=/tmp/tiny-gpt2 --workdir runs/finetune
    python -m train.sample --workdir runs/finetune --prompt "And God said"
    python -m train.export --workdir runs/finetune --out /tmp/tiny-gpt2-kjv

With a real checkpoint (e.g. `gpt2` saved with `save_pretrained` on a machine that can
download it), only --config.init_from changes. The model's architecture comes from the
directory, so every architecture field below is None, and so are the dropout rates (the
checkpoint's own unless given); the run chooses the rest (dtype, scan_layers, LoRA).
docs/training.md "Fine-tune a pretrained model" explains the options.
"""

import ml_collections
from ml_collections.config_dict import placeholder

from configs import lm_kjv
from train.formats.sources import ARCHITECTURE_FIELDS


def get_config() -> ml_collections.ConfigDict:
    """The KJV language model of configs/lm_kjv.py, started from `init_from`'s weights."""
    config = lm_kjv.get_config()
    config.init_from = ""  # required: --config.init_from=DIR
    config.tokenizer = "pretrained"  # the model's own tokenizer.json
    config.max_len = 128  # tokens per window (at most the model's context)
    for name in ARCHITECTURE_FIELDS:
        if name in config.model:
            # None, typed as before (so an override still parses): from config.json.
            config.model[name] = placeholder(config.model.get_ref(name).get_type())
    # None: the checkpoint's own rates (GPT-2's resid_pdrop/attn_pdrop, 0.1; the Llama
    # family's 0): a model pretrained without dropout is not wrecked by one it never saw
    # (SmolLM2-135M at learning rate 0: first loss 8.93 with 0.1, 3.93 with its own 0).
    config.model.dropout_rate = placeholder(float)
    config.model.attention_dropout_rate = placeholder(float)

    config.learning_rate = 1e-4  # fine-tuning: a tenth of pretraining rates and less
    config.warmup_steps = 20
    config.weight_decay = 0.0
    config.num_train_steps = 200
    config.eval_every_steps = 100
    config.checkpoint_every_steps = 100
    config.freeze = ""  # e.g. 'embeddings' or 'embeddings,layers:2'
    config.pretrained_lr_scale = 1.0
    return config
