"""`make device-emulation`: the lent GPU machine (issue 19), without its GPU, on this one.

1. A fresh Python 3.12 venv (pyenv's, ``PYTHON_312``) with what that machine has: torch,
   Triton and transformers at the low ends of pyproject.toml's ranges (the machine's own
   versions; `make test` runs the high ends), and the packages of ``MACHINE_PACKAGES``. The
   registry serves torch 2.11 for Linux only as its CUDA 13 build with the nvidia
   libraries, the machine's own build, which imports and runs on a CPU; that install is
   the one step here that needs the network.
2. The packages the machine lacks are checked to be missing from the venv too, so only
   the bundle can bring them.
3. The device entry, scripts/gpu_check.sh, with that venv's python: the bundle's wheels
   installed with --no-index only, the preflight (every import of the GPU steps and the
   collection of their tests), then its stop for want of CUDA (exit status 2).
4. The end-to-end step of the device check on the CPU, on a tiny synthetic model written
   from the bundle's vocabulary (scripts/gpu_check.sh --e2e tiny cpu).

Prints each stage's seconds; exit status 0 when every stage did what the device would.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "build" / "device-emulation"
PYTHON_312 = Path(os.environ.get("FOLIO_EMULATION_PYTHON",
                                 Path.home() / ".pyenv" / "versions" / "3.12.1" / "bin"
                                 / "python"))
RANGED = ("torch", "triton", "transformers")
# The lent machine's other packages that Folio's GPU steps use, at its versions where
# known (the device tool's KINDS.md).
MACHINE_PACKAGES = ("huggingface-hub==1.33.0", "safetensors==0.8.0", "sentencepiece==0.2.2",
                    "tokenizers==0.23.2", "numpy", "pyyaml", "tqdm", "requests", "jinja2",
                    "pytest", "pytest-timeout", "hypothesis", "prometheus-client", "pygments")
MACHINE_LACKS = ("gguf", "platformdirs", "fastapi", "openai", "PySide6")


def lower_bounds(pyproject: Path = ROOT / "pyproject.toml") -> dict[str, str]:
    """{name: version} of each of RANGED from its ``>=`` in pyproject's dependencies."""
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    found = {}
    for dep in deps:
        match = re.match(r"([A-Za-z0-9_.-]+)\s*>=\s*([0-9][^,;\s]*)", dep)
        if match and match.group(1).lower() in RANGED:
            found[match.group(1).lower()] = match.group(2)
    missing = [name for name in RANGED if name not in found]
    if missing:
        raise ValueError(f"pyproject.toml gives no lower bound for {missing}")
    return found


def pins(bounds: dict[str, str]) -> list[str]:
    """The lower bounds as exact pins, a release's ``.0`` filled in (``2.11`` -> 2.11.0)."""
    return [f"{name}=={v if v.count('.') >= 2 else v + '.0'}" for name, v in bounds.items()]


def stage(name: str, command: list[str], expect: int = 0, **kwargs) -> float:
    print(f"== {name}", flush=True)
    start = time.monotonic()
    code = subprocess.run(command, cwd=ROOT, **kwargs).returncode
    seconds = time.monotonic() - start
    if code != expect:
        raise SystemExit(f"device emulation: {name} exited {code}, expected {expect}")
    print(f"-- {name}: {seconds:.0f} s", flush=True)
    return seconds


def main() -> int:
    if not PYTHON_312.exists():
        raise SystemExit(f"device emulation needs Python 3.12 at {PYTHON_312} "
                         f"(FOLIO_EMULATION_PYTHON)")
    venv = WORK / "venv"
    shutil.rmtree(venv, ignore_errors=True)
    WORK.mkdir(parents=True, exist_ok=True)
    python = str(venv / "bin" / "python")
    wanted = pins(lower_bounds())
    times = {"venv": stage("fresh Python 3.12 venv", [str(PYTHON_312), "-m", "venv",
                                                       str(venv)])}
    times["install"] = stage(f"the machine's packages: {' '.join(wanted)}",
                             [python, "-m", "pip", "install", "--quiet", *wanted,
                              *MACHINE_PACKAGES])
    for name in MACHINE_LACKS:
        stage(f"{name} missing, as on the machine", [python, "-c", f"import {name}"],
              expect=1, stderr=subprocess.DEVNULL)
    if not (ROOT / "device-bundle" / "manifest.json").exists():
        times["bundle"] = stage("make device-bundle", [sys.executable,
                                                       "scripts/device_bundle.py"])
    env = dict(os.environ, FOLIO_DEVICE_PYTHON=python, CUDA_VISIBLE_DEVICES="")
    times["entry"] = stage("the device entry, up to its stop for want of CUDA",
                           ["bash", "scripts/gpu_check.sh"], expect=2, env=env)
    times["e2e"] = stage("the end-to-end step on the CPU (tiny model)",
                         ["bash", "scripts/gpu_check.sh", "--e2e", "tiny", "cpu"], env=env)
    versions = subprocess.run(
        [python, "-c", "import sys, torch, triton, transformers; print(sys.version.split()[0],"
         " torch.__version__, triton.__version__, transformers.__version__)"],
        capture_output=True, text=True, check=True).stdout.split()
    print(f"device emulation passed: Python {versions[0]}, torch {versions[1]}, triton "
          f"{versions[2]}, transformers {versions[3]}; "
          + ", ".join(f"{k} {v:.0f} s" for k, v in times.items())
          + f"; {sum(times.values()):.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
