"""Attachments on screen: the composer's removable chips (a thumbnail for an image, the
name and pages for a document), a sent message's thumbnails and document chips, and the
full-size image a thumbnail opens."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QByteArray, QSize, Qt, Signal
from PySide6.QtGui import QPixmap
from PySide6.QtWidgets import (
    QDialog,
    QFrame,
    QHBoxLayout,
    QLabel,
    QScrollArea,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from desktop_app.data.attachments import IMAGE, Attachment, size_text
from desktop_app.widgets import theme

THUMB_PX = 56  # a thumbnail's longer side


def pixmap_of(data: bytes) -> QPixmap:
    pixmap = QPixmap()
    pixmap.loadFromData(QByteArray(data))
    return pixmap


def thumbnail(data: bytes, side: int = THUMB_PX) -> QPixmap:
    pixmap = pixmap_of(data)
    if pixmap.isNull():
        return pixmap
    return pixmap.scaled(QSize(side, side), Qt.AspectRatioMode.KeepAspectRatio,
                         Qt.TransformationMode.SmoothTransformation)


def chip_text(att: Attachment) -> str:
    """"report.pdf · 3 pages · 2,510 tokens · whole", else its size."""
    return f"{att.name} · {att.detail or size_text(att.size)}"


class ImageDialog(QDialog):
    """An attached image at full size (scrolled when larger than the screen allows)."""

    def __init__(self, name: str, data: bytes, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("imageDialog")
        self.setWindowTitle(name)
        self.image = QLabel()
        self.image.setObjectName("fullImage")
        self.image.setPixmap(pixmap_of(data))
        self.image.setAccessibleName(name)
        area = QScrollArea()
        area.setWidget(self.image)
        area.setAlignment(Qt.AlignmentFlag.AlignCenter)
        layout = QVBoxLayout(self)
        layout.addWidget(area)
        size = self.image.pixmap().size()
        self.resize(min(size.width() + 40, 1200), min(size.height() + 40, 900))


class AttachmentChip(QFrame):
    """One attachment: a thumbnail (an image) or its name and pages (a document), with a
    × to remove it in the composer, or, in a sent message, a click to open an image."""

    removeRequested = Signal(object)  # this chip
    opened = Signal(object)  # this chip (an image clicked)

    def __init__(self, att: Attachment, data: bytes | None, removable: bool,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("attachmentChip")
        self.attachment = att
        self.data = data
        layout = QHBoxLayout(self)
        layout.setContentsMargins(4, 2, 2, 2)
        layout.setSpacing(4)
        self.thumb = QLabel()
        self.thumb.setObjectName("attachmentThumb")
        if att.kind == IMAGE and data is not None:
            self.thumb.setPixmap(thumbnail(data))
            self.thumb.setCursor(Qt.CursorShape.PointingHandCursor)
        else:
            self.thumb.setPixmap(theme.icon("file", theme.current().muted).pixmap(18, 18))
        layout.addWidget(self.thumb)
        self.label = QLabel(chip_text(att) if att.kind != IMAGE else att.name)
        self.label.setObjectName("attachmentLabel")
        layout.addWidget(self.label)
        self.setToolTip(f"{att.name}\n{att.detail}\n{size_text(att.size)}".replace("\n\n", "\n"))
        self.setAccessibleName(f"Attached {att.name}")
        self.remove_button = QToolButton()
        self.remove_button.setText("×")
        self.remove_button.setToolTip(f"Remove {att.name}")
        self.remove_button.setAccessibleName(f"Remove {att.name}")
        self.remove_button.clicked.connect(lambda: self.removeRequested.emit(self))
        self.remove_button.setVisible(removable)
        layout.addWidget(self.remove_button)

    def mouseReleaseEvent(self, event) -> None:  # noqa: N802 - Qt override
        if self.attachment.kind == IMAGE and self.data is not None and \
                event.button() == Qt.MouseButton.LeftButton:
            self.opened.emit(self)
        super().mouseReleaseEvent(event)


class AttachmentChips(QWidget):
    """The composer's attachments, in the order they came; hidden when there are none."""

    changed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("attachmentChips")
        self._chips: list[AttachmentChip] = []
        self._layout = QHBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self._layout.addStretch(1)
        self.setVisible(False)

    def attachments(self) -> list[Attachment]:
        return [chip.attachment for chip in self._chips]

    def chips(self) -> list[AttachmentChip]:
        return list(self._chips)

    def add(self, att: Attachment) -> AttachmentChip | None:
        """Adds it, unless the same file is attached already (None then)."""
        if any(c.attachment.sha256 == att.sha256 for c in self._chips):
            return None
        chip = AttachmentChip(att, att.data, removable=True)
        chip.removeRequested.connect(self.remove)
        chip.opened.connect(lambda c: open_image(c, self))
        self._layout.insertWidget(len(self._chips), chip)
        self._chips.append(chip)
        self.setVisible(True)
        self.changed.emit()
        return chip

    def remove(self, chip: AttachmentChip) -> None:
        self._chips.remove(chip)
        self._layout.removeWidget(chip)
        chip.hide()
        chip.deleteLater()
        self.setVisible(bool(self._chips))
        self.changed.emit()

    def clear(self) -> None:
        for chip in list(self._chips):
            self.remove(chip)

    def set_locked(self, locked: bool) -> None:
        """A draft waiting for the model keeps its attachments as they are."""
        for chip in self._chips:
            chip.remove_button.setEnabled(not locked)


class AttachBar(QWidget):
    """The row above the composer: Attach (images and documents), Image (pictures only;
    greyed out, saying why, for a model that does not see images), then the chips."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("attachBar")
        self.attach_button = QToolButton()
        self.attach_button.setObjectName("attachButton")
        self.attach_button.setIcon(theme.icon("file"))
        self.attach_button.setText("Attach")
        self.attach_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.attach_button.setAccessibleName("Attach files")
        self.image_button = QToolButton()
        self.image_button.setObjectName("imageButton")
        self.image_button.setText("Image")
        self.image_button.setAccessibleName("Attach images")
        self.chips = AttachmentChips()
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(6)
        for widget in (self.attach_button, self.image_button, self.chips):
            layout.addWidget(widget)
        layout.addStretch(1)  # the buttons stay left while no chip is shown


class SentAttachments(QWidget):
    """A sent message's attachments: thumbnails (click: full size) and document chips."""

    def __init__(self, attachments: list[Attachment],
                 data_of: Callable[[str], bytes] | None, parent: QWidget | None = None
                 ) -> None:
        super().__init__(parent)
        self.setObjectName("sentAttachments")
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.chips: list[AttachmentChip] = []
        for att in attachments:
            data = None
            if att.kind == IMAGE and data_of is not None:
                try:
                    data = data_of(att.sha256)
                except KeyError:
                    data = None  # deleted under it: the name still shows
            chip = AttachmentChip(att, data, removable=False)
            chip.opened.connect(lambda c: open_image(c, self))
            layout.addWidget(chip)
            self.chips.append(chip)
        layout.addStretch(1)


def open_image(chip: AttachmentChip, parent: QWidget) -> ImageDialog:
    dialog = ImageDialog(chip.attachment.name, chip.data or b"", parent.window())
    dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    dialog.show()
    return dialog
