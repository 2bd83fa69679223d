"""A ModelHost's own way to load a model and to estimate its memory, by model name or path
(what ``LLM`` accepts); a server passes its library's instead."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.config import EngineConfig


def default_load(config: EngineConfig) -> Callable[[str], Any]:
    def load(name: str):
        from engine.llm import LLM
        from engine.worker import EngineWorker

        return EngineWorker(LLM(name, config)).start()

    return load


def default_estimate(config: EngineConfig) -> Callable[[str], int]:
    def estimate(name: str) -> int:
        from engine.loaders.catalog import model_info, resolve_model
        from engine.runner.kv_cache import estimate_memory

        return estimate_memory(model_info(resolve_model(name)), config).total_bytes

    return estimate
