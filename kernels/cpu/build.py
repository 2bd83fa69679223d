"""Build the native CPU kernel library in place: `python -m kernels.cpu.build`.

`make setup` runs this once torch is installed; nothing builds on a first call. The
library is a PyTorch C++ extension (its ops register under `torch.ops.folio_cpu` and
thread through `at::parallel_for`, sharing torch's OpenMP pool). Every `.cpp` under
`csrc/` is compiled: files holding ISA-specific code select their instruction set with
`#pragma GCC target`, so one set of compiler flags serves every file and the library
dispatches at run time on what the CPU has.

Exit status 0 on success; on failure it prints why and exits 1 (the Makefile carries on:
Folio then runs the PyTorch path and says so once).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCES = HERE / "csrc"
LIBRARY_NAME = "_folio_cpu"


def sources() -> list[Path]:
    return sorted(SOURCES.rglob("*.cpp"))


def build(verbose: bool = False) -> Path:
    """Compile the sources into kernels/cpu/_folio_cpu*.so and return its path."""
    import sysconfig

    from setuptools import Distribution
    from torch.utils.cpp_extension import BuildExtension, CppExtension

    # -fno-trapping-math changes no result (nothing reads the FP exception flags); without
    # it GCC keeps a clamp's compare as a branch and leaves loops like silu_mul's scalar on
    # AVX2, which has no masked vector ops to if-convert it with.
    flags = ["-O3", "-std=c++20", "-fopenmp", "-ffp-contract=off", "-fno-math-errno",
             "-fno-trapping-math", "-Wall", "-Wno-unknown-pragmas", "-Wno-unused-function"]
    extension = CppExtension(
        name=f"kernels.cpu.{LIBRARY_NAME}",
        sources=[str(p.relative_to(HERE.parent.parent)) for p in sources()],
        include_dirs=[str(SOURCES)],
        extra_compile_args=flags,
        extra_link_args=["-fopenmp"],
    )
    root = HERE.parent.parent
    # A checkout builds under its build/ (make clean removes it); an installed package in
    # a scratch folder, never inside site-packages.
    build_temp = (root / "build" / "folio_cpu" if (root / "pyproject.toml").exists()
                  else Path(tempfile.mkdtemp(prefix="folio-cpu-build-")))
    dist = Distribution({"name": "folio-cpu", "ext_modules": [extension],
                         "cmdclass": {"build_ext": BuildExtension.with_options(
                             use_ninja=shutil.which("ninja") is not None)}})
    dist.script_args = ["build_ext", "--inplace", "--build-temp", str(build_temp)]
    if not verbose:
        dist.script_args.insert(0, "--quiet")
    dist.parse_command_line()
    dist.run_commands()
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    return HERE / f"{LIBRARY_NAME}{suffix}"


def main() -> int:
    try:
        path = build(verbose="-v" in sys.argv)
    except Exception as exc:  # a missing compiler raises from deep inside setuptools
        print(f"folio: the native CPU kernels were not built ({exc}); Folio will run the "
              "slower PyTorch path", file=sys.stderr)
        return 1
    print(f"folio: built {path.relative_to(HERE.parent.parent)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
