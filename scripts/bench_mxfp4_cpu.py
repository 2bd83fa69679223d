"""MXFP4 on the CPU, before and after the native kernel, in one run: one gpt-oss-20b expert
matrix (2880 x 2880) multiplied by 1 and 32 rows as MXFP4 through the native library, as
Q8_0 through it (the same shape), and as MXFP4 through the PyTorch dequantization
(Mxfp4Blocks, what every MXFP4 product took before); then one decode token through a
gpt-oss-20b-shaped MoE block (router, 32 experts of 2880, 4 per token, biases) with its
experts kept as each of those. Random weights: timings only.

    python scripts/bench_mxfp4_cpu.py --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's Folio

MXFP4, Q8_0 = 39, 8
HIDDEN, EXPERTS, TOP_K = 2880, 32, 4


def random_blocks(type_id: int, n: int, k: int, rng: np.random.Generator) -> torch.Tensor:
    """uint8 [n, row_bytes] of random blocks with modest scales (MXFP4 2^-9..2^-6, Q8_0's
    fp16 d about 2e-4): weights of a few hundredths, like a trained model's."""
    if type_id == MXFP4:
        blocks = rng.integers(0, 256, size=(n, k // 32, 17), dtype=np.uint8)
        blocks[..., 0] = rng.integers(119, 123, size=(n, k // 32))
    else:
        blocks = rng.integers(0, 256, size=(n, k // 32, 34), dtype=np.uint8)
        d = rng.uniform(1e-4, 3e-4, size=(n, k // 32)).astype(np.float16)
        blocks[..., :2] = d.view(np.uint8).reshape(n, k // 32, 2)
    return torch.from_numpy(blocks.reshape(n, -1))


def interleaved(calls: dict[str, object], repeats: int) -> dict[str, float]:
    """Median seconds of each call over `repeats` rounds, every round running each call
    once (after two warm-ups), so a load that comes and goes weighs on all alike."""
    for call in calls.values():
        call()
        call()
    times: dict[str, list[float]] = {label: [] for label in calls}
    for _ in range(repeats):
        for label, call in calls.items():
            start = time.perf_counter()
            call()
            times[label].append(time.perf_counter() - start)
    return {label: statistics.median(t) for label, t in times.items()}


def kinds():
    """(label, type id, native) of the three ways an expert is held."""
    return [("MXFP4 native", MXFP4, True), ("Q8_0 native", Q8_0, True),
            ("MXFP4 PyTorch (before)", MXFP4, False)]


def storage(tensor, native: bool):
    """The storage the loader would pick, with the native MXFP4 kernel on or off."""
    import kernels.quant.mxfp4 as mxfp4
    from engine.layers.weights import quantized_storage

    saved = mxfp4._library_takes_mxfp4
    if not native:
        mxfp4._library_takes_mxfp4 = lambda: False
    try:
        return quantized_storage([tensor], torch.device("cpu"))
    finally:
        mxfp4._library_takes_mxfp4 = saved


def products(repeats: int) -> dict[tuple[str, int], float]:
    from kernels.quant.formats import QuantizedTensor

    rng = np.random.default_rng(0)
    calls = {}
    for label, type_id, native in kinds():
        matrix = QuantizedTensor(type_id, (HIDDEN, HIDDEN),
                                 random_blocks(type_id, HIDDEN, HIDDEN, rng))
        held = storage(matrix, native)
        for m in (1, 32):
            x = torch.randn(m, HIDDEN)
            calls[(label, m)] = lambda held=held, x=x: held.matmul(x)
    return interleaved(calls, repeats)


def moe_block(type_id: int, native: bool):
    """A gpt-oss-20b-shaped MoE block, experts of `type_id` held as the loader holds them."""
    import transformers

    import kernels.quant.mxfp4 as mxfp4
    from engine.models import build_model
    from kernels.quant.formats import QuantizedTensor

    # gpt-oss-20b's shapes (transformers' defaults but for the experts: 32, not 120b's 128);
    # one layer, a small vocabulary.
    config = transformers.GptOssConfig(vocab_size=512, num_hidden_layers=1,
                                       num_local_experts=EXPERTS, num_experts_per_tok=TOP_K)
    assert config.hidden_size == config.intermediate_size == HIDDEN
    config.architectures = ["GptOssForCausalLM"]
    model = build_model(config, torch.float32, "cpu")
    rng = np.random.default_rng(1)
    gen = torch.Generator().manual_seed(1)
    weights = []
    for name, target in model.checkpoint_targets().items():
        if ".experts." in name and name.endswith("_proj.weight"):
            n, k = target.shape
            weights.append((name, QuantizedTensor(type_id, (n, k),
                                                  random_blocks(type_id, n, k, rng))))
        else:
            weights.append((name, torch.randn(tuple(target.shape), generator=gen) * 0.02))
    saved = mxfp4._library_takes_mxfp4
    if not native:
        mxfp4._library_takes_mxfp4 = lambda: False
    try:
        model.load_weights(weights)
    finally:
        mxfp4._library_takes_mxfp4 = saved
    return model.layers[0].mlp


def decode_tokens(repeats: int) -> dict[str, float]:
    x = torch.randn(1, HIDDEN)
    blocks = {label: moe_block(type_id, native) for label, type_id, native in kinds()}
    with torch.inference_mode():
        return interleaved({label: lambda b=b: b(x) for label, b in blocks.items()}, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import kernels.cpu

    if not kernels.cpu.available():  # loads the library
        raise SystemExit(f"the native CPU library is not loaded: {kernels.cpu.status()}")
    print(f"threads={args.threads} isa={torch.ops.folio_cpu.best_isa()}")
    with torch.inference_mode():
        times = products(args.repeats)
    print(f"\none {HIDDEN} x {HIDDEN} expert matrix, x [m, {HIDDEN}] float32 "
          "(median of interleaved runs):")
    for (label, m), t in times.items():
        print(f"  {label:24s} m={m:3d}  {t * 1e6:9.1f} us  "
              f"{t / times[('Q8_0 native', m)]:6.2f}x Q8_0")
    tokens = decode_tokens(max(5, args.repeats // 3))
    print(f"\none decode token through a {EXPERTS}-expert top-{TOP_K} MoE block "
          f"(hidden {HIDDEN}):")
    for label, t in tokens.items():
        print(f"  {label:24s} {t * 1e3:9.2f} ms  {t / tokens['Q8_0 native']:6.2f}x Q8_0")


if __name__ == "__main__":
    main()
