"""Fixtures of the controller tests: the starter model with a small context."""

from __future__ import annotations

import pytest

CONTEXT = 256


@pytest.fixture(scope="session")
def small_llm():
    """The starter model with a 256-token context (its own pool: two chats of 256)."""
    from engine import LLM, EngineConfig

    return LLM("starter", config=EngineConfig(num_gpu_blocks=64, max_model_len=CONTEXT,
                                              block_size=16))


@pytest.fixture
def small_bridge(qtbot, small_llm):
    from desktop_app.services.engine_bridge import EngineBridge

    bridge = EngineBridge(llm_factory=lambda source, config=None, progress=None: small_llm)
    with qtbot.waitSignal(bridge.modelLoaded, timeout=30000):
        bridge.load_model("starter")
    yield bridge
    bridge.shutdown()
