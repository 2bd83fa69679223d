"""Qwen3.5 through the whole engine against transformers on a tiny random folder:
greedy replies to [image + text] for one and two images and for an image in an earlier
turn (the text after an image and every decode step on M-RoPE's shifted positions),
chunked prefill that cuts an image, prefix-cache hits past an image, and a preempted
sequence recomputed."""

from __future__ import annotations

import io

import pytest
import torch
from PIL import Image

from engine import LLM
from engine.chat import ChatRequest
from tests.engine.vision.chats import GREEDY, image, image_chats, text
from tests.engine.vision.test_qwen35_vision import qwen_folder, qwen_hf  # noqa: F401
from tests.engine.vision.tiny_idefics3 import png
from tests.engine.vision.tiny_qwen35_vl import image_processor

RED, BLUE, WIDE = png(11, (48, 40)), png(12, (48, 40)), png(13, (100, 31))

pytestmark = pytest.mark.usefixtures("single_torch_thread")
# The oracle computes in float32: so does the tower here, on every CPU (a CPU with
# bfloat16 matrix units would run Qwen3.5's in bfloat16 by default).




CHATS, IMAGES = image_chats(RED, (WIDE, BLUE), RED)


@pytest.fixture(scope="module")
def qwen_llm(qwen_folder):  # noqa: F811
    with LLM(str(qwen_folder), num_gpu_blocks=128, block_size=8,
             vision_dtype="float32") as engine:
        yield engine


def hf_reply(folder, model, ids: list[int], images: list[bytes]) -> list[int]:
    """transformers' greedy tokens for our prompt ids and its own processor's pixels,
    never stopping at the end-of-turn token (as ignore_eos: min_new_tokens would instead
    forbid it and pick the runner-up)."""
    pictures = [Image.open(io.BytesIO(d)).convert("RGB") for d in images]
    pixels = image_processor().from_pretrained(folder)(images=pictures, return_tensors="pt")
    input_ids = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                             pixel_values=pixels["pixel_values"],
                             image_grid_thw=pixels["image_grid_thw"],
                             mm_token_type_ids=(input_ids == model.config.image_token_id).int(),
                             max_new_tokens=16, do_sample=False, eos_token_id=-1,
                             pad_token_id=0)
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("name", list(CHATS))
def test_greedy_replies_match_transformers(qwen_llm, qwen_folder, qwen_hf, name):  # noqa: F811
    built = qwen_llm.prompts.build(ChatRequest(CHATS[name]))
    assert [s.grid for s in built.images] == \
        {"one image": [(5, 6)], "two images": [(4, 12), (5, 6)], "earlier turn": [(5, 6)]}[name]
    ours = qwen_llm.chat(CHATS[name], GREEDY).outputs[0].token_ids
    assert ours == hf_reply(qwen_folder, qwen_hf, built.ids, IMAGES[name])


def test_the_image_and_its_positions_decide_the_reply(qwen_llm, qwen_folder, qwen_hf):  # noqa: F811
    """The oracle is not blind: another image, or the image on text positions, changes
    transformers' reply, so equal replies above hold the image and M-RoPE both."""
    chat = CHATS["two images"]
    built = qwen_llm.prompts.build(ChatRequest(chat))
    reply = hf_reply(qwen_folder, qwen_hf, built.ids, IMAGES["two images"])
    assert hf_reply(qwen_folder, qwen_hf, built.ids, [WIDE, RED]) != reply
    flat = qwen_hf.model.get_rope_index
    try:
        qwen_hf.model.get_rope_index = lambda ids, *a, **k: (
            torch.arange(ids.shape[1]).view(1, 1, -1).expand(3, 1, -1), torch.zeros(1, 1))
        assert hf_reply(qwen_folder, qwen_hf, built.ids, IMAGES["two images"]) != reply
    finally:
        qwen_hf.model.get_rope_index = flat


def test_chunked_prefill_and_prefix_hits_keep_the_positions(qwen_folder, qwen_hf,  # noqa: F811
                                                           qwen_llm):
    chat = CHATS["two images"]
    whole = qwen_llm.chat(chat, GREEDY).outputs[0].token_ids
    with LLM(str(qwen_folder), num_gpu_blocks=128, block_size=8, vision_dtype="float32",
             max_num_batched_tokens=8,
             enable_prefix_caching=False) as chunked:
        spans = chunked.prompts.build(ChatRequest(chat)).images
        assert any(s.start % 8 and (s.end - s.start) > 8 for s in spans)  # cut mid-image
        assert chunked.chat(chat, GREEDY).outputs[0].token_ids == whole
        assert chunked.engine.runner.images.cache.encoded == 2
    # The same chat again: its blocks come from the prefix cache, the rest computed on
    # the shifted positions.
    again = qwen_llm.chat(chat, GREEDY)
    assert again.metrics.num_cached_tokens >= spans[-1].end - 8
    assert again.outputs[0].token_ids == whole
    # A follow-up turn after the reply: the whole first turn from the cache.
    follow = [*chat, {"role": "assistant", "content": "x"},
              {"role": "user", "content": [text("and "), image(RED)]}]
    built = qwen_llm.prompts.build(ChatRequest(follow))
    assert qwen_llm.chat(follow, GREEDY).outputs[0].token_ids == \
        hf_reply(qwen_folder, qwen_hf, built.ids, [WIDE, BLUE, RED])


def test_a_preempted_sequence_recomputes_the_same_reply(qwen_folder, qwen_llm):  # noqa: F811
    """Too few blocks for two image chats at once: one is preempted and recomputed."""
    chats = [CHATS["two images"], CHATS["one image"]]
    alone = [qwen_llm.chat(c, GREEDY).outputs[0].token_ids for c in chats]
    with LLM(str(qwen_folder), num_gpu_blocks=23, block_size=8, vision_dtype="float32",
             enable_prefix_caching=False) as tight:
        outs = tight.generate([tight.prompts.build(ChatRequest(c)) for c in chats], GREEDY)
        assert [o.outputs[0].token_ids for o in outs] == alone
        assert tight.engine.scheduler.num_preemptions > 0


def test_text_and_image_chats_in_one_batch(qwen_folder, qwen_llm):  # noqa: F811
    """One step holds a text-only sequence (plain positions) beside image ones ([3, T]),
    every prompt computed (no prefix cache)."""
    chats = [[{"role": "user", "content": "no picture here"}], CHATS["one image"],
             CHATS["earlier turn"]]
    alone = [qwen_llm.chat(c, GREEDY).outputs[0].token_ids for c in chats]
    with LLM(str(qwen_folder), num_gpu_blocks=128, block_size=8, vision_dtype="float32",
             enable_prefix_caching=False) as fresh:
        outs = fresh.generate([fresh.prompts.build(ChatRequest(c)) for c in chats], GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == alone
