"""`python -m train.<command>` asks glibc for huge pages for XLA's large host buffers by
re-executing itself once with `glibc.malloc.hugetlb=1` (train.core.host_memory), where the
kernel gives them only on request; anywhere else, or where the user's GLIBC_TUNABLES names
the tunable, nothing happens."""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from train.core import host_memory

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def no_jax_yet(monkeypatch):
    """The rule as train/__init__.py meets it: before jax is imported."""
    monkeypatch.delitem(sys.modules, "jax", raising=False)


class Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, path, args, environ):
        self.calls.append((path, args, dict(environ)))


@pytest.mark.parametrize(
    "text, mode",
    [
        ("always [madvise] never\n", "madvise"),
        ("[always] madvise never\n", "always"),
        ("always madvise [never]\n", "never"),
        ("garbled\n", None),
    ],
)
def test_the_kernels_mode_is_read_from_its_file(tmp_path, text, mode):
    path = tmp_path / "enabled"
    path.write_text(text)
    assert host_memory.thp_mode(path) == mode
    assert host_memory.thp_mode(tmp_path / "absent") is None


@pytest.mark.parametrize(
    "libc, ok",
    [
        (("glibc", "2.36"), True),
        (("glibc", "2.35"), True),
        (("glibc", "2.34"), False),
        (("glibc", "3.0"), True),
        (("glibc", ""), False),
        (("musl", "1.2"), False),
        (("", ""), False),
    ],
)
def test_only_a_glibc_with_the_tunable_is_asked(libc, ok):
    assert host_memory.glibc_supports_hugetlb(libc) is ok


GOOD = dict(mode="madvise", glibc_ok=True, jax_imported=False, system="linux")


@pytest.mark.parametrize(
    "environ, changes",
    [
        ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, {}),  # the user's way out
        ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}, {}),  # already asked (a child)
        ({}, {"mode": "always"}),  # the kernel gives them to every process
        ({}, {"mode": "never"}),
        ({}, {"mode": None}),  # no such file: not Linux's THP
        ({}, {"glibc_ok": False}),
        ({}, {"jax_imported": True}),
        ({}, {"system": "darwin"}),
    ],
)
def test_nothing_is_done_where_it_would_change_nothing(environ, changes):
    assert not host_memory.should_reexec(environ, **{**GOOD, **changes})


def test_it_is_done_where_the_kernel_waits_to_be_asked():
    assert host_memory.should_reexec({}, **GOOD)
    assert host_memory.should_reexec({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, **GOOD)


def test_the_command_is_executed_again_with_the_tunable_and_its_start(no_jax_yet):
    environ = {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2", "OTHER": "kept"}
    execve = Recorder()
    host_memory.use_huge_pages(
        1234.5, environ=environ, execve=execve, mode="madvise", glibc_ok=True
    )
    expected = {
        "GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1",
        "OTHER": "kept",
        host_memory.STARTED_VAR: "1234.5",
    }
    assert execve.calls == [(sys.executable, list(sys.orig_argv), expected)]


def test_the_executed_command_keeps_the_first_start_and_passes_nothing_on(no_jax_yet):
    environ = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1", host_memory.STARTED_VAR: "1234.5"}
    execve = Recorder()
    started = host_memory.use_huge_pages(
        2000.0, environ=environ, execve=execve, mode="madvise", glibc_ok=True
    )
    assert started == 1234.5 and not execve.calls
    assert environ == {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}  # children start afresh


def test_where_nothing_is_to_be_done_the_start_is_the_processs_own(no_jax_yet):
    environ = {}
    execve = Recorder()
    assert host_memory.use_huge_pages(5.0, environ=environ, execve=execve, mode="never") == 5.0
    assert not execve.calls and environ == {}


# A command of a package of the test's own: importing `train` while Python locates it is what
# `python -m train.<command>` does. It reports its environment, train.STARTED and how many
# bytes of a 256 MiB buffer from malloc (as XLA's are; numpy asks for huge pages itself) the
# kernel mapped with huge pages.
PROBE = """
import ctypes, json, os
import train
from train.core import host_memory
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
buffer = libc.malloc(256 << 20)
ctypes.memset(buffer, 1, 256 << 20)
huge_kib = 0
with open("/proc/self/smaps_rollup") as f:
    for line in f:
        if line.startswith("AnonHugePages:"):
            huge_kib = int(line.split()[1])
print(json.dumps({
    "tunables": os.environ.get("GLIBC_TUNABLES"),
    "passed_on": host_memory.STARTED_VAR in os.environ,
    "started": train.STARTED,
    "huge_kib": huge_kib,
}))
"""


def _probe(tmp_path, env_changes: dict) -> dict:
    package = tmp_path / "probe"
    package.mkdir(exist_ok=True)
    (package / "__init__.py").write_text("import train  # as python -m train.x does\n")
    (package / "cmd.py").write_text(textwrap.dedent(PROBE))
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    env.update(env_changes, PYTHONPATH=os.pathsep.join([str(tmp_path), REPO]))
    done = subprocess.run(
        [sys.executable, "-m", "probe.cmd"], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.skipif(
    not (
        sys.platform.startswith("linux")
        and host_memory.glibc_supports_hugetlb()
        and host_memory.thp_mode() == "madvise"
    ),
    reason="needs Linux with glibc 2.35+ and transparent huge pages in 'madvise' mode",
)
def test_a_command_gets_huge_pages_for_its_large_buffers(tmp_path):
    launched = time.time()
    asked = _probe(tmp_path, {})
    assert asked["tunables"] == "glibc.malloc.hugetlb=1"
    assert not asked["passed_on"]
    assert launched <= asked["started"] <= time.time()
    not_asked = _probe(tmp_path, {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"})
    assert not_asked["tunables"] == "glibc.malloc.hugetlb=0"  # the user's choice, untouched
    assert not_asked["huge_kib"] == 0
    assert asked["huge_kib"] >= 128 << 10, asked  # at least half the buffer
