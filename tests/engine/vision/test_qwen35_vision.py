"""Qwen3.5's image processor, vision tower and multimodal rotary positions against
transformers on a tiny random folder: pixels, grid and prompt text as its Qwen2-VL image
processor writes them, the tower's image features, and the 3-D positions its
``get_rope_index`` gives a prompt's tokens (whole and chunk by chunk)."""

from __future__ import annotations

import io

import pytest
import torch
from PIL import Image
from transformers import Qwen3_5ForConditionalGeneration

from engine.core import mrope
from engine.core.sequence import ImageSpan
from engine.layers.mrope import section_axes
from engine.vision.decode import decode_image
from engine.vision.load import load_vision
from engine.vision.qwen35 import IMAGE_PAD, smart_resize
from tests.engine.vision.tiny_idefics3 import png
from tests.engine.vision.tiny_qwen35_vl import image_processor, save_tiny_qwen35_vl

pytestmark = pytest.mark.usefixtures("single_torch_thread")

# (width, height): square, wide, tall, and one scaled down past max_pixels / up to min.
SIZES = [(48, 48), (100, 31), (30, 90), (300, 200), (5, 9)]


@pytest.fixture(scope="module")
def qwen_folder(tmp_path_factory):
    return save_tiny_qwen35_vl(tmp_path_factory.mktemp("qwen35vl") / "qwen35vl")


@pytest.fixture(scope="module")
def qwen_hf(qwen_folder):
    return Qwen3_5ForConditionalGeneration.from_pretrained(qwen_folder,
                                                           dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def qwen_vision(qwen_folder):
    return load_vision(qwen_folder, torch.float32, encoder_dtype=torch.float32)


def theirs(folder, data: bytes):
    picture = Image.open(io.BytesIO(data)).convert("RGB")
    return image_processor().from_pretrained(folder)(images=[picture], return_tensors="pt")


@pytest.mark.parametrize("size", SIZES)
def test_pixels_grid_and_text_match_the_image_processor(qwen_folder, qwen_vision, size):
    data = png(5, size)
    ours = qwen_vision.prepare(decode_image(data))
    ref = theirs(qwen_folder, data)
    _, rows, cols = ref["image_grid_thw"][0].tolist()
    assert (ours.pixels.rows, ours.pixels.cols) == (rows, cols)
    assert ours.grid == (rows // 2, cols // 2)
    assert ours.num_tokens == rows * cols // 4
    assert ours.text == IMAGE_PAD * ours.num_tokens  # the processor's expansion
    # Rescaling in float32 here, in float64 there: a rounding apart.
    torch.testing.assert_close(ours.pixels.pixels, ref["pixel_values"], rtol=0, atol=2e-6)


def test_smart_resize_refuses_a_sliver():
    assert smart_resize(40, 48, 8, 64, 4096) == (40, 48)
    with pytest.raises(ValueError, match="longer than 200 times"):
        smart_resize(1, 300, 8, 64, 4096)


@pytest.mark.parametrize("size", [(48, 40), (100, 31)])
def test_the_tower_gives_transformers_image_features(qwen_folder, qwen_hf, qwen_vision, size):
    data = png(7, size)
    ref = theirs(qwen_folder, data)
    with torch.no_grad():
        expected = qwen_hf.model.get_image_features(ref["pixel_values"],
                                                    ref["image_grid_thw"]).pooler_output[0]
    got = qwen_vision.encode(qwen_vision.prepare(decode_image(data)))
    assert got.shape == expected.shape
    # float32 both; the learned positions resampled by F.interpolate here, by gathered
    # taps there, and attention by different kernels: within 1e-5 of outputs near 5.
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


def test_the_bfloat16_tower_stays_near_float32(qwen_folder, qwen_vision):
    """The tower's bfloat16 run (the default on a CPU with bfloat16 matrix units, where
    bench vision measured it faster) against the float32 one: within 3% of the largest
    output (the bench's tolerance for Qwen3.5-9B's tower)."""
    from engine.vision.load import families
    from engine.vision.model import tower_dtype

    low = load_vision(qwen_folder, torch.float32, encoder_dtype=torch.bfloat16)
    prepared = qwen_vision.prepare(decode_image(png(7, (100, 31))))
    exact, rough = qwen_vision.encode(prepared), low.encode(prepared)
    assert rough.dtype == torch.float32  # the text model's dtype
    assert (rough - exact).abs().max() <= 0.03 * exact.abs().max()
    family = families()["Qwen3_5ForConditionalGeneration"]
    cpu = torch.device("cpu")
    units = torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported()
    assert tower_dtype(family, torch.float32, cpu) == \
        (torch.bfloat16 if units else torch.float32)
    assert tower_dtype(family, torch.bfloat16, cpu) == torch.bfloat16


def test_sections_interleave_as_transformers_does():
    # Frequencies 0..7 with sections (3, 3, 2): t h w t h w t h.
    assert section_axes((3, 3, 2), 8).tolist() == [0, 1, 2, 0, 1, 2, 0, 1]
    assert section_axes((11, 11, 10), 32).tolist()[-3:] == [2, 0, 1]


def test_positions_match_get_rope_index_whole_and_chunked(qwen_hf):
    pad = qwen_hf.config.image_token_id
    spans = (ImageSpan(7, 55, b"a", None, (4, 12)), ImageSpan(62, 92, b"b", None, (5, 6)))
    n = 106
    ids = torch.zeros(1, n, dtype=torch.long)
    for s in spans:
        ids[0, s.start:s.end] = pad
    grids = torch.tensor([[1, 8, 24], [1, 10, 12]])
    expected, delta = qwen_hf.model.get_rope_index(ids, (ids == pad).int(), image_grid_thw=grids)
    expected = expected[:, 0]
    assert torch.equal(torch.tensor(mrope.positions(spans, 0, n)), expected)
    for start, end in [(0, 7), (5, 30), (30, 60), (55, 62), (60, 106)]:
        got = mrope.positions(spans, start, end)
        got = torch.tensor(got if isinstance(got, tuple) else [got] * 3)
        assert torch.equal(got, expected[:, start:end]), (start, end)
    # Decode steps after the prompt: the text position plus transformers' rope delta.
    assert mrope.positions(spans, n, n + 1) == [n + int(delta)]
    assert mrope.shift_at(spans, n) == -int(delta)
    # Spans without a grid (Idefics3's) leave positions as indices.
    flat = (ImageSpan(7, 55, b"a"),)
    assert mrope.positions(flat, 0, 60) == list(range(60))
