"""The Models dialog's Discover tab, opened from the real window: the catalog with sizes
and fit labels, its search, Download and Load of an entry, the Hub search (a fake Hub),
Close and Esc, and the starter by its real name."""

from __future__ import annotations

import shutil

import pytest
from PySide6.QtCore import Qt

from desktop_app.data import model_catalog
from desktop_app.data.model_catalog import parse_entry
from desktop_app.dialogs.catalog_panel import CATALOG_COLUMNS
from desktop_app.services import downloads, hub_search, machine_memory
from desktop_app.services.hub_search import HubModel
from desktop_app.services.machine_memory import MachineMemory
from desktop_app.widgets.vram_panel import format_bytes

GB = 1 << 30
TINY = {"name": "Tiny Llama", "family": "Tiny", "architecture": "llama",
        "repo": "folio-test/tiny", "file": None, "quantization": "float32",
        "parameters": 100_000, "file_bytes": 400_000, "context": 64,
        "layers": 1, "kv_heads": 1, "head_dim": 8}
BIG = {"name": "Big Llama 70B", "family": "Llama 3.1", "architecture": "llama",
       "repo": "someone/Big-70B-GGUF", "file": "Big-70B-Q4_K_M.gguf",
       "quantization": "Q4_K_M", "parameters": 70_000_000_000, "file_bytes": 42 * GB,
       "context": 8192, "layers": 80, "kv_heads": 8, "head_dim": 128}
QWEN = {**BIG, "name": "Qwen3 4B", "family": "Qwen3", "architecture": "qwen3",
        "repo": "Qwen/Qwen3-4B-GGUF", "file": "Qwen3-4B-Q4_K_M.gguf",
        "parameters": 4_000_000_000, "file_bytes": 2_500_000_000, "layers": 36}


@pytest.fixture
def models_dialog(make_window, fake_bridge, monkeypatch, tmp_path, tiny_model_path, qtbot):
    """The window's Models dialog on a 24 GB machine, a catalog of three (the tiny one
    already in the HF cache) and a Hub that answers from a list."""
    cache = tmp_path / "hf-cache"
    snapshot = cache / "models--folio-test--tiny" / "snapshots" / "abc123"
    shutil.copytree(tiny_model_path, snapshot)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr(machine_memory, "read_machine_memory",
                        lambda: MachineMemory(24 * GB, 20 * GB))
    entries = tuple(parse_entry(e, i) for i, e in enumerate((TINY, BIG, QWEN)))
    monkeypatch.setattr(model_catalog, "load_catalog", lambda: entries)
    hub_calls = []

    def fake_hub(query):
        hub_calls.append(query)
        if query == "offline":
            raise downloads.DownloadError("offline", downloads.OFFLINE_MESSAGE)
        return [HubModel("someone/phi-mini", "safetensors", "phi3", 1234)]

    monkeypatch.setattr(hub_search, "search_hub", fake_hub)
    window = make_window(fake_bridge)
    window.open_model_manager()
    dialog = window.model_manager
    qtbot.waitExposed(dialog)
    dialog.tabs.setCurrentWidget(dialog.catalog)
    dialog.hub_calls, dialog.window_ = hub_calls, window
    dialog.snapshot = snapshot
    return dialog


def _rows(panel) -> list[dict[str, str]]:
    return [{name: panel.table.item(row, col).text() for col, name in
             enumerate(CATALOG_COLUMNS)} for row in range(panel.table.rowCount())]


def test_the_catalog_shows_sizes_memory_and_fit_labels(models_dialog):
    panel = models_dialog.catalog
    rows = {r["Model"]: r for r in _rows(panel)}
    assert list(rows) == ["Tiny Llama", "Big Llama 70B", "Qwen3 4B"]
    config = models_dialog._engine_config()
    for entry in panel.entries:
        row = rows[entry.name]
        assert row["Download"] == format_bytes(entry.file_bytes)
        assert row["Memory needed"] == format_bytes(
            model_catalog.memory_needed(entry, config))
        assert row["Quantization"] == entry.quantization
    assert rows["Tiny Llama"]["This computer"] == "Fits"
    assert rows["Big Llama 70B"]["This computer"] == "Too large for this computer's 24 GB"
    assert rows["Big Llama 70B"]["Parameters"] == "70.0 B"
    assert rows["Tiny Llama"]["Status"] == "downloaded"
    assert rows["Qwen3 4B"]["Status"] == ""
    assert panel.machine_label.text() == "This computer: 24 GB of memory, 20 GB free"


