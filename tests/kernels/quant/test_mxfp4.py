"""MXFP4's PyTorch path (kernels/quant/mxfp4.py, the fallback where the native library does
not take MXFP4: every test here turns it off) against gguf's reference dequantizer: every
scale byte (subnormal, normal, the largest) and every code, the product of a matrix with x
equal to gguf.quants.dequantize(W) @ x, row lookups in a moved row order, and the storage
a layer picks for MXFP4 parts (dequantized on use). The native kernel's tests are
tests/kernels/cpu/test_quant_mxfp4.py."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from engine.layers.linear import StackedLinear
from engine.layers.weights import TorchQuantized
from kernels.quant.formats import QuantizedTensor, quant_format
from kernels.quant.matrix import for_product, for_rows
from kernels.quant.mxfp4 import MXFP4_TYPE, Mxfp4Blocks, dequantize_mxfp4
from tests.kernels.mxfp4_cases import random_mxfp4


@pytest.fixture(autouse=True)
def pytorch_path(monkeypatch):
    import kernels.quant.mxfp4 as mxfp4

    monkeypatch.setattr(mxfp4, "_library_takes_mxfp4", lambda: False)


def random_blocks(n: int, k: int, seed: int, scales: tuple[int, int] = (118, 130)
                  ) -> np.ndarray:
    return random_mxfp4(n, k, seed, exponents=scales)


def oracle(blocks: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(gguf.quants.dequantize(blocks, Q.MXFP4))


def test_the_format_is_gguf_type_39_of_17_byte_blocks():
    fmt = quant_format(MXFP4_TYPE)
    assert (fmt.name, fmt.block_size, fmt.block_bytes) == ("MXFP4", 32, 17)
    assert int(Q.MXFP4) == MXFP4_TYPE


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")  # gguf's, at scale byte 255
def test_every_scale_and_code_dequantizes_as_gguf():
    blocks = random_blocks(256, 64, seed=0, scales=(0, 256))
    blocks.reshape(256, 2, 17)[:, 0, 0] = np.arange(256)  # each scale byte at least once
    expected = oracle(blocks)
    got = dequantize_mxfp4(torch.from_numpy(blocks), 64)
    assert torch.equal(torch.isfinite(got), torch.isfinite(expected))
    finite = torch.isfinite(expected)
    assert torch.equal(got[finite], expected[finite])


def test_real_weights_round_trip_through_gguf_quantize():
    w = np.random.default_rng(1).standard_normal((8, 96)).astype(np.float32)
    blocks = gguf.quants.quantize(w, Q.MXFP4)
    assert torch.equal(dequantize_mxfp4(torch.from_numpy(blocks), 96), oracle(blocks))


@pytest.mark.parametrize("rows", [1, 7, 40])
def test_products_equal_the_dequantized_matrix_times_x(rows):
    blocks = random_blocks(48, 128, seed=rows)
    x = torch.randn(rows, 128, generator=torch.Generator().manual_seed(rows))
    layout = for_product(QuantizedTensor(MXFP4_TYPE, (48, 128), torch.from_numpy(blocks)),
                         torch.device("cpu"))
    assert isinstance(layout, Mxfp4Blocks)
    torch.testing.assert_close(layout.matmul(x), x @ oracle(blocks).T, atol=1e-4, rtol=1e-5)


def test_rows_follow_the_row_order():
    blocks = random_blocks(16, 64, seed=3)
    order = torch.randperm(16, generator=torch.Generator().manual_seed(0))
    tensor = QuantizedTensor(MXFP4_TYPE, (16, 64), torch.from_numpy(blocks), order)
    layout = for_rows(tensor, torch.device("cpu"))
    ids = torch.tensor([5, 0, 15])
    assert torch.equal(layout.rows(ids, torch.float32), oracle(blocks)[order][ids])


def test_a_layer_of_mxfp4_parts_dequantizes_them_on_use():
    parts = [random_blocks(32, 64, seed=s) for s in (4, 5)]
    layer = StackedLinear(64, (32, 32), bias=False, dtype=torch.float32, device="cpu")
    for index, blocks in enumerate(parts):
        layer.slot(index).copy_(QuantizedTensor(MXFP4_TYPE, (32, 64), torch.from_numpy(blocks)))
    layer.prepare()
    assert isinstance(layer.storage, TorchQuantized)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(6))
    expected = x @ torch.cat([oracle(b) for b in parts]).T
    torch.testing.assert_close(layer(x), expected, atol=1e-4, rtol=1e-5)


def test_other_block_types_are_refused():
    tensor = QuantizedTensor(int(Q.Q8_0), (1, 32), torch.zeros(1, 34, dtype=torch.uint8))
    with pytest.raises(ValueError, match="MXFP4"):
        Mxfp4Blocks(tensor)
