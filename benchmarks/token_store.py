"""Token stores (issue 33): preparation speed, a run's memory and start-up against corpus
size, and the loader's tokens per second, all measured in one run.

    python benchmarks/token_store.py [--sizes_mb 25,100,400] [--memory_sizes_mb 25] \\
        [--out /tmp/token_store_bench]

Corpora: plain-text files of synthetic verse-like lines (10 to 40 words drawn, with their
frequencies, from the KJV's verses by a seeded RNG), one per size, written under `--out`
with the stores and run directories (nothing goes into the repository). The data fields are
configs/lm_kjv_llama.py's (SentencePiece, vocab 4000, max_len 128), corpus='text'.

1. Preparation: the `--prep_mb` corpus (the second size by default) prepared into two fresh
   stores, with 1 and with 2 worker processes (`store_prepare.prepare_store`), shards of
   `--shard_mb`. The tokenizer stage (plan, the sample pass over the corpus, SentencePiece
   training) is timed apart from the shard tokenizing; tokens/s is the stored tokens (train
   and validation, BOS and EOS included) over the tokenizing time alone.
2. A run per size: `python -m train.main` (through a wrapper that records the time of step 1
   via `step_callback`) with a tiny model for 2 steps on the prepared store, under
   `/usr/bin/time -v` for its peak RSS (`resource.getrusage` where that is missing), with
   JAX_PLATFORMS=cpu. Time to first step is from just before the process is started to the
   end of step 1 (imports, opening and checking the store, compiling, the step). The same run
   with `--config.store_dir=''` (the corpus read and tokenized in memory) at the sizes of
   `--memory_sizes_mb`, for comparison.
3. The loader: `store_pipeline.train_batches` over the largest store, windows of 128 and
   2048 tokens, batch 64, for the whole batch and for share 1 of 4; tokens/s of this
   process's rows over `--loader_batches` batches after a warm-up.

The machine's cores, load, memory and a 2048x2048 float32 numpy matmul rate are printed
before and after (the figures are only as steady as the machine).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CONFIG = ROOT / "configs" / "lm_kjv_llama.py"
TINY_MODEL = (
    "--config.model.num_layers=1",
    "--config.model.d_model=64",
    "--config.model.d_ff=128",
    "--config.model.num_heads=2",
    "--config.model.num_kv_heads=1",
    "--config.num_train_steps=2",
    "--config.sample_prompts=()",
    "--config.num_eval_batches=1",
    "--config.eval_every_steps=2",
    "--config.checkpoint_every_steps=2",
)
# Runs train.main, writing the wall time at the end of step 1 to $BENCH_STEP_FILE.
_TIMED_MAIN = (
    "import os, sys, time\n"
    "from train import main\nfrom train.program import loop as train_lib\n"
    "real = train_lib.train_and_evaluate\n"
    "def mark(step):\n"
    "    if step == 1:\n"
    "        with open(os.environ['BENCH_STEP_FILE'], 'w') as f:\n"
    "            f.write(repr(time.time()))\n"
    "train_lib.train_and_evaluate = lambda c, w: real(c, w, step_callback=mark)\n"
    "sys.argv = ['train.main', *sys.argv[1:]]\n"
    "main.run()\n"
)
# Llama_1b on a v5e-256: 1M tokens per step over 64 hosts in about 0.35 s.
HOST_TOKENS_PER_S = 2**20 / 64 / 0.35


def machine_state() -> dict:
    """Cores, load, available memory and a 2048x2048 float32 matmul rate now."""
    a = np.random.default_rng(0).random((2048, 2048), dtype=np.float32)
    a @ a
    start = time.perf_counter()
    for _ in range(10):
        a @ a
    gflops = 2 * 2048**3 * 10 / (time.perf_counter() - start) / 1e9
    meminfo = dict(
        line.split(":", 1) for line in pathlib.Path("/proc/meminfo").read_text().splitlines()
    )
    return {
        "nproc": os.cpu_count(),
        "load": os.getloadavg(),
        "mem_total_gib": int(meminfo["MemTotal"].split()[0]) / 2**20,
        "mem_available_gib": int(meminfo["MemAvailable"].split()[0]) / 2**20,
        "matmul_gflops": gflops,
    }


def make_corpus(path: pathlib.Path, size_mb: float, seed: int) -> None:
    """Writes about `size_mb` MB of lines of 10 to 40 KJV words (unigram frequencies)."""
    from train.formats.corpora.bibles import load_kjv_lines

    words = [w for line in load_kjv_lines() for w in line.split()]
    vocab, flat = np.unique(np.array(words), return_inverse=True)
    # Each word twice: followed by a space, or ending its line.
    table = [f"{w} ".encode() for w in vocab] + [f"{w}\n".encode() for w in vocab]
    rng = np.random.default_rng(seed)
    target, written = int(size_mb * 1e6), 0
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        while written < target:
            lengths = rng.integers(10, 41, 5_000)
            ids = flat[rng.integers(0, len(flat), int(lengths.sum()))]
            ids[np.cumsum(lengths) - 1] += len(vocab)
            chunk = b"".join(map(table.__getitem__, ids.tolist()))
            if written + len(chunk) > target:  # stop at the line that reaches the size
                chunk = chunk[: chunk.index(b"\n", target - written) + 1]
            f.write(chunk)
            written += len(chunk)
    tmp.replace(path)


def data_section(corpus: pathlib.Path, store: pathlib.Path, shard_mb: int):
    """lm_kjv_llama's data section for a text corpus and a store directory."""
    from configs import lm_kjv_llama
    from train.config.sections import DataConfig

    config = lm_kjv_llama.get_config()
    config.corpus = "text"
    config.corpus_path = str(corpus)
    config.store_dir = str(store)
    config.store_shard_bytes = shard_mb << 20
    return DataConfig.from_config(config)


