"""Packaging: what `pip install` puts on a user's machine."""

import importlib.util
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_py_typed_marker_is_package_data():
    """PEP 561: type checkers read the library's inline hints only if `py.typed` ships."""
    tomllib = pytest.importorskip("tomllib")
    assert (ROOT / "flax_transformer" / "py.typed").is_file()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    package_data = pyproject["tool"]["setuptools"]["package-data"]
    assert "py.typed" in package_data["flax_transformer"]


def test_explorer_template_is_package_data():
    """`python -m train.visualize --html` reads its page template from the installed package."""
    tomllib = pytest.importorskip("tomllib")
    assert (ROOT / "train" / "tools" / "explorer.html").is_file()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "explorer.html" in pyproject["tool"]["setuptools"]["package-data"]["train.tools"]


def _can_build_wheels() -> bool:
    """setuptools builds wheels itself from 70.1 on; older ones need the `wheel` package
    (a fresh Python 3.11 venv has setuptools 65 and no `wheel`)."""
    return (
        importlib.util.find_spec("setuptools.command.bdist_wheel") is not None
        or importlib.util.find_spec("wheel") is not None
    )


@pytest.mark.skipif(not _can_build_wheels(), reason="setuptools < 70.1 without `wheel`")
def test_wheel_contains_package_data(tmp_path):
    """A wheel built from a copy of the sources (the worktree stays clean) holds the marker
    and the explorer's page template."""
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in ("flax_transformer", "train", "configs"):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    build = "from setuptools import build_meta; print(build_meta.build_wheel('dist'))"
    done = subprocess.run(
        [sys.executable, "-c", build], cwd=src, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    wheel = src / "dist" / done.stdout.strip().splitlines()[-1]
    names = zipfile.ZipFile(wheel).namelist()
    assert "flax_transformer/py.typed" in names
    assert "train/tools/explorer.html" in names
    assert "train/aot/gpu_specs/h100_sxm.txtpb" in names
