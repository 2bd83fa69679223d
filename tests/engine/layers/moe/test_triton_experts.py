"""The MoE block's fused Triton method (engine/layers/moe/triton.py, kernels interpreted
on CPU): picked at load only where every expert holds Triton's quantized storage (what a CUDA
load of a GGUF file gives), equal to the PyTorch block (the loop of `SparseMoE.mix`) over
the same experts dequantized by gguf, for the softmax router's SiLU experts and gpt-oss's
router, clamped SwiGLU and biases, at decode and prefill sizes; the stacked blocks are
the experts' own storage, held once."""

from __future__ import annotations

import pytest
import torch

from engine.layers.linear import StackedLinear
from engine.layers.moe.gpt_oss import ClampedSwiGLU, SoftmaxOfTopKRouter
from engine.layers.moe.sparse import SparseMoE
from engine.layers.weights import DenseWeight, TritonQuantized
from kernels.quant.formats import BY_NAME, QuantizedTensor
from kernels.quant.matrix import RawBlocks
from tests.kernels.quant_cases import oracle_weights, random_quantized

pytestmark = pytest.mark.usefixtures("single_torch_thread")

EXPERTS, TOP_K = 6, 2


def block_of(gpt_oss: bool, hidden: int, size: int, seed: int = 0) -> SparseMoE:
    if not gpt_oss:
        block = SparseMoE(hidden, size, EXPERTS, TOP_K, True, torch.float32, "cpu")
    else:
        experts = [ClampedSwiGLU(hidden, size, 1.702, 7.0, torch.float32, "cpu")
                   for _ in range(EXPERTS)]
        router = SoftmaxOfTopKRouter(hidden, EXPERTS, TOP_K, torch.float32, "cpu")
        block = SparseMoE(hidden, size, EXPERTS, TOP_K, True, torch.float32, "cpu",
                          gate=router, experts=experts)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in block.gate.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    return block


def twins(name: str, gpt_oss: bool = False) -> tuple[SparseMoE, SparseMoE]:
    """(a block whose experts hold random `name` blocks in Triton's storage, as a CUDA
    load leaves them, prepared; the same block with gguf's dequantized floats)."""
    block = BY_NAME[name].block_size
    hidden, size = 2 * block, block
    fused, dense = block_of(gpt_oss, hidden, size), block_of(gpt_oss, hidden, size)
    seed = 0
    for ours, theirs in zip(fused.experts, dense.experts, strict=True):
        for a, b in ((ours.gate_up_proj, theirs.gate_up_proj),
                     (ours.down_proj, theirs.down_proj)):
            fmt, blocks = random_quantized(name, a.shape[0], a.shape[1], seed=seed)
            seed += 1
            a.storage = TritonQuantized([RawBlocks(QuantizedTensor(
                fmt.type_id, a.shape, torch.from_numpy(blocks)), triton=True)])
            with torch.no_grad():
                b.slot(None).copy_(oracle_weights(fmt, blocks))
                if a.bias is not None:
                    bias = torch.randn(a.shape[0], generator=torch.Generator().manual_seed(seed))
                    a.bias.copy_(bias)
                    b.bias.copy_(bias)
            b.prepare()
    fused.prepare()
    dense.prepare()
    return fused, dense


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return ((a - b).norm() / b.norm()).item() < 1e-5


@pytest.mark.parametrize("tokens", [1, 5, 13])
@pytest.mark.parametrize("name", ["Q8_0", "MXFP4"])
def test_softmax_experts_take_the_fused_kernels_and_equal_the_loop(name, tokens):
    fused, dense = twins(name)
    assert fused.fused is not None and dense.fused is None
    x = torch.randn(tokens, fused.experts[0].gate_up_proj.in_features,
                    generator=torch.Generator().manual_seed(tokens))
    assert close(fused(x), dense(x))


@pytest.mark.parametrize("tokens", [3, 17])
def test_gpt_oss_router_clamped_swiglu_and_biases(tokens):
    fused, dense = twins("MXFP4", gpt_oss=True)
    assert fused.fused is not None and fused.fused.gate_up.bias is not None
    x = 4 * torch.randn(tokens, 64, generator=torch.Generator().manual_seed(tokens))
    gate_up = fused.experts[0].gate_up_proj(x)
    assert (gate_up.abs() > 7.0).any()  # the clamp is exercised
    assert close(fused(x), dense(x))


def test_the_stack_is_the_experts_storage_held_once():
    fused, dense = twins("Q4_0")
    stack = fused.fused.gate_up.parts[0].data
    for e, expert in enumerate(fused.experts):
        run = expert.gate_up_proj.storage.runs[0].tensor.data
        assert run.data_ptr() == stack[e].data_ptr()
        # The expert on its own still multiplies its slice.
        x = torch.randn(3, 64, generator=torch.Generator().manual_seed(e))
        assert close(expert(x), dense.experts[e](x))
    assert fused.expert_bytes() == EXPERTS * sum(
        linear.storage.nbytes for linear in (fused.experts[0].gate_up_proj,
                                             fused.experts[0].down_proj))


def test_experts_not_all_in_triton_storage_keep_the_loop():
    fused, _ = twins("Q4_0")
    linear: StackedLinear = fused.experts[2].down_proj
    linear.storage = DenseWeight(linear.weight, linear.shape)
    fused.prepare()
    assert fused.fused is None
