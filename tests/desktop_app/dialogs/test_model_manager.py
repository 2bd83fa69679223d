"""The model manager: the list and its numbers, load, add, and the download UI."""

from __future__ import annotations

import socket
import threading

import pytest

from desktop_app.data.settings import AppSettings
from desktop_app.dialogs.model_manager import (
    COLUMNS,
    ModelManagerDialog,
    format_parameters,
    memory_needed,
    source_for,
)
from desktop_app.services import downloads
from desktop_app.services.machine_memory import MachineMemory
from desktop_app.widgets.vram_panel import format_bytes
from engine.config import EngineConfig
from tests.cpu_pool import cpu_kv_bytes_per_token

# SmolLM2-135M: K and V, 30 layers, 3 KV heads of 64, fp32.
STARTER_KV_BYTES_PER_TOKEN = 2 * 30 * 3 * 64 * 4


@pytest.fixture
def dialog(qtbot, fake_bridge, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))  # an empty HF cache
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)  # CPU figures everywhere
    fake_bridge.engine_config = EngineConfig(max_model_len=2048)
    saved = []
    dlg = ModelManagerDialog(fake_bridge, AppSettings(), saved.append,
                             catalog={"memory": MachineMemory(16 << 30, 12 << 30)})
    dlg.saved = saved
    qtbot.addWidget(dlg)
    return dlg


def _row(dlg, row: int) -> dict[str, str]:
    return {name: dlg.table.item(row, col).text() for col, name in enumerate(COLUMNS)}


def test_format_parameters():
    assert [format_parameters(n) for n in (999, 134_515_008, 7_241_732_096)] == [
        "999", "134.5 M", "7.2 B"]
    assert format_parameters(6_919_000_000, 1_280_000_000) == "MoE: 6.9 B, 1.3 B active"


def test_lists_the_starter_with_what_it_needs(dialog):
    [info] = dialog.infos
    assert (info.name, info.format, info.architecture) == ("starter", "gguf", "llama")
    assert info.kv_bytes(1) == STARTER_KV_BYTES_PER_TOKEN
    assert info.context_length == 8192
    row = _row(dialog, 0)
    assert row["Name"] == "SmolLM2-135M-Instruct (built in)"  # its real name, not "starter"
    assert row["Architecture"] == "llama"
    assert row["Parameters"] == format_parameters(info.num_parameters) == "134.5 M"
    assert row["Context"] == "8192"
    assert row["On disk"] == format_bytes(info.size_bytes)
    # The engine's figures (engine.runner.kv_cache.estimate_memory) on the CPU: quantized
    # weights as stored (the file), plus a KV pool of four full 2048-token contexts, in
    # the CPU's default pool (int8 on the native kernels, fp32 on the reference).
    pool = 4 * 2048 * cpu_kv_bytes_per_token(30, 3, 64)
    expected = info.size_bytes + pool
    assert memory_needed(info, EngineConfig(max_model_len=2048)) == expected
    assert row["Memory needed"] == format_bytes(expected)
    dense = EngineConfig(max_model_len=2048, weights="float32")
    assert memory_needed(info, dense) == info.num_parameters * 4 + pool
    fp32_pool = EngineConfig(max_model_len=2048, kv_cache_dtype="float32")
    assert memory_needed(info, fp32_pool) == info.size_bytes + 4 * 2048 * 46_080
    assert row["Status"] == "● loaded"  # the fake bridge was loaded from "starter"


def test_load_button_asks_for_the_selected_source(dialog, qtbot):
    dialog.table.selectRow(0)
    with qtbot.waitSignal(dialog.loadRequested) as requested:
        dialog.load_button.click()
    assert requested.args == ["starter"]
    assert source_for(dialog.infos[0]) == "starter"


def test_added_broken_folder_shows_why(dialog, tmp_path):
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    dialog.add_path(str(broken))
    assert dialog.settings.model_paths == [str(broken)]
    assert dialog.saved == [dialog.settings]
    row = _row(dialog, 1)
    assert row["Name"] == "broken-model"
    assert "config.json" in row["Status"] and "missing or unreadable" in row["Status"]


def test_an_added_mixture_of_experts_shows_its_active_parameters(dialog, tmp_path):
    from tests.engine.tiny_moe import save_moe_model

    save_moe_model(tmp_path / "tiny-olmoe", "olmoe")
    dialog.add_path(str(tmp_path / "tiny-olmoe"))
    info, row = dialog.infos[1], _row(dialog, 1)
    assert (row["Name"], row["Architecture"]) == ("tiny-olmoe", "olmoe")
    assert info.active_parameters < info.num_parameters
    assert row["Parameters"] == format_parameters(info.num_parameters,
                                                  info.active_parameters)
    assert row["Parameters"].startswith("MoE: ") and row["Parameters"].endswith(" active")


