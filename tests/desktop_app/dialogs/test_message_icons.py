"""Error, information and question boxes carry Folio's own icons, not the style's stock
pixmaps."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QMessageBox, QStyle

from desktop_app.dialogs.error_dialog import show_error as real_show_error  # before patching
from desktop_app.widgets import chat_list, message_box, theme


def same_image(a, b) -> bool:
    return a.toImage().convertToFormat(b.toImage().format()) == b.toImage()


def test_an_error_box_carries_the_apps_warning_icon(qtbot, qapp):
    theme.apply_theme(qapp, "light")
    box = real_show_error(None, "Could not load the model", "The file is damaged.")
    qtbot.addWidget(box)
    try:
        assert box.objectName() == "errorDialog" and box.isVisible()
        assert box.icon() == QMessageBox.Icon.NoIcon  # no stock icon
        ours = theme.icon("warning", theme.current().error).pixmap(message_box.ICON_PX,
                                                                   message_box.ICON_PX)
        assert same_image(box.iconPixmap(), ours)
        stock = qapp.style().standardIcon(QStyle.StandardPixmap.SP_MessageBoxWarning)
        assert not same_image(box.iconPixmap(), stock.pixmap(box.iconPixmap().size()))
        assert not box.windowIcon().isNull()
        assert box.text() == "The file is damaged."
    finally:
        box.close()


@pytest.mark.parametrize("kind, asset", [(message_box.INFO, "info"),
                                         (message_box.QUESTION, "help")])
def test_info_and_question_boxes_use_their_own_icons(qtbot, qapp, kind, asset):
    box = message_box.message_box(None, kind, "Title", "Text")
    qtbot.addWidget(box)
    ours = theme.icon(asset, theme.current().accent).pixmap(message_box.ICON_PX,
                                                           message_box.ICON_PX)
    assert same_image(box.iconPixmap(), ours) and box.property("folioIcon") == kind


def test_an_unknown_kind_is_refused(qapp):
    with pytest.raises(ValueError, match="kind must be one of warning, info, question"):
        message_box.message_box(None, "panic", "t", "x")


@pytest.mark.parametrize("button, answer", [(QMessageBox.StandardButton.Yes, True),
                                            (QMessageBox.StandardButton.No, False)])
def test_the_delete_confirmation_asks_with_the_question_icon(qtbot, qapp, button, answer):
    seen = {}

    def click() -> None:
        box = QApplication.activeModalWidget()
        seen["icon"] = box.property("folioIcon")
        seen["default"] = box.defaultButton() is box.button(QMessageBox.StandardButton.No)
        box.button(button).click()

    QTimer.singleShot(0, click)
    assert chat_list.confirm(None, "Delete chat", "Delete it?") is answer
    assert seen == {"icon": message_box.QUESTION, "default": True}
