"""`make gpu-check` (on the lent GPU machine: scripts/gpu_check.sh): the checks that need a
CUDA GPU, in one run of at most 9.5 minutes.

0. preflight: every module the GPU steps import, and the collection of their tests, so a
   missing package shows in seconds, before any GPU time (it runs without CUDA too);
1. kernel tests: `pytest tests/kernels` with the Triton kernels compiled (TRITON_INTERPRET
   unset; tests/conftest.py turns the interpreter on only where there is no GPU), and
   CUDA-graph replay against eager decode (tests/engine/runner/test_cuda_graphs_cuda.py);
2. kernel bench: `folio bench kernels` at Llama-8B shapes (attention decode, 4,096-token
   contexts, over a bfloat16 pool and over int8 and fp8 pools scored by their quantized
   bytes (issue 47), and the Q4_K / Q6_K GEMVs), as shares of the card's peak bandwidth;
3. Gated DeltaNet (engine/bench/gpu_deltanet.py): a Qwen3.5-0.8B-shaped linear layer's
   token mixing, Triton against the PyTorch path (prefill of 4 x 2,048 tokens, a decode
   step at batch 32), and fla-core's kernels against ours where the bundle brings it;
4. end to end (engine/bench/gpu_e2e.py): synthetic Llama-3.2-1B and Llama-3-8B-shaped
   Q4_K_M models written from the starter's vocabulary (the bundle's vocabulary-only GGUF
   where the starter is not installed), loaded with the default device;
5. MoE (engine/bench/gpu_moe.py): an OLMoE-1B-7B-shaped Q4_K layer and a gpt-oss-20b-shaped
   MXFP4 one, the fused Triton kernels against the per-expert loop (prefill of 512 tokens,
   decode at batch 1 and 32), each row also checking the two agree.

Each step runs in its own process group under a time limit (cut further so the whole run
ends within TOTAL_S), then one table: each step's status and seconds, and the figures it
gave with their targets (issue 19). Exit status: 0 all passed, 1 a step failed or timed
out, 2 no CUDA device here (after the preflight; nothing else run).
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The tree this script is in, not whichever Folio is installed, as for `python -m` from ROOT.
sys.path.insert(0, str(ROOT))
TOTAL_S = 570.0
RESERVE_S = 10.0  # left for the table and process start-up, out of TOTAL_S
E2E_MARK = "@@gpu-e2e@@ "  # engine/bench/gpu_e2e.py's MARK, without importing torch here
DELTANET_MARK = "@@gpu-deltanet@@ "  # engine/bench/gpu_deltanet.py's MARK
MOE_MARK = "@@gpu-moe@@ "  # engine/bench/gpu_moe.py's MARK
NO_CUDA = ("gpu-check: no CUDA device on this machine ({why}); the preflight passed and no "
           "GPU step was run. Run `make gpu-check` on a machine with an NVIDIA GPU and a "
           "CUDA build of torch.")
# The native CPU library's tests stay out: nothing builds that library on the GPU machine.
KERNEL_TESTS = ("tests/kernels", "--ignore=tests/kernels/cpu",
                "--ignore=tests/kernels/test_cpu_library.py",
                "tests/engine/runner/test_cuda_graphs_cuda.py",
                "tests/engine/layers/test_token_mixers.py",
                "tests/engine/layers/moe/test_triton_experts.py")
# What the GPU steps import beyond the test files (which the preflight collects).
GPU_IMPORTS = ("torch", "triton", "transformers", "gguf", "platformdirs", "numpy",
               "kernels.triton.backend", "kernels.triton.quant_matmul", "kernels.bench",
               "engine.cli", "engine.bench.cli", "engine.bench.gpu_e2e", "engine.llm",
               "engine.runner.cuda_graphs", "engine.bench.gpu_deltanet",
               "engine.bench.gpu_moe", "kernels.triton.fused_moe",
               "engine.loaders.gguf.loader")
KV_BENCH_FORMATS = ("int8", "fp8")  # the quantized pools' cells (issue 47)
# Blocks of 64: an int8 pool's keys are encoded a block at a time from 64 tokens
# (kernels/kv_key_centers.py); every column of the table reads the same block size.
BENCH_ARGS = ("--shapes", "llama8b", "--batches", "1,8,32", "--contexts", "4096",
              "--reps", "10", "--block-size", "64", "--kv", ",".join(KV_BENCH_FORMATS))
TOKENIZER_ENV = "FOLIO_TOKENIZER_GGUF"  # the vocabulary GGUF (scripts/gpu_check.sh sets it)


@dataclass(slots=True)
class Step:
    name: str
    command: list[str]
    limit_s: float
    env: dict[str, str] | None = None


@dataclass(slots=True)
class Outcome:
    name: str
    status: str  # "passed", "FAILED" or "TIMED OUT"
    seconds: float
    figures: list[tuple[str, str, str]] = field(default_factory=list)  # (figure, value, target)


def cuda_missing_reason() -> str | None:
    """Why there is no usable CUDA device here, or None when there is one. The cheap checks
    come first so a machine without a GPU answers before torch is imported."""
    if shutil.which("nvidia-smi") is None and not Path("/dev/nvidia0").exists():
        return "no nvidia-smi and no /dev/nvidia0"
    import torch

    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device"
    return None


def preflight_step(python: str = sys.executable) -> Step:
    return Step("preflight (imports)", [python, str(Path(__file__).resolve()), "--preflight"],
                60.0)


def steps(python: str = sys.executable, triton_cache: Path | None = None) -> list[Step]:
    """``triton_cache``: an empty folder for the end-to-end steps' Triton cache, so the
    first model's compile is a first use (the kernel tests compile into the default)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    e2e_env = env | ({"TRITON_CACHE_DIR": str(triton_cache)} if triton_cache else {})
    me = str(Path(__file__).resolve())
    return [
        Step("kernel tests (compiled Triton)",
             [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout", "120",
              *KERNEL_TESTS], 150.0, env),
        Step("folio bench kernels", [python, "-m", "engine.cli", "bench", "kernels",
                                     *BENCH_ARGS], 60.0, env),
        deltanet_step(python, env),
        Step("e2e 1b", [python, me, "--e2e", "1b"], 60.0, e2e_env),
        Step("e2e 8b", [python, me, "--e2e", "8b"], 110.0, e2e_env),
        moe_bench_step(python, env),
    ]


