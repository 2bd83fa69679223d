"""The Settings switch "Serve the loaded model on localhost:PORT" over a tiny real model:
API requests run on the app's own worker (their blocks show in the memory panel as "API
request"), the server follows the model, and a port in use turns the switch off."""

from __future__ import annotations

import socket
import threading

import openai
import pytest
from PySide6.QtWidgets import QCheckBox, QSpinBox

from desktop_app.data.settings import AppSettings, load_settings
from desktop_app.services.engine_bridge import EngineBridge
from engine.serve.server import free_port


@pytest.fixture
def tiny_bridge(qtbot, tiny_model_path):
    from engine import LLM

    bridge = EngineBridge(llm_factory=lambda source, config=None, progress=None: LLM(
        str(tiny_model_path), num_gpu_blocks=256, max_model_len=512))
    with qtbot.waitSignal(bridge.modelLoaded, timeout=60000):
        bridge.load_model("tiny")
    yield bridge
    bridge.shutdown()


def set_switch(window, on: bool, port: int) -> None:
    dialog = window.open_settings()
    dialog.findChild(QSpinBox, "servePort").setValue(port)
    dialog.findChild(QCheckBox, "serveSetting").setChecked(on)
    dialog.accept()


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def ask(url: str, model: str, **kwargs):
    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)
    return client.chat.completions.create(model=model, messages=[
        {"role": "user", "content": "Hello from a script"}], **kwargs)


def test_the_switch_serves_the_loaded_model(qtbot, tiny_bridge, make_window, monkeypatch):
    import engine.worker

    monkeypatch.setattr(engine.worker, "STATS_INTERVAL_S", 0.0)  # a snapshot every step
    window = make_window(tiny_bridge, AppSettings())
    port = free_port()
    set_switch(window, True, port)
    url = f"http://127.0.0.1:{port}/v1"
    qtbot.waitUntil(lambda: window.serve.url == url, timeout=30000)
    assert window.serve_label.text() == f"API: {url}"
    assert (load_settings().serve_enabled, load_settings().serve_port) == (True, port)

    # Pause the engine one step after an API request holds blocks, so the panel's
    # snapshot (taken after that step) is looked at while the request still runs.
    engine_ = tiny_bridge.worker.llm.engine
    seen, resume = threading.Event(), threading.Event()

    def hook(_report) -> None:
        if seen.is_set():
            resume.wait(30)
        elif any(o.startswith("api-") for b in engine_.kv_stats().blocks for o in b.owners):
            seen.set()

    remove = tiny_bridge.worker.llm.loop.add_hook(hook)
    answers: list = []
    caller = threading.Thread(target=lambda: answers.append(
        ask(url, tiny_bridge.model_name, n=2, max_tokens=24, temperature=1.0, seed=1)))
    caller.start()
    panel = window.vram_panel

    def panel_shows_the_api_request() -> bool:
        panel.refresh()
        return any(o.startswith("api-") for b in panel.block_map.blocks for o in b.owners)

    try:
        qtbot.waitUntil(panel_shows_the_api_request, timeout=60000)
    finally:
        resume.set()
        remove()
    owner = next(o for b in panel.block_map.blocks for o in b.owners if o.startswith("api-"))
    block = next(b for b in panel.block_map.blocks if owner in b.owners)
    assert f"API request ({owner})" in panel.block_map.tooltip_for(block)
    assert "API request:" in panel.value("per_chat")
    caller.join(60)
    [answer] = answers
    assert len(answer.choices) == 2
    assert all(isinstance(c.message.content, str) for c in answer.choices)
    assert answer.usage.prompt_tokens > 0

    set_switch(window, False, port)
    qtbot.waitUntil(lambda: not port_open(port), timeout=15000)
    assert window.serve.url == "" and window.serve_label.text() == ""
    assert load_settings().serve_enabled is False


def test_the_server_follows_the_model(qtbot, tiny_bridge, make_window):
    window = make_window(tiny_bridge, AppSettings(serve_enabled=True, serve_port=free_port()))
    port = window.settings.serve_port
    qtbot.waitUntil(lambda: window.serve.url != "", timeout=30000)  # on at startup
    tiny_bridge.unload_model()
    qtbot.waitUntil(lambda: not port_open(port), timeout=15000)
    assert window.serve_label.text() == "API: serving stopped with the model"
    with qtbot.waitSignal(tiny_bridge.modelLoaded, timeout=60000):
        window.load_model("tiny")
    qtbot.waitUntil(lambda: window.serve.url != "", timeout=30000)
    answer = ask(window.serve.url, tiny_bridge.model_name, max_tokens=4)  # the new worker
    assert answer.choices[0].finish_reason in ("stop", "length")


def test_a_port_in_use_turns_the_switch_off(qtbot, tiny_bridge, make_window, captured_errors):
    window = make_window(tiny_bridge, AppSettings())
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        set_switch(window, True, port)
        qtbot.waitUntil(lambda: captured_errors != [], timeout=30000)
    [(title, text)] = captured_errors
    assert title == "Could not serve the model"
    assert f"localhost:{port}" in text and "already in use" in text
    assert "Pick another port" in text
    assert window.serve.url == "" and not window.serve.enabled
    assert window.settings.serve_enabled is False and load_settings().serve_enabled is False
    dialog = window.open_settings()
    assert not dialog.findChild(QCheckBox, "serveSetting").isChecked()
    dialog.reject()


def test_the_apps_server_refuses_foreign_hosts_and_origins(qtbot, tiny_bridge, make_window):
    import httpx2 as httpx

    window = make_window(tiny_bridge, AppSettings(serve_enabled=True, serve_port=free_port()))
    qtbot.waitUntil(lambda: window.serve.url != "", timeout=30000)
    chat = {"model": tiny_bridge.model_name, "max_tokens": 4, "stream": True,
            "messages": [{"role": "user", "content": "hi"}]}
    url = window.serve.url + "/chat/completions"
    for headers in ({"host": "evil.example:8765"}, {"origin": "http://evil.example"}):
        refused = httpx.post(url, json=chat, headers=headers, timeout=60)
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["type"] == "permission_error"
        assert "access-control-allow-origin" not in refused.headers
    port = window.settings.serve_port
    assert httpx.post(url, json=chat, headers={"host": f"localhost:{port}"},
                      timeout=60).status_code == 200
