"""Gemma 4 with images through the whole engine against transformers on tiny random
folders, causal and with its sliding layers reading an image's tokens both ways
(use_bidirectional_attention "vision"): greedy replies to [image + text] for one and two
images and for an image in an earlier turn (the follow-up reusing the prefix cache)."""

from __future__ import annotations

import io
import json

import pytest
import torch
from PIL import Image
from transformers import Gemma4ForConditionalGeneration
from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

from engine import LLM
from engine.chat import ChatRequest
from tests.engine.vision.chats import GREEDY, image_chats
from tests.engine.vision.tiny_gemma4v import save_tiny_gemma4v
from tests.engine.vision.tiny_idefics3 import png

SQUARE, WIDE = png(21, (40, 40)), png(22, (90, 30))

pytestmark = pytest.mark.usefixtures("single_torch_thread")




CHATS, IMAGES = image_chats(SQUARE, (WIDE, SQUARE), WIDE)


@pytest.fixture(scope="module", params=[None, "vision"])
def folder(tmp_path_factory, request):
    return save_tiny_gemma4v(tmp_path_factory.mktemp("gemma4v") / "gemma4",
                             use_bidirectional_attention=request.param)


@pytest.fixture(scope="module")
def hf_model(folder):
    model = Gemma4ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    model.config.get_text_config()._attn_implementation = "eager"
    return model


@pytest.fixture(scope="module")
def llm(folder):
    with LLM(str(folder), num_gpu_blocks=256, block_size=8) as engine:
        both_ways = engine.engine.runner.images.vision.bidirectional_in_windows
        assert both_ways == (folder_mode(folder) == "vision")
        yield engine


def folder_mode(folder) -> str | None:
    return json.loads((folder / "config.json").read_text())["text_config"].get(
        "use_bidirectional_attention")


def hf_reply(folder, hf_model, ids: list[int], images: list[bytes]) -> list[int]:
    processor = Gemma4ImageProcessorPil.from_pretrained(folder)
    pictures = [Image.open(io.BytesIO(data)).convert("RGB") for data in images]
    batch = processor(images=pictures, return_tensors="pt")
    input_ids = torch.tensor([ids])
    # The token types that mark the image tokens: transformers' bidirectional runs.
    types = (input_ids == hf_model.config.image_token_id).long()
    with torch.no_grad():
        out = hf_model.generate(input_ids=input_ids, pixel_values=batch["pixel_values"],
                                image_position_ids=batch["image_position_ids"],
                                mm_token_type_ids=types,
                                attention_mask=torch.ones_like(input_ids),
                                max_new_tokens=16, do_sample=False, min_new_tokens=16)
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("name", list(CHATS))
def test_greedy_replies_match_transformers(llm, folder, hf_model, name):
    built = llm.prompts.build(ChatRequest(CHATS[name]))
    assert len(built.images) == len(IMAGES[name])
    ours = llm.chat(CHATS[name], GREEDY)
    assert ours.outputs[0].token_ids == hf_reply(folder, hf_model, built.ids, IMAGES[name])


def test_the_follow_up_reuses_the_images_blocks(llm):
    chat = CHATS["earlier turn"]
    first = llm.chat(chat[:1], GREEDY)
    follow = llm.chat(chat, GREEDY)
    image_tokens = llm.prompts.build(ChatRequest(chat[:1])).images[0]
    assert follow.metrics.num_cached_tokens >= image_tokens.end - image_tokens.end % 8
    assert first.outputs[0].token_ids  # the first turn ran
