"""SmolVLM / Idefics3 through the whole engine against transformers on a tiny random
folder: greedy replies to [image + text] for one and two images and for an image in an
earlier turn, chunked prefill that cuts an image (encoded once all the same), the
prefix cache keyed by the image's content, and what a text model says to an image."""

from __future__ import annotations

import io

import pytest
import torch
from PIL import Image
from transformers.models.idefics3.image_processing_pil_idefics3 import (
    Idefics3ImageProcessorPil,
)

from engine import LLM
from engine.chat import ChatRequest
from tests.engine.tiny_models import save_tiny_model
from tests.engine.vision.chats import GREEDY, image, image_chats, text
from tests.engine.vision.tiny_idefics3 import png, save_tiny_idefics3

RED, BLUE, WIDE = png(11, (48, 40)), png(12, (48, 40)), png(13, (100, 31))

pytestmark = pytest.mark.usefixtures("single_torch_thread")




@pytest.fixture(scope="module")
def llm(folder):
    with LLM(str(folder), num_gpu_blocks=128, block_size=8) as engine:
        yield engine


def hf_reply(folder, hf_model, ids: list[int], images: list[bytes]) -> list[int]:
    """transformers' greedy tokens for our prompt ids and its own processor's pixels."""
    processor = Idefics3ImageProcessorPil.from_pretrained(folder)
    pictures = [Image.open(io.BytesIO(data)).convert("RGB") for data in images]
    pixels = processor(images=[pictures], return_tensors="pt")
    with torch.no_grad():
        out = hf_model.generate(input_ids=torch.tensor([ids]),
                                pixel_values=pixels["pixel_values"],
                                pixel_attention_mask=pixels["pixel_attention_mask"],
                                max_new_tokens=16, do_sample=False, min_new_tokens=16)
    return out[0, len(ids):].tolist()


CHATS, IMAGES = image_chats(RED, (WIDE, BLUE), RED)


@pytest.mark.parametrize("name", list(CHATS))
def test_greedy_replies_match_transformers(llm, folder, hf_model, name):
    built = llm.prompts.build(ChatRequest(CHATS[name]))
    assert len(built.images) == len(IMAGES[name])
    ours = llm.chat(CHATS[name], GREEDY).outputs[0].token_ids
    assert ours == hf_reply(folder, hf_model, built.ids, IMAGES[name])


def test_chunked_prefill_encodes_each_image_once(folder, llm):
    chat = CHATS["two images"]
    whole = llm.chat(chat, GREEDY).outputs[0].token_ids
    with LLM(str(folder), num_gpu_blocks=128, block_size=8, max_num_batched_tokens=8,
             enable_prefix_caching=False) as chunked:
        spans = chunked.prompts.build(ChatRequest(chat)).images
        assert any(s.start % 8 and (s.end - s.start) > 8 for s in spans)  # cut mid-image
        assert chunked.chat(chat, GREEDY).outputs[0].token_ids == whole
        assert chunked.engine.runner.images.cache.encoded == 2


def test_the_prefix_cache_knows_the_image_by_its_content(folder):
    with LLM(str(folder), num_gpu_blocks=128, block_size=8) as llm:
        ask = [{"role": "user", "content": [text("what is "), image(RED), text("?")]}]
        first = llm.chat(ask, GREEDY)
        span = llm.prompts.build(ChatRequest(ask)).images[0]
        again = llm.chat(ask, GREEDY)
        # The same image: every full block found, the image's included.
        assert again.metrics.num_cached_tokens >= span.end - 8
        assert again.outputs[0].token_ids == first.outputs[0].token_ids
        # Another image of the same size: its tokens are the same ids, its blocks are not.
        other = [{"role": "user", "content": [text("what is "), image(BLUE), text("?")]}]
        assert llm.prompts.build(ChatRequest(other)).ids == \
            llm.prompts.build(ChatRequest(ask)).ids
        miss = llm.chat(other, GREEDY)
        assert miss.metrics.num_cached_tokens == span.start  # the words before it only
        assert llm.engine.runner.images.cache.encoded == 2


