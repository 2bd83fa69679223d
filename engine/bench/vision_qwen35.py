"""``folio bench vision``'s Qwen3.5 row: the tower of Qwen3.5-9B's vision_config (27
blocks, 1,152 wide, 16 heads, MLP 4,304, 16 x 16 patches merged 2 x 2 into 4,096-wide
image tokens, a 48 x 48 learned position grid), random weights, encoding one
1,024 x 1,024 picture (64 x 64 patches, 1,024 image tokens) in one run.

transformers runs ``Qwen3_5VisionModel`` in float32 with its default attention. Folio
runs the same weights twice: in float32, and with its weights and activations in
bfloat16 (matrix units where the CPU has them: AMX, AVX512-BF16), whose output is held
to the float32 oracle within ``BF16_TOLERANCE`` (the largest error over the largest
output value). The ratio the target reads is the faster Folio run that is within
tolerance (float32 always is).
"""

from __future__ import annotations

import time

import torch

from engine.bench.setup import BenchContext, Target

# Qwen3.5-9B's vision_config (as its config.json writes it).
QWEN35_TOWER = dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16,
                    patch_size=16, temporal_patch_size=2, spatial_merge_size=2,
                    num_position_embeddings=2304, out_hidden_size=4096,
                    hidden_act="gelu_pytorch_tanh")
SIDE = 1024
BF16_TOLERANCE = 0.03


def qwen35_tower_row(ctx: BenchContext) -> tuple[dict, Target, str]:
    """(the table's row, its target, a note on the bfloat16 run)."""
    from transformers import Qwen3_5VisionConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5VisionModel

    from engine.vision.qwen35 import Qwen35Processing, patchify
    from engine.vision.qwen35_tower import Qwen35Encoder, Qwen35TowerSpec

    torch.set_num_threads(ctx.threads)
    config = Qwen3_5VisionConfig(**QWEN35_TOWER)
    torch.manual_seed(0)
    theirs = Qwen3_5VisionModel(config).eval()
    ours = Qwen35Encoder(Qwen35TowerSpec.of(config)).eval()
    ours.visual.load_state_dict(theirs.state_dict(), strict=False)
    spec = ours.spec
    processing = Qwen35Processing(SIDE * SIDE, SIDE * SIDE, spec.patch_size,
                                  spec.temporal_patch_size, spec.merge_size, (0.5,) * 3,
                                  (0.5,) * 3, 1 / 255, 3)
    generator = torch.Generator().manual_seed(1)
    image = torch.rand((3, SIDE, SIDE), generator=generator) * 2 - 1
    grid = patchify(image.numpy(), processing)
    thw = torch.tensor([[1, grid.rows, grid.cols]])
    attention = theirs.config._attn_implementation
    with torch.inference_mode():
        expected, hf_s = _once(lambda: theirs(grid.pixels, grid_thw=thw).pooler_output)
        theirs = None  # its memory back before Folio's runs
        f32, f32_s = _once(lambda: ours.encode(grid, torch.float32, torch.device("cpu")))
        ours.to(torch.bfloat16)
        bf16, bf16_s = _once(lambda: ours.encode(grid, torch.bfloat16, torch.device("cpu")))
    scale = expected.abs().max().item()
    f32_err = (f32 - expected).abs().max().item() / scale
    bf16_err = (bf16.float() - expected).abs().max().item() / scale
    use_bf16 = bf16_err <= BF16_TOLERANCE and bf16_s < f32_s
    best = bf16_s if use_bf16 else f32_s
    row = {"measure": f"Qwen3.5-shaped tower at {SIDE:,} x {SIDE:,}, encode (s), Folio "
                      f"({'bfloat16' if use_bf16 else 'float32'}) / transformers (float32)",
           "folio": round(best, 2), "transformers": round(hf_s, 2),
           "ratio": round(best / hf_s, 2)}
    note = (f"Qwen3.5 tower: Folio float32 {f32_s:.2f} s (error {f32_err:.1e} of the largest "
            f"output), bfloat16 {bf16_s:.2f} s (error {bf16_err:.1e}, tolerance "
            f"{BF16_TOLERANCE}); transformers float32 ({attention} attention) {hf_s:.2f} s, "
            f"{grid.rows * grid.cols:,} patches, one warm-up run each")
    return row, Target("Qwen3.5 tower encode, Folio / transformers", row["ratio"], 0.8,
                       "<="), note


def _once(call) -> tuple[torch.Tensor, float]:
    """(the output, the seconds of one run after an untimed one): a run is tens of
    seconds, so one timed run is the measure."""
    call()
    start = time.perf_counter()
    out = call()
    return out, time.perf_counter() - start
