"""One run over several processes (hosts): start-up, who writes, each process's data share.

JAX's own runtime does the work: `jax.distributed.initialize` connects the processes through
a coordinator (process 0's address), after which `jax.devices()` lists every process's
devices, the mesh spans them all, and jitted steps run as one program with collectives
between processes (on CPU through gloo). Every process runs the same training loop on the
same global arrays; what differs is only

- the data: each process fills only the rows of every global batch that its own devices
  hold (`batch_row_share`), and the global batch is assembled from the parts with
  `jax.make_array_from_process_local_data` (`train.program.steps.jit_steps`);
- the files: only process 0 (`is_primary`) writes logs, metrics, TensorBoard, the loss
  curve, config.json, results.json and the SentencePiece model, and takes the work-directory
  lock; every process joins the orbax checkpoint saves and restores;
- decoding for BLEU: each process translates a contiguous share of the sentences on its own
  devices (`share_of`), and the texts are gathered in every process (`gather_texts`).

With one process all of this is a no-op.
"""

from __future__ import annotations

import logging
import os

import jax
import numpy as np
from jax.experimental import multihost_utils

from train.core.batch_rows import RowShare, rows_per_batch

# Environment variables read when the flags are not given (JAX itself reads
# JAX_COORDINATOR_ADDRESS; the process count and index it only detects on managed clusters
# such as Slurm, Open MPI or Cloud TPU, so these two are this program's own).
ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"


def settings_from_env(
    coordinator_address: str | None, num_processes: int | None, process_id: int | None
) -> tuple[str | None, int, int]:
    """The flags' values, each falling back to its environment variable, then to one process.

    Raises:
        ValueError: an environment variable that is not an integer.
    """

    def env_int(name: str, default: int) -> int:
        text = os.environ.get(name, "")
        if not text:
            return default
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"${name}={text!r} must be an integer.") from None

    coordinator_address = coordinator_address or os.environ.get(ENV_COORDINATOR) or None
    if num_processes is None:
        num_processes = env_int(ENV_NUM_PROCESSES, 1)
    if process_id is None:
        process_id = env_int(ENV_PROCESS_ID, 0)
    return coordinator_address, num_processes, process_id


def initialize(coordinator_address: str | None, num_processes: int, process_id: int) -> None:
    """Connects this process to the others; a no-op for one process.

    Must run before anything else touches JAX (a backend, once started, cannot join).

    Args:
        coordinator_address: 'host:port' of process 0, reachable from every process.
        num_processes: processes in the run (one per host, or several on one machine).
        process_id: this process's index in [0, num_processes).

    Raises:
        ValueError: a missing address or an index out of range (named as the flags).
    """
    if num_processes < 1:
        raise ValueError(f"--num_processes={num_processes} must be at least 1.")
    if num_processes == 1:
        return
    if not coordinator_address:
        raise ValueError(
            f"--num_processes={num_processes} needs --coordinator_address=HOST:PORT (process "
            f"0's address, the same in every process) or ${ENV_COORDINATOR}."
        )
    if not 0 <= process_id < num_processes:
        raise ValueError(
            f"--process_id={process_id} must be in [0, {num_processes}) for "
            f"--num_processes={num_processes}; give each process its own index."
        )
    # CPU devices exchange data across processes only with a collectives implementation.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address, num_processes, process_id)


# The most CPU devices --config.cpu_devices=0 (auto) makes.
AUTO_MAX_CPU_DEVICES = 4
# The XLA flag that makes the CPU platform show several devices (read when JAX starts).
_HOST_DEVICES_FLAG = "--xla_force_host_platform_device_count"


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, e.g. a container's share)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def auto_cpu_devices(config, cores: int) -> int:
    """How many CPU devices `--config.cpu_devices=0` (auto) makes of `cores` cores.

    The largest count, at most `cores` and at most AUTO_MAX_CPU_DEVICES, that divides every
    batch's rows, so the batches are the same as on one device and only the float reduction
    order of the gradient changes. (The cap: each device holds its own copy of the
    parameters and optimizer state, and the gain was measured on 2 cores only.)
    One (no split) where the rows are not fixed by the config (length buckets with
    `tokens_per_batch`), where `mesh_shape` names sizes other than data = -1, or where
    several processes share the run (each is given its devices by its launcher).
    """
    mesh = tuple(config.mesh_shape)
    if mesh[:1] != (-1,) or any(size != 1 for size in mesh[1:]):
        return 1
    if config.batch_size > 0:
        rows = config.batch_size
    elif config.packing in ("stream", "segments"):
        (rows,) = rows_per_batch([config.max_len], None, config.tokens_per_batch, 1)
    else:
        return 1
    most = max(min(cores, AUTO_MAX_CPU_DEVICES), 1)
    return max(d for d in range(1, most + 1) if rows % d == 0)


