"""The Memory dock during speculative decoding, from a real engine's kv_stats: after each
step the block map holds only the reply's own blocks (drafts' extra blocks given back),
and the dock counts the blocks rolled back."""

from __future__ import annotations

import pytest

from desktop_app.widgets.vram_panel import VramPanel
from engine.sampling_params import SamplingParams
from tests.desktop_app.widgets.test_vram_beams import EngineSource
from tests.engine.tiny_models import (
    peaked_weights,
    random_prompt,
    save_tiny_model,
    tiny_llama_config,
)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from engine import LLM

    path = save_tiny_model(tmp_path_factory.mktemp("models") / "tiny", tiny_llama_config(),
                           init=peaked_weights)
    return LLM(str(path), num_gpu_blocks=64, kv_cache_dtype="float32", block_size=8,
               speculative="ngram").engine


def test_block_map_after_rolled_back_drafts(qtbot, engine):
    request_id = engine.add_request(random_prompt(5, 12) * 3,
                                    SamplingParams(temperature=0, max_tokens=40,
                                                   ignore_eos=True))
    panel = VramPanel(EngineSource(engine), chat_of_owner=lambda owner: "Drafts"
                      if owner.startswith(request_id + ":") else None)
    qtbot.addWidget(panel)
    while engine.has_unfinished_requests():
        engine.step()
        request = engine.scheduler.requests.get(request_id)
        if request is None:
            break
        [seq] = request.live_seqs
        panel.refresh()
        # The reply holds the blocks of its computed tokens only, between steps.
        held = -(-seq.num_computed_tokens // 8)
        assert panel.value("per_chat") == f"Drafts: {held} blocks"
        used = [info for info in panel.block_map.blocks if info.owners]
        assert len(used) == held
    stats = engine.kv_stats()
    assert stats.rolled_back_blocks > 0
    panel.refresh()
    assert panel.value("rolled_back") == f"{stats.rolled_back_blocks} blocks since start"
