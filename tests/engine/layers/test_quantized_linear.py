"""StackedLinear, Embedding and LMHead holding GGUF-quantized checkpoint matrices: how
stacked slots become runs of one block type, the float fallback, biases, byte accounting,
and the tied embedding sharing its LM head's layout. The layouts' own error bounds are
tests/kernels/quant/test_torch_packed.py's; here the layer must compose them exactly. These
are the storages without the native CPU library (TorchQuantized); the native one is
tests/engine/layers/test_native_storage.py's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.layers import onednn
from engine.layers.embedding import Embedding
from engine.layers.linear import StackedLinear
from engine.layers.lm_head import LMHead
from engine.layers.weights import TorchQuantized
from kernels.quant.formats import BY_NAME, QuantizedTensor
from kernels.quant.matrix import RawBlocks, for_product
from kernels.quant.torch_packed import Int4Packed, Int8Rows
from tests.kernels.quant_cases import oracle_weights, random_quantized

CPU = torch.device("cpu")

pytestmark = pytest.mark.usefixtures("without_native_cpu")
K = 256  # one K-quant block per row
SIZES = (64, 32, 32)  # q, k, v rows
# Relative error of a layer's part against the oracle (test_torch_packed.py measures and
# bounds each layout): int4pack's three bf16 roundings ~3e-3; int8 rows, half a step of
# each row's scale on random blocks ~6e-3..9e-3.
INT4_REL = 6e-3
INT8_REL = 2e-2


def _quantized(name: str, n: int, seed: int, k: int = K) -> tuple[QuantizedTensor, torch.Tensor]:
    fmt, blocks = random_quantized(name, n, k, seed=seed)
    return QuantizedTensor(fmt.type_id, (n, k), torch.from_numpy(blocks)), oracle_weights(
        fmt, blocks)


def _rel(actual: torch.Tensor, reference: torch.Tensor) -> float:
    return ((actual.double() - reference.double()).norm() / reference.double().norm()).item()


def _x(rows: int, seed: int = 0, k: int = K) -> torch.Tensor:
    return torch.randn(rows, k, generator=torch.Generator().manual_seed(seed))


def _assert_float32_product(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                            bias: torch.Tensor | None) -> None:
    # A float32 product in any summation order: within 2 K 2**-24 of the sum of |products|.
    ref = F.linear(x.double(), weight.double(), None if bias is None else bias.double())
    slack = 2 * K * 2.0 ** -24 * (x.double().abs() @ weight.double().abs().T) + 1e-6
    assert out.dtype == torch.float32 and ((out.double() - ref).abs() <= slack).all()


def _layer(types: tuple[str, ...], bias: bool = False, order=None, dtype=torch.float32):
    """A q/k/v StackedLinear loaded with one quantized matrix per slot (in `order`), and
    the oracle's matrices and the bias."""
    layer = StackedLinear(K, SIZES, bias=bias, dtype=dtype, device="cpu")
    parts = [_quantized(name, rows, seed=i) for i, (name, rows) in
             enumerate(zip(types, SIZES, strict=True))]
    for index in order or range(len(SIZES)):
        layer.slot(index).copy_(parts[index][0])
    b = None
    if bias:
        b = torch.randn(sum(SIZES), generator=torch.Generator().manual_seed(9))
        for index in range(len(SIZES)):
            layer.block(index, "bias").copy_(b[sum(SIZES[:index]):sum(SIZES[:index + 1])])
    layer.prepare()
    return layer, parts, b


def _merged(parts: list[tuple[QuantizedTensor, torch.Tensor]]) -> QuantizedTensor:
    tensors = [t for t, _ in parts]
    return QuantizedTensor(tensors[0].type_id, (sum(t.shape[0] for t in tensors), K),
                           torch.cat([t.data for t in tensors]))