def split_cpu(config, num_processes: int = 1, environ=None) -> int:
    """Makes JAX's CPU platform `config.cpu_devices` devices (0: `auto_cpu_devices`), so a
    CPU-only run is data parallel over its cores: XLA runs most of a small step's operations
    on one thread, so one device per core keeps both busy (`benchmarks/nanogpt_peer.py`:
    1.3x per step at nanoGPT's CPU recipe on 2 cores).

    Sets `--xla_force_host_platform_device_count` in `environ` (default os.environ) before
    JAX starts; does nothing when that flag is already set (`train.launch_local`, a user's
    XLA_FLAGS), when JAX has started, for several processes, or for a count of 1 (an explicit
    count above 1 that cannot be applied is logged as a warning). The flag
    changes only the CPU platform: on a GPU or TPU the run's devices are the accelerators.

    Returns:
        The device count asked for (1: nothing set).
    """
    environ = os.environ if environ is None else environ
    flags = environ.get("XLA_FLAGS", "")
    asked = config.get("cpu_devices", 0)
    if not isinstance(asked, int) or isinstance(asked, bool) or asked < 0:
        return 1  # validate_config names the bad value before any work
    from jax._src import xla_bridge

    why_not = (
        "XLA_FLAGS already sets the host device count" if _HOST_DEVICES_FLAG in flags
        else "the run has several processes" if num_processes > 1
        else "JAX had started before" if xla_bridge.backends_are_initialized()
        else None
    )  # fmt: skip
    if why_not:
        if asked > 1:
            logging.warning("--config.cpu_devices=%d is not applied: %s.", asked, why_not)
        return 1
    count = asked or auto_cpu_devices(config, usable_cores())
    if count > 1:
        environ["XLA_FLAGS"] = f"{flags} {_HOST_DEVICES_FLAG}={count}".strip()
    return count


def is_primary() -> bool:
    """True in process 0, the one that writes the run's files."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Waits until every process reaches the barrier called `name`; a no-op for one."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def batch_row_share(mesh: jax.sharding.Mesh, batch_sharding: jax.sharding.Sharding) -> RowShare:
    """Which rows of every global batch this process's devices hold.

    The batch is split into equal blocks along its rows (one per shard of the batch axis);
    this process holds a contiguous run of them, so its rows are part `index` of `count`
    equal parts. Processes that are replicas of each other (a mesh whose batch axes do not
    span processes) get the same part.

    Args:
        mesh: the device mesh.
        batch_sharding: the sharding of a (B, L) batch on it.

    Raises:
        ValueError: this process's blocks are not one contiguous, aligned run (a device order
            that interleaves processes along the batch axes).
    """
    blocks = int(np.prod([mesh.shape[a] for a in ("data", "fsdp")]))
    indices = batch_sharding.addressable_devices_indices_map((blocks, 1))
    mine = sorted({index[0].indices(blocks)[0] for index in indices.values()})
    first, size = mine[0], len(mine)
    if mine != list(range(first, first + size)) or blocks % size or first % size:
        raise ValueError(
            f"Process {jax.process_index()} holds batch blocks {mine} of {blocks}: not one "
            "aligned contiguous run; build the mesh from jax.devices() in their order."
        )
    return RowShare(index=first // size, count=blocks // size)


def share_of(num_items: int) -> range:
    """This process's contiguous share of `num_items` items (decoding), by process index."""
    return share_of_process(num_items, jax.process_index(), jax.process_count())


def gather_texts(texts: list[str], num_items: int) -> list[str]:
    """Every process's `share_of(num_items)` texts, concatenated in process order.

    Args:
        texts: this process's texts, one per item of its share.
        num_items: the total, as given to `share_of`.

    Returns:
        All `num_items` texts, in every process.
    """
    count = jax.process_count()
    if count == 1:
        return list(texts)
    per = -(-num_items // count)
    encoded = [t.encode("utf-8") for t in texts]
    lengths = np.zeros((per,), np.int32)
    lengths[: len(encoded)] = [len(b) for b in encoded]
    all_lengths = np.asarray(multihost_utils.process_allgather(lengths))  # (P, per)
    width = max(int(all_lengths.max()), 1)
    chars = np.zeros((per, width), np.uint8)
    for row, raw in enumerate(encoded):
        chars[row, : len(raw)] = np.frombuffer(raw, np.uint8)
    all_chars = np.asarray(multihost_utils.process_allgather(chars))  # (P, per, width)
    gathered = []
    for process in range(count):
        for row in range(len(share_of_process(num_items, process, count))):
            size = int(all_lengths[process, row])
            gathered.append(all_chars[process, row, :size].tobytes().decode("utf-8"))
    return gathered


def share_of_process(num_items: int, index: int, count: int) -> range:
    """Process `index`'s share of `num_items` among `count` processes (see `share_of`)."""
    per = -(-num_items // count)
    return range(min(index * per, num_items), min((index + 1) * per, num_items))


def host_copy(tree):
    """The whole value of every global array of `tree`, as numpy, in every process.

    Decoding runs on each process's own devices (no collectives per generated token), so it
    needs the parameters whole; with one process the tree is returned as it is.
    """
    if jax.process_count() == 1:
        return tree
    return multihost_utils.process_allgather(tree, tiled=True)
