"""Drops and pastes through the real window: files and images never become a file://
path in the composer (they are attached, or the note says in plain words why not: here a
model that does not see images, and a file of no known type), and text still goes in as
text (folded when long). tests/desktop_app/test_attachments_window.py attaches them."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QMimeData, QPoint, QPointF, Qt, QUrl
from PySide6.QtGui import QColor, QDragEnterEvent, QDropEvent, QGuiApplication, QImage
from PySide6.QtWidgets import QApplication

from desktop_app.widgets.drops import Dropped

IMAGES_NOTE = "fake-model does not see images"
FILES_NOTE = "unknown type (.bin)"


@pytest.fixture
def files(tmp_path):
    image = tmp_path / "photo.png"
    picture = QImage(8, 8, QImage.Format.Format_RGB32)
    picture.fill(QColor("red"))
    picture.save(str(image))
    text = tmp_path / "blob.bin"
    text.write_bytes(b"\x00\x01binary")
    return image, text


def url_mime(*paths) -> QMimeData:
    """What a file manager offers: file URLs (text/uri-list) and the paths as text."""
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    mime.setText("\n".join(QUrl.fromLocalFile(str(p)).toString() for p in paths))
    return mime


def drop(target, mime: QMimeData) -> None:
    """Drag `mime` over `target` and drop it, as the platform would."""
    at = target.rect().center()
    enter = QDragEnterEvent(at, Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                            Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(target, enter)
    assert enter.isAccepted()
    event = QDropEvent(QPointF(QPoint(at)), Qt.DropAction.CopyAction, mime,
                       Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(target, event)


@pytest.fixture
def window(make_window, fake_bridge):
    return make_window(fake_bridge)


def offered(window) -> list[Dropped]:
    got: list[Dropped] = []
    window.conversation.attachmentsOffered.connect(got.append)
    return got


@pytest.mark.parametrize("where", ["composer", "chat"])
def test_dropped_files_are_not_inserted_and_the_notice_says_why(window, files, where):
    view = window.conversation
    target = view.composer.viewport() if where == "composer" else view.scroll.viewport()
    image, text = files
    got = offered(window)

    drop(target, url_mime(image))
    assert view.composer.toPlainText() == ""
    assert view.composer_note.isVisible() and IMAGES_NOTE in view.composer_note.text()
    assert "photo.png" in view.composer_note.text()

    drop(target, url_mime(text))
    assert view.composer.toPlainText() == ""
    assert FILES_NOTE in view.composer_note.text() and "blob.bin" in view.composer_note.text()
    assert got == [Dropped(images=(str(image),)), Dropped(files=(str(text),))]
    assert view.attachments() == []

    pixels = QMimeData()
    pixels.setImageData(QImage(4, 4, QImage.Format.Format_RGB32))
    drop(target, pixels)
    assert view.composer.toPlainText() == "" and IMAGES_NOTE in view.composer_note.text()
    assert got[-1].image_data and got[-1].image_png.startswith(b"\x89PNG")


def test_dropped_text_on_the_chat_goes_into_the_composer(window):
    view = window.conversation
    mime = QMimeData()
    mime.setText("a quoted line")
    drop(view.scroll.viewport(), mime)
    assert view.composer.toPlainText() == "a quoted line"
    assert not view.composer_note.isVisible()


def test_pasting_a_copied_file_or_image_inserts_no_path(window, files):
    view = window.conversation
    image, text = files
    clipboard = QGuiApplication.clipboard()
    view.composer.setFocus()

    clipboard.setMimeData(url_mime(image, text))  # a file manager's copy of two files
    view.composer.paste()
    assert view.composer.toPlainText() == ""
    notice = view.composer_note.text()
    assert IMAGES_NOTE in notice and FILES_NOTE in notice

    only_text = QMimeData()  # some file managers put nothing but the address as text
    only_text.setText(QUrl.fromLocalFile(str(text)).toString())
    clipboard.setMimeData(only_text)
    view.composer.paste()
    assert view.composer.toPlainText() == ""

    view.composer_note.dismiss()
    clipboard.setImage(QImage(4, 4, QImage.Format.Format_RGB32))  # a copied picture
    view.composer.paste()
    assert view.composer.toPlainText() == "" and IMAGES_NOTE in view.composer_note.text()

    clipboard.setText("plain words, and https://example.com/page")
    view.composer.paste()
    assert view.composer.toPlainText() == "plain words, and https://example.com/page"
    view.clear_composer()  # sending or clearing the draft ends the notice
    assert not view.composer_note.isVisible()
