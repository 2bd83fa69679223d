"""Attachments through the window to the real engine: a tiny random SmolVLM folder reads
the attached picture (its prompt grows by the image's tokens, and the next turn finds
them in the prefix cache); the starter (a text model) greys out images and reads an
attached document whole, its chip saying so with the engine's token count."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from desktop_app.controllers import attach
from desktop_app.data.settings import load_settings
from desktop_app.services.engine_bridge import EngineBridge
from engine import LLM
from tests.engine.vision.tiny_idefics3 import png, save_tiny_idefics3


@pytest.fixture(scope="module")
def vlm_folder(tmp_path_factory):
    return save_tiny_idefics3(tmp_path_factory.mktemp("idefics3") / "smolvlm")


@pytest.fixture
def vlm_bridge(qtbot, vlm_folder):
    llm = LLM(str(vlm_folder), num_gpu_blocks=256, block_size=8, max_model_len=2048)
    bridge = EngineBridge(llm_factory=lambda src, config=None, progress=None: llm)
    with qtbot.waitSignal(bridge.modelLoaded, timeout=30000):
        bridge.load_model("smolvlm")
    yield bridge
    bridge.shutdown()


def short_greedy_settings():
    """Replies of 8 greedy tokens: the random model's words are the same every run."""
    settings = load_settings()
    settings.chat_defaults.max_tokens = 8
    settings.chat_defaults.temperature = 0.0
    return settings


def attach_files(qtbot, monkeypatch, view, *paths) -> None:
    monkeypatch.setattr(attach, "open_file_names", lambda *a: [str(p) for p in paths])
    qtbot.mouseClick(view.attach_button, Qt.MouseButton.LeftButton)


def send(qtbot, window, text: str, errors: list | None = None):
    window.conversation.composer.setPlainText(text)
    with qtbot.waitSignal(window.controller.turnFinished, timeout=60000):
        qtbot.mouseClick(window.conversation.send_button, Qt.MouseButton.LeftButton)
        assert not errors, errors  # refused at once: say why rather than time out
    store = window.store
    return store.get_message(store.active_leaf(window.controller.chat_id))


def test_a_vision_model_reads_the_attached_picture(qtbot, make_window, vlm_bridge,
                                                   monkeypatch, tmp_path, captured_errors):
    window = make_window(vlm_bridge, short_greedy_settings())
    view = window.conversation
    assert vlm_bridge.sees_images and view.image_button.isEnabled()
    plain = send(qtbot, window, "what is this?")
    window.controller.new_chat()
    picture = tmp_path / "red.png"
    picture.write_bytes(png(11, (48, 40)))
    attach_files(qtbot, monkeypatch, view, picture)
    with_image = send(qtbot, window, "what is this?")
    assert with_image.status == "complete", with_image.content
    image_tokens = (with_image.metrics["num_prompt_tokens"]
                    - plain.metrics["num_prompt_tokens"])
    assert image_tokens > 16  # the picture's tokens went in
    follow_up = send(qtbot, window, "and now?", captured_errors)
    assert follow_up.metrics["num_cached_tokens"] >= with_image.metrics["num_prompt_tokens"] \
        - 8  # all but the last partial block of the first prompt came from the cache


def test_a_text_model_greys_out_images_and_reads_a_document_whole(
        qtbot, make_window, make_starter_bridge, monkeypatch, tmp_path, store):
    bridge = make_starter_bridge()
    window = make_window(bridge, short_greedy_settings())
    view = window.conversation
    assert bridge.sees_images is False and not view.image_button.isEnabled()
    assert "does not see images" in view.image_button.toolTip()
    notes = tmp_path / "notes.md"
    notes.write_text("# Shopping\n\nMilk, eggs and the number 4417.\n")
    attach_files(qtbot, monkeypatch, view, notes)
    reply = send(qtbot, window, "What number?")
    assert reply.status == "complete"
    [user] = [m for m in store.path_to(reply.id) if m.role == "user"]
    [doc] = user.attachments
    assert doc.detail.startswith("1 section · ") and doc.detail.endswith(" tokens · whole")
    assert view.rows()[0].attachments.chips[0].label.text() == f"notes.md · {doc.detail}"
