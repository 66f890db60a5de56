"""`train_and_evaluate(config, workdir)`: the training program, importable from a notebook.

One run = one work directory (its files: train.core.rundir), locked while the run writes it.
Rerunning the same command resumes from the latest checkpoint, bit-identically on CPU.

In a run of several processes (train.core.distributed) every process runs this same program on
the same global arrays; only process 0 takes the lock and writes the files above, except the
checkpoints, which every process writes together.

SIGTERM (a preemption notice) stops the loop at the next step boundary: it saves that step's
checkpoint, waits for the write, and raises `Preempted` (train.main prints its line and
exits with 143); every process of a run stops at the same step.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import threading
from collections.abc import Callable, Iterator
from typing import NamedTuple

import flax
import jax
import jax.numpy as jnp
import ml_collections

from flax_transformer import sharding as sharding_lib
from train.config import config_lib
from train.config.sections import Experiment
from train.core import compute_dtype, distributed
from train.core.failures import Preempted
from train.core.rundir import RunDir, WorkdirLock, atomic_write_text, prepare_workdir
from train.data.batching import RowShare
from train.data.chat.template import keep_run_template
from train.data.dataset import Dataset, Processes
from train.data.pipeline.input_pipeline import open_dataset
from train.data.tokenizers import vocabulary
from train.formats import sources
from train.program import finetune, steps, weights
from train.program.assembly import Program, build_program, make_mesh
from train.program.checkpoint import Checkpointer
from train.program.metrics import (
    STEPS_IN_FLIGHT,
    MetricsWriter,
    RunClock,
    Target,
    TrainingDivergedError,
    TrainLog,
    evaluate_loss,
    format_report,
    format_target,
    plot_loss_curve,
    progress_bar,
)
from train.program.resume import check_resumable, check_same_data, finished_results
from train.program.signals import preempted, sigterm_notice
from train.tasks import get_task


class _Discard:
    """The MetricsWriter of processes other than 0: writes nothing."""

    def write(self, step: int, split: str, values) -> None:
        del step, split, values

    def close(self) -> None:
        pass


@jax.jit
def _all_finite(tree) -> jax.Array:
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]
    return jnp.all(jnp.stack(leaves))


def train_and_evaluate(
    config: ml_collections.ConfigDict,
    workdir: str,
    *,
    step_callback: Callable[[int], None] | None = None,
    started: float | None = None,
) -> dict:
    """Trains (or resumes) the configured model, evaluates it, and returns the results.

    Every record of the run's metrics carries `wall_s`, the seconds since `started`
    (`metrics.RunClock`; a resumed run counts on from its checkpoint's). With
    `--config.target_valid_loss` or `--config.target_bleu`, the first evaluation that
    reaches the target saves a checkpoint and ends the loop; the report follows as at the
    end of a full run.

    Args:
        config: an experiment config (`configs/*.py`).
        workdir: the run directory (created if missing); rerunning with the same directory
            resumes from its latest checkpoint.
        step_callback: called with the step number after every train step (e.g. to stop a
            run from a notebook by raising).
        started: `time.time()` when the command started (`train.main` reads it first
            thing); None: when this call started.

    Returns:
        The results also written to `workdir/results.json`: final step, validation metrics,
        and BLEU/chrF with samples (translation) or samples (LM); `wall_s`, the clock at the
        report; with a target, `target` (`metrics.Target.result`: reached or not, the
        step, value and `wall_s` where it was).

    Raises:
        ValueError: a bad config value or corpus file, or a regular file as `workdir`.
        RunFailure: `workdir` is not writable, is locked by another run
            (`WorkdirLockedError`), or a checkpoint is damaged (`CheckpointError`).
        TrainingDivergedError: the loss became NaN or infinite (names the step); a
            RunFailure too.
    """
    clock = RunClock(started)
    # The sections; the config is not read again.
    experiment = config_lib.validate_config(config, workdir)
    run = RunDir(prepare_workdir(workdir))
    # One run per work directory; released on any exit. Process 0 holds it for the run.
    lock = WorkdirLock(run.path) if distributed.is_primary() else contextlib.nullcontext()
    with lock:
        checkpointer = Checkpointer(
            run.path,
            keep=experiment.run.keep_checkpoints,
            asynchronous=experiment.run.async_checkpoints,
        )
        try:
            check_resumable(config, run, checkpointer.latest_step() is not None)
            with sigterm_notice() as notice:
                return _run(experiment, run, checkpointer, step_callback, notice, clock)
        finally:
            checkpointer.close()


class _Start(NamedTuple):
    """Where a run's training loop starts: its data, program and (restored) state."""

    dataset: Dataset
    program: Program
    state: steps.TrainState
    stream: Iterator  # an EpochStream (in memory) or a StoreStream (a token store)
    share: RowShare
    wall_s: float | None  # the clock the restored checkpoint recorded (None: fresh, or none)


def _pretrained_snapshot(experiment: Experiment, run: RunDir, resuming: bool) -> sources.Source:
    """`--config.init_from`'s source (a resumed run: the run's copy of it, as the weights
    come from the checkpoint), opened once for the run: `_start` hands it to the data path
    and the weights. Process 0 first copies its config and tokenizer into the run directory,
    for the tools that read the run later, and the run's own chat template file, if any
    (`train.data.chat.template.keep_run_template`)."""
    if resuming:
        source = sources.open_source(experiment.data.init_from, run.path)
    else:
        source = sources.read_source(experiment.data.init_from)
    if distributed.is_primary():
        if not (run.pretrained / sources.CONFIG_FILE).is_file():
            sources.snapshot(source, run.pretrained)
        keep_run_template(experiment.data.chat_template, run)
    distributed.barrier("pretrained-snapshot")
    model, pretrained = experiment.model, config_lib.source_model(source)
    rates = (model.dropout_rate, model.attention_dropout_rate)
    own = rates == (pretrained.dropout_rate, pretrained.attention_dropout_rate)
    logging.info(
        "Dropout: %g on residuals and embeddings, %g on attention weights (%s).",
        *rates,
        "the pretrained model's own" if own else "--config.model's, not the pretrained model's",
    )
    return source


def _start(experiment: Experiment, run: RunDir, checkpointer: Checkpointer) -> _Start:
    """Builds the data and the program of a run, then its state: fresh, or the newest good
    checkpoint's with the data stream where it stopped."""
    settings = experiment.run
    asked = settings.cpu_devices
    if asked > 1 and jax.default_backend() == "cpu" and jax.local_device_count() != asked:
        logging.warning(
            "--config.cpu_devices=%d: this process has %d CPU device(s); only train.main makes "
            "them (before JAX starts), so the run uses those.",
            asked,
            jax.local_device_count(),
        )
    resuming = checkpointer.latest_step() is not None
    mesh = make_mesh(settings.mesh_shape)
    share = distributed.batch_row_share(mesh, sharding_lib.batch_sharding(mesh))
    source = None
    if experiment.data.init_from:
        source = _pretrained_snapshot(experiment, run, resuming)
    dataset = open_dataset(
        experiment.data,
        run,
        # The source opened once, handed down: the data path never reads its path again.
        vocabulary(experiment.data, experiment.model.vocab_size, source or run.pretrained),
        task=get_task(experiment.data.task).configured(experiment.data),
        seed=settings.seed,
        num_steps=settings.num_train_steps,
        num_devices=mesh.size,
        share=share,
        max_eval_batches=experiment.eval.num_eval_batches,
        processes=Processes(
            primary=distributed.is_primary(),
            barrier=distributed.barrier,
            part=(jax.process_index(), jax.process_count()),
        ),
        resuming=resuming,
    )
    _check_end_of_run(experiment, dataset)
    check_same_data(dataset.fingerprint, run, resuming)
    logging.info("Examples: %s; vocabulary %d.", dataset.sizes, dataset.tokenizer.vocab_size)
    tokenizer = dataset.tokenizer
    program = build_program(
        experiment, dataset.task, mesh, tokenizer.vocab_size, unk_id=tokenizer.unk_id, share=share
    )
    loaded = None
    if source is not None and not resuming:
        placement = flax.traverse_util.flatten_dict(program.state_shapes.params)
        loaded, size = weights.load_weights(source, experiment.model, placement)
        logging.info("Pretrained weights: %s (%.1f MiB on disk).", source.path, size / 2**20)
    state = steps.create_train_state(
        program.model,
        dataset.task,
        program.tx,
        mesh,
        settings.seed,
        settings.rng_impl,
        pretrained=loaded,
    )
    del loaded
    num_params = sum(x.size for x in jax.tree.leaves(state.params))
    logging.info("Model: %s parameters on %d device(s).", f"{num_params:,}", mesh.size)
    if jax.default_backend() == "cpu":
        # What the host would choose (train.core.compute_dtype), beside what the config
        # runs: the config's dtype is used as it is.
        host = compute_dtype.choose_compute_dtype(compute_dtype.cpu_flags())
        logging.info(
            "Compute dtype %s; this CPU host's choice (--config.model.dtype=auto): %s.",
            jnp.dtype(program.model.config.dtype).name,
            host.reason,
        )
    if source is not None:
        labels = finetune.param_labels(experiment.optimizer, experiment.model)
        logging.info(finetune.summary(state.params, state.opt_state, labels))
    # What the task computes with the starting weights (a preference run's reference).
    dataset = dataset.task.before_training(
        dataset, program.model, state.params, program.put_batch, run, resuming=resuming
    )
    stream_state = wall_s = None
    if resuming:
        state, progress = checkpointer.restore_newest_good(state)
        stream_state, wall_s = progress["stream"], progress.get("wall_s")
        logging.info("Resumed from checkpoint step %d.", int(state.step))
    stream = dataset.stream(settings.seed, stream_state, int(state.step))
    return _Start(dataset, program, state, stream, share, wall_s)


def _check_end_of_run(experiment: Experiment, dataset: Dataset) -> None:
    """Checks, before the first step and any checkpoint, what the run does at its end and
    between steps with the tokenizer in hand: the task's decoding and scoring settings
    (`Task.check_outputs`: prompts, BLEU, beams, sampling) and the loss curve's plotter.

    Raises:
        ValueError: a setting that would fail later, naming its fields and the fix.
    """
    dataset.task.check_outputs(
        experiment.eval, dataset.tokenizer, interim=bool(experiment.run.bleu_every_steps)
    )
    if importlib.util.find_spec("matplotlib") is None:
        logging.warning("matplotlib is not installed: the run will draw no loss_curve.png.")


def _run(
    experiment: Experiment,
    run: RunDir,
    checkpointer: Checkpointer,
    step_callback,
    notice: threading.Event,
    clock: RunClock,
) -> dict:
    """The body of `train_and_evaluate`, which owns (and always closes) the checkpointer;
    `notice`: set by SIGTERM, it stops the loop at the next step with a checkpoint; `clock`:
    the run's seconds, in every record."""
    settings, evaluation = experiment.run, experiment.eval
    finished = finished_results(run, checkpointer.latest_step(), settings)
    if finished is not None:
        return finished
    dataset, program, state, stream, share, wall_s = _start(experiment, run, checkpointer)
    if wall_s is not None:
        clock.resume(wall_s)
    elif int(state.step):
        logging.info("Checkpoint %d recorded no wall time: wall_s counts from now.", state.step)
    task, model = dataset.task, program.model
    train_step, eval_step, put_batch = program.train_step, program.eval_step, program.put_batch
    primary = distributed.is_primary()
    writer = MetricsWriter(run, int(state.step), clock) if primary else _Discard()
    log = TrainLog(checkpointer)
    target = Target(settings.target_valid_loss, settings.target_bleu)
    chars_per_token = dataset.chars_per_token if task.reports_bits_per_char else None
    pad_id = dataset.tokenizer.pad_id
    eval_batches = dataset.eval_batches[: evaluation.num_eval_batches or None]
    evaluated = [-1, None]  # (step, validation metrics) of the latest evaluation

    def run_eval(step: int) -> dict:
        begun = clock.seconds()
        params = program.eval_params(state)
        valid = evaluate_loss(eval_step, params, eval_batches, put_batch, chars_per_token)
        now = clock.seconds()
        writer.write(step, "valid", {**valid, "eval_s": now - begun, "wall_s": now})
        target.check("valid_loss", valid["nll"], step, now)
        evaluated[:] = [step, valid]
        return valid

    def save(step: int) -> None:
        summary = log.check()  # raises before a diverged state is saved
        if summary is not None:
            writer.write(step, "train", summary)
        if not bool(_all_finite(state.params)):
            raise TrainingDivergedError(
                f"Parameters are NaN or infinite at step {step}; the last good checkpoint "
                f"(step {checkpointer.latest_step()}) is kept in {checkpointer.directory}."
            )
        progress = {"stream": stream.state_dict(), "step": step, "wall_s": clock.seconds()}
        checkpointer.save(step, state, progress)

    total = settings.num_train_steps
    # Several CPU devices in one process (train.main's --config.cpu_devices): XLA's
    # in-process all-reduce deadlocks when hundreds of steps are queued, so the loop waits
    # for a step every STEPS_IN_FLIGHT steps (the metrics fetch every log_every_steps
    # already does when that is smaller).
    bounded = jax.default_backend() == "cpu" and jax.local_device_count() > 1
    with progress_bar(total, int(state.step), enabled=primary) as bar:
        say = bar.write if primary else lambda text: None
        for step in range(int(state.step) + 1, total + 1):
            batch = next(stream)
            state, metrics = train_step(state, put_batch(batch))
            # This process's rows only: with equal shares, times the share count is the whole.
            log.add(step, metrics, task.tokens_in(batch, pad_id) * share.count)
            bar.update(1)
            if bounded and step % STEPS_IN_FLIGHT == 0:
                jax.block_until_ready(metrics)
            if step % settings.log_every_steps == 0 or step == total:
                summary = log.check()
                writer.write(step, "train", summary)
                bar.set_postfix(
                    loss=f"{summary['loss']:.3f}",
                    lr=f"{summary['learning_rate']:.2e}",
                    tok_s=f"{summary['tokens_per_sec']:.0f}",
                )
            if step % settings.eval_every_steps == 0 or step == total:
                valid = run_eval(step)
                say(
                    f"step {step}: validation loss {valid['nll']:.3f}, perplexity "
                    f"{valid['perplexity']:.1f}, accuracy {100 * valid['accuracy']:.1f}%"
                    + (
                        f", {valid['bits_per_char']:.3f} bits/char"
                        if "bits_per_char" in valid
                        else ""
                    )
                )
            every = settings.bleu_every_steps
            if every and step % every == 0 and step < total:
                begun = clock.seconds()
                params = program.eval_params(state)
                scored = task.interim_scores(evaluation, dataset, model, params)
                if scored is not None:
                    split, record, line = scored
                    now = clock.seconds()
                    writer.write(step, split, {**record, "eval_s": now - begun, "wall_s": now})
                    if "bleu" in record:
                        target.check("bleu", record["bleu"], step, now)
                    say(f"step {step}: {line}")
            reached = target.reached is not None and target.reached["step"] == step
            saved = step % settings.checkpoint_every_steps == 0 or step == total or reached
            if saved:
                save(step)
            if step % settings.log_every_steps == 0:
                log.restart_clock()  # tokens/s counts training time only
            if step_callback is not None:
                step_callback(step)
            if preempted(notice, step):
                if not saved:
                    save(step)
                checkpointer.wait()
                raise Preempted(
                    f"preempted: SIGTERM at step {step}; checkpoint {step} saved in "
                    f"{checkpointer.directory} ; rerun the same command to resume."
                )
            if reached:
                say(format_target(target.result(step)))
                break

    step = int(state.step)
    # The last evaluation's metrics, unless it was of an earlier step (a target reached at
    # a BLEU evaluation, or a rerun that lost results.json).
    valid = evaluated[1] if evaluated[0] == step else run_eval(step)
    results = {
        "step": step,
        "valid": valid,
        **task.final_outputs(
            evaluation, dataset, model, distributed.host_copy(program.eval_params(state))
        ),
    }
    if "bleu" in results:  # a BLEU target met only by the final scores: reached at the end
        target.check("bleu", results["bleu"]["bleu"], step, clock.seconds())
    if settings.has_target:
        results["target"] = target.result(step)
    results["wall_s"] = clock.seconds()
    _report(run, writer, results, primary)
    return results


def _report(run: RunDir, writer, results: dict, primary: bool) -> None:
    """Writes the final scores, the loss curve and results.json (process 0), and prints the
    report."""
    if "bleu" in results:  # scored with the rest of the report: its clock is the report's
        scores = {k: results["bleu"][k] for k in ("bleu", "chrf")}
        writer.write(results["step"], "bleu", {**scores, "wall_s": results["wall_s"]})
    writer.close()
    if not primary:
        return
    if importlib.util.find_spec("matplotlib") is not None:  # else warned before step 1
        plot_loss_curve(run)
    atomic_write_text(run.results, json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    print(format_report(results), flush=True)
