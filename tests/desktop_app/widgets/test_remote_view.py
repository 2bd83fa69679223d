"""The memory panel for a remote model, and API requests named in the block map."""

from __future__ import annotations

from desktop_app.services.remote_metrics import RemoteMetrics, RemoteStatus
from desktop_app.widgets.remote_view import remote_rows
from desktop_app.widgets.vram_panel import VramPanel
from engine.core.kv_stats import BlockInfo, KVStats
from engine.runner.memory import MemoryStats

FOLIO = RemoteMetrics("Folio", usage=0.25, hit_rate=0.5, running=1, waiting=0, blocks_used=64,
                      blocks_free=192, blocks_cached=40, blocks_total=256)
VLLM = RemoteMetrics("vLLM", usage=0.031, hit_rate=None, running=2, waiting=3)


class RemoteSource:
    busy, max_model_len = False, 8192

    def __init__(self, status) -> None:
        self.status = status

    def kv_stats(self):
        return None

    def memory_stats(self):
        return None

    def remote_status(self):
        return self.status

    def clear_disk(self):
        pass


def test_rows_for_folio_vllm_and_no_metrics():
    status = RemoteStatus("gpu-box:8000", "http://gpu-box:8000/v1", "m", FOLIO, "", True)
    assert remote_rows(status) == {
        "where": "The model runs remotely on gpu-box:8000", "model": "m",
        "kv_blocks": "64 / 256 used · 40 cached · 192 free", "kv_usage": "25.0%",
        "hit_rate": "50.0%", "requests": "1 running, 0 waiting",
        "note": "Figures from the server's /metrics (Folio names), every 2 s."}
    rows = remote_rows(RemoteStatus("h", "http://h/v1", "m", VLLM, "", True))
    assert "kv_blocks" not in rows and "hit_rate" not in rows
    assert (rows["kv_usage"], rows["requests"]) == ("3.1%", "2 running, 3 waiting")
    none = RemoteStatus("h", "http://h/v1", "m", None, "http://h/metrics shows no KV-cache "
                        "figures in Folio's, vLLM's or SGLang's names.", True)
    assert remote_rows(none)["note"].startswith("http://h/metrics shows no KV-cache figures")
    assert "kv_usage" not in remote_rows(none)


def test_panel_switches_to_the_remote_view(qtbot):
    status = RemoteStatus("gpu-box:8000", "http://gpu-box:8000/v1", "m", VLLM, "", True)
    panel = VramPanel(RemoteSource(status))
    qtbot.addWidget(panel)
    panel.show()
    panel.refresh()
    assert panel.remote_view.isVisible() and not panel.local_view.isVisible()
    assert panel.remote_view.value("where") == "The model runs remotely on gpu-box:8000"
    assert panel.remote_view.value("kv_usage") == "3.1%"
    assert panel.last_kv is None
    panel.source.status = RemoteStatus("h", "http://h/v1", "m", None, "no figures", True)
    panel.refresh()
    assert panel.remote_view.value("note") == "no figures"


def test_api_requests_are_named_in_the_block_map(qtbot):
    blocks = [BlockInfo(0, "used", 1, ("api-3:0",)), BlockInfo(1, "used", 1, ("chat-1:0",)),
              BlockInfo(2, "used", 1, ("api-3:0",)), BlockInfo(3, "free", 0, ())]
    kv = KVStats(block_size=16, num_blocks=4, bytes_per_block=1024, num_free=1, num_used=3,
                 num_cached=0, num_shared=0, bytes_saved_by_sharing=0, allocated_slots=48,
                 used_slots=40, prefix_hit_tokens=0, prefix_query_tokens=0, blocks=blocks)
    mem = MemoryStats("cpu", 2**20, 2**20, None, None, None, 2**24)

    class Local:
        busy, max_model_len = False, 512

        def kv_stats(self):
            return kv

        def memory_stats(self):
            return mem

        def remote_status(self):
            return None

        def clear_disk(self):
            pass

    panel = VramPanel(Local(),
                      chat_of_owner=lambda owner: "Trip" if owner.startswith("chat-1") else None)
    qtbot.addWidget(panel)
    panel.refresh()
    assert not panel.remote_view.isVisibleTo(panel)
    assert panel.block_map.tooltip_for(blocks[0]) == (
        "Block 0: used, ref count 1\nOwners:\n  API request (api-3:0)")
    assert panel.value("per_chat") == "API request: 2 blocks\nTrip: 1 block"
