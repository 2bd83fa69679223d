"""Gemma 3 through the whole engine against transformers on a tiny random folder (a
16-token window on three of four layers, 16 image tokens an image): greedy replies to
[image + text] for one and two images and for an image in an earlier turn (the
follow-up reusing the prefix cache, and a hit that ends inside an image's tokens), an
image that waits for a chunk of its own, and the refusal of an image no step holds.

transformers attends bidirectionally among one image's tokens (token_type_ids); so
does the engine (ImageSpan.joint, AttentionMetadata.key_ends), on the PyTorch
reference and on the native CPU kernels."""

from __future__ import annotations

import io

import pytest
import torch
from PIL import Image
from transformers import Gemma3ForConditionalGeneration
from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

from engine import LLM, EngineConfig
from engine.chat import ChatRequest
from tests.engine.vision.chats import GREEDY, image, image_chats, text
from tests.engine.vision.tiny_gemma3 import TOKENS, save_tiny_gemma3
from tests.engine.vision.tiny_idefics3 import png

RED, BLUE, WIDE = png(21, (48, 40)), png(22, (48, 40)), png(23, (100, 31))

pytestmark = pytest.mark.usefixtures("single_torch_thread")


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    return save_tiny_gemma3(tmp_path_factory.mktemp("gemma3") / "gemma3")


@pytest.fixture(scope="module")
def hf_gemma3(gemma3):
    return Gemma3ForConditionalGeneration.from_pretrained(gemma3, dtype=torch.float32).eval()


@pytest.fixture(scope="module", params=["cpu", "torch"])
def llm(gemma3, request):
    if request.param == "cpu":
        import kernels.cpu

        if not kernels.cpu.available():
            pytest.skip(f"native CPU kernels: {kernels.cpu.status()}")
    config = EngineConfig(num_gpu_blocks=128, block_size=8, attention_backend=request.param,
                          vision_dtype="float32")
    with LLM(str(gemma3), config) as engine:
        yield engine


def hf_reply(folder, hf_model, ids: list[int], images: list[bytes]) -> list[int]:
    """transformers' greedy tokens for our prompt ids, its processor's pixels and the
    token types that mark the image tokens (its bidirectional spans)."""
    processor = Gemma3ImageProcessorPil.from_pretrained(folder)
    pictures = [Image.open(io.BytesIO(data)).convert("RGB") for data in images]
    pixels = processor(images=pictures, return_tensors="pt")["pixel_values"]
    input_ids = torch.tensor([ids])
    types = (input_ids == hf_model.config.image_token_id).long()
    with torch.no_grad():
        out = hf_model.generate(input_ids=input_ids, pixel_values=pixels,
                                token_type_ids=types, attention_mask=torch.ones_like(input_ids),
                                max_new_tokens=16, do_sample=False, min_new_tokens=16)
    return out[0, len(ids):].tolist()


CHATS, IMAGES = image_chats(RED, (WIDE, BLUE), RED)


@pytest.mark.parametrize("name", list(CHATS))
def test_greedy_replies_match_transformers(llm, gemma3, hf_gemma3, name):
    built = llm.prompts.build(ChatRequest(CHATS[name]))
    assert len(built.images) == len(IMAGES[name])
    for span in built.images:
        assert span.joint[1] - span.joint[0] == TOKENS
    ours = llm.chat(CHATS[name], GREEDY).outputs[0].token_ids
    assert ours == hf_reply(gemma3, hf_gemma3, built.ids, IMAGES[name])


def test_a_follow_up_reuses_the_image_from_the_prefix_cache(gemma3, hf_gemma3):
    with LLM(str(gemma3), num_gpu_blocks=128, block_size=8, vision_dtype="float32") as llm:
        first = [{"role": "user", "content": [text("see "), image(WIDE)]}]
        reply = llm.chat(first, GREEDY).outputs[0]
        follow = [*first, {"role": "assistant", "content": reply.text,
                           "token_ids": list(reply.token_ids)},
                  {"role": "user", "content": "and now?"}]
        built = llm.prompts.build(ChatRequest(follow))
        again = llm.chat(follow, GREEDY)
        assert again.metrics.num_cached_tokens >= built.images[0].end
        assert llm.engine.runner.images.cache.encoded == 1
        assert again.outputs[0].token_ids == hf_reply(gemma3, hf_gemma3, built.ids, [WIDE])