def moe_bench_step(python: str, env: dict[str, str]) -> Step:
    """Step 5: first-use compiles of about twenty kernel variants, then the timed rows."""
    return Step("moe fused vs loop", [python, str(Path(__file__).resolve()), "--moe"], 80.0,
                env)


def run_step(step: Step, limit_s: float) -> tuple[Outcome, str]:
    """Run one step in its own process group, killed whole when it runs past ``limit_s``."""
    start = time.monotonic()
    proc = subprocess.Popen(step.command, cwd=ROOT, env=step.env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=limit_s)
        status = "passed" if proc.returncode == 0 else "FAILED"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        status = "TIMED OUT"
    seconds = time.monotonic() - start
    return Outcome(step.name, status, seconds, figures_of(step.name, output or "")), output


def figures_of(name: str, output: str) -> list[tuple[str, str, str]]:
    """The step's figures for the table, read from its output."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    if name.startswith("kernel tests"):
        counts = [ln.strip("= ") for ln in lines if re.search(r"\d+ (passed|failed|error)", ln)]
        return [("compiled kernel tests", counts[-1] if counts else "no summary", "all pass")]
    if name.startswith("folio bench"):
        return bench_figures(lines)
    if name.startswith("e2e"):
        marked = [ln for ln in lines if ln.startswith(E2E_MARK)]
        return e2e_figures(json.loads(marked[-1][len(E2E_MARK):])) if marked else []
    if name.startswith("gated deltanet"):
        marked = [ln for ln in lines if ln.startswith(DELTANET_MARK)]
        return deltanet_figures(json.loads(marked[-1][len(DELTANET_MARK):])) if marked else []
    if name.startswith("moe"):
        marked = [ln for ln in lines if ln.startswith(MOE_MARK)]
        return moe_figures(json.loads(marked[-1][len(MOE_MARK):])) if marked else []
    return [("last line", lines[-1][:70], "")] if lines else []


def bench_figures(lines: list[str]) -> list[tuple[str, str, str]]:
    """Attention decode per batch (its triton cell, then the cell of each quantized pool)
    and each GEMV type's range over the 8B matmuls, as shares of the peak."""
    figures = []
    for pool in ("", *KV_BENCH_FORMATS):
        name = "triton" + (f"-{pool}" if pool else "")
        attention = []
        for line in lines:
            cell = re.search(name + r":\s+[\d.]+ us\s+\d+ GB/s\s+([\d.]+)%", line)
            if line.startswith("llama-8B") and cell:
                attention.append(f"b{line.split()[1]} {cell.group(1)}%")
        label = f"{pool} attention decode" if pool else "attention decode"
        figures.append((f"{label} 8B, ctx 4096", ", ".join(attention) or "none", ">= 70%"))
    for kind, target in (("Q4_K", ">= 60%"), ("Q6_K", "")):
        shares = [float(ln.split()[-1].rstrip("%")) for ln in lines
                  if ln.startswith(kind + " ") and ln.endswith("%")]
        value = f"{min(shares):.0f}-{max(shares):.0f}% of peak" if shares else "none"
        figures.append((f"{kind} GEMV 8B shapes, batch 1", value, target))
    return figures


