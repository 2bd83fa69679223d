"""The native CPU storage (engine/layers/weights.py NativeQuantized): a stack of checkpoint
matrices multiplied as they lie (no byte copied, Q/K row order by index), one activation
quantization for every run, a tied embedding and LM head sharing one storage. The kernel's
own error bound is tests/kernels/cpu/test_quant_matmul.py's; here the layers must compose
the kernel exactly."""

from __future__ import annotations

import pytest
import torch

import kernels.cpu
from engine.layers.embedding import Embedding
from engine.layers.linear import StackedLinear
from engine.layers.lm_head import LMHead
from engine.layers.weights import NativeQuantized
from kernels.quant.formats import QuantizedTensor
from kernels.quant.matrix import NativeBlocks
from tests.kernels.quant_cases import oracle_weights, random_quantized

pytestmark = pytest.mark.skipif(not kernels.cpu.available(),
                                reason="the native CPU library is not built")

K = 256
SIZES = (64, 32, 32)  # q, k, v rows
TYPES = ("Q4_K", "Q4_K", "Q6_K")  # llama.cpp's Q4_K_M mix


def _part(name: str, n: int, seed: int, k: int = K,
          order: torch.Tensor | None = None) -> tuple[QuantizedTensor, torch.Tensor]:
    fmt, blocks = random_quantized(name, n, k, seed=seed)
    weights = oracle_weights(fmt, blocks)
    if order is not None:
        weights = weights[order]
    return QuantizedTensor(fmt.type_id, (n, k), torch.from_numpy(blocks), order), weights


def _x(rows: int, seed: int = 0, k: int = K) -> torch.Tensor:
    return torch.randn(rows, k, generator=torch.Generator().manual_seed(seed))


def _qkv():
    order = torch.randperm(SIZES[0], generator=torch.Generator().manual_seed(3))
    parts = [_part(name, rows, seed=i, order=order if i == 0 else None)
             for i, (name, rows) in enumerate(zip(TYPES, SIZES, strict=True))]
    layer = StackedLinear(K, SIZES, bias=False, dtype=torch.float32, device="cpu")
    for index in (2, 0, 1):  # slots arrive in any order
        layer.slot(index).copy_(parts[index][0])
    layer.prepare()
    return layer, parts


def test_the_native_layout_is_picked_for_every_type():
    from kernels.quant.formats import QUANT_FORMATS
    from kernels.quant.matrix import for_product, for_rows

    for fmt in QUANT_FORMATS.values():
        if fmt.name == "MXFP4":  # no native kernel yet: tests/kernels/quant/test_mxfp4.py
            continue
        part, _ = _part(fmt.name, 8, seed=1)
        assert isinstance(for_product(part, torch.device("cpu")), NativeBlocks), fmt.name
        assert isinstance(for_rows(part, torch.device("cpu")), NativeBlocks), fmt.name


def test_each_part_is_a_run_of_its_own_bytes():
    layer, parts = _qkv()
    assert isinstance(layer.storage, NativeQuantized) and layer.storage.pairs
    runs = layer.storage.runs
    assert all(isinstance(run, NativeBlocks) for run in runs)
    # The very tensors loaded (views of the file in a real load): nothing copied, even for
    # the two Q4_K parts that other storages merge.
    assert [run.tensor for run in runs] == [part for part, _ in parts]
    assert layer.derived_bytes == sum(part.nbytes for part, _ in parts)
    assert layer.weight.numel() == 0


@pytest.mark.parametrize("rows", [1, 5, 64])
def test_the_stack_is_the_kernel_on_each_part(rows):
    from kernels.cpu import quant

    layer, parts = _qkv()
    x = _x(rows, seed=rows)
    if rows == 64 and torch.ops.folio_cpu.best_isa() in ("avx512", "avx512vnni"):
        # Prefill-sized rows on AVX-512: the wide (16-bit) tiles, each run as it lies.
        each = [quant.quant_matmul_wide(x, p.data, p.type_id, K, p.row_order)
                for p, _ in parts]
        expected = torch.cat(each, dim=1)
    else:
        # The input quantized once, as (row, residual) pairs, for every run.
        pairs = quant.quantize_activations_residual(x)
        each = [quant.quant_matmul_stack(pairs, [p.data], [p.type_id], K, [p.row_order], True)
                for p, _ in parts]
        expected = torch.cat(each, dim=1)
    out = layer(x)
    assert out.shape == (rows, sum(SIZES)) and out.dtype == torch.float32
    assert torch.equal(out, expected)
    # The rows are in Hugging Face's order (q's permutation honoured), and the residual
    # pairs or the wide rows keep the product near float32's: far inside 8-bit
    # activations' error.
    weights = torch.cat([w for _, w in parts]).double()
    ref = x.double() @ weights.T
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-4
    assert torch.equal(layer.dense_weight(), weights.float())


