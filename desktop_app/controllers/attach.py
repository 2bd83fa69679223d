"""The composer's attachments: the Attach and Image buttons' file dialogs, what is
dropped on the chat or pasted (widgets.drops sorts it), each file read and checked once
(data.attachments) into a removable chip, and each refusal on the composer note in plain
words: a corrupt image, an encrypted PDF, a file over the limit, an unknown type, an image
for a model that does not see images. The draft's text and its other attachments stay.

Whether images may be attached follows the picker's model (``EngineBridge.sees_images``):
a local model without a vision encoder greys out the Image button and says why in its
tooltip; a server's model is let through (its server answers for it); documents work
with every model. Tests replace ``open_file_names`` instead of showing the dialog.
"""

from __future__ import annotations

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QFileDialog, QWidget

from desktop_app.data.attachments import (
    AttachmentError,
    dialog_filter,
    image_filter,
    is_image_name,
    read_attachment,
    read_file,
)
from desktop_app.services.sources import display_name
from desktop_app.widgets import drops
from desktop_app.widgets.composer import NOTICE_MS
from desktop_app.widgets.conversation_view import ConversationView

PASTED_IMAGE = "Pasted image.png"
IMAGES_TIP = "Attach images (PNG, JPEG, WebP, GIF): the model reads them"


def open_file_names(parent: QWidget | None, title: str, filters: str) -> list[str]:
    """The files chosen; [] when cancelled."""
    return QFileDialog.getOpenFileNames(parent, title, "", filters)[0]


def no_images_reason(model: str | None) -> str:
    if not model:
        return "Load a model that sees images to attach pictures (documents work with any)"
    return (f"{model} does not see images: load a model marked \"sees images\" in the "
            "Models dialog (SmolVLM) to attach pictures. Documents work with every model.")


class AttachControls(QObject):
    def __init__(self, bridge, view: ConversationView, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.bridge, self.view = bridge, view
        view.attach_button.clicked.connect(self.choose_files)
        view.image_button.clicked.connect(self.choose_images)
        view.attachmentsOffered.connect(self.offer)
        for signal in (bridge.modelLoaded, bridge.modelUnloaded):
            signal.connect(lambda *_: self.update())
        self.update()

    @property
    def images_allowed(self) -> bool:
        return self.bridge.sees_images is not False

    def reason(self) -> str:
        """Why images cannot be attached now ("" when they can)."""
        if self.images_allowed:
            return ""
        return no_images_reason(display_name(self.bridge.model_name)
                                if self.bridge.model_name else None)

    def update(self) -> None:
        allowed = self.images_allowed
        self.view.set_images_allowed(allowed, IMAGES_TIP if allowed else self.reason())
        self.view.attach_button.setToolTip(
            "Attach documents (PDF, DOCX, Markdown, HTML, text, code)"
            + (" or images" if allowed else f".\n{self.reason()}"))

    def choose_files(self) -> None:
        filters = dialog_filter(images=self.images_allowed)
        self.attach_paths(open_file_names(self.view, "Attach files", filters))

    def choose_images(self) -> None:
        if self.images_allowed:
            self.attach_paths(open_file_names(self.view, "Attach images", image_filter()))

    def offer(self, dropped: drops.Dropped) -> None:
        """A drop or paste: its files, and a copied picture's pixels."""
        problems = self._attach([*dropped.images, *dropped.files])
        if dropped.image_data:
            if not self.images_allowed:
                problems.append(self.reason())
            elif not dropped.image_png:
                problems.append("The copied picture could not be read.")
            else:
                problems += self._add(lambda: read_attachment(PASTED_IMAGE, dropped.image_png))
        self._tell(problems)

    def attach_paths(self, paths: list[str]) -> None:
        self._tell(self._attach(paths))

    def _attach(self, paths: list[str]) -> list[str]:
        problems: list[str] = []
        refused_images = []
        for path in paths:
            if is_image_name(path) and not self.images_allowed:
                refused_images.append(path.rsplit("/", 1)[-1])
                continue
            problems += self._add(lambda p=path: read_file(p))
        if refused_images:
            problems.insert(0, f"{', '.join(refused_images)}: {self.reason()}")
        return problems

    def _add(self, read) -> list[str]:
        try:
            attachment = read()
        except AttachmentError as exc:
            return [str(exc)]
        self.view.attachment_chips.add(attachment)
        return []

    def _tell(self, problems: list[str]) -> None:
        if problems:
            self.view.composer_note.show_note("\n".join(problems), NOTICE_MS)
        self.view.composer.setFocus()