def prepare(corpus, store, shard_mb: int, workers: int, time_sample: bool) -> dict:
    """Prepares a fresh store: the tokenizer stage and the shard stage timed apart."""
    from train.data.store import store_prepare
    from train.data.tokenizer import model_vocab_size
    from train.data.tokenizers import vocabulary

    shutil.rmtree(store, ignore_errors=True)
    data = data_section(corpus, store, shard_mb)
    ids = vocabulary(data, model_vocab_size(data.tokenizer, data.vocab_size))
    result = {"workers": workers}
    if time_sample:
        sources = store_prepare.plan_shards(data)
        start = time.perf_counter()
        store_prepare.tokenizer_sample(sources, data, workers)
        result["sample_pass_s"] = time.perf_counter() - start
    start = time.perf_counter()
    sources = store_prepare.prepare_plan_and_tokenizer(data, ids, workers=workers)
    result["tokenizer_s"] = time.perf_counter() - start
    start = time.perf_counter()
    opened = store_prepare.prepare_store(data, ids, workers=workers, progress=False)
    result["shards_s"] = time.perf_counter() - start
    totals = opened.manifest["totals"]
    result["shards"] = len(sources)
    result["tokens"] = totals["train"]["tokens"] + totals["valid"]["tokens"]
    result["train_tokens"] = totals["train"]["tokens"]
    result["tokens_per_s"] = result["tokens"] / result["shards_s"]
    return result


def timed_run(corpus, store: str, workdir: pathlib.Path) -> dict:
    """train.main for 2 steps of the tiny model: peak RSS and time to the end of step 1."""
    shutil.rmtree(workdir, ignore_errors=True)
    step_file = workdir.with_suffix(".step")
    step_file.unlink(missing_ok=True)
    args = [
        "-c",
        _TIMED_MAIN,
        f"--config={CONFIG}",
        f"--workdir={workdir}",
        f"--config.store_dir={store}",
        "--config.corpus=text",
        f"--config.corpus_path={corpus}",
        *TINY_MODEL,
    ]
    env = dict(os.environ, JAX_PLATFORMS="cpu", BENCH_STEP_FILE=str(step_file))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    gnu_time = shutil.which("time") or ("/usr/bin/time" if os.path.exists("/usr/bin/time") else "")
    with tempfile.NamedTemporaryFile("r", suffix=".time") as report:
        command = [sys.executable, *args]
        if gnu_time:
            command = [gnu_time, "-v", "-o", report.name, *command]
        start = time.time()
        proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        end = time.time()
        text = report.read()
    if proc.returncode != 0:
        raise RuntimeError(f"train.main failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    if gnu_time:
        rss_kib = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)[1])
    else:
        import resource

        rss_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # largest child so far
    return {
        "peak_rss_mib": rss_kib / 1024,
        "first_step_s": float(step_file.read_text()) - start,
        "total_s": end - start,
    }


