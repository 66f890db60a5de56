"""What the command-line programs share: one-line errors, quiet library logs, jax on the CPU
of a host without accelerators (`skip_absent_accelerators`, which train/__init__.py applies
before a `python -m train.<command>` imports jax), and the experiment config flag
(`--config FILE` and `--config.<field>=value` overrides, read by train.main and
train.compile). The two kinds of failure and their exit statuses live in `train.core.failures`.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import logging
import os
import pathlib
import pkgutil
import re
import sys
import tempfile
import traceback
import warnings

from absl import flags
from absl import logging as absl_logging

from train.core.failures import USAGE_ERROR

# Libraries whose INFO lines (orbax: several per checkpoint) would drown the progress output.
_CHATTY_LIBRARIES = ("/orbax/", "/matplotlib/", "/jax/_src/")
# Where a failed checkpoint write logs its error again from every worker thread, with
# tracebacks (dozens of lines); the error itself reaches the program and is reported once.
_ERROR_ECHOES = ("/orbax/", "/asyncio/")

# Config fields renamed since runs were recorded: old field -> today's dotted field. Read as
# the new on the command line (`--config.muon_learning_rate=0.03` is
# `--config.optimizer.muon.learning_rate=0.03`; `renamed_overrides`) and in a run
# directory's config.json (`train.config.config_lib.read_saved`): this is the one table.
# The optimizer was a name (`--config.optimizer=muon`) and Muon's options flat fields; both
# are now in the optimizer's section (`train.formats.optimizers`). The corpora's options
# (`hf_*`, `text_*`, `direction`) are now their readers' (`train.formats.corpora.options`).
RENAMED_FIELDS = {
    "optimizer": "optimizer.name",
    "muon_learning_rate": "optimizer.muon.learning_rate",
    "muon_momentum": "optimizer.muon.momentum",
    "muon_weight_decay": "optimizer.muon.weight_decay",
    "direction": "corpora.bible.direction",
    "hf_dataset": "corpora.hf.dataset",
    "hf_config": "corpora.hf.config",
    "hf_split": "corpora.hf.split",
    "hf_fields": "corpora.hf.fields",
    "text_documents": "corpora.text.documents",
    "text_field": "corpora.text.field",
    "text_in_memory": "corpora.text.in_memory",
}

# The experiment config of a program run without --config.
DEFAULT_CONFIG = str(pathlib.Path(__file__).resolve().parents[2] / "configs" / "default.py")

# How a host shows an accelerator to the plugin that drives it (paths under the root "/"):
# TPU chips (libtpu) as /dev/accel* (v2-v4) or VFIO groups /dev/vfio/<n> (v5e and later),
# and as PCI devices of Google's vendor id with a TPU device id (jax's hardware_utils list,
# jax 0.10; a newer chip shows VFIO groups as well); NVIDIA GPUs (jax's CUDA plugins) as the
# device files jax looks for (nvidia0, nvidiactl in containers, dxg under WSL2) or a loaded
# driver; AMD GPUs (the ROCm plugins) as /dev/kfd.
_TPU_DEVICE_FILES = ("dev/accel*", "dev/vfio/[0-9]*")
_GOOGLE_PCI_VENDOR = "0x1ae0"
_TPU_PCI_DEVICES = ("0x0027", "0x0056", "0x005e", "0x0062", "0x0063", "0x006f", "0x0076")
_NVIDIA_DEVICE_FILES = ("dev/nvidia0", "dev/nvidiactl", "dev/dxg", "proc/driver/nvidia/version")
_AMD_DEVICE_FILES = ("dev/kfd",)


class _QuietLibraries(logging.Filter):
    """Passes warnings from anywhere, INFO only from outside the chatty libraries, and
    errors from outside the libraries that echo an error the program reports itself."""

    def filter(self, record: logging.LogRecord) -> bool:
        path = record.pathname.replace("\\", "/")
        if record.levelno >= logging.ERROR:
            return not any(p in path for p in _ERROR_ECHOES)
        return record.levelno >= logging.WARNING or not any(p in path for p in _CHATTY_LIBRARIES)


def _unraisable_to_debug_log(unraisable) -> None:
    """sys.unraisablehook: one DEBUG line instead of a traceback on stderr.

    TensorStore's write callbacks, still running after orbax closed their event loop
    because a write failed, raise 'Event loop is closed' where nothing can catch it: dozens
    of tracebacks for one disk-full error that the program reports in one line.
    """
    logging.debug("Ignored in %r: %r", unraisable.object, unraisable.exc_value)


def verbose() -> bool:
    """True under `--verbosity=1` (`-v 1`) or more: show everything, tracebacks included."""
    return absl_logging.get_verbosity() >= 1


def quiet_library_logs() -> None:
    """Drops INFO records of orbax, matplotlib and jax and the error echoes of orbax and
    asyncio from every root-logger handler (absl's included), and routes unraisable
    exceptions to the debug log; call inside `main`, after absl set up logging. Does nothing
    under `--verbosity=1`."""
    if verbose():
        return
    for handler in logging.getLogger().handlers:
        handler.addFilter(_QuietLibraries())
    sys.unraisablehook = _unraisable_to_debug_log
    # The same writers' coroutines, dropped unawaited when the loop closed.
    warnings.filterwarnings("ignore", "coroutine .* was never awaited", RuntimeWarning)


def skip_absent_accelerators(environ=None, root: str | os.PathLike = "/") -> bool:
    """Sets JAX_PLATFORMS=cpu where no installed accelerator plugin has its hardware, before
    jax is imported.

    jax starts every accelerator plugin it finds, and with libtpu (requirements-tpu.txt) or
    its CUDA plugin (requirements-gpu.txt) installed on a host without their chips, libtpu
    prints six lines of warnings (no TPU metadata, no TPU_WORKER_HOSTNAMES) and the CUDA
    plugin a traceback (no driver) before the program's first line, and both then fail.
    Where that is all they can do, jax is told to start on the CPU alone. Nothing is set
    where JAX_PLATFORMS is already set (to anything, '' included) or JAX_FORCE_TPU_INIT is,
    where jax is already imported, where a plugin's hardware is visible (a TPU VM; a GPU
    host, whose plugin jax must still find), or where a plugin this rule does not know is
    installed.

    Args:
      environ: the environment to read and set (default `os.environ`).
      root: the file system root the devices are looked for under (tests pass a fake one).

    Returns:
      Whether JAX_PLATFORMS was set.
    """
    environ = os.environ if environ is None else environ
    if "JAX_PLATFORMS" in environ or "JAX_FORCE_TPU_INIT" in environ or "jax" in sys.modules:
        return False
    plugins = _accelerator_plugins()
    root = pathlib.Path(root)
    if not plugins or any(_hardware_visible(plugin, root) for plugin in plugins):
        return False
    environ["JAX_PLATFORMS"] = "cpu"
    return True


def _accelerator_plugins() -> set[str]:
    """The accelerator plugins jax would start: libtpu, and the `jax_plugins` modules and
    entry points (found without importing jax or them)."""
    names = set()
    if importlib.util.find_spec("libtpu") is not None:
        names.add("libtpu")
    spec = importlib.util.find_spec("jax_plugins")
    if spec is not None and spec.submodule_search_locations:
        names |= {m.name for m in pkgutil.iter_modules(spec.submodule_search_locations)}
    names |= {point.name for point in importlib.metadata.entry_points(group="jax_plugins")}
    return names


def _hardware_visible(plugin: str, root: pathlib.Path) -> bool:
    """Whether `root` shows the hardware of `plugin`; True for a plugin not known here."""
    if plugin == "libtpu":
        return _tpu_visible(root)
    if re.fullmatch(r"xla_cuda\d*", plugin):
        return any((root / path).exists() for path in _NVIDIA_DEVICE_FILES)
    if re.fullmatch(r"xla_rocm\d*", plugin):
        return any((root / path).exists() for path in _AMD_DEVICE_FILES)
    return True


def _tpu_visible(root: pathlib.Path) -> bool:
    """Whether `root` shows a TPU chip: a device file, or a PCI device with a TPU's id."""
    if any(next(root.glob(pattern), None) for pattern in _TPU_DEVICE_FILES):
        return True
    for vendor in root.glob("sys/bus/pci/devices/*/vendor"):
        try:
            if vendor.read_text().strip() != _GOOGLE_PCI_VENDOR:
                continue
            if (vendor.parent / "device").read_text().strip() in _TPU_PCI_DEVICES:
                return True
        except OSError:
            return True  # unreadable: assume a chip, set nothing
    return False


