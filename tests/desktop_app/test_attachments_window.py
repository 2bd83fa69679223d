"""Attachments through the real window (offscreen) on the fake engine: attached by the
Attach button (the file dialog replaced), by a drop of file URLs, by a paste of a
picture; a chip removed; the parts the engine received; a bad file's message with the
draft kept; the chat reopened with its attachments; the Markdown and JSON exports; the
Image button greyed out, saying why, for a model that does not see images."""

from __future__ import annotations

import base64
import io
import json

import pytest
from PIL import Image
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QImage

from desktop_app.controllers import attach
from desktop_app.dialogs import chat_files
from desktop_app.services.engine_bridge import EngineBridge
from desktop_app.widgets.attachment_view import ImageDialog
from engine.bench.pdf_writer import write_pdf
from engine.documents.limits import MAX_FILE_BYTES
from tests.desktop_app.conftest import FakeLLM, FakeWorker
from tests.desktop_app.test_drops import drop, url_mime


def png_bytes(color=(0, 120, 255), size=(20, 10)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture
def files(tmp_path):
    photo = tmp_path / "photo.png"
    photo.write_bytes(png_bytes())
    report = tmp_path / "report.pdf"
    report.write_bytes(write_pdf([["The code is 4417."], ["Page two."]]))
    notes = tmp_path / "notes.md"
    notes.write_text("# Notes\n\nBuy milk.\n")
    return photo, report, notes


def make_bridge(qtbot, sees_images: bool) -> EngineBridge:
    workers: list[FakeWorker] = []

    def make_worker(llm):
        workers.append(FakeWorker(llm))
        return workers[-1]

    bridge = EngineBridge(
        llm_factory=lambda src, config=None, progress=None: FakeLLM(sees_images=sees_images),
        worker_factory=make_worker)
    with qtbot.waitSignal(bridge.modelLoaded, timeout=5000):
        bridge.load_model("starter")
    bridge.fake_workers = workers
    return bridge


@pytest.fixture
def vision_bridge(qtbot):
    bridge = make_bridge(qtbot, sees_images=True)
    yield bridge
    bridge.shutdown()


def choose(monkeypatch, *paths) -> list[tuple[str, str]]:
    asked = []

    def fake(parent, title, filters):
        asked.append((title, filters))
        return [str(p) for p in paths]

    monkeypatch.setattr(attach, "open_file_names", fake)
    return asked


def chip_names(view) -> list[str]:
    return [c.attachment.name for c in view.attachment_chips.chips()]


def send(qtbot, window, text: str) -> None:
    window.conversation.composer.setPlainText(text)
    with qtbot.waitSignal(window.controller.turnFinished, timeout=5000):
        qtbot.mouseClick(window.conversation.send_button, Qt.MouseButton.LeftButton)


def test_attach_by_button_send_and_see_the_parts_and_the_thumbnails(
        qtbot, make_window, vision_bridge, files, monkeypatch, store):
    window = make_window(vision_bridge)
    view = window.conversation
    photo, report, _ = files
    asked = choose(monkeypatch, photo, report)
    assert view.image_button.isEnabled()
    qtbot.mouseClick(view.attach_button, Qt.MouseButton.LeftButton)
    assert asked[0][0] == "Attach files" and "*.png" in asked[0][1] and "*.pdf" in asked[0][1]
    assert chip_names(view) == ["photo.png", "report.pdf"]
    assert view.attachment_chips.chips()[1].label.text() == "report.pdf · 2 pages"
    assert not view.attachment_chips.chips()[0].thumb.pixmap().isNull()

    send(qtbot, window, "What is the code?")
    messages, _ = vision_bridge.fake_workers[0].submitted[-1]
    assert messages[-1]["content"] == [
        {"type": "image", "image": photo.read_bytes()},
        {"type": "file", "file": {
            "file_data": "data:application/pdf;base64,"
            + base64.b64encode(report.read_bytes()).decode(), "filename": "report.pdf"}},
        {"type": "text", "text": "What is the code?"}]
    assert view.attachments() == [] and not view.attachment_chips.isVisible()

    sent = view.rows()[0].attachments
    assert [c.attachment.name for c in sent.chips] == ["photo.png", "report.pdf"]
    assert not sent.chips[0].remove_button.isVisible()
    qtbot.mouseClick(sent.chips[0], Qt.MouseButton.LeftButton)
    dialog = window.findChild(ImageDialog, "imageDialog")
    assert dialog is not None and dialog.image.pixmap().size().width() == 20
    dialog.close()

    # The next turn sends the picture again (the engine's prefix cache keys it).
    send(qtbot, window, "And the colour?")
    messages, _ = vision_bridge.fake_workers[0].submitted[-1]
    assert messages[0]["content"][0] == {"type": "image", "image": photo.read_bytes()}
    assert messages[-1]["content"] == "And the colour?"


def test_drop_and_paste_attach_and_a_chip_can_be_removed(qtbot, make_window, vision_bridge,
                                                         files):
    window = make_window(vision_bridge)
    view = window.conversation
    photo, _, notes = files
    drop(view.composer.viewport(), url_mime(photo, notes))
    assert chip_names(view) == ["photo.png", "notes.md"]
    assert view.composer.toPlainText() == ""

    drop(view.scroll.viewport(), url_mime(photo))  # the same file again: one chip
    assert chip_names(view) == ["photo.png", "notes.md"]

    picture = QImage(6, 4, QImage.Format.Format_RGB32)
    picture.fill(QColor("green"))
    QGuiApplication.clipboard().setImage(picture)
    view.composer.setFocus()
    view.composer.paste()
    assert chip_names(view) == ["photo.png", "notes.md", "Pasted image.png"]
    assert view.attachment_chips.chips()[2].attachment.detail == "6 × 4"

    qtbot.mouseClick(view.attachment_chips.chips()[1].remove_button, Qt.MouseButton.LeftButton)
    assert chip_names(view) == ["photo.png", "Pasted image.png"]


def test_a_bad_file_is_a_message_and_the_draft_stays(qtbot, make_window, vision_bridge,
                                                     files, monkeypatch, tmp_path):
    window = make_window(vision_bridge)
    view = window.conversation
    photo, _, _ = files
    choose(monkeypatch, photo)
    qtbot.mouseClick(view.attach_button, Qt.MouseButton.LeftButton)
    view.composer.setPlainText("my words")
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n not really")
    locked = tmp_path / "locked.pdf"
    locked.write_bytes(write_pdf([["secret"]], user_password="pw"))
    odd = tmp_path / "program.exe"
    odd.write_bytes(b"MZ\x00\x01")
    huge = tmp_path / "huge.txt"
    with huge.open("wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)
    choose(monkeypatch, broken, locked, odd, huge)
    qtbot.mouseClick(view.attach_button, Qt.MouseButton.LeftButton)
    note = view.composer_note.text()
    assert view.composer_note.isVisible()
    assert "broken.png:" in note and "locked.pdf: the PDF is encrypted" in note
    assert "program.exe: unknown type (.exe)" in note
    assert "huge.txt: 32.0 MiB is over the limit" in note
    assert view.composer.toPlainText() == "my words" and chip_names(view) == ["photo.png"]


def test_a_model_without_vision_greys_out_images_and_says_why(qtbot, make_window,
                                                              fake_bridge, files,
                                                              monkeypatch):
    window = make_window(fake_bridge)
    view = window.conversation
    photo, _, notes = files
    assert not view.image_button.isEnabled()
    assert "fake-model does not see images" in view.image_button.toolTip()
    assert "Documents work with every model" in view.image_button.toolTip()
    asked = choose(monkeypatch, notes)
    qtbot.mouseClick(view.attach_button, Qt.MouseButton.LeftButton)
    assert "*.png" not in asked[0][1] and chip_names(view) == ["notes.md"]

    drop(view.composer.viewport(), url_mime(photo))
    assert chip_names(view) == ["notes.md"]
    assert "photo.png: fake-model does not see images" in view.composer_note.text()
    QGuiApplication.clipboard().setImage(QImage(4, 4, QImage.Format.Format_RGB32))
    view.composer.paste()
    assert chip_names(view) == ["notes.md"]


def test_reopen_export_and_import_keep_the_attachments(qtbot, make_window, vision_bridge,
                                                       files, monkeypatch, tmp_path, store,
                                                       captured_errors):
    window = make_window(vision_bridge)
    view = window.conversation
    photo, report, _ = files
    choose(monkeypatch, photo, report)
    qtbot.mouseClick(view.attach_button, Qt.MouseButton.LeftButton)
    send(qtbot, window, "look")
    chat_id = window.controller.chat_id
    window.controller.new_chat()
    window.open_chat(chat_id)
    reopened = view.rows()[0].attachments
    assert [c.attachment.name for c in reopened.chips] == ["photo.png", "report.pdf"]
    assert not reopened.chips[0].thumb.pixmap().isNull()

    monkeypatch.setattr(chat_files, "save_file_name",
                        lambda *a: (str(tmp_path / "out" / "look.md"), chat_files.MARKDOWN_FILTER))
    (tmp_path / "out").mkdir()
    window.menus.export_chat_action.trigger()
    markdown = (tmp_path / "out" / "look.md").read_text()
    assert "![photo.png](look%20files/photo.png)" in markdown
    assert (tmp_path / "out" / "look files" / "report.pdf").read_bytes() == report.read_bytes()

    monkeypatch.setattr(chat_files, "save_file_name",
                        lambda *a: (str(tmp_path / "look.json"), chat_files.JSON_FILTER))
    window.menus.export_chat_action.trigger()
    exported = json.loads((tmp_path / "look.json").read_text())
    assert len(exported["attachments"]) == 2
    monkeypatch.setattr(chat_files, "open_file_name",
                        lambda *a: (str(tmp_path / "look.json"), ""))
    with qtbot.waitSignal(window.menus.chat_files.chatImported) as imported:
        window.menus.import_chat_action.trigger()
    assert captured_errors == []
    window.controller.delete_chat(chat_id)  # the copy keeps the files
    window.open_chat(imported.args[0])
    copy = view.rows()[0].attachments
    assert [c.attachment.name for c in copy.chips] == ["photo.png", "report.pdf"]
    assert store.attachment_data(copy.chips[0].attachment.sha256) == photo.read_bytes()


def test_an_edited_message_keeps_its_attachments(qtbot, make_window, vision_bridge, files,
                                                 monkeypatch, store):
    window = make_window(vision_bridge)
    view = window.conversation
    photo, _, _ = files
    choose(monkeypatch, photo)
    qtbot.mouseClick(view.attach_button, Qt.MouseButton.LeftButton)
    send(qtbot, window, "first words")
    first = view.rows()[0]
    with qtbot.waitSignal(window.controller.turnFinished, timeout=5000):
        first.editSubmitted.emit(first.message_id, "better words")
    messages, _ = vision_bridge.fake_workers[0].submitted[-1]
    assert messages[-1]["content"] == [{"type": "image", "image": photo.read_bytes()},
                                       {"type": "text", "text": "better words"}]
    edited = view.rows()[0]
    assert edited.branch_label.text() == "2/2"
    assert [c.attachment.name for c in edited.attachments.chips] == ["photo.png"]
