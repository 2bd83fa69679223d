"""A GGUF Gemma 3 with llama.cpp's "gemma3" mmproj file against the Hugging Face folder
it was converted from (tiny_gemma3_gguf.py): the same image embeddings (an F32 file
within 1e-5; F16 within 1e-5 of the folder's encoder given the F16 matrices), the same
prompt ids and greedy tokens (16) for one image and for an image in an earlier turn (an
image's tokens bidirectional, as the folder's); the pooling from projector.scale_factor
(4 without it); a scale that does not pool the patch grid evenly refused by name. The
towers compute in float32 on every CPU here (Gemma 3's takes bfloat16 matmuls by default
where the CPU has them, folder and file alike: the last test)."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as Q

from engine import LLM, EngineConfig
from engine.chat import ChatRequest
from engine.loaders import load_model_files
from engine.loaders.gguf.mmproj import read_mmproj_header
from engine.vision.load import load_vision
from engine.vision.mmproj import load_mmproj
from tests.engine.vision.chats import GREEDY, mmproj_chats
from tests.engine.vision.mmproj_cases import embeddings, folder_vision, mmproj_vision
from tests.engine.vision.tiny_gemma3 import TOKENS, save_tiny_gemma3
from tests.engine.vision.tiny_gemma3_gguf import write_mmproj, write_text_gguf
from tests.engine.vision.tiny_idefics3 import png

pytestmark = pytest.mark.usefixtures("single_torch_thread", "gguf_cache_dir")

RED, WIDE = png(21, (48, 40)), png(23, (100, 31))
MODEL = "gemma3-tiny-F32.gguf"
MMPROJ = "mmproj-gemma3-tiny-F32.gguf"


CHATS = mmproj_chats(RED, WIDE)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny_gemma3(tmp_path_factory.mktemp("gemma3") / "gemma3")


@pytest.fixture(scope="module")
def converted(folder, tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    write_text_gguf(folder, root / MODEL)
    write_mmproj(folder, root / MMPROJ)
    return root


@pytest.fixture(scope="module")
def text_model(converted):
    return load_model_files(converted / MODEL)


@pytest.fixture(scope="module")
def reference(folder):
    return folder_vision(folder)


def test_f32_mmproj_gives_the_folders_embeddings(converted, text_model, reference):
    vision = mmproj_vision(converted / MMPROJ, text_model)
    assert read_mmproj_header(converted / MMPROJ).key("projector.scale_factor") == 2
    ours, ours_out = embeddings(vision, WIDE)
    theirs, theirs_out = embeddings(reference, WIDE)
    assert (ours.text, ours.num_tokens) == (theirs.text, theirs.num_tokens)
    assert ours.num_tokens == TOKENS
    assert torch.equal(ours.pixels, theirs.pixels)
    assert vision.image_token_id == reference.image_token_id
    torch.testing.assert_close(ours_out, theirs_out, rtol=0, atol=1e-5)


def test_f16_mmproj_is_the_folders_encoder_given_what_the_file_holds(folder, tmp_path,
                                                                     text_model, reference):
    path = write_mmproj(folder, tmp_path / "mmproj-F16.gguf", Q.F16)
    encoder = reference.encoder
    original = {name: p.detach().clone() for name, p in encoder.named_parameters()}
    try:
        with torch.no_grad():
            for name, param in encoder.named_parameters():
                if param.dim() >= 2 and "position_embedding" not in name:
                    param.copy_(param.half().float())
        _, theirs = embeddings(reference, RED)
    finally:
        with torch.no_grad():
            for name, param in encoder.named_parameters():
                param.copy_(original[name])
    _, ours = embeddings(mmproj_vision(path, text_model), RED)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
    _, full = embeddings(reference, RED)
    assert not torch.equal(ours, full)


@pytest.fixture(scope="module")
def folder_llm(folder):
    with LLM(str(folder), num_gpu_blocks=128, block_size=8, vision_dtype="float32") as engine:
        yield engine


@pytest.mark.parametrize("name", list(CHATS))
def test_greedy_tokens_match_the_folder_with_the_mmproj_beside(converted, folder_llm, name):
    with LLM(str(converted / MODEL), num_gpu_blocks=128, block_size=8,
             vision_dtype="float32") as llm:
        built = llm.prompts.build(ChatRequest(CHATS[name]))
        theirs = folder_llm.prompts.build(ChatRequest(CHATS[name]))
        assert built.ids == theirs.ids
        assert [(s.start, s.end) for s in built.images] == [(s.start, s.end)
                                                            for s in theirs.images]
        ours = llm.chat(CHATS[name], GREEDY).outputs[0].token_ids
    assert ours == folder_llm.chat(CHATS[name], GREEDY).outputs[0].token_ids


def test_a_scale_that_does_not_pool_the_grid_is_refused_by_name(converted, folder, tmp_path):
    bad = write_mmproj(folder, tmp_path / "mmproj-bad.gguf", scale=3)
    with pytest.raises(ValueError, match=r"scale_factor 3 does not pool a 8 x 8 patch grid"):
        LLM(str(converted / MODEL), EngineConfig(num_gpu_blocks=64, mmproj=str(bad)))


def test_the_files_tower_computes_in_the_folders_dtype(converted, folder, text_model):
    """Left to choose (bfloat16 matmuls where the CPU has them), both choose alike."""
    ours = load_mmproj(read_mmproj_header(converted / MMPROJ), text_model.tokenizer,
                       text_model.config.hidden_size, torch.float32)
    theirs = load_vision(folder, torch.float32)
    assert ours.encoder.tower.embeddings.matmul_dtype == \
        theirs.encoder.tower.embeddings.matmul_dtype
    torch.testing.assert_close(embeddings(ours, RED)[1], embeddings(theirs, RED)[1],
                               rtol=0, atol=1e-5)
