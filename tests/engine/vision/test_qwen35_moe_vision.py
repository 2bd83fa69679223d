"""Qwen3.5-MoE (``Qwen3_5MoeForConditionalGeneration``) sees images: its tower (the
dense release's, under the same names) against transformers' image features, and the
whole engine's greedy replies to [image + text] against transformers' for one image,
two images and an image in an earlier turn, on a tiny random folder."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3_5MoeForConditionalGeneration

from engine import LLM
from engine.chat import ChatRequest
from engine.loaders.catalog import model_info
from engine.vision.decode import decode_image
from engine.vision.load import load_vision
from engine.vision.qwen35_tower import Qwen35Encoder
from tests.engine.vision.test_qwen35_vision import theirs
from tests.engine.vision.test_qwen35_vision_engine import CHATS, GREEDY, IMAGES, hf_reply
from tests.engine.vision.tiny_idefics3 import png
from tests.engine.vision.tiny_qwen35_vl import save_tiny_qwen35_vl

pytestmark = pytest.mark.usefixtures("single_torch_thread")


@pytest.fixture(scope="module")
def moe_folder(tmp_path_factory):
    return save_tiny_qwen35_vl(tmp_path_factory.mktemp("qwen35moevl") / "qwen35moevl",
                               seed=3, moe=True)


@pytest.fixture(scope="module")
def moe_hf(moe_folder):
    return Qwen3_5MoeForConditionalGeneration.from_pretrained(
        moe_folder, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def moe_llm(moe_folder):
    # The oracle computes in float32: so does the tower here, on every CPU.
    with LLM(str(moe_folder), num_gpu_blocks=128, block_size=8,
             vision_dtype="float32") as engine:
        yield engine


def test_the_tower_gives_transformers_image_features(moe_folder, moe_hf):
    vision = load_vision(moe_folder, torch.float32, encoder_dtype=torch.float32)
    assert isinstance(vision.encoder, Qwen35Encoder)
    data = png(7, (100, 31))
    ref = theirs(moe_folder, data)
    with torch.no_grad():
        expected = moe_hf.model.get_image_features(ref["pixel_values"],
                                                   ref["image_grid_thw"]).pooler_output[0]
    got = vision.encode(vision.prepare(decode_image(data)))
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_the_models_list_says_it_sees_images(moe_folder):
    info = model_info(moe_folder)
    assert info.sees_images and not info.text_only


@pytest.mark.parametrize("name", list(CHATS))
def test_greedy_replies_match_transformers(moe_llm, moe_folder, moe_hf, name):
    built = moe_llm.prompts.build(ChatRequest(CHATS[name]))
    assert all(s.grid is not None for s in built.images)  # M-RoPE positions
    ours = moe_llm.chat(CHATS[name], GREEDY).outputs[0].token_ids
    assert ours == hf_reply(moe_folder, moe_hf, built.ids, IMAGES[name])


def test_the_image_decides_the_reply(moe_llm, moe_folder, moe_hf):
    """The oracle is not blind: another image changes its reply, so equal replies above
    hold the image."""
    built = moe_llm.prompts.build(ChatRequest(CHATS["two images"]))
    reply = hf_reply(moe_folder, moe_hf, built.ids, IMAGES["two images"])
    assert hf_reply(moe_folder, moe_hf, built.ids, [IMAGES["two images"][0], png(11, (48, 40))]) \
        != reply
