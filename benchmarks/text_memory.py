"""Peak memory of a text language-model run without `--config.store_dir` (issue 41, item 5),
against corpus size.

    python benchmarks/text_memory.py [--sizes_mb 25,200] [--root DIR] [--out DIR]

Corpora: `benchmarks/token_store.py`'s synthetic verse-like lines (seeded), one file per
size under `--out`. Each run is `python -m train.main --config configs/lm_kjv.py` with
`--config.corpus=text --config.corpus_path=<file> --config.tokenizer=byte`, a tiny model
(1 layer, d_model 64) for 2 steps, one validation batch, no samples, and no `store_dir`:
whatever the program does by default with a text corpus. `--root` runs another checkout's
program (e.g. an export of an older commit, for the figures before a change); the corpora
come from this one's generator either way. Peak RSS from `/usr/bin/time -v`, with
JAX_PLATFORMS=cpu; the wall time includes preparing the store where one is built.
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

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TINY_RUN = (
    "--config.tokenizer=byte",
    "--config.model.num_layers=1",
    "--config.model.d_model=64",
    "--config.model.d_ff=128",
    "--config.model.num_heads=2",
    "--config.num_train_steps=2",
    "--config.sample_prompts=()",
    "--config.num_eval_batches=1",
    "--config.eval_every_steps=2",
    "--config.checkpoint_every_steps=2",
)


def peak_rss_run(root: pathlib.Path, corpus: pathlib.Path, workdir: pathlib.Path) -> dict:
    """`train.main` of `root` on `corpus`: peak RSS (MiB) and wall time (s)."""
    shutil.rmtree(workdir, ignore_errors=True)
    command = [
        sys.executable,
        "-m",
        "train.main",
        f"--config={root / 'configs' / 'lm_kjv.py'}",
        f"--workdir={workdir}",
        "--config.corpus=text",
        f"--config.corpus_path={corpus}",
        *TINY_RUN,
    ]
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(root))
    with tempfile.NamedTemporaryFile("r", suffix=".time") as report:
        start = time.time()
        proc = subprocess.run(
            ["/usr/bin/time", "-v", "-o", report.name, *command],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
        )
        wall = time.time() - start
        text = report.read()
    if proc.returncode != 0:
        raise RuntimeError(f"train.main failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    rss_kib = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)[1])
    store = workdir / "token_store"
    return {"peak_rss_mib": rss_kib / 1024, "wall_s": wall, "store_built": store.is_dir()}


def main() -> None:
    from benchmarks.token_store import machine_state, make_corpus

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes_mb", default="25,200")
    parser.add_argument("--root", default=str(ROOT), help="the checkout whose program runs")
    parser.add_argument("--out", default="/tmp/text_memory_bench")
    flags = parser.parse_args()
    out = pathlib.Path(flags.out)
    out.mkdir(parents=True, exist_ok=True)
    root = pathlib.Path(flags.root).resolve()
    results = {"command": " ".join(sys.argv), "root": str(root), "before": machine_state()}
    print("machine before:", results["before"], flush=True)
    results["runs"] = []
    for size in (float(s) for s in flags.sizes_mb.split(",")):
        corpus = out / f"corpus_{size:g}mb.txt"
        if not corpus.exists():
            make_corpus(corpus, size, seed=int(size))
        row = {"corpus_mb": size, **peak_rss_run(root, corpus, out / f"run_{size:g}mb")}
        results["runs"].append(row)
        print("run:", row, flush=True)
    results["after"] = machine_state()
    print("machine after:", results["after"], flush=True)
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    print("\n| corpus | peak RSS | wall | token store built |")
    print("|---|---|---|---|")
    for r in results["runs"]:
        print(
            f"| {r['corpus_mb']:g} MB | {r['peak_rss_mib']:.0f} MiB | {r['wall_s']:.0f} s "
            f"| {'yes' if r['store_built'] else 'no'} |"
        )


if __name__ == "__main__":
    main()