def test_a_text_model_refuses_an_image_by_name(tmp_path):
    with LLM(str(save_tiny_model(tmp_path / "text")), num_gpu_blocks=32) as llm:
        with pytest.raises(ValueError, match=r"messages\[0\].content\[1\].type: 'image'"):
            llm.chat([{"role": "user", "content": [text("hi"), image(RED)]}], GREEDY)


def test_bad_images_are_refused_by_name(llm):
    with pytest.raises(ValueError, match=r"messages\[0\].content\[0\]: not an image"):
        llm.chat([{"role": "user", "content": [image(b"plain text")]}], GREEDY)
    url = {"type": "image_url", "image_url": {"url": "https://example.invalid/cat.png"}}
    with pytest.raises(ValueError, match="image_url.url: http.s. image URLs are not fetched"):
        llm.chat([{"role": "user", "content": [url]}], GREEDY)
    with pytest.raises(ValueError, match=r"content\[0\].text: holds '<image>'"):
        llm.chat([{"role": "user", "content": [text("a <image> b")]}], GREEDY)


# A template that reads content only as parts, as SmolVLM's does: "User:" right before
# an image that opens a message, "User: " before text.
PARTS_TEMPLATE = (
    "<|im_start|>{% for m in messages %}{{ m['role'] | capitalize }}"
    "{{ ':' if m['content'][0]['type'] == 'image' else ': ' }}"
    "{% for p in m['content'] %}{% if p['type'] == 'text' %}{{ p['text'] }}"
    "{% elif p['type'] == 'image' %}<image>{% endif %}{% endfor %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
)


def test_a_parts_only_template_gives_the_processors_ids(folder, tmp_path):
    from transformers.models.idefics3.processing_idefics3 import Idefics3Processor

    from tests.engine.vision.tiny_idefics3 import idefics3_tokenizer

    parts = tmp_path / "parts"
    save_tiny_idefics3(parts)
    tokenizer = idefics3_tokenizer()
    tokenizer.chat_template = PARTS_TEMPLATE
    tokenizer.save_pretrained(parts)
    (parts / "chat_template.jinja").write_text(PARTS_TEMPLATE)
    chat = [{"role": "user", "content": [image(WIDE), text("and "), image(RED)]},
            {"role": "assistant", "content": [text("two pictures")]},
            {"role": "user", "content": [text("which is wider?")]}]
    processor = Idefics3Processor(Idefics3ImageProcessorPil.from_pretrained(parts),
                                  tokenizer, image_seq_len=4, chat_template=PARTS_TEMPLATE)
    hf_chat = [{**m, "content": [{"type": "image"} if p["type"] == "image" else p
                                 for p in m["content"]]} for m in chat]
    prompt = processor.apply_chat_template(hf_chat, add_generation_prompt=True)
    pictures = [Image.open(io.BytesIO(d)).convert("RGB") for d in (WIDE, RED)]
    theirs = processor(text=[prompt], images=[pictures])["input_ids"][0]
    with LLM(str(parts), num_gpu_blocks=64, block_size=8) as llm:
        assert llm.tokenizer.parts_only
        assert llm.prompts.build(ChatRequest(chat)).ids == list(theirs)


def test_image_blocks_come_back_from_disk_after_a_restart(folder, tmp_path, monkeypatch):
    from engine import EngineConfig

    monkeypatch.setenv("FOLIO_KV_CACHE_DIR", str(tmp_path / "kv"))
    config = EngineConfig(num_gpu_blocks=128, block_size=8, kv_disk_bytes=64 << 20)
    chat = CHATS["one image"]
    with LLM(str(folder), config) as llm:
        first = llm.chat(chat, GREEDY)
        span = llm.prompts.build(ChatRequest(chat)).images[0]
    with LLM(str(folder), config) as llm:  # a new process's memory: only the disk
        again = llm.chat(chat, GREEDY)
        assert again.metrics.num_disk_tokens >= span.end - 8
        assert again.outputs[0].token_ids == first.outputs[0].token_ids
        other = [{"role": "user", "content": [text("what is "), image(BLUE), text("?")]}]
        assert llm.chat(other, GREEDY).metrics.num_cached_tokens <= span.start // 8 * 8
