"""Folio's inference engine: paged KV cache, continuous batching, and the decoder-only
model families registered in engine/models/registry.py (``FAMILIES``).

The public names are imported lazily so that the Qt-free, torch-free bookkeeping
modules (``engine.core.kv_cache_manager``, ``engine.core.scheduler``) stay light to import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "LLM": "engine.llm",
    "LLMEngine": "engine.llm_engine",
    "EngineWorker": "engine.worker",
    "EngineConfig": "engine.config",
    "SamplingParams": "engine.sampling_params",
    "ResponseFormat": "engine.sampling_params",
    "BeamSearchParams": "engine.beam.params",
    "KVStats": "engine.core.kv_stats",
    "RequestOutput": "engine.outputs",
    "CompletionOutput": "engine.outputs",
}

__all__ = [
    "LLM",
    "BeamSearchParams",
    "CompletionOutput",
    "EngineConfig",
    "EngineWorker",
    "KVStats",
    "LLMEngine",
    "RequestOutput",
    "ResponseFormat",
    "SamplingParams",
]

if TYPE_CHECKING:
    from engine.beam.params import BeamSearchParams
    from engine.config import EngineConfig
    from engine.core.kv_stats import KVStats
    from engine.llm import LLM
    from engine.llm_engine import LLMEngine
    from engine.outputs import CompletionOutput, RequestOutput
    from engine.sampling_params import ResponseFormat, SamplingParams
    from engine.worker import EngineWorker


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
