"""engine/bench/gpu_moe.py (the device check's MoE timing row) where this suite runs: its
random experts are valid blocks, and a tiny layer's row (Triton interpreted) has the fused
kernels agreeing with the per-expert loop."""

from __future__ import annotations

import pytest
import torch

from engine.bench.gpu_moe import (
    REL_TOLERANCE,
    SHAPES,
    TINY,
    build_layer,
    random_blocks,
    run_moe_bench,
    to_json,
)
from kernels.quant.formats import BY_NAME
from kernels.quant.matrix import dequantize_cpu

pytestmark = pytest.mark.usefixtures("single_torch_thread")


@pytest.mark.parametrize("name", ["Q4_K", "MXFP4", "Q4_0"])
def test_random_blocks_have_finite_modest_weights(name):
    data = random_blocks(name, 8, 256, torch.Generator().manual_seed(0), torch.device("cpu"))
    assert data.shape == (8, BY_NAME[name].row_bytes(256))
    weights = dequantize_cpu(data, BY_NAME[name].type_id)
    assert torch.isfinite(weights).all() and 0 < weights.abs().max() < 100


def test_the_shapes_are_the_issue_s():
    olmoe, oss = SHAPES
    assert (olmoe.type_name, olmoe.hidden, olmoe.intermediate, olmoe.experts,
            olmoe.top_k) == ("Q4_K", 2048, 1024, 64, 8)
    assert (oss.type_name, oss.hidden, oss.intermediate, oss.experts, oss.top_k,
            oss.gpt_oss) == ("MXFP4", 2880, 2880, 32, 4, True)


def test_a_tiny_row_agrees_with_the_loop():
    rows = run_moe_bench(TINY[1:], (("decode b3", 3),), device="cpu")
    (row,) = rows
    assert row.shape == "tiny-oss" and row.tokens == 3
    assert row.ok and row.rel_err <= REL_TOLERANCE
    assert row.fused_ms > 0 and row.loop_ms > 0
    assert '"case": "decode b3"' in to_json(rows)


def test_the_layer_picks_the_fused_method():
    layer = build_layer(TINY[0], torch.device("cpu"), torch.float32)
    assert layer.fused is not None
    assert layer.fused.gate_up.parts[0].data.shape[0] == TINY[0].experts