def e2e_figures(got: dict) -> list[tuple[str, str, str]]:
    size = got["size"]
    gib = 2.0**30
    rows = [(f"{size} device / backend", f"{got['device']} / {got['backend']}", "cuda / triton"),
            (f"{size} first-use compile", f"{got['compile_s']:.1f} s", "<= 60 s"),
            (f"{size} TTFT, 2,048-token prompt", f"{got['ttft_s'] * 1e3:.0f} ms", ""),
            (f"{size} first-step logits vs torch",
             f"{got['logits_rel_err']:.2e} rel ({'ok' if got['logits_ok'] else 'OFF'})",
             "<= 3.1e-02")]
    graphs, eager = got["tok_s_graphs"], got["tok_s_eager"]
    if graphs is None:
        rows.append((f"{size} decode, batch 1", f"{eager:.1f} tok/s (no graphs)", ""))
    else:
        rows.append((f"{size} decode, graphs / eager",
                     f"{graphs:.1f} / {eager:.1f} tok/s = {graphs / eager:.2f}x",
                     ">= 3x" if size == "1b" else ""))
    if got.get("bound_tok_s") and graphs is not None:
        rows.append((f"{size} decode / bandwidth bound",
                     f"{100 * graphs / got['bound_tok_s']:.0f}% of {got['bound_tok_s']:.0f}",
                     ">= 40%" if size == "8b" else ""))
    if got["peak_bytes"] is not None:
        rows.append((f"{size} peak GPU memory / budget",
                     f"{got['peak_bytes'] / gib:.2f} / {got['budget_bytes'] / gib:.2f} GiB",
                     "<= budget"))
    return rows


def deltanet_step(python: str, env: dict[str, str]) -> Step:
    return Step("gated deltanet (0.8B layer)", [python, str(Path(__file__).resolve()),
                                                "--deltanet"], 50.0, env)


def deltanet_figures(got: dict) -> list[tuple[str, str, str]]:
    """Triton against the PyTorch path, and fla-core against our kernels where it ran."""
    def versus(slow: float, fast: float) -> str:
        return f"{slow * 1e3:.2f} / {fast * 1e3:.2f} ms = {slow / fast:.1f}x"

    rows = [("GDN prefill 4 x 2,048, torch / triton",
             versus(got["prefill_torch_s"], got["prefill_triton_s"]), "> 1x"),
            ("GDN decode batch 32, torch / triton",
             versus(got["decode_torch_s"], got["decode_triton_s"]), "> 1x"),
            ("GDN triton vs torch (outputs, states)",
             f"{max(got['prefill_rel_err'], got['decode_rel_err']):.1e} rel", "<= 1e-3")]
    if got.get("prefill_fla_s") is None or got.get("decode_fla_s") is None:
        return [*rows, ("GDN fla-core", got["fla"][:70], "")]
    return [*rows,
            ("GDN prefill, fla-core / our kernels",
             versus(got["prefill_fla_s"], got["prefill_kernel_s"]), ""),
            ("GDN decode b32, fla-core / our kernels",
             versus(got["decode_fla_s"], got["decode_kernel_s"]), ""),
            (f"GDN {got['fla']} vs ours", f"{got['fla_rel_err']:.1e} rel", "<= 1e-2")]


def deltanet_bench_step() -> int:
    """Step 3, in its own process."""
    from engine.bench.gpu_deltanet import MARK, run_deltanet_bench

    # Each report a line of its own: the table reads the last, so a step cut short while
    # fla-core compiles still shows the Triton and PyTorch figures.
    result = run_deltanet_bench("cuda", report=lambda r: print(MARK + r.to_json(), flush=True))
    return 0 if max(result.prefill_rel_err, result.decode_rel_err) <= 1e-3 else 1


