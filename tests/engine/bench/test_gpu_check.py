"""scripts/gpu_check.py (``make gpu-check``) where this suite runs: no CUDA, so it must stop
at once with a clear message; and its summary table, from made-up outcomes."""

from __future__ import annotations

import importlib.util
import json
import os
import re
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


def test_no_cuda_stops_after_the_preflight_with_a_message(gpu_check, capsys):
    ok = gpu_check.Step("preflight (imports)", [sys.executable, "-c", "print('fine')"], 30.0)
    assert gpu_check.main([], cuda_reason=lambda: "test machine", first=ok) == 2
    captured = capsys.readouterr()
    assert "no CUDA device on this machine (test machine); the preflight passed" in captured.err
    assert "fine" in captured.out


def test_a_failed_preflight_stops_before_the_cuda_check(gpu_check, capsys):
    bad = gpu_check.Step("preflight (imports)",
                         [sys.executable, "-c", "import no_such_module_here"], 30.0)
    assert gpu_check.main([], cuda_reason=lambda: pytest.fail("asked for CUDA"),
                          first=bad) == 1
    out = capsys.readouterr().out
    assert "No module named 'no_such_module_here'" in out
    assert re.search(r"preflight \(imports\)\s+FAILED", out)


@pytest.mark.skipif(os.path.exists("/dev/nvidia0"), reason="this machine has a GPU")
def test_script_without_cuda_runs_the_preflight_then_stops():
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                          timeout=240, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no GPU step was run" in proc.stderr
    assert re.search(r"preflight: \d+ modules imported; \d+ tests collected", proc.stdout)


BENCH_OUTPUT = """peak bandwidth: NVIDIA H200: 4800 GB/s (spec sheet)
shape                    batch context splits  kernels
llama-8B                     1    4096     16  triton:     12.0 us    1398 GB/s  29.1% | \
triton-int8:      8.0 us    1090 GB/s  22.7% | triton-fp8:      7.0 us    1245 GB/s  25.9% | \
sdpa: n/a
llama-8B                     8    4096      4  triton:     40.0 us    3356 GB/s  69.9% | \
triton-int8:     25.0 us    2727 GB/s  56.8% | triton-fp8:     24.0 us    2840 GB/s  59.2% | \
sdpa: n/a

type  matmul         N      K      MB       us   GB/s   peak
Q4_K  q/o proj    4096   4096     9.4      4.1   2290  47.7%
Q4_K  gate/up    14336   4096    33.0      9.9   3333  69.4%
Q6_K  down        4096  14336    48.2     14.0   3443  71.7%
"""
E2E = {"size": "1b", "device": "cuda:0", "backend": "triton", "write_s": 3.0, "load_s": 4.0,
       "compile_s": 21.5, "ttft_s": 0.0812, "tok_s_graphs": 410.0, "tok_s_eager": 120.0,
       "logits_rel_err": 0.004, "weights_bytes": 800 << 20, "peak_bytes": 3 << 30,
       "budget_bytes": 4 << 30, "peak_gbps": 4800.0, "logits_ok": True, "bound_tok_s": 5722.0}


def test_summary_table_and_figures(gpu_check):
    Outcome = gpu_check.Outcome
    pytest_tail = "....\n===== 41 passed, 2 skipped in 63.2s =====\n"
    tests = gpu_check.figures_of("kernel tests (compiled Triton)", pytest_tail)
    assert tests == [("compiled kernel tests", "41 passed, 2 skipped in 63.2s", "all pass")]
    bench = gpu_check.figures_of("folio bench kernels", BENCH_OUTPUT)
    assert bench == [("attention decode 8B, ctx 4096", "b1 29.1%, b8 69.9%", ">= 70%"),
                     ("int8 attention decode 8B, ctx 4096", "b1 22.7%, b8 56.8%", ">= 70%"),
                     ("fp8 attention decode 8B, ctx 4096", "b1 25.9%, b8 59.2%", ">= 70%"),
                     ("Q4_K GEMV 8B shapes, batch 1", "48-69% of peak", ">= 60%"),
                     ("Q6_K GEMV 8B shapes, batch 1", "72-72% of peak", "")]
    e2e = gpu_check.figures_of("e2e 1b", "loading\n" + gpu_check.E2E_MARK + json.dumps(E2E))
    values = {name: value for name, value, _ in e2e}
    assert values["1b device / backend"] == "cuda:0 / triton"
    assert values["1b decode, graphs / eager"] == "410.0 / 120.0 tok/s = 3.42x"
    assert values["1b TTFT, 2,048-token prompt"] == "81 ms"
    assert values["1b first-step logits vs torch"] == "4.00e-03 rel (ok)"
    assert values["1b peak GPU memory / budget"] == "3.00 / 4.00 GiB"
    assert values["1b decode / bandwidth bound"] == "7% of 5722"
    table = gpu_check.format_summary([
        Outcome("kernel tests (compiled Triton)", "passed", 63.2, tests),
        Outcome("folio bench kernels", "TIMED OUT", 70.0, bench),
        Outcome("e2e 1b", "FAILED", 9.04, e2e)])
    lines = table.splitlines()
    assert lines[0].split() == ["step", "/", "figure", "status", "seconds", "value", "target"]
    assert set(lines[1]) <= {"-", " "}
    assert lines[2].split()[-2:] == ["passed", "63.2"]
    assert lines[3].split()[1:] == ["compiled", "kernel", "tests", "41", "passed,", "2",
                                    "skipped", "in", "63.2s", "all", "pass"][1:]
    assert "TIMED OUT" in lines[4] and lines[5].rstrip().endswith(">= 70%")
    # Every column starts at the same offset on every line.
    value_at = lines[0].index("value")
    assert all(line[value_at - 2:value_at] == "  " for line in lines[2:] if len(line) > value_at)


