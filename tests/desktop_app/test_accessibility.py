"""Screen readers get a name for each key widget (found by objectName)."""

from __future__ import annotations

from PySide6.QtWidgets import QWidget

from desktop_app.widgets.candidates import CandidateColumn

NAMED = {"composer": "Message to the model", "sendButton": "Send the message",
         "vramPanel": "Memory panel", "chatList": "Chats", "modelPicker": "Model"}


def test_key_widgets_have_accessible_names(make_window, fake_bridge):
    window = make_window(fake_bridge)
    for object_name, expected in NAMED.items():
        found = [w for w in window.findChildren(QWidget, object_name) if w.accessibleName()]
        assert [w.accessibleName() for w in found][:1] == [expected], object_name


def test_candidate_columns_are_numbered(qtbot):
    column = CandidateColumn(7, 1, "text")
    qtbot.addWidget(column)
    assert (column.objectName(), column.accessibleName()) == ("candidateColumn", "Candidate 2")