def moe_figures(rows: list[dict]) -> list[tuple[str, str, str]]:
    """A row per layer and case: fused and loop times, the speed-up, whether they agree."""
    return [(f"{r['shape']} {r['case']}",
             f"{r['fused_ms']:.3f} / {r['loop_ms']:.3f} ms = {r['loop_ms'] / r['fused_ms']:.2f}x"
             f" (rel {r['rel_err']:.1e})", "fused faster") for r in rows]


def moe_step() -> int:
    """Step 5, in its own process: the rows as one marked JSON line; fails where a fused
    result is off the loop's or there is no CUDA."""
    import torch

    from engine.bench.gpu_moe import MARK, run_moe_bench, to_json

    if not torch.cuda.is_available():
        print("the MoE timing needs CUDA", file=sys.stderr)
        return 1
    rows = run_moe_bench()
    print(MARK + to_json(rows), flush=True)
    return 0 if all(row.ok for row in rows) else 1


def format_summary(outcomes: list[Outcome]) -> str:
    """One table: a line per step (status, seconds), then its figures indented under it."""
    rows = [("step / figure", "status", "seconds", "value", "target")]
    for o in outcomes:
        rows.append((o.name, o.status, f"{o.seconds:.1f}", "", ""))
        rows += [("  " + fig, "", "", value, target) for fig, value, target in o.figures]
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def preflight() -> int:
    """Import what the GPU steps import and collect their tests (no kernel runs)."""
    for name in GPU_IMPORTS:
        importlib.import_module(name)
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider", *KERNEL_TESTS], cwd=ROOT,
                          capture_output=True, text=True)
    tail = proc.stdout.strip().splitlines()[-1:] or [proc.stderr.strip()[-300:]]
    print(f"preflight: {len(GPU_IMPORTS)} modules imported; {tail[0]}")
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
    return proc.returncode


def e2e_step(size: str, device: str | None = None) -> int:
    """Step 3 for one size, in its own process; on a GPU it must pick CUDA and Triton."""
    from engine.bench.gpu_e2e import MARK, run_e2e
    from engine.loaders.gguf.loader import cache_root

    vocab = os.environ.get(TOKENIZER_ENV)
    if vocab is None:
        from engine.loaders.catalog import starter_path

        vocab = starter_path()
    result = run_e2e(size, Path(vocab), cache_root() / "bench", device)
    print(MARK + result.to_json(), flush=True)
    picked = (result.device.startswith("cuda") and result.backend == "triton"
              or device == "cpu")
    if not picked:
        print(f"the default config picked {result.device} / {result.backend}, not CUDA / "
              f"Triton", file=sys.stderr)
    return 0 if picked and result.logits_ok else 1


def run_all(outcomes: list[Outcome], todo: list[Step], deadline: float) -> None:
    for step in todo:
        left = deadline - time.monotonic()
        if left < 5:
            outcomes.append(Outcome(step.name, "TIMED OUT", 0.0, [("", "no time left", "")]))
            continue
        print(f"== {step.name} (limit {min(step.limit_s, left):.0f} s)", flush=True)
        outcome, output = run_step(step, min(step.limit_s, left))
        print(output.rstrip()[-4000:], flush=True)  # the tail: failures end up there
        outcomes.append(outcome)


def main(argv: list[str] | None = None, cuda_reason=cuda_missing_reason,
         first: Step | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--preflight"]:
        return preflight()
    if argv == ["--deltanet"]:
        return deltanet_bench_step()
    if argv[:1] == ["--e2e"]:
        return e2e_step(argv[1], *argv[2:3])
    if argv == ["--moe"]:
        return moe_step()
    deadline = time.monotonic() + TOTAL_S - RESERVE_S
    outcomes: list[Outcome] = []
    run_all(outcomes, [first or preflight_step()], deadline)
    if outcomes[0].status != "passed":
        print("\n" + format_summary(outcomes))
        return 1
    why = cuda_reason()
    if why is not None:
        print(NO_CUDA.format(why=why), file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="folio-triton-") as cache:
        run_all(outcomes, steps(triton_cache=Path(cache)), deadline)
    print("\n" + format_summary(outcomes))
    return 0 if all(o.status == "passed" for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