@contextlib.contextmanager
def native_stderr_captured():
    """Keeps what native code writes to stderr inside the block off it: libtpu's start-up
    warnings (a CPU host has no TPU metadata to read), the CUDA plugin's (no GPU driver) when
    jax is imported. Everything is shown under --verbosity=1."""
    if verbose():
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def die(message: str, status: int = USAGE_ERROR) -> None:
    """Prints `error: message` to stderr and exits with `status`; under `--verbosity=1`
    the traceback of the exception being handled comes first."""
    if verbose() and sys.exc_info()[0] is not None:
        traceback.print_exc()
    print(f"error: {message}", file=sys.stderr)
    sys.exit(status)


def parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing (`app.run(main, flags_parser=parse_flags)`) with a one-line error
    and the usage exit status instead of absl's 'FATAL Flags parsing error' and status 1."""
    try:
        return flags.FLAGS(argv)
    except flags.Error as err:
        die(f"{err} ; see --helpshort for the flags.", USAGE_ERROR)


def _override_error(err: Exception, argv: list[str]) -> str:
    """A readable message for an override of a field the config does not have."""
    text = str(err).replace("\\", "")  # ml_collections nests the quoted name in reprs
    found = re.search(r"'([A-Za-z_]\w*)", text)
    field = found.group(1) if found else text
    culprits = [a for a in argv if a.lstrip("-").startswith("config.") and field in a]
    shown = culprits[0] if culprits else f"--config.{field}"
    hint = re.search(r'Did you mean "(\w+)"', text)
    return (
        f"{shown}: the config has no field '{field}'"
        + (f" (did you mean '{hint.group(1)}'?)" if hint else "")
        + ". See the fields and their comments in configs/default.py (or the --config file)."
    )


