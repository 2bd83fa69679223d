"""The native CPU kernels' tests need the library (`python -m kernels.cpu.build`)."""

from __future__ import annotations

import pytest

from kernels import cpu


def pytest_collection_modifyitems(config, items):
    if cpu.available():
        return
    skip = pytest.mark.skip(reason=f"native CPU kernels unavailable: {cpu.status()}")
    for item in items:
        if "tests/kernels/cpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(skip)


@pytest.fixture(params=["portable", "avx2", "best"])
def isa_path(request):
    """Each kernel path this CPU runs: portable, AVX2 and its best (AVX-512 where it has it)."""
    ops = cpu.ops()
    previous = ops.isa()
    if request.param == "avx2" and ops.best_isa() in ("portable", "avx2"):
        pytest.skip("AVX2 is this CPU's best path or beyond it: covered by 'best'")
    ops.set_isa(ops.best_isa() if request.param == "best" else request.param)
    yield request.param
    ops.set_isa(previous)
