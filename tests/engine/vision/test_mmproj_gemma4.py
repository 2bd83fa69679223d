"""A GGUF Gemma 4 with llama.cpp's "gemma4v" mmproj file against the Hugging Face folder
it was converted from (tiny_gemma4v_gguf.py): the same image embeddings (an F32 file
within 1e-5, F16 within 2e-2 of embeddings up to ~4, Q8_0 within 1e-5 of the folder's
encoder given the dequantized matrices), the same prompt ids and greedy
tokens (16) for one image and for an image in an earlier turn; the budget and pooling
from the file's keys (280 tokens without image_max_pixels); an audio encoder in the same
file left out; a normalizing mean or std and
a budget Gemma 4 was not trained with refused by name."""

from __future__ import annotations

from dataclasses import replace

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from engine import LLM, EngineConfig
from engine.chat import ChatRequest
from engine.loaders import load_model_files
from engine.loaders.gguf.mmproj import read_mmproj_header
from tests.engine.vision.chats import GREEDY, mmproj_chats
from tests.engine.vision.mmproj_cases import embeddings, folder_vision, mmproj_vision
from tests.engine.vision.tiny_gemma4v import BUDGET, POOLING, save_tiny_gemma4v
from tests.engine.vision.tiny_gemma4v_gguf import budget_pixels, write_mmproj, write_text_gguf
from tests.engine.vision.tiny_idefics3 import png

pytestmark = pytest.mark.usefixtures("single_torch_thread", "gguf_cache_dir")

SQUARE, WIDE = png(21, (40, 40)), png(22, (90, 30))
MODEL = "gemma4-tiny-F32.gguf"
MMPROJ = "mmproj-gemma4-tiny-F32.gguf"


CHATS = mmproj_chats(SQUARE, WIDE)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny_gemma4v(tmp_path_factory.mktemp("gemma4v") / "gemma4")


def budget_keys(folder) -> dict[str, int]:
    return {"image_max_pixels": budget_pixels(BUDGET, folder)}


@pytest.fixture(scope="module")
def converted(folder, tmp_path_factory):
    """The folder as llama.cpp's two files, side by side (the folder's budget stated)."""
    root = tmp_path_factory.mktemp("gguf")
    write_text_gguf(folder, root / MODEL)
    write_mmproj(folder, root / MMPROJ, extra=budget_keys(folder))
    return root


@pytest.fixture(scope="module")
def text_model(converted):
    return load_model_files(converted / MODEL)


@pytest.fixture(scope="module")
def reference(folder):
    return folder_vision(folder)


@pytest.mark.parametrize("data", [SQUARE, WIDE], ids=["square", "wide"])
def test_f32_mmproj_gives_the_folders_embeddings(converted, text_model, reference, data):
    vision = mmproj_vision(converted / MMPROJ, text_model)
    ours, ours_out = embeddings(vision, data)
    theirs, theirs_out = embeddings(reference, data)
    assert (ours.text, ours.num_tokens) == (theirs.text, theirs.num_tokens)
    assert torch.equal(ours.pixels.patches, theirs.pixels.patches)
    assert vision.image_token_id == reference.image_token_id
    # kv heads, clamps, position tables, standardization: all read (eps as a float32 key)
    spec, want = vision.encoder.spec, reference.encoder.spec
    assert replace(spec, eps=want.eps) == want and spec.eps == pytest.approx(want.eps)
    torch.testing.assert_close(ours_out, theirs_out, rtol=0, atol=1e-5)


def test_f16_mmproj_within_its_tolerance(folder, tmp_path, text_model, reference):
    path = write_mmproj(folder, tmp_path / "mmproj-F16.gguf", Q.F16, extra=budget_keys(folder))
    assert {t.qtype for t in read_mmproj_header(path).tensors if len(t.shape) == 2} == {Q.F16}
    _, ours = embeddings(mmproj_vision(path, text_model), WIDE)
    _, theirs = embeddings(reference, WIDE)
    assert (ours - theirs).abs().max() < 2e-2  # measured 1e-2 on values up to ~4
    assert not torch.equal(ours, theirs)