def loader_rate(store_dir, seq_len: int, batch: int, share, warmup: int, batches: int) -> dict:
    """This process's tokens/s from train_batches after `warmup` batches."""
    from train.data.store.store_pipeline import WindowSource, train_batches
    from train.data.store.token_store import TokenStore

    source = WindowSource(TokenStore.open(store_dir), "train", seq_len, segments=False)
    iterator = train_batches(
        source, seed=0, batch_size=batch, share=share, num_steps=warmup + batches
    )
    for _ in range(warmup):
        next(iterator)
    start, tokens = time.perf_counter(), 0
    for item in iterator:
        tokens += item["inputs"].size
    elapsed = time.perf_counter() - start
    return {
        "seq_len": seq_len,
        "batch": batch,
        "share": f"{share.index + 1} of {share.count}",
        "tokens_per_s": tokens / elapsed,
        "windows": len(source),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes_mb", default="25,100,400")
    parser.add_argument("--memory_sizes_mb", default="25", help="'' for none")
    parser.add_argument("--prep_mb", type=float, default=None, help="default: the 2nd size")
    parser.add_argument("--shard_mb", type=int, default=16)
    parser.add_argument("--loader_batches", type=int, default=40)
    parser.add_argument("--out", default="/tmp/token_store_bench")
    flags = parser.parse_args()
    from train.data.batching import RowShare

    sizes = [float(s) for s in flags.sizes_mb.split(",")]
    memory_sizes = [float(s) for s in flags.memory_sizes_mb.split(",") if s]
    prep_mb = flags.prep_mb or sizes[min(1, len(sizes) - 1)]
    out = pathlib.Path(flags.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {"command": " ".join(sys.argv), "before": machine_state()}
    print("machine before:", results["before"], flush=True)

    corpora = {}
    for size in sorted({*sizes, *memory_sizes, prep_mb}):
        corpora[size] = out / f"corpus_{size:g}mb.txt"
        if not corpora[size].exists():
            start = time.perf_counter()
            make_corpus(corpora[size], size, seed=int(size))
            print(f"corpus {size:g} MB written in {time.perf_counter() - start:.1f} s", flush=True)

    # 1. Preparation with 1 and 2 workers, fresh stores of the same corpus.
    stores = {}
    results["prepare"] = []
    for workers in (1, 2):
        store = out / f"store_{prep_mb:g}mb_w{workers}"
        row = prepare(corpora[prep_mb], store, flags.shard_mb, workers, time_sample=workers == 1)
        row["corpus_mb"] = prep_mb
        results["prepare"].append(row)
        stores[prep_mb] = store
        print("prepare:", row, flush=True)
    for size in sizes:
        if size not in stores:
            stores[size] = out / f"store_{size:g}mb"
            row = prepare(corpora[size], stores[size], flags.shard_mb, 2, time_sample=False)
            row["corpus_mb"] = size
            results["prepare"].append(row)
            print("prepare:", row, flush=True)

    # 2. A short training run per size, from the store and (some sizes) in memory.
    results["runs"] = []
    for size in sizes:
        row = {"corpus_mb": size, "path": "store"}
        row.update(timed_run(corpora[size], str(stores[size]), out / f"run_store_{size:g}"))
        results["runs"].append(row)
        print("run:", row, flush=True)
    for size in memory_sizes:
        row = {"corpus_mb": size, "path": "in memory"}
        row.update(timed_run(corpora[size], "", out / f"run_memory_{size:g}"))
        results["runs"].append(row)
        print("run:", row, flush=True)

    # 3. The loader over the largest store.
    results["loader"] = []
    largest = stores[max(sizes)]
    for seq_len in (128, 2048):
        for share in (RowShare(0, 1), RowShare(0, 4)):
            batches = flags.loader_batches * (4 if seq_len == 128 else 1)
            row = loader_rate(largest, seq_len, 64, share, warmup=5, batches=batches)
            row["corpus_mb"] = max(sizes)
            results["loader"].append(row)
            print("loader:", row, flush=True)

    results["after"] = machine_state()
    print("machine after:", results["after"], flush=True)
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    print_table(results)


def print_table(results: dict) -> None:
    for key in ("before", "after"):
        m = results[key]
        print(
            f"machine {key}: {m['nproc']} CPUs, load {m['load'][0]:.2f}, "
            f"{m['mem_available_gib']:.1f} of {m['mem_total_gib']:.1f} GiB available, "
            f"matmul {m['matmul_gflops']:.0f} GFLOP/s"
        )
    print(
        "\n| corpus | workers | shards | tokens | tokenizer stage | shard tokenizing | tokens/s |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in results["prepare"]:
        sample = f" (sample pass {r['sample_pass_s']:.1f} s)" if "sample_pass_s" in r else ""
        print(
            f"| {r['corpus_mb']:g} MB | {r['workers']} | {r['shards']} | {r['tokens'] / 1e6:.1f}M "
            f"| {r['tokenizer_s']:.1f} s{sample} | {r['shards_s']:.1f} s "
            f"| {r['tokens_per_s'] / 1e6:.2f}M |"
        )
    print("\n| corpus | data path | peak RSS | start to end of step 1 | whole run |")
    print("|---|---|---|---|---|")
    for r in results["runs"]:
        print(
            f"| {r['corpus_mb']:g} MB | {r['path']} | {r['peak_rss_mib']:.0f} MiB "
            f"| {r['first_step_s']:.1f} s | {r['total_s']:.1f} s |"
        )
    store_runs = [r for r in results["runs"] if r["path"] == "store"]
    rss = [r["peak_rss_mib"] for r in store_runs]
    print(f"store runs: largest/smallest peak RSS = {max(rss) / min(rss):.2f} (goal <= 1.2)")
    print("\n| window | rows of | tokens/s per process | x llama_1b v5e host (45k/s) |")
    print("|---|---|---|---|")
    for r in results["loader"]:
        print(
            f"| {r['seq_len']} x batch {r['batch']} | {r['share']} "
            f"| {r['tokens_per_s'] / 1e6:.2f}M | {r['tokens_per_s'] / HOST_TOKENS_PER_S:.0f}x |"
        )


if __name__ == "__main__":
    main()
