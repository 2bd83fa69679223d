"""Tests of the native CPU library's ops: skipped where the library is not built; the ISA
paths to run each kernel on; the NumPy model of activation quantization that both quant
test modules check against (a fixture: test modules cannot import each other or this file
by name)."""

from __future__ import annotations

import numpy as np
import pytest

import kernels.cpu
from tests.kernels.quant_cases import round_blocks


@pytest.fixture(autouse=True, scope="module")
def _native_library():
    if not kernels.cpu.available():
        pytest.skip(f"native CPU kernels: {kernels.cpu.status()}")


def quantize_model(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float32 [m, k] -> (q int8 [m, k], d float32 [m, k/32], sums int16 [m, k/16]): the
    layout's definition in NumPy float32 (d = amax / 127, q = rint(x * (1 / d)), ties to
    even, clamped to +-127, 0 where d = 0)."""
    m, k = x.shape
    q, d = round_blocks(x, 127)
    q = q.astype(np.int8)
    sums = q.reshape(m, k // 16, 16).astype(np.int16).sum(axis=-1, dtype=np.int16)
    return q.reshape(m, k), d.astype(np.float32), sums


def parse_act(act: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """uint8 [m, act_row_bytes(k)] -> (q int8 [m, K256], d float32 [m, K256/32],
    sums int16 [m, K256/16]), K256 = k rounded up to 256 (the documented layout)."""
    kp = -(-k // 256) * 256
    act = np.ascontiguousarray(act)
    q = act[:, :kp].view(np.int8)
    d = np.ascontiguousarray(act[:, kp:kp + kp // 8]).view(np.float32)
    sums = np.ascontiguousarray(act[:, kp + kp // 8:kp + kp // 4]).view(np.int16)
    return q, d, sums


@pytest.fixture(scope="session")
def act_model():
    """(quantize_model, parse_act): see their docstrings."""
    return quantize_model, parse_act


@pytest.fixture(params=["portable", "avx2", "best"])
def isa_path(request):
    """Each kernel path this CPU runs: portable, AVX2 and its best (AVX-512 where it has it)."""
    ops = kernels.cpu.ops()
    previous = ops.isa()
    if request.param == "avx2" and ops.best_isa() in ("portable", "avx2"):
        pytest.skip("AVX2 is this CPU's best path or beyond it: covered by 'best'")
    ops.set_isa(ops.best_isa() if request.param == "best" else request.param)
    yield request.param
    ops.set_isa(previous)
