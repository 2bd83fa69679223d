"""Gemma 4's preprocessing, prompt text and vision encoder against transformers on a tiny
random-weight folder."""

from __future__ import annotations

import io
import logging

import pytest
import torch
from PIL import Image
from transformers import AutoConfig, Gemma4ForConditionalGeneration
from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

from engine.loaders.safetensors import safetensors_shards
from engine.vision.decode import decode_image
from engine.vision.gemma4 import GEMMA4, Gemma4Processing, fitted_size
from engine.vision.load import load_vision, tower_tensors
from engine.vision.model import VisionModel, VisionUnavailable
from tests.engine.tiny_models import byte_level_tokenizer
from tests.engine.vision.tiny_gemma4v import (
    BEGIN,
    END,
    IMAGE,
    gemma4v_tokenizer,
    save_tiny_gemma4v,
)
from tests.engine.vision.tiny_idefics3 import png

# (width, height): square, wide, tall, a sliver, larger than the budget, smaller than it.
SIZES = [(64, 64), (200, 90), (40, 130), (300, 12), (512, 384), (20, 20)]
ATOL = 2e-4


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny_gemma4v(tmp_path_factory.mktemp("gemma4v") / "gemma4")


@pytest.fixture(scope="module")
def hf_model(folder):
    return Gemma4ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def vision(folder):
    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    state = tower_tensors(safetensors_shards(folder), GEMMA4.tower_prefixes)
    parts = GEMMA4.load(folder, config, state)
    parts.encoder.float().eval()
    return VisionModel(parts, torch.float32, torch.device("cpu"))


def theirs(folder, data: bytes):
    processor = Gemma4ImageProcessorPil.from_pretrained(folder)
    return processor(images=[Image.open(io.BytesIO(data)).convert("RGB")],
                     return_tensors="pt")


@pytest.mark.parametrize("size", SIZES)
def test_patches_and_token_count_are_the_processors(folder, vision, size):
    data = png(1, size)
    prepared = vision.prepare(decode_image(data))
    batch = theirs(folder, data)
    real = (batch["image_position_ids"][0] >= 0).all(-1)
    assert int(batch["num_soft_tokens_per_image"][0]) == prepared.num_tokens
    assert torch.equal(batch["pixel_values"][0][real], prepared.pixels.patches)
    cols = int(batch["image_position_ids"][0][real][:, 0].max()) + 1
    assert (prepared.pixels.rows * prepared.pixels.cols, prepared.pixels.cols) == \
        (int(real.sum()), cols)
    assert prepared.text == f"{BEGIN}{IMAGE * prepared.num_tokens}{END}"


def test_the_budget_bounds_every_shape():
    p = Gemma4Processing(16, 3, 280, 1 / 255, 3)
    for height, width in [(4000, 3000), (7, 4096), (896, 896), (1, 1_000_000)]:
        h, w = fitted_size(height, width, p)
        assert h % 48 == w % 48 == 0
        assert (h // 16) * (w // 16) <= 280 * 9


@pytest.mark.parametrize("size", SIZES[:4])
def test_embeddings_match_transformers(folder, hf_model, vision, size):
    data = png(2, size)
    prepared = vision.prepare(decode_image(data))
    batch = theirs(folder, data)
    ours = vision.encode(prepared)
    with torch.no_grad():
        ref = hf_model.model.get_image_features(
            batch["pixel_values"], batch["image_position_ids"]).pooler_output[0]
    assert ours.shape == ref.shape == (prepared.num_tokens, 64)
    assert torch.allclose(ours, ref, atol=ATOL), (ours - ref).abs().max()


def test_a_folder_whose_tokenizer_lacks_the_image_tokens_reads_text_only(tmp_path, caplog):
    folder = save_tiny_gemma4v(tmp_path / "g4")
    plain = gemma4v_tokenizer()
    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    config.eoi_token_id = len(plain) + 5  # an id no token has
    state = tower_tensors(safetensors_shards(folder), GEMMA4.tower_prefixes)
    with pytest.raises(VisionUnavailable, match="lacks the end-of-image token"):
        GEMMA4.load(folder, config, state)
    byte_level_tokenizer().save_pretrained(folder)  # no image tokens at all
    with caplog.at_level(logging.WARNING):
        assert load_vision(folder, torch.float32) is None
    assert "reads text only" in caplog.text and "begin-of-image" in caplog.text