def test_one_type_becomes_one_run():
    layer, parts, _ = _layer(("Q4_K", "Q4_K", "Q4_K"))
    assert layer.quantized and len(layer.storage.runs) == 1
    (run,) = layer.storage.runs
    assert isinstance(run, Int4Packed) and run.shape == (128, K)
    assert layer.weight.numel() == 0
    expected = for_product(_merged(parts), CPU)
    assert layer.derived_bytes == run.nbytes == expected.nbytes
    weights = torch.cat([w for _, w in parts])
    for rows in (1, 7, 40):
        x = _x(rows, seed=rows)
        out = layer(x)
        assert out.shape == (rows, 128) and out.dtype == torch.float32
        assert torch.equal(out, expected.matmul(x))
        assert _rel(out, x.double() @ weights.double().T) < INT4_REL


@pytest.mark.parametrize("order", [(0, 1, 2), (2, 0, 1)])
def test_q4_k_m_mix_multiplies_per_run_and_concatenates(order):
    # llama.cpp's Q4_K_M: Q4_K q/k with a Q6_K v. Slots may arrive in any order.
    layer, parts, _ = _layer(("Q4_K", "Q4_K", "Q6_K"), order=order)
    assert [type(r) for r in layer.storage.runs] == [Int4Packed, Int8Rows]
    assert [r.shape for r in layer.storage.runs] == [(96, K), (32, K)]
    assert layer.weight.numel() == 0
    qk = for_product(_merged(parts[:2]), CPU)
    v = for_product(parts[2][0], CPU)
    assert layer.derived_bytes == qk.nbytes + v.nbytes
    for rows in (1, 16, 17, 40):  # both Int8Rows paths
        x = _x(rows, seed=rows)
        out = layer(x)
        assert torch.equal(out, torch.cat([qk.matmul(x), v.matmul(x)], dim=1))
        ref_qk = x.double() @ torch.cat([parts[0][1], parts[1][1]]).double().T
        assert _rel(out[:, :96], ref_qk) < INT4_REL
        assert _rel(out[:, 96:], x.double() @ parts[2][1].double().T) < INT8_REL


def test_same_types_apart_stay_separate_runs():
    layer, parts, _ = _layer(("Q4_K", "Q6_K", "Q4_K"))
    assert [type(r) for r in layer.storage.runs] == [Int4Packed, Int8Rows, Int4Packed]
    x = _x(3)
    expected = torch.cat([for_product(t, CPU).matmul(x) for t, _ in parts], dim=1)
    assert torch.equal(layer(x), expected)


def test_bias_is_added_to_the_quantized_product():
    layer, parts, b = _layer(("Q8_0", "Q8_0", "Q5_0"), bias=True)
    plain, _, _ = _layer(("Q8_0", "Q8_0", "Q5_0"), bias=False)
    for rows in (1, 20):
        x = _x(rows, seed=rows)
        out = layer(x)
        torch.testing.assert_close(out, plain(x) + b, rtol=0, atol=0)
        ref = x.double() @ torch.cat([w for _, w in parts]).double().T + b.double()
        assert _rel(out, ref) < INT8_REL


def test_bfloat16_layer_keeps_bfloat16():
    layer, parts, _ = _layer(("Q4_0", "Q4_0", "Q6_K"), dtype=torch.bfloat16)
    x = _x(5).bfloat16()
    out = layer(x)
    assert out.dtype == torch.bfloat16 and out.shape == (5, 128)
    ref = x.double() @ torch.cat([w for _, w in parts]).double().T
    assert _rel(out, ref) < INT8_REL


