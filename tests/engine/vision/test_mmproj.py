"""A GGUF SmolVLM with llama.cpp's mmproj file against the Hugging Face folder it was
converted from (tiny_idefics3_gguf.py): the same image embeddings (an F32 file exactly,
F16 within 2e-2 of embeddings up to ~7, Q8_0 exactly as the folder's encoder given the
dequantized matrices), the same prompt ids and greedy tokens (16) for one image and an
image in an earlier turn; the file found beside the model or named; which of several is
taken; and each bad mmproj refused by name, the file-level ones before the text model
loads."""

from __future__ import annotations

import shutil

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from engine import LLM, EngineConfig
from engine.chat import ChatRequest
from engine.loaders import load_model_files
from engine.loaders.gguf.mmproj import find_mmproj, read_mmproj_header
from tests.engine.vision.chats import GREEDY, mmproj_chats
from tests.engine.vision.mmproj_cases import embeddings, folder_vision, mmproj_vision
from tests.engine.vision.tiny_idefics3 import png
from tests.engine.vision.tiny_idefics3_gguf import write_mmproj, write_text_gguf

pytestmark = pytest.mark.usefixtures("single_torch_thread", "gguf_cache_dir")

RED, WIDE = png(11, (48, 40)), png(13, (100, 31))
MODEL = "SmolVLM-tiny-F32.gguf"


CHATS = mmproj_chats(RED, WIDE)


@pytest.fixture(scope="module")
def converted(folder, tmp_path_factory):
    """The folder as llama.cpp's two files, side by side."""
    root = tmp_path_factory.mktemp("gguf")
    write_text_gguf(folder, root / MODEL)
    write_mmproj(folder, root / "mmproj-SmolVLM-tiny-F32.gguf")
    return root


@pytest.fixture(scope="module")
def text_model(converted):
    return load_model_files(converted / MODEL)


@pytest.fixture(scope="module")
def reference(folder):
    return folder_vision(folder)


@pytest.mark.parametrize("data", [RED, WIDE], ids=["one tile", "split"])
def test_f32_mmproj_gives_the_folders_embeddings(converted, text_model, reference, data):
    vision = mmproj_vision(converted / "mmproj-SmolVLM-tiny-F32.gguf", text_model)
    ours, ours_out = embeddings(vision, data)
    theirs, theirs_out = embeddings(reference, data)
    assert (ours.text, ours.num_tokens) == (theirs.text, theirs.num_tokens)
    assert torch.equal(ours.pixels.pixels, theirs.pixels.pixels)
    assert vision.image_token_id == reference.image_token_id
    torch.testing.assert_close(ours_out, theirs_out, rtol=0, atol=1e-5)


def test_f16_mmproj_within_its_tolerance(folder, tmp_path, text_model, reference):
    vision = mmproj_vision(write_mmproj(folder, tmp_path / "mmproj-F16.gguf", Q.F16),
                           text_model)
    header = read_mmproj_header(tmp_path / "mmproj-F16.gguf")
    assert {t.qtype for t in header.tensors if len(t.shape) == 2} == {Q.F16, Q.F32}
    _, ours = embeddings(vision, WIDE)
    _, theirs = embeddings(reference, WIDE)
    assert (ours - theirs).abs().max() < 2e-2  # measured 8e-3 on values up to ~7
    assert not torch.equal(ours, theirs)


def test_q8_0_mmproj_is_dequantized_by_ggufs_tables(folder, tmp_path, text_model, reference):
    path = write_mmproj(folder, tmp_path / "mmproj-Q8_0.gguf", Q.Q8_0)
    vision = mmproj_vision(path, text_model)
    # The folder's encoder given what the file holds: Q8_0 matrices back through gguf.
    encoder = reference.encoder
    original = {name: p.detach().clone() for name, p in encoder.named_parameters()}
    try:
        with torch.no_grad():
            for name, param in encoder.named_parameters():
                if param.dim() == 2 and "embedding" not in name:
                    data = param.numpy()
                    back = gguf.quants.dequantize(gguf.quants.quantize(data, Q.Q8_0), Q.Q8_0)
                    param.copy_(torch.from_numpy(np.asarray(back).reshape(data.shape)))
        _, theirs = embeddings(reference, RED)
    finally:
        with torch.no_grad():
            for name, param in encoder.named_parameters():
                param.copy_(original[name])
    _, ours = embeddings(vision, RED)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def folder_llm(folder):
    with LLM(str(folder), num_gpu_blocks=128, block_size=8) as engine:
        yield engine


@pytest.mark.parametrize("name", list(CHATS))
def test_greedy_tokens_match_the_folder_with_the_mmproj_beside(converted, folder_llm, name):
    with LLM(str(converted / MODEL), num_gpu_blocks=128, block_size=8) as llm:
        built = llm.prompts.build(ChatRequest(CHATS[name]))
        assert built.ids == folder_llm.prompts.build(ChatRequest(CHATS[name])).ids
        assert len(built.images) == 1
        ours = llm.chat(CHATS[name], GREEDY).outputs[0].token_ids
    assert ours == folder_llm.chat(CHATS[name], GREEDY).outputs[0].token_ids


