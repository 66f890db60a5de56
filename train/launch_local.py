"""Run one training as several processes on this machine, each with its own CPU devices.

    python -m train.launch_local --num_processes 2 --devices_per_process 4 -- \\
        --workdir runs/two --config.mesh_shape="(2,2,2)"

starts `python -m train.main` N times on 127.0.0.1 (a free port for the coordinator), each
with M simulated CPU devices (`XLA_FLAGS=--xla_force_host_platform_device_count=M`,
`JAX_PLATFORMS=cpu`) and `--coordinator_address/--num_processes/--process_id`; everything
after `--` goes to every process unchanged. It is a way to try (and test) a multi-process run
without a cluster: the processes find each other through JAX's own coordinator
(`jax.distributed.initialize`), exactly as on several hosts.

Each output line is prefixed with `[i]`, the process's index. When a process fails, the
others are stopped (a process whose peer died would otherwise wait for it in a collective
until JAX's heartbeat timeout); Ctrl-C stops them all. SIGTERM to the launcher (a
preemption notice) goes on to every process, which then all save a checkpoint at the same
step and exit with 143; the launcher waits for them. The exit status is the worst of the
processes that ended on their own: 0 when all finished.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence

LOCALHOST = "127.0.0.1"
# Seconds between a polite SIGTERM and a SIGKILL when stopping the processes.
STOP_GRACE_S = 5.0
_POLL_S = 0.1


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (the coordinator binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOCALHOST, 0))
        return sock.getsockname()[1]


def process_env(devices_per_process: int, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of one process: `base` (default: ours) with M simulated CPU devices."""
    env = dict(os.environ if base is None else base)
    flag = f"--xla_force_host_platform_device_count={devices_per_process}"
    kept = [f for f in env.get("XLA_FLAGS", "").split() if "host_platform_device_count" not in f]
    env["XLA_FLAGS"] = " ".join([*kept, flag])
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def start(
    num_processes: int,
    devices_per_process: int,
    args: Sequence[str],
    *,
    command: Sequence[str] = (sys.executable, "-m", "train.main"),
    port: int | None = None,
    cwd: str | None = None,
    output=None,
) -> list[subprocess.Popen]:
    """Starts the processes of one run.

    Args:
        num_processes: N.
        devices_per_process: M simulated CPU devices in each.
        args: arguments for every process (after the distributed flags).
        command: the program (default `python -m train.main`).
        port: the coordinator's port on 127.0.0.1 (default: a free one).
        cwd: the processes' working directory.
        output: where prefixed output lines go (default: our stdout).

    Returns:
        The processes, index i at position i; each in its own process group.
    """
    if num_processes < 1 or devices_per_process < 1:
        raise ValueError(
            f"--num_processes={num_processes} and --devices_per_process="
            f"{devices_per_process} must be at least 1."
        )
    port = port or free_port()
    env = process_env(devices_per_process)
    processes = []
    for index in range(num_processes):
        distributed = (
            [
                f"--coordinator_address={LOCALHOST}:{port}",
                f"--num_processes={num_processes}",
                f"--process_id={index}",
            ]
            if num_processes > 1
            else []
        )
        process = subprocess.Popen(
            [*command, *distributed, *args],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # stopped as a group, never by a terminal's Ctrl-C alone
        )
        threading.Thread(
            target=_copy_lines, args=(process.stdout, f"[{index}] ", output), daemon=True
        ).start()
        processes.append(process)
    return processes


def _copy_lines(stream, prefix: str, output) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", errors="replace").rstrip("\r\n").split("\r")[-1]
        print(prefix + line, file=output or sys.stdout, flush=True)
    stream.close()


def exit_status(returncode: int) -> int:
    """A shell-style status: a process killed by signal S counts as 128 + S."""
    return 128 - returncode if returncode < 0 else returncode


def stop(processes: Sequence[subprocess.Popen], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM to every running process's group, SIGKILL to those left after `grace_s`."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, grace_s)):
        running = [p for p in processes if p.poll() is None]
        for process in running:
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while running and time.monotonic() < deadline:
            running = [p for p in running if p.poll() is None]
            time.sleep(_POLL_S)


def forward_sigterm(processes: Sequence[subprocess.Popen]) -> Callable[[], bool]:
    """Installs a SIGTERM handler (main thread only) that sends SIGTERM on to every running
    process's group; returns a function telling whether one came."""
    came = threading.Event()

    def forward(signum, frame):
        came.set()
        for process in processes:
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, forward)
    return came.is_set


def supervise(
    processes: Sequence[subprocess.Popen],
    timeout_s: float | None = None,
    sigterm_forwarded: Callable[[], bool] = lambda: False,
) -> int:
    """Waits for the processes; stops the rest as soon as one fails (or on Ctrl-C, timeout).

    After a forwarded SIGTERM (`sigterm_forwarded()` True) it waits for all of them instead:
    each saves its checkpoint and exits on its own.

    Args:
        processes: from `start`.
        timeout_s: stop them all after this long (None: no limit).
        sigterm_forwarded: from `forward_sigterm`.

    Returns:
        The worst exit status among the processes that ended on their own (0 if all
        finished); 124 on timeout, 130 on Ctrl-C when none failed first.
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    stopped_by_us = 0
    try:
        while any(p.poll() is None for p in processes):
            if any(p.poll() not in (None, 0) for p in processes) and not sigterm_forwarded():
                break
            if deadline is not None and time.monotonic() > deadline:
                stopped_by_us = 124
                break
            time.sleep(_POLL_S)
    except KeyboardInterrupt:
        stopped_by_us = 130
    finally:
        ended = {id(p) for p in processes if p.poll() is not None}
        stop(processes)
    statuses = [exit_status(p.returncode) for p in processes if id(p) in ended]
    return max([*statuses, stopped_by_us])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m train.launch_local",
        description="Run train.main as N processes on 127.0.0.1, M CPU devices each; "
        "arguments after -- go to every process.",
    )
    parser.add_argument("--num_processes", type=int, default=2, help="N processes (default 2).")
    parser.add_argument(
        "--devices_per_process", type=int, default=4, help="M CPU devices each (default 4)."
    )
    parser.add_argument("--port", type=int, default=0, help="Coordinator port (default: free).")
    parser.add_argument("--timeout_s", type=float, default=None, help="Stop all after this.")
    ours, rest = parser.parse_known_args(argv)
    if rest[:1] == ["--"]:
        rest = rest[1:]
    try:
        processes = start(ours.num_processes, ours.devices_per_process, rest, port=ours.port)
    except ValueError as err:
        parser.error(str(err))
    return supervise(processes, ours.timeout_s, forward_sigterm(processes))


if __name__ == "__main__":
    sys.exit(main())