def test_tied_embedding_and_head_share_one_storage():
    embed = Embedding(130, 64, torch.float32, "cpu")
    head = LMHead(64, 130, torch.float32, "cpu", tied=embed)
    table, weights = _part("Q8_0", 130, seed=21, k=64)
    embed.slot().copy_(table)
    head.prepare()
    embed.prepare()
    assert isinstance(head.storage, NativeQuantized) and embed.storage is head.storage
    assert not head.storage.pairs  # 8-bit activations: the top logits are refined below
    assert embed.derived_bytes == table.nbytes and head.derived_bytes == 0
    ids = torch.tensor([0, 63, 64, 129, 7, 7])
    assert torch.equal(embed(ids), weights[ids])  # dequantized exactly as gguf does
    hidden = _x(3, k=64)
    logits = head(hidden)
    ref = hidden.double() @ weights.double().T
    # The head's top logits are recomputed in float32 from the exact rows.
    top = logits.topk(32, dim=1).indices
    torch.testing.assert_close(logits.gather(1, top).double(), ref.gather(1, top),
                               rtol=1e-5, atol=1e-5)
    assert ((logits.double() - ref).norm() / ref.norm()).item() < 2e-2


def test_eight_bit_activations_are_one_row_each():
    """EngineConfig(cpu_activation_bits=8): every native product takes plain 8-bit rows
    (set_activation_bits), llama.cpp's arithmetic; 16 restores the pairs where asked."""
    from engine.layers.weights import set_activation_bits
    from kernels.cpu import quant

    layer, parts = _qkv()
    head = LMHead(K, 24, torch.float32, "cpu")
    table, _ = _part("Q4_K", 24, seed=9)
    head.slot(0).copy_(table)
    head.prepare()
    model = torch.nn.ModuleList([layer, head])
    set_activation_bits(model, 8)
    assert not layer.storage.pairs and not head.storage.pairs
    x = _x(3, seed=2)
    single = quant.quantize_activations(x)
    expected = torch.cat([quant.quant_matmul(single, p.data, p.type_id, K, p.row_order)
                          for p, _ in parts], dim=1)
    assert torch.equal(layer(x), expected)
    set_activation_bits(model, 16)
    assert layer.storage.pairs and not head.storage.pairs  # the head's top logits refine


def test_mxfp4_takes_the_native_kernel_and_the_pytorch_dequant_stays_the_fallback(
        monkeypatch):
    import kernels.quant.mxfp4 as mxfp4
    from engine.layers.weights import TorchQuantized, quantized_storage
    from kernels.quant.mxfp4 import Mxfp4Blocks
    from tests.kernels.mxfp4_cases import MXFP4, model_weights, random_mxfp4

    blocks = random_mxfp4(48, K, seed=4)
    part = QuantizedTensor(MXFP4, (48, K), torch.from_numpy(blocks))
    native = quantized_storage([part], torch.device("cpu"))
    assert isinstance(native, NativeQuantized) and isinstance(native.runs[0], NativeBlocks)
    monkeypatch.setattr(mxfp4, "_library_takes_mxfp4", lambda: False)  # a build before it
    fallback = quantized_storage([part], torch.device("cpu"))
    assert isinstance(fallback, TorchQuantized) and isinstance(fallback.runs[0], Mxfp4Blocks)
    x = _x(5, seed=2)
    exact = x.double() @ torch.from_numpy(model_weights(blocks, K)).T
    torch.testing.assert_close(fallback.matmul(x).double(), exact, atol=1e-5, rtol=1e-5)
    rel = (native.matmul(x).double() - exact).norm() / exact.norm()
    assert rel < 1e-3  # (x, residual) pairs: about 15 bits of each activation
