"""torch.ops.folio_cpu.top_k_indices (csrc/select/top_k.cpp): each row's k largest values'
indices, largest first, equal values by lower index, NaN above every number; against a
stable NumPy sort of the same ranking."""

from __future__ import annotations

import numpy as np
import pytest
import torch

NAN, INF = float("nan"), float("inf")


def _ranked(values: np.ndarray, k: int) -> np.ndarray:
    """The reference: a stable sort on (NaN first, then value descending)."""
    out = []
    for row in values:
        key = np.where(np.isnan(row), -np.inf, -row)  # NaN first, then the largest
        order = np.lexsort((np.arange(row.size), key, ~np.isnan(row)))
        out.append(order[:k])
    return np.array(out)


def _top(values: torch.Tensor, k: int) -> np.ndarray:
    got = torch.ops.folio_cpu.top_k_indices(values, k)
    assert got.dtype == torch.int64 and got.shape == (values.shape[0], k)
    return got.numpy()


# n: shorter than a chunk, whole chunks, a partial last chunk, the starter's vocabulary.
@pytest.mark.parametrize("n", [5, 64, 130, 6401, 49152])
@pytest.mark.parametrize("k", [1, 3, 32])
def test_random_rows(n, k):
    k = min(k, n)
    x = torch.randn(4, n, generator=torch.Generator().manual_seed(n + k))
    assert (_top(x, k) == _ranked(x.numpy(), k)).all()
    assert (_top(x, k) == x.topk(k, dim=1).indices.numpy()).all()  # distinct values


def test_ties_go_to_the_lower_index():
    x = torch.zeros(2, 300)
    x[0, [7, 250, 100]] = 2.0  # three equal maxima in three chunks, out of order
    x[1, 299] = 1.0  # the rest all equal
    assert _top(x, 4).tolist() == [[7, 100, 250, 0], [299, 0, 1, 2]]


def test_nan_ranks_above_every_number_and_infinities_are_values():
    x = torch.zeros(1, 200)
    x[0, [3, 150]] = NAN
    x[0, 70] = INF
    x[0, 71] = -INF
    x[0, 199] = 5.0
    assert _top(x, 4).tolist() == [[3, 150, 70, 199]]
    x = torch.full((1, 200), -INF)  # only -inf but one number: the number, then by index
    x[0, 130] = -1.0
    assert _top(x, 3).tolist() == [[130, 0, 1]]


def test_all_nan_and_k_equal_to_the_row():
    assert _top(torch.full((1, 130), NAN), 2).tolist() == [[0, 1]]
    x = torch.randn(3, 70, generator=torch.Generator().manual_seed(1))
    assert (_top(x, 70) == _ranked(x.numpy(), 70)).all()


def test_strided_rows_and_threads():
    x = torch.randn(40, 1000, generator=torch.Generator().manual_seed(2))
    view = x[:, ::2]  # non-contiguous rows
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)  # 40 rows split over the pool
        assert (_top(view, 10) == _ranked(view.numpy(), 10)).all()
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("values, k, match", [
    (torch.zeros(2, 5), 0, "k must be in"),
    (torch.zeros(2, 5), 6, "k must be in"),
    (torch.zeros(5), 1, "float32 \\[rows, n\\]"),
    (torch.zeros(2, 5, dtype=torch.float64), 1, "float32 \\[rows, n\\]"),
])
def test_bad_arguments(values, k, match):
    with pytest.raises(RuntimeError, match=match):
        torch.ops.folio_cpu.top_k_indices(values, k)