@pytest.mark.parametrize("float_first", [True, False])
def test_float_and_quantized_rows_fall_back_to_float(float_first):
    # A stack mixing a float matrix with quantized ones holds one float matrix: the float
    # rows as loaded, the quantized rows dequantized by gguf's reference (bit for bit).
    gen = torch.Generator().manual_seed(3)
    q_float = torch.randn(SIZES[0], K, generator=gen)
    k_part, k_weights = _quantized("Q4_K", SIZES[1], seed=1)
    v_part, v_weights = _quantized("Q6_K", SIZES[2], seed=2)
    b = torch.randn(sum(SIZES), generator=gen)
    layer = StackedLinear(K, SIZES, bias=True, dtype=torch.float32, device="cpu")
    loads = [(0, q_float), (1, k_part), (2, v_part)]
    for index, tensor in loads if float_first else loads[::-1]:
        layer.slot(index).copy_(tensor)
    layer.bias.data.copy_(b)
    layer.prepare()
    assert not layer.quantized and not isinstance(layer.storage, TorchQuantized)
    dense = torch.cat([q_float, k_weights, v_weights])
    assert torch.equal(layer.dense_weight(), dense)
    for rows in (1, 3, 70):
        x = _x(rows, seed=rows)
        _assert_float32_product(layer(x), x, dense, b)
    # No quantized bytes; a packed float copy (oneDNN) counts as the matrix's own size.
    assert layer.derived_bytes in (0, dense.numel() * 4)


def test_a_quantized_layer_allocates_no_float_matrix():
    layer = StackedLinear(K, SIZES, bias=False, dtype=torch.float32, device="cpu")
    assert layer.weight.numel() == 0
    for index, (name, rows) in enumerate(zip(("Q4_1", "Q4_1", "Q4_1"), SIZES, strict=True)):
        layer.slot(index).copy_(_quantized(name, rows, seed=index)[0])
        assert layer.weight.numel() == 0  # not even while loading
    layer.prepare()
    assert layer.weight.numel() == 0
    # int4pack holds Q4_1 at its file size: 5 bits a weight.
    assert layer.derived_bytes == sum(SIZES) * BY_NAME["Q4_1"].row_bytes(K)


def test_a_quantized_layer_takes_float_weights_again():
    layer, _, _ = _layer(("Q4_K", "Q4_K", "Q6_K"))
    dense = torch.randn(sum(SIZES), K, generator=torch.Generator().manual_seed(4))
    for index in range(3):
        layer.block(index, "weight").copy_(dense[sum(SIZES[:index]):sum(SIZES[:index + 1])])
    layer.prepare()
    assert not layer.quantized
    assert torch.equal(layer.dense_weight(), dense)
    x = _x(2)
    _assert_float32_product(layer(x), x, dense, None)


# ------------------------------------------------------------- embedding and LM head
VOCAB, HIDDEN = 130, 64  # 130 rows: three 64-row tiles of int4pack, the last padded
IDS = torch.tensor([0, 63, 64, 129, 7, 7, 128])


def _tied(name: str, dtype=torch.float32):
    embed = Embedding(VOCAB, HIDDEN, dtype, "cpu")
    head = LMHead(HIDDEN, VOCAB, dtype, "cpu", tied=embed)
    table, weights = _quantized(name, VOCAB, seed=21, k=HIDDEN if name != "Q6_K" else 256)
    embed.slot().copy_(table)
    head.prepare()  # the engine's order: linears first, then embeddings
    embed.prepare()
    return embed, head, table, weights


def test_tied_q8_0_table_is_one_layout_for_lookup_and_product():
    embed, head, table, weights = _tied("Q8_0")
    assert head.storage is embed.storage
    assert isinstance(embed.storage.runs[0], Int4Packed) and embed.storage.runs[0].halves
    assert embed.weight.numel() == 0 and head.weight.numel() == 0
    # Counted once, by the embedding.
    assert embed.derived_bytes == embed.storage.runs[0].nbytes and head.derived_bytes == 0
    assert embed.storage.runs[0].nbytes == for_product(table, CPU).nbytes
    # Lookups: Q8_0's weight d * q with d rounded to bf16, so within 2**-8 of each weight.
    looked_up = embed(IDS)
    assert looked_up.shape == (len(IDS), HIDDEN) and looked_up.dtype == torch.float32
    err = (looked_up.double() - weights[IDS].double()).abs()
    assert (err <= 2.0 ** -8 * weights[IDS].double().abs() + 1e-12).all()
    assert torch.equal(looked_up, embed.storage.runs[0].rows(IDS, torch.float32))
    hidden = _x(5, k=HIDDEN)
    logits = head(hidden)
    assert logits.dtype == torch.float32 and logits.shape == (5, VOCAB)
    assert logits.is_contiguous()
    assert _rel(logits, hidden.double() @ weights.double().T) < INT4_REL


