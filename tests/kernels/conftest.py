"""Kernel tests run Triton's interpreter on CPU, where each tl.dot is a numpy matmul:
numpy's multi-threaded BLAS makes those tiny products about 1000x slower on the shared
2-core machine, so every kernel test module runs with one BLAS thread."""

from __future__ import annotations

import pytest

from tests.kernels.paged_cases import single_thread_blas


@pytest.fixture(autouse=True, scope="module")
def _one_blas_thread():
    with single_thread_blas():
        yield
