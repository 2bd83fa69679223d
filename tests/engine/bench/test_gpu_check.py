"""scripts/gpu_check.py (``make gpu-check``) where this suite runs: no CUDA, so it must stop
at once with a clear message; and its summary table, from made-up outcomes."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_no_cuda_stops_at_once_with_a_message(gpu_check, capsys):
    assert gpu_check.main([], cuda_reason=lambda: "test machine") == 2
    err = capsys.readouterr().err
    assert "no CUDA device on this machine (test machine); nothing was run" in err


@pytest.mark.skipif(os.path.exists("/dev/nvidia0"), reason="this machine has a GPU")
def test_script_without_cuda_exits_quickly():
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                          timeout=60, env=env)
    assert proc.returncode == 2
    assert "nothing was run" in proc.stderr and proc.stdout == ""


def test_summary_table_and_key_figures(gpu_check):
    Outcome = gpu_check.Outcome
    pytest_tail = "....\n===== 41 passed, 2 skipped in 63.2s =====\n"
    bench_tail = ("shape batch\nllama8b  1  512  1  412 GB/s (9 %)\nquant_matmul Q4_K "
                  "4096x14336  2,913 GB/s (61 %)\n")
    starter_tail = gpu_check.MARK + '{"device": "cuda:0", "tokens": 64, "tok_s": 182.46}\nA poem'
    figures = [gpu_check.key_figure("kernel tests (compiled Triton)", pytest_tail),
               gpu_check.key_figure("folio bench kernels", bench_tail),
               gpu_check.key_figure("starter on CUDA (device auto)", starter_tail)]
    assert figures == ["41 passed, 2 skipped in 63.2s",
                       "quant_matmul Q4_K 4096x14336 2,913 GB/s (61 %)",
                       "cuda:0, 182.5 tok/s, 64 tokens"]
    table = gpu_check.format_summary([
        Outcome("kernel tests (compiled Triton)", "passed", 63.2, figures[0]),
        Outcome("folio bench kernels", "TIMED OUT", 120.0, figures[1]),
        Outcome("starter on CUDA (device auto)", "FAILED", 9.04, figures[2])])
    lines = table.splitlines()
    assert lines[0].split() == ["step", "status", "seconds", "key", "figure"]
    assert set(lines[1]) <= {"-", " "}
    assert lines[3].split()[3:5] == ["TIMED", "OUT"] and "120.0" in lines[3]
    assert "9.0" in lines[4] and lines[4].endswith("64 tokens")
    # Every column starts at the same offset on every line.
    status_at = lines[0].index("status")
    assert all(line[status_at - 2:status_at] == "  " for line in lines[2:])


def test_time_limits_fit_the_budget(gpu_check):
    assert sum(step.limit_s for step in gpu_check.steps()) <= gpu_check.TOTAL_S
    assert all("TRITON_INTERPRET" not in step.env for step in gpu_check.steps())
