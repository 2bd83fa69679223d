"""``folio bench vision``'s Gemma 3 row: a Gemma 3 4B-shaped SigLIP tower (27 layers,
1,152 wide, 4,304 MLP, 16 heads, 896 x 896 frames of 14 x 14 patches) and projector
(pooled to 256 tokens, 2,560 wide), random weights, one frame encoded by Folio and by
transformers' ``get_image_features`` (float32, its default attention), the same weights
and threads. Folio's tower takes its bfloat16 matmuls where the CPU has them
(engine/vision/gemma3.py ``bf16_pays``); its error against the float32 oracle is
reported beside the times.
"""

from __future__ import annotations

import time

import torch

TOWER = dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27,
             num_attention_heads=16, image_size=896, patch_size=14, vision_use_head=False)
# A one-layer text model of the 4B's width: the projector's output width is all the
# encoder needs of it.
TEXT = dict(hidden_size=2560, intermediate_size=256, num_hidden_layers=1,
            num_attention_heads=8, num_key_value_heads=4, head_dim=256, vocab_size=512)


def _best_alternating(calls, rounds: int) -> list[float]:
    """Each call's best time over ``rounds``, the calls taking turns within a round (on
    a shared machine both sides meet the same load), after one untimed call each."""
    for call in calls:
        call()
    best = [float("inf")] * len(calls)
    for _ in range(rounds):
        for i, call in enumerate(calls):
            start = time.perf_counter()
            call()
            best[i] = min(best[i], time.perf_counter() - start)
    return best


def gemma3_tower_times(threads: int, rounds: int = 1, layers: int | None = None) -> dict:
    """{"folio", "transformers"} seconds for one frame's encode, Folio's matmul dtype
    and its largest error over the oracle's largest magnitude. ``layers``: fewer than
    the 27 (a quick look)."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    from engine.vision.gemma3 import GEMMA3, Gemma3Encoder, checkpoint_names
    from engine.vision.model import load_tower, tower_dtype
    from engine.vision.siglip import TowerSpec

    torch.set_num_threads(threads)
    tower = TOWER | ({} if layers is None else {"num_hidden_layers": layers})
    config = Gemma3Config(text_config=TEXT, vision_config=tower, mm_tokens_per_image=256,
                          boi_token_index=509, eoi_token_index=510, image_token_index=511)
    torch.manual_seed(0)
    hf = Gemma3ForConditionalGeneration(config).eval()
    _random_weights(hf)
    state = {name.removeprefix("model."): p.detach()
             for name, p in hf.named_parameters()
             if name.startswith(("model.vision_tower.", "model.multi_modal_projector."))}
    ours = Gemma3Encoder(TowerSpec.of(config.vision_config), 2560, 256)
    load_tower(ours, checkpoint_names(state), "bench")
    ours.eval()
    # The engine's choice for a float32 model on this CPU (model.tower_dtype).
    ours.placed(tower_dtype(GEMMA3, torch.float32, torch.device("cpu")))
    generator = torch.Generator().manual_seed(1)
    pixels = torch.rand((1, 3, 896, 896), generator=generator) * 2 - 1
    with torch.inference_mode():
        folio, theirs = _best_alternating(
            [lambda: ours.encode(pixels, torch.float32, torch.device("cpu")),
             lambda: hf.model.get_image_features(pixels)], rounds)
        a = ours.encode(pixels, torch.float32, torch.device("cpu"))
        b = hf.model.get_image_features(pixels).pooler_output.reshape(a.shape)
    error = float((a - b).abs().max() / b.abs().max())
    matmul = ours.tower.matmul_dtype or torch.float32
    return {"folio": folio, "transformers": theirs, "error": error,
            "matmul": str(matmul).removeprefix("torch.")}


def _random_weights(model: torch.nn.Module) -> None:
    """Weights with a trained model's magnitudes where transformers' init leaves zeros
    (the projector's matrix and norm): each matrix scaled by 1 / sqrt(its input size),
    norms near their identity."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not name.startswith(("model.vision_tower.", "model.multi_modal_projector.")):
                continue
            noise = torch.randn(param.shape, generator=generator)
            if name.endswith("mm_input_projection_weight"):
                param.copy_(noise * param.shape[0] ** -0.5)
            elif name.endswith("mm_soft_emb_norm.weight"):
                param.copy_(0.1 * noise)
            elif param.dim() >= 2:
                param.copy_(noise * param[0].numel() ** -0.5)

