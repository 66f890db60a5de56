"""Whether a run directory may resume, and the files that say so: config.json's identity
fields (`check_resumable`), the data's fingerprint (`check_same_data`), and the results of a
run that already finished (`finished_results`).
"""

from __future__ import annotations

import json
import logging

import ml_collections

from train.config import config_lib
from train.config.sections import RunConfig
from train.core import distributed
from train.core.rundir import RunDir, atomic_write_text, read_json
from train.program.metrics import format_report


def check_resumable(config: ml_collections.ConfigDict, run: RunDir, resuming: bool):
    """Writes config.json, or refuses to resume with different identity fields."""
    path = run.config
    if resuming and path.exists():
        saved = read_json(
            path,
            "delete it and rerun with the run's --config and overrides: it is rewritten from them",
        )
        changed = config_lib.changed_identity_fields(saved, config)
        if changed:
            raise ValueError(
                f"{run.path} holds checkpoints of a run with different {', '.join(changed)} "
                f"(see {path}) ; resuming would not fit them: use a fresh --workdir, or the "
                "saved values."
            )
    if distributed.is_primary():
        atomic_write_text(path, config.to_json(indent=2) + "\n")


def check_same_data(fingerprint: dict, run: RunDir, resuming: bool) -> None:
    """Writes the data fingerprint, or refuses to resume on data that changed since.

    Only the corpus path is in config.json; a file edited in place (columns swapped, lines
    added) would otherwise resume silently on other data, with a stream position that means
    nothing for it.
    """
    path = run.data_fingerprint
    if resuming and path.exists():
        saved = read_json(path, "delete it and rerun: it is rewritten from the current data")
        if saved != fingerprint:
            raise ValueError(
                f"{run.path} holds checkpoints trained on other data: {saved['train']} train / "
                f"{saved['valid']} validation examples, sha256 {saved['sha256'][:12]}, now "
                f"{fingerprint['train']} / {fingerprint['valid']}, sha256 "
                f"{fingerprint['sha256'][:12]} (see {path}) ; restore the corpus the run "
                "started with, or use a fresh --workdir."
            )
    if distributed.is_primary():
        atomic_write_text(path, json.dumps(fingerprint, indent=2) + "\n")


def finished_results(run: RunDir, latest: int | None, settings: RunConfig) -> dict | None:
    """The results of a run that already trained every step, or stopped at the target it
    still has, and wrote them; else None (a changed target trains on)."""
    if latest is None or not run.results.exists():
        return None
    if latest < settings.num_train_steps and not settings.has_target:
        return None
    results = read_json(
        run.results,
        "delete it and rerun: the final evaluation is redone from the last checkpoint",
    )
    if latest < settings.num_train_steps:
        target = results.get("target") or {}
        same = (target.get("valid_loss"), target.get("bleu")) == (
            settings.target_valid_loss,
            settings.target_bleu,
        )
        if not (same and target.get("reached") and results.get("step") == latest):
            return None
    logging.info("%s already finished at step %d; its results:", run.path, latest)
    if distributed.is_primary():
        print(format_report(results), flush=True)
    return results