def test_search_filters_the_catalog(models_dialog, qtbot):
    panel = models_dialog.catalog
    qtbot.keyClicks(panel.search_edit, "qwen")
    assert [r["Model"] for r in _rows(panel)] == ["Qwen3 4B"]
    panel.search_edit.setText("llama 70b")
    assert [r["Model"] for r in _rows(panel)] == ["Big Llama 70B"]
    panel.search_edit.setText("mistral")
    assert _rows(panel) == []
    assert "Search the Hub" in panel.hub_status.text()
    panel.search_edit.clear()
    assert len(_rows(panel)) == 3


def test_download_of_a_catalog_entry_fetches_its_repo_and_file(models_dialog, qtbot,
                                                                monkeypatch, tmp_path):
    calls = []

    def fake_download(repo_id, gguf_file=None, on_progress=None, cancel=None):
        calls.append((repo_id, gguf_file))
        on_progress(downloads.DownloadProgress(500, 1000, gguf_file, 0, 1))
        return downloads.DownloadResult(repo_id, "abc", tmp_path / "snap", [gguf_file], 1000)

    monkeypatch.setattr(downloads, "download_model", fake_download)
    panel = models_dialog.catalog
    panel.select("Qwen3 4B")
    assert panel.action_button.text() == "Download"
    qtbot.mouseClick(panel.action_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not models_dialog.downloading, timeout=5000)
    assert calls == [("Qwen/Qwen3-4B-GGUF", "Qwen3-4B-Q4_K_M.gguf")]
    assert models_dialog.repo_edit.text() == "Qwen/Qwen3-4B-GGUF"
    assert models_dialog.download_status.text().startswith("Downloaded Qwen/Qwen3-4B-GGUF")


def test_load_of_a_downloaded_entry_asks_for_its_folder(models_dialog, qtbot, monkeypatch):
    monkeypatch.setattr(downloads, "download_model",
                        lambda *a, **k: pytest.fail("a downloaded model is not fetched"))
    panel = models_dialog.catalog
    panel.select("Tiny Llama")
    assert panel.action_button.text() == "Load"
    with qtbot.waitSignal(models_dialog.loadRequested) as requested:
        qtbot.mouseClick(panel.action_button, Qt.MouseButton.LeftButton)
    assert requested.args == [str(models_dialog.snapshot)]


def test_hub_search_lists_loadable_models_and_says_when_offline(models_dialog, qtbot):
    panel = models_dialog.catalog
    panel.search_edit.setText("phi")
    qtbot.mouseClick(panel.hub_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.hub_table.rowCount() == 1, timeout=5000)
    assert models_dialog.hub_calls == ["phi"]
    assert panel.hub_table.item(0, 0).text() == "someone/phi-mini"
    assert panel.hub_table.isVisible()
    assert panel.hub_status.text() == "1 model on the Hub match “phi” and can load in Folio."
    panel.search_edit.setText("offline")
    qtbot.keyClick(panel.search_edit, Qt.Key.Key_Return)  # nothing in the catalog: the Hub
    qtbot.waitUntil(lambda: "connection" in panel.hub_status.text(), timeout=5000)
    assert panel.hub_status.text() == ("Could not reach the model hub: check your "
                                       "connection. The catalog above works without a "
                                       "connection.")
    assert panel.hub_button.isEnabled()


def test_close_button_and_escape_close_the_dialog(models_dialog, qtbot):
    qtbot.mouseClick(models_dialog.close_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not models_dialog.isVisible(), timeout=2000)
    window = models_dialog.window_
    window.open_model_manager()
    again = window.model_manager
    qtbot.waitExposed(again)
    again.activateWindow()
    qtbot.keyClick(again, Qt.Key.Key_Escape)
    qtbot.waitUntil(lambda: not again.isVisible(), timeout=2000)


def test_the_starter_goes_by_its_real_name(models_dialog):
    window = models_dialog.window_
    local = models_dialog.table
    names = [local.item(r, 0).text() for r in range(local.rowCount())]
    assert "SmolLM2-135M-Instruct (built in)" in names and "starter" not in names
    index = window.model_picker.findData("starter")
    assert window.model_picker.itemText(index) == "SmolLM2-135M-Instruct (built in)"
