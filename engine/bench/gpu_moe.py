"""The device check's MoE timing row (scripts/gpu_check.py): one mixture-of-experts layer
of random quantized experts, its fused Triton kernels (engine/layers/moe/triton.py) against
the per-expert loop of `SparseMoE.mix` over the same experts (each expert's Triton
GEMV / GEMM in turn), both on the card:

- an OLMoE-1B-7B-shaped Q4_K layer (64 experts of 2048 x 1024, top 8, softmax router);
- a gpt-oss-20b-shaped MXFP4 layer (32 experts of 2880 x 2880, top 4, clamped SwiGLU,
  biases);

each at a 512-token prefill and decode batches of 1 and 32, in bfloat16, the median of
CUDA-event-timed repeats; the router is outside the timed part (both sides share it).
Each row also carries the two sides' relative difference, so a wrong fused result fails
the step. ``tiny`` shapes run on any device (the Triton interpreter off CUDA) in seconds.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from engine.layers.moe.gpt_oss import ClampedSwiGLU, SoftmaxOfTopKRouter
from engine.layers.moe.sparse import SparseMoE
from engine.layers.weights import TritonQuantized
from kernels.quant.formats import BY_NAME, QuantizedTensor
from kernels.quant.matrix import RawBlocks

MARK = "@@gpu-moe@@ "
# bfloat16 on both sides, rounded at different points (the fused kernels keep float32
# until the sum over k): a few 2^-8 steps, as the end-to-end logits check allows.
REL_TOLERANCE = 2.0**-5
# Byte offsets of each block's fp16 scales (set to modest values; random bytes there can
# be inf or NaN). MXFP4's one scale byte is drawn apart.
FP16_SCALES = {"Q4_0": (0,), "Q8_0": (0,), "Q4_K": (0, 2)}


@dataclass(slots=True, frozen=True)
class MoeShape:
    name: str
    type_name: str
    hidden: int
    intermediate: int
    experts: int
    top_k: int
    gpt_oss: bool


SHAPES = (MoeShape("OLMoE-1B-7B", "Q4_K", 2048, 1024, 64, 8, False),
          MoeShape("gpt-oss-20b", "MXFP4", 2880, 2880, 32, 4, True))
TINY = (MoeShape("tiny", "Q4_0", 64, 32, 4, 2, False),
        MoeShape("tiny-oss", "MXFP4", 64, 32, 4, 2, True))
CASES = (("prefill", 512), ("decode b1", 1), ("decode b32", 32))
TINY_CASES = (("prefill", 9), ("decode b1", 1), ("decode b3", 3))


@dataclass(slots=True)
class MoeTiming:
    shape: str
    case: str
    tokens: int
    fused_ms: float
    loop_ms: float
    rel_err: float

    @property
    def ok(self) -> bool:
        return self.rel_err <= REL_TOLERANCE


def random_blocks(type_name: str, rows: int, k: int, gen: torch.Generator,
                  device: torch.device) -> torch.Tensor:
    """uint8 [rows, row_bytes] of random `type_name` blocks with modest finite scales."""
    fmt = BY_NAME[type_name]
    shape = (rows, k // fmt.block_size)
    data = torch.randint(0, 256, (*shape, fmt.block_bytes), dtype=torch.uint8,
                         generator=gen, device=device)
    if type_name == "MXFP4":
        data[..., 0] = torch.randint(118, 126, shape, dtype=torch.uint8, generator=gen,
                                     device=device)
    for offset in FP16_SCALES.get(type_name, ()):
        scales = (torch.rand(shape, generator=gen, device=device) - 0.5) * 0.02
        data[..., offset:offset + 2] = scales.half().view(torch.uint8).view(*shape, 2)
    return data.view(rows, -1)


def build_layer(shape: MoeShape, device: torch.device, dtype: torch.dtype,
                seed: int = 0) -> SparseMoE:
    """The layer with random experts in Triton's storage, as a CUDA load of a GGUF file
    leaves them, prepared (so it has picked the fused method)."""
    h, i = shape.hidden, shape.intermediate
    gate = experts = None
    if shape.gpt_oss:
        experts = [ClampedSwiGLU(h, i, 1.702, 7.0, dtype, device) for _ in range(shape.experts)]
        gate = SoftmaxOfTopKRouter(h, shape.experts, shape.top_k, dtype, device)
    layer = SparseMoE(h, i, shape.experts, shape.top_k, True, dtype, device, gate=gate,
                      experts=experts)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for p in layer.gate.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, device=device) / h**0.5)
        for expert in layer.experts:
            for linear in (expert.gate_up_proj, expert.down_proj):
                n, k = linear.shape
                blocks = random_blocks(shape.type_name, n, k, gen, device)
                linear.storage = TritonQuantized([RawBlocks(QuantizedTensor(
                    BY_NAME[shape.type_name].type_id, (n, k), blocks), triton=True)])
                if linear.bias is not None:
                    linear.bias.copy_(torch.randn(n, generator=gen, device=device) * 0.1)
    layer.prepare()
    if layer.fused is None:
        raise RuntimeError("the layer did not pick the fused Triton method")
    return layer


def median_ms(fn: Callable[[], object], reps: int, device: torch.device) -> float:
    fn()  # compile and warm
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def time_case(layer: SparseMoE, name: str, case: str, tokens: int, reps: int,
              seed: int = 1) -> MoeTiming:
    device = layer.gate.weight.device
    hidden = layer.gate.weight.shape[1]
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen, device=device).to(layer.gate.weight.dtype)
    weights, ids = layer.gate(x)
    fused_method = layer.fused

    def loop() -> torch.Tensor:
        layer.fused = None
        try:
            return layer.mix(x, weights, ids)
        finally:
            layer.fused = fused_method

    def fused() -> torch.Tensor:
        return layer.mix(x, weights, ids)

    with torch.no_grad():
        want, got = loop().float(), fused().float()
        rel = ((got - want).norm() / want.norm()).item()
        fused_ms = median_ms(fused, reps, device)
        loop_ms = median_ms(loop, reps, device)
    return MoeTiming(name, case, tokens, fused_ms, loop_ms, rel)


def run_moe_bench(shapes: tuple[MoeShape, ...] = SHAPES,
                  cases: tuple[tuple[str, int], ...] = CASES,
                  device: str | None = None) -> list[MoeTiming]:
    """Every shape at every case (the full ones on CUDA; TINY and TINY_CASES anywhere)."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    rows = []
    for shape in shapes:
        layer = build_layer(shape, dev, dtype)
        for case, tokens in cases:
            reps = 20 if dev.type == "cuda" and tokens <= 64 else 5 if dev.type == "cuda" else 1
            rows.append(time_case(layer, shape.name, case, tokens, reps))
        del layer
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def to_json(rows: list[MoeTiming]) -> str:
    return json.dumps([asdict(row) for row in rows])
