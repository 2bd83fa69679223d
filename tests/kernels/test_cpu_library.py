"""The native CPU library's loading: built by `make setup` where a compiler exists, and
where it is missing or switched off, Folio says so once and runs the PyTorch path."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import kernels.cpu

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler on this machine")
def test_the_library_is_built_where_a_compiler_is():
    # make setup built it; a silent build failure would leave every CPU on the slow path.
    assert kernels.cpu.available(), kernels.cpu.status()
    assert kernels.cpu.status().startswith("native kernels (")
    ops = kernels.cpu.ops()
    assert ops.isa() == ops.best_isa() in ("portable", "avx2", "avx512", "avx512vnni")


def _run(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**env, "PYTHONPATH": str(ROOT)})


def test_switched_off_the_pytorch_path_runs_and_says_so_once(monkeypatch):
    import os

    code = ("import logging; logging.basicConfig(level=logging.WARNING)\n"
            "import kernels.cpu as c\n"
            "print(c.available(), c.available(), c.status(), sep='|')\n")
    done = _run(code, {**os.environ, "FOLIO_NATIVE_CPU": "0"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "False|False|PyTorch kernels (native switched off)")
    assert done.stderr.count("native CPU kernels switched off (FOLIO_NATIVE_CPU=0): "
                             "running the slower PyTorch path") == 1


def test_not_built_is_said_in_the_status(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(kernels.cpu, "_HERE", tmp_path)  # a folder with no library in it
    kernels.cpu._load.cache_clear()
    try:
        with caplog.at_level("WARNING", logger="kernels.cpu"):
            assert not kernels.cpu.available() and not kernels.cpu.available()
        assert kernels.cpu.status() == "PyTorch kernels (native not built)"
        assert [r.getMessage() for r in caplog.records] == [
            "native CPU kernels not built (run `make setup`, or `python -m "
            "kernels.cpu.build` for an installed Folio; it needs a C++ compiler): running the "
            "slower PyTorch path"]
    finally:
        monkeypatch.undo()
        kernels.cpu._load.cache_clear()
