"""The engine tests' shared tiny model: a random Llama saved as a real model folder once
per test module, transformers' copy of it, and Folio's LLM over it (a module that needs
another model defines its own fixtures of these names)."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaForCausalLM

from tests.engine.tiny_models import save_tiny_model


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="module")
def hf_model(tiny_dir):
    return LlamaForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def llm(tiny_dir):
    from engine import LLM

    # A float32 pool (not the CPU's float16 default): tests hold its logits to
    # transformers' float32 ones at 1e-4.
    return LLM(str(tiny_dir), num_gpu_blocks=256, kv_cache_dtype="float32")