def test_q8_0_mmproj_is_the_folders_encoder_given_what_the_file_holds(folder, tmp_path,
                                                                      text_model, reference):
    path = write_mmproj(folder, tmp_path / "mmproj-Q8_0.gguf", Q.Q8_0,
                        extra=budget_keys(folder))
    encoder = reference.encoder
    original = {name: p.detach().clone() for name, p in encoder.named_parameters()}
    try:
        with torch.no_grad():
            for name, param in encoder.named_parameters():
                if name.endswith("input_proj.weight"):  # the patch kernel: F16
                    param.copy_(param.half().float())
                elif param.dim() == 2:
                    data = param.numpy()
                    back = gguf.quants.dequantize(gguf.quants.quantize(data, Q.Q8_0), Q.Q8_0)
                    param.copy_(torch.from_numpy(np.asarray(back).reshape(data.shape)))
        _, theirs = embeddings(reference, SQUARE)
    finally:
        with torch.no_grad():
            for name, param in encoder.named_parameters():
                param.copy_(original[name])
    _, ours = embeddings(mmproj_vision(path, text_model), SQUARE)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)


def test_without_a_budget_key_the_processors_default(folder, tmp_path, text_model):
    vision = mmproj_vision(write_mmproj(folder, tmp_path / "mmproj.gguf"), text_model)
    processing = vision.processor.processing
    assert (processing.max_soft_tokens, processing.pooling) == (280, POOLING)


def test_an_audio_encoder_beside_the_tower_is_left_out(folder, tmp_path, text_model,
                                                       reference):
    path = write_mmproj(folder, tmp_path / "mmproj-audio.gguf", extra=budget_keys(folder),
                        audio=True)
    assert "a.blk.0.ffn_up.weight" in {t.name for t in read_mmproj_header(path).tensors}
    _, ours = embeddings(mmproj_vision(path, text_model), SQUARE)
    _, theirs = embeddings(reference, SQUARE)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def folder_llm(folder):
    with LLM(str(folder), num_gpu_blocks=256, block_size=8) as engine:
        yield engine


@pytest.mark.parametrize("name", list(CHATS))
def test_greedy_tokens_match_the_folder_with_the_mmproj_beside(converted, folder_llm, name):
    with LLM(str(converted / MODEL), num_gpu_blocks=256, block_size=8) as llm:
        built = llm.prompts.build(ChatRequest(CHATS[name]))
        assert built.ids == folder_llm.prompts.build(ChatRequest(CHATS[name])).ids
        assert len(built.images) == 1
        ours = llm.chat(CHATS[name], GREEDY).outputs[0].token_ids
    assert ours == folder_llm.chat(CHATS[name], GREEDY).outputs[0].token_ids


BAD_KEYS = {
    "mean": ({"mean": (0.5, 0.5, 0.5)}, r"clip\.vision\.image_mean .* not supported"),
    "budget": ({"image_max_pixels": 100 * (8 * POOLING) ** 2},
               r"image_max_pixels 25600 is a budget of 100 soft tokens"),
}


@pytest.mark.parametrize("case", list(BAD_KEYS))
def test_a_key_gemma_4_was_not_built_with_is_refused_by_name(converted, folder, tmp_path,
                                                             case):
    keys, message = BAD_KEYS[case]
    bad = tmp_path / "mmproj-bad.gguf"
    if case == "mean":
        write_mmproj(folder, bad, extra=budget_keys(folder), mean=keys["mean"])
    else:
        write_mmproj(folder, bad, extra=keys)
    with pytest.raises(ValueError, match=message) as caught:
        LLM(str(converted / MODEL), EngineConfig(num_gpu_blocks=64, mmproj=str(bad)))
    assert str(bad) in str(caught.value)