def test_moe_rows(gpu_check):
    rows = [{"shape": "OLMoE-1B-7B", "case": "decode b1", "tokens": 1, "fused_ms": 0.05,
             "loop_ms": 0.4, "rel_err": 0.0031}]
    output = "compiling\n" + gpu_check.MOE_MARK + json.dumps(rows) + "\n"
    assert gpu_check.figures_of("moe fused vs loop", output) == [
        ("OLMoE-1B-7B decode b1", "0.050 / 0.400 ms = 8.00x (rel 3.1e-03)", "fused faster")]
    assert gpu_check.figures_of("moe fused vs loop", "crashed\n") == []
    assert gpu_check.MOE_MARK == __import__("engine.bench.gpu_moe").bench.gpu_moe.MARK


def test_time_limits_fit_the_budget(gpu_check):
    steps = [gpu_check.preflight_step(), *gpu_check.steps()]
    assert sum(step.limit_s for step in steps) <= gpu_check.TOTAL_S
    assert all("TRITON_INTERPRET" not in step.env for step in gpu_check.steps())
    cache = Path("/tmp/folio-triton-test")
    e2e = [s for s in gpu_check.steps(triton_cache=cache) if s.name.startswith("e2e")]
    assert [s.env["TRITON_CACHE_DIR"] for s in e2e] == [str(cache)] * 2


DELTANET = {"device": "cuda", "prefill_torch_s": 0.120, "prefill_triton_s": 0.008,
            "decode_torch_s": 0.0012, "decode_triton_s": 0.0001, "prefill_rel_err": 2e-6,
            "decode_rel_err": 4e-7, "fla": "not installed", "prefill_kernel_s": None,
            "prefill_fla_s": None, "decode_kernel_s": None, "decode_fla_s": None,
            "fla_rel_err": None}


def test_gated_deltanet_figures_with_and_without_fla_core(gpu_check):
    from engine.bench.gpu_deltanet import MARK

    assert gpu_check.DELTANET_MARK == MARK  # the script reads it without importing torch
    name = gpu_check.deltanet_step(sys.executable, {}).name
    output = "compiling\n" + gpu_check.DELTANET_MARK + json.dumps(DELTANET)
    rows = gpu_check.figures_of(name, output)
    assert rows == [
        ("GDN prefill 4 x 2,048, torch / triton", "120.00 / 8.00 ms = 15.0x", "> 1x"),
        ("GDN decode batch 32, torch / triton", "1.20 / 0.10 ms = 12.0x", "> 1x"),
        ("GDN triton vs torch (outputs, states)", "2.0e-06 rel", "<= 1e-3"),
        ("GDN fla-core", "not installed", "")]
    with_fla = DELTANET | {"fla": "fla-core 0.6.0", "prefill_kernel_s": 0.006,
                           "prefill_fla_s": 0.003, "decode_kernel_s": 0.0001,
                           "decode_fla_s": 0.0002, "fla_rel_err": 3e-3}
    rows = gpu_check.figures_of(name, gpu_check.DELTANET_MARK + json.dumps(with_fla))
    assert rows[3:] == [
        ("GDN prefill, fla-core / our kernels", "3.00 / 6.00 ms = 0.5x", ""),
        ("GDN decode b32, fla-core / our kernels", "0.20 / 0.10 ms = 2.0x", ""),
        ("GDN fla-core 0.6.0 vs ours", "3.0e-03 rel", "<= 1e-2")]
    assert gpu_check.figures_of(name, "Traceback: no mark") == []