def test_tied_int8_rows_table_is_shared_too():
    embed, head, _, weights = _tied("Q6_K")
    assert isinstance(head.storage.runs[0], Int8Rows) and head.storage is embed.storage
    assert head.derived_bytes == 0 and embed.derived_bytes == embed.storage.runs[0].nbytes
    step = weights.double().abs().amax(dim=1, keepdim=True) * (1 + 2.0 ** -8) / 254
    assert ((embed(IDS).double() - weights[IDS].double()).abs() <= step[IDS]).all()


def test_bfloat16_tied_table_gives_float32_logits():
    embed, head, _, weights = _tied("Q8_0", dtype=torch.bfloat16)
    assert embed(IDS).dtype == torch.bfloat16
    logits = head(_x(3, k=HIDDEN).bfloat16())
    assert logits.dtype == torch.float32


@pytest.mark.parametrize("name", ["Q8_0", "Q4_K", "Q6_K", "Q5_1"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_untied_quantized_embedding_looks_up_the_oracle_rows(name, dtype):
    k = BY_NAME[name].block_size * 8
    embed = Embedding(VOCAB, k, dtype, "cpu")
    table, weights = _quantized(name, VOCAB, seed=22, k=k)
    embed.slot().copy_(table)
    assert embed.weight.numel() == 0
    embed.prepare()
    assert isinstance(embed.storage.runs[0], RawBlocks) and embed.derived_bytes == table.nbytes
    out = embed(IDS)
    assert out.dtype == dtype
    assert torch.equal(out, weights[IDS].to(dtype))


def test_untied_quantized_lm_head():
    head = LMHead(HIDDEN, VOCAB, torch.float32, "cpu")
    table, weights = _quantized("Q4_0", VOCAB, seed=23, k=HIDDEN)
    head.slot(0).copy_(table)
    head.prepare()
    assert head.quantized and head.derived_bytes == for_product(table, CPU).nbytes
    hidden = _x(4, k=HIDDEN)
    assert _rel(head(hidden), hidden.double() @ weights.double().T) < INT4_REL


def test_float_embedding_after_a_quantized_one():
    embed = Embedding(VOCAB, HIDDEN, torch.float32, "cpu")
    table, _ = _quantized("Q8_0", VOCAB, seed=24, k=HIDDEN)
    embed.slot().copy_(table)
    embed.prepare()
    dense = torch.randn(VOCAB, HIDDEN, generator=torch.Generator().manual_seed(5))
    embed.slot().copy_(dense)
    embed.prepare()
    assert embed.storage is None and embed.derived_bytes == 0
    assert torch.equal(embed(IDS), dense[IDS])


@pytest.mark.skipif(not onednn.available(), reason="the stale copy is oneDNN's packed one")
def test_quantized_weights_after_float_ones_drop_the_packed_copy():
    layer = StackedLinear(K, (64,), bias=False, dtype=torch.float32, device="cpu")
    layer.block(0, "weight").copy_(torch.randn(64, K, generator=torch.Generator().manual_seed(6)))
    layer.prepare()
    table, _ = _quantized("Q4_K", 64, seed=7)
    layer.slot(0).copy_(table)
    layer.prepare()
    assert layer.quantized
    assert layer.derived_bytes == for_product(table, CPU).nbytes
