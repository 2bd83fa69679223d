"""A GGUF Qwen3.5 with llama.cpp's "qwen3vl_merger" mmproj file against the Hugging Face
folder it was converted from (tiny_qwen35_vl_gguf.py), the towers in float32 on every
CPU: the same image embeddings (an F32 file within 1e-5, F16 within 2e-2 of embeddings
up to ~6), the same prompt ids and greedy tokens (16) for one image and for an image in
an earlier turn (the M-RoPE sections read from rope.dimension_sections); the pixel
bounds from the file's keys, transformers' defaults without them; a Qwen3-VL file's
deepstack tensors and a kernel without its second temporal slice refused by name; a
Qwen3.5-MoE GGUF with the merger beside it replies as its folder; another family's
projector beside the model leaves it text only and unlisted as seeing, named for it is
refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from engine import LLM, EngineConfig
from engine.chat import ChatRequest
from engine.loaders import load_model_files
from engine.loaders.gguf.mmproj import read_mmproj_header
from engine.vision import qwen35
from tests.engine.vision.chats import GREEDY, mmproj_chats
from tests.engine.vision.mmproj_cases import embeddings, folder_vision, mmproj_vision
from tests.engine.vision.tiny_idefics3 import png
from tests.engine.vision.tiny_qwen35_vl import MAX_PIXELS, MIN_PIXELS, save_tiny_qwen35_vl
from tests.engine.vision.tiny_qwen35_vl_gguf import write_mmproj, write_text_gguf

pytestmark = pytest.mark.usefixtures("single_torch_thread", "gguf_cache_dir")

RED, WIDE = png(11, (48, 40)), png(13, (100, 31))
MODEL = "qwen35-tiny-F32.gguf"
MMPROJ = "mmproj-qwen35-tiny-F32.gguf"
PIXELS = (MIN_PIXELS, MAX_PIXELS)
F32 = torch.float32


CHATS = mmproj_chats(RED, WIDE)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny_qwen35_vl(tmp_path_factory.mktemp("qwen35vl") / "qwen35")


@pytest.fixture(scope="module")
def converted(folder, tmp_path_factory):
    """The folder as llama.cpp's two files, side by side (its pixel bounds stated)."""
    root = tmp_path_factory.mktemp("gguf")
    write_text_gguf(folder, root / MODEL)
    write_mmproj(folder, root / MMPROJ, pixels=PIXELS)
    return root


@pytest.fixture(scope="module")
def text_model(converted):
    return load_model_files(converted / MODEL)


@pytest.fixture(scope="module")
def reference(folder):
    return folder_vision(folder)


def test_the_text_file_carries_the_folders_mrope_sections(text_model, folder):
    from transformers import AutoConfig

    want = AutoConfig.from_pretrained(folder).text_config.rope_parameters["mrope_section"]
    assert text_model.config.rope_parameters["mrope_section"] == list(want)


@pytest.mark.parametrize("data", [RED, WIDE], ids=["one", "wide"])
def test_f32_mmproj_gives_the_folders_embeddings(converted, text_model, reference, data):
    vision = mmproj_vision(converted / MMPROJ, text_model)
    ours, ours_out = embeddings(vision, data)
    theirs, theirs_out = embeddings(reference, data)
    assert (ours.text, ours.num_tokens, ours.grid) == (theirs.text, theirs.num_tokens,
                                                       theirs.grid)
    assert torch.equal(ours.pixels.pixels, theirs.pixels.pixels)
    assert (vision.image_token_id, vision.marker_text) == (reference.image_token_id,
                                                           reference.marker_text)
    assert vision.encoder.spec == reference.encoder.spec
    torch.testing.assert_close(ours_out, theirs_out, rtol=0, atol=1e-5)


def test_f16_mmproj_within_its_tolerance(folder, tmp_path, text_model, reference):
    path = write_mmproj(folder, tmp_path / "mmproj-F16.gguf", Q.F16, pixels=PIXELS)
    assert Q.F16 in {t.qtype for t in read_mmproj_header(path).tensors}
    _, ours = embeddings(mmproj_vision(path, text_model), WIDE)
    _, theirs = embeddings(reference, WIDE)
    assert (ours - theirs).abs().max() < 2e-2
    assert not torch.equal(ours, theirs)


def test_without_pixel_keys_transformers_defaults(folder, tmp_path, text_model):
    vision = mmproj_vision(write_mmproj(folder, tmp_path / "mmproj.gguf"), text_model)
    processing = vision.processor.processing
    assert (processing.min_pixels, processing.max_pixels) == (qwen35.MIN_PIXELS,
                                                              qwen35.MAX_PIXELS)


