"""The vision tests' tiny SmolVLM folder, once per module, and transformers' copy of it;
a module's own GGUF conversion cache (``gguf_cache_dir``) for the mmproj tests."""

from __future__ import annotations

import pytest
import torch
from transformers import Idefics3ForConditionalGeneration

from tests.engine.vision.tiny_idefics3 import save_tiny_idefics3


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny_idefics3(tmp_path_factory.mktemp("idefics3") / "smolvlm")


@pytest.fixture(scope="module")
def hf_model(folder):
    return Idefics3ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def gguf_cache_dir(tmp_path_factory):
    """FOLIO_CACHE_DIR in a fresh folder for the module: its GGUF files' converted
    tokenizers and configs are written there, not in the user's cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FOLIO_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield
