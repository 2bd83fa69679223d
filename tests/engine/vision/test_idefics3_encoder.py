"""SmolVLM / Idefics3's image path against transformers on a tiny random folder: the
preprocessed frames against its PIL image processor, the tower + connector's
embeddings against ``get_image_features``, and an image's prompt text against its
processor's."""

from __future__ import annotations

import io
from dataclasses import replace

import pytest
import torch
from PIL import Image
from transformers.models.idefics3.image_processing_pil_idefics3 import (
    Idefics3ImageProcessorPil,
)
from transformers.models.idefics3.processing_idefics3 import Idefics3Processor

from engine.vision.decode import decode_image
from engine.vision.idefics3 import Idefics3Processing, preprocess
from engine.vision.load import load_vision
from engine.vision.siglip import patch_positions
from tests.engine.vision.tiny_idefics3 import idefics3_tokenizer, png

# float32 on both sides; the tower's attention and GELU differ in summation order only.
ATOL = 1e-4

SIZES = [(48, 40), (40, 72), (20, 20), (100, 31)]


@pytest.mark.parametrize("split", [True, False])
@pytest.mark.parametrize("size", SIZES)
def test_frames_match_the_image_processor(folder, size, split):
    hf = Idefics3ImageProcessorPil.from_pretrained(folder, do_image_splitting=split)
    rgb = decode_image(png(1, size)).image
    ours = preprocess(rgb, replace(Idefics3Processing.read(folder), split=split))
    theirs = hf(images=[[rgb]], return_tensors="pt", return_row_col_info=True)
    assert (ours.rows, ours.cols) == (theirs["rows"][0][0], theirs["cols"][0][0])
    assert torch.allclose(ours.pixels, theirs["pixel_values"][0], atol=1e-6)


def test_positions_bucket_a_smaller_frame_into_the_grid():
    assert patch_positions(4, 4, 4, "cpu").tolist() == list(range(16))
    # A 2 x 2 patch frame on a 4 x 4 grid takes rows and columns 0 and 2.
    assert patch_positions(2, 2, 4, "cpu").tolist() == [0, 2, 8, 10]


@pytest.mark.parametrize("size", SIZES)
def test_embeddings_match_transformers(folder, hf_model, size):
    vision = load_vision(folder, torch.float32)
    prepared = vision.prepare(decode_image(png(2, size)))
    ours = vision.encode(prepared)
    with torch.no_grad():
        pixels = prepared.pixels.pixels[None]
        theirs = hf_model.model.get_image_features(pixels).pooler_output[0]
    assert ours.shape == theirs.shape == (prepared.num_tokens, 64)
    assert torch.allclose(ours, theirs, atol=ATOL), (ours - theirs).abs().max()


@pytest.mark.parametrize("size", SIZES)
def test_an_images_prompt_text_is_the_processors(folder, size):
    vision = load_vision(folder, torch.float32)
    data = png(3, size)
    prepared = vision.prepare(decode_image(data))
    processor = Idefics3Processor(Idefics3ImageProcessorPil.from_pretrained(folder),
                                  idefics3_tokenizer(), image_seq_len=4)
    text = processor(text=["a<image>b"], images=[[Image.open(io.BytesIO(data))]])
    ours = idefics3_tokenizer()(f"a{prepared.text}b", add_special_tokens=False)["input_ids"]
    assert list(text["input_ids"][0]) == ours
    assert ours.count(vision.image_token_id) == prepared.num_tokens


def test_the_models_list_says_it_sees_images(folder):
    from engine.loaders.catalog import model_info

    info = model_info(folder)
    assert not info.text_only and info.sees_images and info.layer_summary == "sees images"
    assert info.num_layers == 2  # the text model's