@pytest.fixture(scope="module")
def folder_llm(folder):
    with LLM(str(folder), num_gpu_blocks=128, block_size=8, vision_dtype="float32") as llm:
        yield llm


@pytest.mark.parametrize("name", list(CHATS))
def test_greedy_tokens_match_the_folder_with_the_mmproj_beside(converted, folder_llm, name):
    with LLM(str(converted / MODEL), num_gpu_blocks=128, block_size=8,
             vision_dtype="float32") as llm:
        built = llm.prompts.build(ChatRequest(CHATS[name]))
        theirs = folder_llm.prompts.build(ChatRequest(CHATS[name]))
        assert built.ids == theirs.ids
        assert [s.grid for s in built.images] == [s.grid for s in theirs.images]
        ours = llm.chat(CHATS[name], GREEDY).outputs[0].token_ids
    assert ours == folder_llm.chat(CHATS[name], GREEDY).outputs[0].token_ids


BAD = {
    "deepstack": ({"v.deepstack.0.fc1.weight": np.ones((4, 4), np.float32)},
                  r"tensor v\.deepstack\.0\.fc1\.weight has no place in the qwen3vl_merger"),
    "one slice": ({}, r"lacks v\.patch_embd\.weight or its second temporal slice"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_file_folio_cannot_run_is_refused_by_name(converted, folder, tmp_path, case,
                                                    monkeypatch):
    extra, message = BAD[case]
    bad = tmp_path / "mmproj-bad.gguf"
    if case == "one slice":
        import tests.engine.vision.tiny_qwen35_vl_gguf as writer

        original = writer.mmproj_tensors
        monkeypatch.setattr(writer, "mmproj_tensors", lambda f: {
            k: v for k, v in original(f).items() if k != "v.patch_embd.weight.1"})
    write_mmproj(folder, bad, pixels=PIXELS, extra_tensors=extra)
    with pytest.raises(ValueError, match=message) as caught:
        LLM(str(converted / MODEL), EngineConfig(num_gpu_blocks=64, mmproj=str(bad)))
    assert str(bad) in str(caught.value)


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    """The MoE folder and its two files."""
    root = tmp_path_factory.mktemp("moe")
    folder = save_tiny_qwen35_vl(root / "folder", moe=True)
    (root / "gguf").mkdir()
    write_text_gguf(folder, root / "gguf" / "qwen35moe.gguf")
    write_mmproj(folder, root / "gguf" / "mmproj-qwen35moe.gguf", pixels=PIXELS)
    return folder, root / "gguf" / "qwen35moe.gguf"


def test_a_moe_gguf_with_the_merger_beside_replies_as_its_folder(moe):
    folder, path = moe
    chat = CHATS["earlier turn"]
    replies = []
    for source in (folder, path):
        with LLM(str(source), num_gpu_blocks=128, block_size=8, vision_dtype="float32") as llm:
            assert len(llm.prompts.build(ChatRequest(chat)).images) == 1
            replies.append(llm.chat(chat, GREEDY).outputs[0].token_ids)
    assert replies[0] == replies[1]


def test_another_familys_projector_beside_leaves_it_text_only_and_named_is_refused(
        converted, tmp_path):
    from engine.loaders.catalog import model_info
    from tests.engine.vision.tiny_gemma4v import save_tiny_gemma4v
    from tests.engine.vision.tiny_gemma4v_gguf import write_mmproj as write_gemma4_mmproj

    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / MODEL).symlink_to(converted / MODEL)
    gemma = write_gemma4_mmproj(save_tiny_gemma4v(tmp_path / "gemma4"),
                                alone / "mmproj-gemma4.gguf")
    assert not model_info(alone / MODEL).sees_images
    with LLM(str(alone / MODEL), num_gpu_blocks=64, block_size=8) as llm:
        assert llm.prompts.vision is None
    with pytest.raises(ValueError, match=r"gives images to a Gemma 4 text model "
                                         r"\(gemma4_text\), and this model is qwen3_5_text"):
        LLM(str(alone / MODEL), EngineConfig(num_gpu_blocks=64, mmproj=str(gemma)))


def test_the_merger_beside_its_dense_model_is_listed_as_seeing(converted):
    from engine.loaders.catalog import model_info

    assert model_info(converted / MODEL).sees_images