def test_an_explicit_mmproj_path_and_none(converted, folder_llm, tmp_path):
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(converted / MODEL, alone / MODEL)
    with LLM(str(alone / MODEL), num_gpu_blocks=64, block_size=8) as llm:  # text only
        with pytest.raises(ValueError, match=r"content\[1\].type: 'image'"):
            llm.chat(CHATS["one image"], GREEDY)
    config = EngineConfig(num_gpu_blocks=128, block_size=8,
                          mmproj=str(converted / "mmproj-SmolVLM-tiny-F32.gguf"))
    with LLM(str(alone / MODEL), config) as llm:
        ours = llm.chat(CHATS["one image"], GREEDY).outputs[0].token_ids
    assert ours == folder_llm.chat(CHATS["one image"], GREEDY).outputs[0].token_ids


def test_the_first_mmproj_by_name_is_taken(tmp_path):
    for name in ("model.gguf", "mmproj-model-Q8_0.gguf", "MMPROJ-model-f16.gguf",
                 "mmproj-notes.txt"):
        (tmp_path / name).write_bytes(b"GGUF")
    (tmp_path / "mmproj-folder.gguf").mkdir()
    assert find_mmproj(tmp_path / "model.gguf") == tmp_path / "MMPROJ-model-f16.gguf"
    assert find_mmproj(tmp_path) is None  # a folder carries its own tower
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "model.gguf").write_bytes(b"GGUF")
    assert find_mmproj(alone / "model.gguf") is None
    # A model file named like a projector is not its own.
    (alone / "mmproj-like-model.gguf").write_bytes(b"GGUF")
    assert find_mmproj(alone / "mmproj-like-model.gguf") is None


def _not_gguf(folder, path):
    path.write_text("not a gguf")


def _text_gguf(folder, path):
    write_text_gguf(folder, path)


def _kimivl(folder, path):
    write_mmproj(folder, path, projector="kimivl")


BAD_FILES = {
    "not GGUF": (_not_gguf, "mmproj file is not a readable GGUF file"),
    "not an mmproj": (_text_gguf, "not an mmproj file .its general.architecture is 'llama'"),
    "projector type": (_kimivl, "projector type 'kimivl' is not one Folio runs"),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_a_bad_mmproj_is_refused_before_the_text_model_loads(converted, folder, tmp_path,
                                                             case, monkeypatch):
    write, message = BAD_FILES[case]
    bad = tmp_path / "mmproj-bad.gguf"
    write(folder, bad)

    def no_text_model(*args, **kwargs):
        raise AssertionError("the text model was loaded before the mmproj was checked")

    monkeypatch.setattr("engine.loaders.load_model_files", no_text_model)
    with pytest.raises(ValueError, match=message) as caught:
        LLM(str(converted / MODEL), EngineConfig(num_gpu_blocks=64, mmproj=str(bad)))
    assert str(bad) in str(caught.value)


def test_a_projector_type_folio_lacks_beside_the_model_leaves_it_text_only(folder, tmp_path):
    write_text_gguf(folder, tmp_path / MODEL)
    _kimivl(folder, tmp_path / "mmproj-other.gguf")
    with LLM(str(tmp_path / MODEL), num_gpu_blocks=64, block_size=8) as llm:
        assert llm.prompts.vision is None


def test_a_mismatched_width_is_refused_by_name(converted, folder, tmp_path):
    bad = write_mmproj(folder, tmp_path / "mmproj-wide.gguf", projection_dim=96)
    with pytest.raises(ValueError, match=r"projects to 96 wide embeddings .* the text "
                                         r"model is 64 wide"):
        LLM(str(converted / MODEL), EngineConfig(num_gpu_blocks=64, mmproj=str(bad)))


def test_a_vocabulary_without_the_image_tokens_is_refused_by_name(folder, tmp_path):
    write_text_gguf(folder, tmp_path / MODEL, rename={"<global-img>": "<global-image>"})
    write_mmproj(folder, tmp_path / "mmproj-SmolVLM.gguf")
    with pytest.raises(ValueError, match="the model's vocabulary has no '<global-img>' token"):
        LLM(str(tmp_path / MODEL), num_gpu_blocks=64)


def test_the_disk_tier_keeps_image_blocks_per_mmproj_file(converted, folder, tmp_path,
                                                          monkeypatch):
    monkeypatch.setenv("FOLIO_KV_CACHE_DIR", str(tmp_path / "kv"))
    f16 = write_mmproj(folder, tmp_path / "mmproj-F16.gguf", Q.F16)
    chat = CHATS["one image"]

    def disk_tokens(mmproj=None) -> int:
        config = EngineConfig(num_gpu_blocks=128, block_size=8, kv_disk_bytes=64 << 20,
                              mmproj=mmproj)
        with LLM(str(converted / MODEL), config) as llm:
            return llm.chat(chat, GREEDY).metrics.num_disk_tokens

    assert disk_tokens() == 0  # written on close
    span = None
    with LLM(str(converted / MODEL), num_gpu_blocks=128, block_size=8) as llm:
        span = llm.prompts.build(ChatRequest(chat)).images[0]
    assert disk_tokens() >= span.end - 8  # a restart: the image's blocks from disk
    # Another projector file makes other embeddings: its blocks are not those.
    assert disk_tokens(str(f16)) == 0
