"""dequantize_rows (Triton, interpreted on CPU) against gguf's reference dequantizer, for
every GGUF block type Folio keeps quantized."""

from __future__ import annotations

import pytest
import torch

from kernels.quant.formats import BY_NAME
from kernels.triton.quant_dequant import dequantize_rows
from tests.kernels.quant_cases import TRITON_TYPE_NAMES, oracle_weights, random_quantized

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _exact_or_fp32_rounding(actual: torch.Tensor, expected: torch.Tensor) -> None:
    if DEVICE.type == "cpu":  # the interpreter does the oracle's float32 ops in its order
        assert torch.equal(actual, expected)
    else:  # compiled code may fuse a multiply-add: one float32 rounding apart at most
        torch.testing.assert_close(actual, expected, rtol=2**-22, atol=1e-9)


@pytest.mark.parametrize("name", TRITON_TYPE_NAMES)
def test_dequantize_rows_matches_oracle(name):
    fmt, qweight = random_quantized(name, 5, 3 * BY_NAME[name].block_size, seed=1)
    expected = oracle_weights(fmt, qweight)
    actual = dequantize_rows(torch.from_numpy(qweight).to(DEVICE), fmt.type_id,
                             expected.shape[1])
    assert actual.dtype == torch.float32 and actual.shape == expected.shape
    _exact_or_fp32_rounding(actual.cpu(), expected)


@pytest.mark.parametrize("name", ["Q4_0", "Q6_K"])
def test_gathered_and_strided_rows(name):
    # Embedding lookups gather token rows (repeats included) before dequantizing; a
    # strided view of rows must come out the same as its copy.
    fmt, qweight = random_quantized(name, 9, 2 * BY_NAME[name].block_size, seed=2)
    expected = oracle_weights(fmt, qweight)
    rows = torch.tensor([8, 0, 3, 3])
    table = torch.from_numpy(qweight).to(DEVICE)
    got = dequantize_rows(table[rows.to(DEVICE)], fmt.type_id, expected.shape[1])
    _exact_or_fp32_rounding(got.cpu(), expected[rows])
    got = dequantize_rows(table[::2], fmt.type_id, expected.shape[1])
    _exact_or_fp32_rounding(got.cpu(), expected[::2])
    empty = dequantize_rows(table[:0], fmt.type_id, expected.shape[1])
    assert empty.shape == (0, expected.shape[1])


@pytest.mark.parametrize("name", ["Q5_1", "Q3_K"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_output_is_the_oracle_rounded(name, dtype):
    fmt, qweight = random_quantized(name, 4, 2 * BY_NAME[name].block_size, seed=3)
    expected = oracle_weights(fmt, qweight)
    got = dequantize_rows(torch.from_numpy(qweight).to(DEVICE), fmt.type_id,
                          expected.shape[1], dtype).cpu()
    assert got.dtype == dtype
    if dtype == torch.bfloat16 and DEVICE.type == "cpu":
        # The interpreter narrows float32 to bfloat16 by truncation, not to nearest:
        # at most one bfloat16 step (2**-7 relative) from torch's rounding.
        torch.testing.assert_close(got.float(), expected.to(dtype).float(), rtol=2**-7,
                                   atol=0)
    else:
        assert torch.equal(got, expected.to(dtype))


def test_bad_inputs_name_the_argument():
    fmt, qweight = random_quantized("Q4_K", 2, 256)
    w = torch.from_numpy(qweight)
    with pytest.raises(ValueError, match="type_id"):
        dequantize_rows(w, 99, 256)
    with pytest.raises(ValueError, match="k "):
        dequantize_rows(w, fmt.type_id, 200)
    with pytest.raises(ValueError, match="qweight"):
        dequantize_rows(w, fmt.type_id, 512)
    with pytest.raises(ValueError, match="qweight"):
        dequantize_rows(w.to(torch.int16), fmt.type_id, 256)
    with pytest.raises(ValueError, match="dtype"):
        dequantize_rows(w, fmt.type_id, 256, torch.int32)