def test_a_prefix_hit_that_ends_inside_the_image(gemma3, hf_gemma3):
    with LLM(str(gemma3), num_gpu_blocks=128, block_size=8, vision_dtype="float32") as llm:
        llm.chat([{"role": "user", "content": [text("what is it "), image(WIDE), text("?")]}],
                 GREEDY)
        # Whole blocks only, as when holding a cached block for its first tokens' copy
        # would not fit (engine/core/partial_blocks.py): the hit then ends inside the run.
        llm.engine.kv_cache.reuse_partial = False
        other = [{"role": "user", "content": [text("what is it "), image(WIDE), text("!!")]}]
        built = llm.prompts.build(ChatRequest(other))
        out = llm.chat(other, GREEDY)
        lo, hi = built.images[0].joint
        # The blocks up to the one that holds the run's end and the new text are found.
        assert lo < out.metrics.num_cached_tokens < hi
        assert out.outputs[0].token_ids == hf_reply(gemma3, hf_gemma3, built.ids, [WIDE])


def test_an_image_waits_for_a_chunk_that_holds_it_whole(gemma3, hf_gemma3):
    chat = CHATS["two images"]
    with LLM(str(gemma3), num_gpu_blocks=128, block_size=8, vision_dtype="float32",
             max_num_batched_tokens=20,
             enable_prefix_caching=False) as llm:
        built = llm.prompts.build(ChatRequest(chat))
        # The first image's run starts after 20 % 20 would cut it: the chunks move.
        assert any(s.joint[0] // 20 != (s.joint[1] - 1) // 20 for s in built.images)
        ours = llm.chat(chat, GREEDY).outputs[0].token_ids
        assert ours == hf_reply(gemma3, hf_gemma3, built.ids, [WIDE, BLUE])


def test_an_image_larger_than_a_step_is_refused_by_name(gemma3):
    with LLM(str(gemma3), num_gpu_blocks=128, block_size=8, vision_dtype="float32",
             max_num_batched_tokens=8) as llm:
        with pytest.raises(ValueError, match="max_num_batched_tokens=8"):
            llm.chat(CHATS["one image"], GREEDY)
        assert llm.chat([{"role": "user", "content": "hi"}], GREEDY).outputs[0].token_ids


def test_the_marker_typed_as_text_is_refused(llm):
    with pytest.raises(ValueError, match="holds '<start_of_image>'"):
        llm.chat([{"role": "user", "content": [text("a <start_of_image> b")]}], GREEDY)


def test_the_prompt_ids_are_the_processors(gemma3):
    """The image's newlines are tokenized with the text they join ("user\\n" + "\\n\\n"
    and "\\n\\n" + "what?"), as Gemma3Processor tokenizes the whole expanded prompt."""
    from transformers.models.gemma3.processing_gemma3 import Gemma3Processor

    from tests.engine.vision.tiny_gemma3 import gemma3_tokenizer

    tokenizer = gemma3_tokenizer()
    processor = Gemma3Processor(Gemma3ImageProcessorPil.from_pretrained(gemma3), tokenizer,
                                image_seq_length=TOKENS)
    chat = [{"role": "user", "content": [image(RED), text("what?\n"), image(BLUE)]},
            {"role": "assistant", "content": "two\n"},
            {"role": "user", "content": [text("and\n"), image(WIDE), text("\nnow")]}]
    flat = [{**m, "content": m["content"] if isinstance(m["content"], str) else "".join(
        p["text"] if p["type"] == "text" else "<start_of_image>" for p in m["content"])}
        for m in chat]
    prompt = tokenizer.apply_chat_template(flat, tokenize=False, add_generation_prompt=True)
    pictures = [Image.open(io.BytesIO(d)).convert("RGB") for d in (RED, BLUE, WIDE)]
    theirs = processor(text=[prompt], images=[pictures])
    with LLM(str(gemma3), num_gpu_blocks=64, block_size=8, vision_dtype="float32") as llm:
        built = llm.prompts.build(ChatRequest(chat))
    assert built.ids == list(theirs["input_ids"][0])
    # The spans' joint runs are exactly the tokens the processor marks as image tokens.
    types = list(theirs["token_type_ids"][0])
    marked = [p for span in built.images for p in range(*span.joint)]
    assert marked == [p for p, t in enumerate(types) if t]
    for span in built.images:
        assert built.ids[span.start] == tokenizer.convert_tokens_to_ids("<start_of_image>")
        assert built.ids[span.end - 1] == tokenizer.convert_tokens_to_ids("<end_of_image>")
