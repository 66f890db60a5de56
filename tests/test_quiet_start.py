"""A command's output starts with the program's own lines: on a host without accelerators,
the plugins installed for them (libtpu, jax's CUDA plugin) are not started
(`train.core.cli.skip_absent_accelerators`, applied by train/__init__.py), and a user's
JAX_PLATFORMS, a TPU VM and a GPU host are left as they are."""

import os
import subprocess
import sys

import pytest
from train_helpers import tiny_config, write_tiny_tsv

from train.core import cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What libtpu (no TPU metadata) and jax's CUDA plugin (no driver) print when jax starts them
# on a host without their chips.
PLUGIN_NOISE = ("TPU", "libtpu", "Jax plugin configuration error", "cuDNN", "CUDA")


@pytest.fixture
def no_jax_yet(monkeypatch):
    """The rule as train/__init__.py meets it: before jax is imported."""
    monkeypatch.delitem(sys.modules, "jax", raising=False)


def _command(tmp_path, env_changes: dict) -> subprocess.CompletedProcess:
    """`python -m train.main` on a tiny config, one step, in a fresh environment without
    the tests' JAX_PLATFORMS (tests/conftest.py sets it), plus `env_changes`."""
    config = tiny_config(write_tiny_tsv(tmp_path), num_train_steps=1, bleu_examples=0)
    path = tmp_path / "tiny_config.py"
    path.write_text(
        "import ml_collections\n\n\n"
        f"def get_config():\n    return ml_collections.ConfigDict({config.to_dict()!r})\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    env.update(env_changes)
    args = ["--config", str(path), "--workdir", str(tmp_path / "run")]
    return subprocess.run(
        [sys.executable, "-m", "train.main", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=300,
    )


def test_a_command_on_a_host_without_accelerators_starts_with_its_own_lines(tmp_path, no_jax_yet):
    if not cli.skip_absent_accelerators(environ={}):
        pytest.skip("an accelerator (or none of its plugins) here: the rule sets nothing")
    result = _command(tmp_path, {})
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stderr.splitlines()
    noise = [line for line in lines if any(word in line for word in PLUGIN_NOISE)]
    assert not noise, "\n".join(lines[:30])
    assert lines and "Work directory:" in lines[0], "\n".join(lines[:30])  # the first line


def test_a_users_jax_platforms_reaches_the_command(tmp_path):
    """The command keeps the user's JAX_PLATFORMS: jax is asked for the platform named, and
    says it does not know it (were it replaced by cpu, the run would train)."""
    result = _command(tmp_path, {"JAX_PLATFORMS": "nosuchplatform"})
    assert result.returncode != 0
    assert "nosuchplatform" in result.stderr


def _host(root, *files: str, pci: dict | None = None):
    """A fake file system root holding device `files` and PCI devices {name: (vendor, id)}."""
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).touch()
    for name, (vendor, device) in (pci or {}).items():
        folder = root / "sys/bus/pci/devices" / name
        folder.mkdir(parents=True)
        (folder / "vendor").write_text(vendor + "\n")
        (folder / "device").write_text(device + "\n")
    return root


@pytest.mark.parametrize(
    "environ",
    [{"JAX_PLATFORMS": ""}, {"JAX_PLATFORMS": "tpu"}, {"JAX_FORCE_TPU_INIT": "1"}],
    ids=["empty", "tpu", "force-tpu-init"],
)
def test_the_rule_leaves_a_users_setting_alone(environ, tmp_path, monkeypatch, no_jax_yet):
    monkeypatch.setattr(cli, "_accelerator_plugins", lambda: {"libtpu"})
    given = dict(environ)
    assert not cli.skip_absent_accelerators(environ=given, root=_host(tmp_path))
    assert given == environ


@pytest.mark.parametrize(
    "plugins, files, pci, sets",
    [
        ({"libtpu"}, (), {}, True),
        ({"libtpu", "xla_cuda12"}, (), {}, True),
        # A GCE VM's network card has Google's vendor id too, but no TPU device id.
        ({"libtpu"}, (), {"0000:00:04.0": ("0x1ae0", "0x0042")}, True),
        ({"libtpu"}, ("dev/accel0",), {}, False),  # TPU v2-v4
        ({"libtpu"}, ("dev/vfio/0",), {}, False),  # TPU v5e and later
        ({"libtpu"}, (), {"0000:00:05.0": ("0x1ae0", "0x0063")}, False),
        ({"libtpu", "xla_cuda12"}, ("dev/nvidiactl",), {}, False),  # a GPU host
        ({"libtpu"}, ("dev/nvidiactl",), {}, True),  # a GPU, but no GPU plugin
        ({"xla_rocm7"}, ("dev/kfd",), {}, False),
        ({"libtpu", "metal_plugin"}, (), {}, False),  # a plugin the rule does not know
        (set(), (), {}, False),  # nothing that would print
    ],
)
def test_the_rule_sets_cpu_only_where_no_plugin_has_its_hardware(
    plugins, files, pci, sets, tmp_path, monkeypatch, no_jax_yet
):
    monkeypatch.setattr(cli, "_accelerator_plugins", lambda: plugins)
    environ = {}
    root = _host(tmp_path, *files, pci=pci)
    assert cli.skip_absent_accelerators(environ=environ, root=root) == sets
    assert environ == ({"JAX_PLATFORMS": "cpu"} if sets else {})