def _config_path(argv: list[str]) -> str:
    """The --config file named on the command line (`--config X` or `--config=X`)."""
    for i, arg in enumerate(argv):
        if arg in ("--config", "-config") and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(("--config=", "-config=")):
            return arg.split("=", 1)[1]
    return DEFAULT_CONFIG


def loaded_config(config):
    """The parsed `--config` ConfigDict, or exit with one line for a file that cannot be read
    (its load is lazy: an unreadable or broken file raises when the config is first touched).
    """
    try:
        config.lock  # noqa: B018
    except (OSError, SyntaxError, TypeError) as err:
        die(config_file_error(err, sys.argv), USAGE_ERROR)
    return config


def _renamed_in_file(text: str, argv: list[str]) -> str | None:
    """One line for a config file that assigns a renamed field its old kind of value
    (`config.optimizer = 'adam'`, now a section), from ml_collections' error; else None."""
    found = re.search(r"Could not override field '(\w+)'", text)
    if not found or found.group(1) not in RENAMED_FIELDS:
        return None
    old, new = found.group(1), RENAMED_FIELDS[found.group(1)]
    return (
        f"--config {_config_path(argv)}: sets config.{old}, which is now config.{new} ; "
        f"write config.{new} = ... in the file"
    )


def config_file_error(err: Exception, argv: list[str]) -> str:
    """One line for a --config file that cannot be loaded: what went wrong ; the fix."""
    path = _config_path(argv)
    fix = "pass a config file such as --config configs/default.py"
    if renamed := _renamed_in_file(str(err), argv):
        return renamed
    if isinstance(err, SyntaxError):
        return (
            f"--config {path}: {err.msg} at line {err.lineno} (a Python syntax error) ; "
            "fix the file, or " + fix
        )
    file = pathlib.Path(path)
    if not file.exists():
        return f"--config {path}: no such file ; check the path, or {fix}"
    if file.is_dir():
        return f"--config {path}: is a directory, not a file ; {fix}"
    if not os.access(file, os.R_OK):
        return f"--config {path}: cannot be read (permission denied) ; fix its permissions"
    what = str(err).splitlines()[0] if str(err) else type(err).__name__
    return f"--config {path}: could not be loaded ({what}) ; fix the file, or {fix}"


def renamed_overrides(argv: list[str]) -> list[str]:
    """Rewrites, in place, each `--config.<old>` override of a renamed field
    (`RENAMED_FIELDS`) as today's `--config.<new>`, `=value` or a separate value alike, and
    returns `argv`. A dotted field under an old name (`--config.optimizer.name`) is today's
    and stays."""
    for i, arg in enumerate(argv):
        name, sep, value = arg.partition("=")
        dashes = "--" if name.startswith("--") else "-"
        field = name.removeprefix(dashes).removeprefix("config.")
        if name.startswith(f"{dashes}config.") and field in RENAMED_FIELDS:
            argv[i] = f"{dashes}config.{RENAMED_FIELDS[field]}{sep}{value}"
    return argv


def define_config_flag(argv: list[str]) -> None:
    """Defines --config (default: configs/default.py), exiting cleanly on a bad override.

    ml_collections applies `--config.x=...` overrides while the flag is defined (default
    config) or parsed (--config given); both raise AttributeError/KeyError for an unknown
    field, which becomes a one-line message here. The overrides of renamed fields are read
    as today's first (`renamed_overrides`, on `argv` itself: pass `sys.argv`, which absl
    parses after).
    """
    from ml_collections import config_flags

    renamed_overrides(argv)
    try:
        config_flags.DEFINE_config_file(
            "config", DEFAULT_CONFIG, "Experiment config file (configs/*.py).", lock_config=True
        )
    except (AttributeError, KeyError) as err:
        die(_override_error(err, argv), USAGE_ERROR)


def parse_config_flags(argv: list[str]) -> list[str]:
    """`parse_flags` for a program with `define_config_flag`: a bad --config file or
    `--config.<field>` override is one line too."""
    try:
        return flags.FLAGS(argv)
    except (AttributeError, KeyError) as err:
        die(_override_error(err, argv), USAGE_ERROR)
    except (OSError, SyntaxError, TypeError) as err:  # the --config file, loaded to apply overrides
        die(config_file_error(err, argv), USAGE_ERROR)
    except flags.Error as err:
        die(_renamed_in_file(str(err), argv) or str(err), USAGE_ERROR)