def test_download_progress_then_done(dialog, qtbot, monkeypatch, tmp_path):
    calls = []

    def fake_download(repo_id, gguf_file=None, on_progress=None, cancel=None):
        calls.append((repo_id, gguf_file))
        for done in (0, 250, 1000):
            on_progress(downloads.DownloadProgress(done, 1000, "model.safetensors", 1, 2))
        return downloads.DownloadResult(repo_id, "abc", tmp_path / "snap", ["config.json"], 1000)

    monkeypatch.setattr(downloads, "download_model", fake_download)
    dialog.repo_edit.setText("owner/tiny")
    dialog.start_download()
    assert dialog.downloading and not dialog.download_button.isEnabled()
    qtbot.waitUntil(lambda: not dialog.downloading, timeout=5000)
    assert calls == [("owner/tiny", None)]
    assert dialog.download_progress.value() == 1000
    assert dialog.download_status.text() == f"Downloaded owner/tiny to {tmp_path / 'snap'}"
    assert dialog.download_button.isEnabled() and not dialog.cancel_button.isEnabled()


def test_download_cancel(dialog, qtbot, monkeypatch):
    started = threading.Event()

    def slow_download(repo_id, gguf_file=None, on_progress=None, cancel=None):
        on_progress(downloads.DownloadProgress(100, 1000, "model.safetensors", 0, 3))
        started.set()
        if not cancel.wait(5):
            raise AssertionError("cancel never came")
        raise downloads.DownloadCancelled()

    monkeypatch.setattr(downloads, "download_model", slow_download)
    dialog.repo_edit.setText("owner/big")
    dialog.gguf_edit.setText("big.Q4_0.gguf")
    dialog.start_download()
    qtbot.waitUntil(lambda: dialog.download_progress.value() == 100, timeout=5000)
    assert dialog.download_status.text() == (
        "model.safetensors: 100 B of 1000 B, 10% (file 1 of 3)")
    dialog.cancel_button.click()
    qtbot.waitUntil(lambda: not dialog.downloading, timeout=5000)
    # What arrived stays (services.partial_download): the next Download resumes it.
    assert dialog.download_status.text() == (
        "Download paused: 100 B of 1000 B kept. Download again to resume.")
    assert dialog.download_progress.value() == 100


@pytest.mark.parametrize("kind, message, advice", [
    ("not_found", "model a/b was not found on the model hub: check the name",
     "Check the repo id on huggingface.co"),
    ("disk_full", "not enough disk space in /x: free some space and try again",
     "Free some disk space"),
])
def test_download_errors_open_the_error_dialog(dialog, qtbot, monkeypatch, captured_errors,
                                               kind, message, advice):
    def failing(repo_id, **kwargs):
        raise downloads.DownloadError(kind, message)

    monkeypatch.setattr(downloads, "download_model", failing)
    dialog.repo_edit.setText("a/b")
    dialog.start_download()
    qtbot.waitUntil(lambda: captured_errors != [], timeout=5000)
    [(title, text)] = captured_errors
    assert title == "Download failed"
    assert text.startswith(message[0].upper() + message[1:] + ".\n\n" + advice)
    assert dialog.download_status.text() == message


def test_offline_through_the_real_downloader(dialog, qtbot, monkeypatch, captured_errors):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")  # nothing listens there
    monkeypatch.setenv("HF_TOKEN", "hf_test_token_unused")
    dialog.repo_edit.setText("folio-test/tiny-llama")
    dialog.start_download()
    qtbot.waitUntil(lambda: captured_errors != [], timeout=30000)
    [(title, text)] = captured_errors
    assert title == "Download failed"
    assert text.startswith("Could not reach the model hub: check your connection.")
    assert "Check your internet connection" in text


def test_a_gguf_repo_without_a_chosen_file_asks_for_one_without_an_error_box(
        dialog, qtbot, monkeypatch, captured_errors):
    def no_file(repo_id, **kwargs):
        raise downloads.DownloadError("no_weights", "a/b has no safetensors weights (it has "
                                      "GGUF files: choose one of m-Q4_0.gguf, m-Q8_0.gguf)")

    monkeypatch.setattr(downloads, "download_model", no_file)
    dialog.repo_edit.setText("a/b")
    dialog.start_download()
    qtbot.waitUntil(lambda: not dialog.downloading, timeout=5000)
    assert dialog.download_status.text() == (
        "a/b has no safetensors weights (it has GGUF files: choose one of m-Q4_0.gguf, "
        "m-Q8_0.gguf): type it in the second field.")
    assert captured_errors == []
