"""Gemma 3's image path against transformers on a tiny random folder: the preprocessed
frame against its PIL image processor, an image's prompt text against Gemma3Processor's
expansion, and the tower + projector against ``get_image_features`` (float32, and the
bfloat16 matmuls a wide tower takes on a CPU with AMX / AVX512-BF16)."""

from __future__ import annotations

import pytest
import torch
from transformers import Gemma3ForConditionalGeneration
from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil
from transformers.models.gemma3.processing_gemma3 import Gemma3Processor

from engine.vision.decode import decode_image
from engine.vision.gemma3 import GEMMA3, Gemma3Processing, checkpoint_names, preprocess
from engine.vision.load import load_vision
from engine.vision.model import tower_dtype
from tests.engine.vision.tiny_gemma3 import TOKENS, gemma3_tokenizer, save_tiny_gemma3
from tests.engine.vision.tiny_idefics3 import png

# float32 on both sides: summation order only.
ATOL = 1e-4
# bfloat16 matmuls (8 significant bits) against the float32 oracle: the largest error
# over the output's largest magnitude.
BF16_RTOL = 3e-2

SIZES = [(48, 40), (40, 72), (64, 64), (100, 31), (7, 300)]


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    return save_tiny_gemma3(tmp_path_factory.mktemp("gemma3") / "gemma3")


@pytest.fixture(scope="module")
def hf_gemma3(gemma3):
    return Gemma3ForConditionalGeneration.from_pretrained(gemma3, dtype=torch.float32).eval()


@pytest.mark.parametrize("size", SIZES)
def test_the_frame_matches_the_image_processor(gemma3, size):
    rgb = decode_image(png(3, size)).image
    ours = preprocess(rgb, Gemma3Processing.read(gemma3, 64))
    theirs = Gemma3ImageProcessorPil.from_pretrained(gemma3)(images=[rgb],
                                                             return_tensors="pt")
    assert ours.shape == theirs["pixel_values"].shape == (1, 3, 64, 64)
    assert torch.allclose(ours, theirs["pixel_values"], atol=1e-6)


def test_pan_and_scan_is_refused_by_name(tmp_path):
    (tmp_path / "preprocessor_config.json").write_text('{"do_pan_and_scan": true}')
    with pytest.raises(ValueError, match="do_pan_and_scan is not supported"):
        Gemma3Processing.read(tmp_path, 896)


def test_the_prompt_text_is_the_processors_expansion(gemma3):
    vision = load_vision(gemma3, torch.float32, encoder_dtype=torch.float32)
    tokenizer = gemma3_tokenizer()
    processor = Gemma3Processor(Gemma3ImageProcessorPil.from_pretrained(gemma3), tokenizer,
                                image_seq_length=TOKENS)
    rgb = decode_image(png(4, (48, 40))).image
    prepared = vision.prepare(decode_image(png(4, (48, 40))))
    theirs = processor(text=["look: <start_of_image> ok"], images=[[rgb]])
    ours = tokenizer("look: " + prepared.text + " ok")["input_ids"]
    assert list(theirs["input_ids"][0]) == ours
    assert prepared.num_tokens == TOKENS == ours.count(vision.image_token_id)
    assert vision.marker_id == tokenizer.convert_tokens_to_ids("<start_of_image>")
    assert vision.bidirectional
    # Image tokens are the ones marked 1 in the processor's token types.
    types = list(theirs["token_type_ids"][0])
    assert [t == vision.image_token_id for t in ours] == [bool(t) for t in types]


@pytest.mark.parametrize("count", [1, 2])
def test_embeddings_match_get_image_features(gemma3, hf_gemma3, count):
    vision = load_vision(gemma3, torch.float32, encoder_dtype=torch.float32)
    assert vision.encoder.tower.matmul_dtype is None  # a narrow tower stays float32
    pictures = [decode_image(png(5 + i, (48, 40 + 8 * i))) for i in range(count)]
    frames = torch.cat([vision.prepare(p).pixels for p in pictures])
    ours = torch.cat([vision.encode(vision.prepare(p)) for p in pictures])
    with torch.no_grad():
        theirs = hf_gemma3.model.get_image_features(frames).pooler_output
    assert ours.shape == (count * TOKENS, hf_gemma3.config.text_config.hidden_size)
    assert torch.allclose(ours, theirs.reshape(ours.shape), atol=ATOL)


def test_released_checkpoint_names_load_too():
    tensor = torch.zeros(1)
    state = {"vision_tower.vision_model.embeddings.patch_embedding.weight": tensor,
             "vision_tower.encoder.layers.0.mlp.fc1.weight": tensor,
             "vision_tower.head.probe": tensor,
             "multi_modal_projector.mm_input_projection_weight": tensor}
    assert sorted(checkpoint_names(state)) == [
        "multi_modal_projector.mm_input_projection_weight",
        "vision_tower.embeddings.patch_embedding.weight",
        "vision_tower.encoder.layers.0.mlp.fc1.weight"]


def test_a_wide_tower_in_bfloat16_stays_near_float32(tmp_path):
    wide = save_tiny_gemma3(tmp_path / "wide", hidden_size=512, intermediate_size=1024,
                            num_attention_heads=8)
    if tower_dtype(GEMMA3, torch.float32, torch.device("cpu")) != torch.bfloat16:
        pytest.skip("this CPU has no bfloat16 matrix units (AMX / AVX512-BF16)")
    fast = load_vision(wide, torch.float32)  # the engine's default there
    assert fast.encoder.tower.matmul_dtype == torch.bfloat16
    hf = Gemma3ForConditionalGeneration.from_pretrained(wide, dtype=torch.float32).eval()
    prepared = fast.prepare(decode_image(png(9, (80, 60))))
    ours = fast.encode(prepared)
    with torch.no_grad():
        theirs = hf.model.get_image_features(prepared.pixels).pooler_output[0]
    assert ours.dtype == torch.float32
    error = (ours - theirs).abs().max() / theirs.abs().max()
    assert error < BF16_RTOL, float(error)


def test_the_models_list_says_it_sees_images(gemma3):
    from engine.loaders.catalog import model_info

    info = model_info(gemma3)
    assert not info.text_only and info.sees_images and info.layer_summary == "sees images"
    assert info.num_layers == 4  # the text model's
