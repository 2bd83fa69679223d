"""`make gpu-check`: the checks that need a CUDA GPU, in one run of at most 8 minutes.

1. kernel tests: `pytest tests/kernels` with the Triton kernels compiled (TRITON_INTERPRET
   unset; tests/conftest.py turns the interpreter on only where there is no GPU), the
   quantized-kernel tests (tests/kernels/triton/test_quant_*.py) included;
2. kernel bench: `folio bench kernels` (attention bandwidth and the quantized GEMV line);
3. starter on CUDA: the starter model end to end through the Python API with the default
   device (auto), checking that it picked CUDA and generated text.

Each step runs in its own process group under a time limit (cut further so the whole run
ends within TOTAL_S), then one summary table: step, status, seconds, key figure. Exit
status: 0 all passed, 1 a step failed or timed out, 2 no CUDA device here (nothing run).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOTAL_S = 480.0
RESERVE_S = 10.0  # left for the table and process start-up, out of TOTAL_S
MARK = "@@gpu-check@@ "
NO_CUDA = ("gpu-check: no CUDA device on this machine ({why}); nothing was run. "
           "Run `make gpu-check` on a machine with an NVIDIA GPU and a CUDA build of torch.")


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
    figure: str


def cuda_missing_reason() -> str | None:
    """Why there is no usable CUDA device here, or None when there is one. The cheap checks
    come first so a machine without a GPU answers before torch is imported."""
    if shutil.which("nvidia-smi") is None and not Path("/dev/nvidia0").exists():
        return "no nvidia-smi and no /dev/nvidia0"
    import torch

    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device"
    return None


def steps(python: str = sys.executable) -> list[Step]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return [
        Step("kernel tests (compiled Triton)",
             [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout", "120",
              "tests/kernels"], 270.0, env),
        Step("folio bench kernels", [python, "-m", "engine.cli", "bench", "kernels"], 120.0,
             env),
        Step("starter on CUDA (device auto)", [python, str(Path(__file__).resolve()),
                                                "--starter-step"], 80.0, env),
    ]


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
    return Outcome(step.name, status, seconds, key_figure(step.name, output or "")), output


def key_figure(name: str, output: str) -> str:
    """The one number worth a column: the test counts, the bench's last bandwidth line,
    the starter's device and rate."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    if name.startswith("kernel tests"):
        for line in reversed(lines):
            if re.search(r"\d+ (passed|failed|error)", line):
                return line.strip("= ")
    elif name.startswith("folio bench"):
        for line in reversed(lines):
            if "GB/s" in line or "%" in line:
                return " ".join(line.split())[:70]
    else:
        for line in reversed(lines):
            if line.startswith(MARK):
                got = json.loads(line[len(MARK):])
                return f"{got['device']}, {got['tok_s']:.1f} tok/s, {got['tokens']} tokens"
    return lines[-1][:70] if lines else ""


def format_summary(outcomes: list[Outcome]) -> str:
    rows = [("step", "status", "seconds", "key figure")]
    rows += [(o.name, o.status, f"{o.seconds:.1f}", o.figure) for o in outcomes]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def starter_step() -> int:
    """Step 3, in its own process: the starter through LLM with the default config."""
    from engine.config import EngineConfig
    from engine.llm import LLM
    from engine.loaders.catalog import resolve_model
    from engine.sampling_params import SamplingParams

    llm = LLM(str(resolve_model("starter")), EngineConfig())
    device = llm.memory_stats().device
    params = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
    llm.generate(["Warm-up."], SamplingParams(max_tokens=4, temperature=0))
    start = time.perf_counter()
    out = llm.generate(["Write a short poem about the sea."], params)[0]
    wall = time.perf_counter() - start
    tokens = len(out.outputs[0].token_ids)
    print(MARK + json.dumps({"device": device, "tokens": tokens, "tok_s": tokens / wall}))
    print(out.outputs[0].text)
    if not device.startswith("cuda"):
        print(f"the default config picked {device}, not CUDA", file=sys.stderr)
        return 1
    return 0 if tokens == 64 and out.outputs[0].text.strip() else 1


def main(argv: list[str] | None = None, cuda_reason=cuda_missing_reason) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--starter-step"]:
        return starter_step()
    why = cuda_reason()
    if why is not None:
        print(NO_CUDA.format(why=why), file=sys.stderr)
        return 2
    deadline = time.monotonic() + TOTAL_S - RESERVE_S
    outcomes = []
    for step in steps():
        left = deadline - time.monotonic()
        if left < 5:
            outcomes.append(Outcome(step.name, "TIMED OUT", 0.0, "no time left"))
            continue
        print(f"== {step.name} (limit {min(step.limit_s, left):.0f} s)", flush=True)
        outcome, output = run_step(step, min(step.limit_s, left))
        print(output.rstrip()[-4000:], flush=True)  # the tail: failures end up there
        outcomes.append(outcome)
    print("\n" + format_summary(outcomes))
    return 0 if all(o.status == "passed" for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
