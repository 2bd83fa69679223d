"""The vision tests' tiny SmolVLM folder, once per module, and transformers' copy of it."""

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
