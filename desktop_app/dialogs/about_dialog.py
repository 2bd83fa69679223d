"""Help ▸ About and Help ▸ Documentation.

About says what a bug report needs and what a newcomer asks first: the version, the model
loaded and the device it runs on, and where Folio keeps its settings and chats.
Documentation opens the README: the repository's, in a source checkout, else the copy
every installed wheel carries as its package description (written out once to the config
folder, since a browser cannot open package metadata)."""

from __future__ import annotations

import html
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QHBoxLayout, QLabel, QVBoxLayout, QWidget

from desktop_app.data.settings import config_dir
from desktop_app.services.sources import display_name
from desktop_app.widgets import theme

PACKAGE = "folio"
DOCS_FILE = "README.md"
_CHECKOUT = Path(__file__).resolve().parents[2]  # the repository, in a source checkout


@dataclass(slots=True, frozen=True)
class AboutFacts:
    version: str
    model: str
    device: str
    config_dir: Path
    chats_path: Path


def app_version() -> str:
    try:
        return metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def about_facts(bridge, store) -> AboutFacts:
    if bridge.is_loaded:
        model = display_name(bridge.source) if bridge.source else str(bridge.model_name)
        stats = bridge.memory_stats()
        if stats is not None:
            device = stats.device
        else:  # a remote model: its server's device is its own
            device = "the server's (a remote model)"
    else:
        model, device = "none loaded", "none (no model loaded)"
    return AboutFacts(app_version(), model, device, config_dir(), Path(store.path))


def about_html(facts: AboutFacts) -> str:
    rows = (("Version", facts.version), ("Model", facts.model), ("Device", facts.device),
            ("Settings", str(facts.config_dir)), ("Chats", str(facts.chats_path)))
    cells = "".join(f"<tr><td><b>{name}</b>&nbsp;&nbsp;</td><td>{html.escape(value)}</td></tr>"
                    for name, value in rows)
    return ("<h3>Folio</h3><p>A desktop chat app for local LLMs, on its own paged-attention "
            f"engine.</p><table>{cells}</table>")


def docs_path(checkout: Path = _CHECKOUT, folder: Path | None = None) -> Path | None:
    """The README to open: the checkout's, else the installed package's description
    written to `folder` (the config folder); None when neither exists."""
    readme = checkout / DOCS_FILE
    if readme.is_file():
        return readme
    try:
        meta = metadata.metadata(PACKAGE)
    except metadata.PackageNotFoundError:
        return None
    text = meta.get("Description") or meta.get_payload()
    if not text:
        return None
    out = (folder or config_dir()) / DOCS_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    return out


def open_docs(parent: QWidget | None = None) -> bool:
    """Open the README in the desktop's viewer; False (and the user is told) if none."""
    from desktop_app.dialogs import error_dialog

    path = docs_path()
    if path is None or not QDesktopServices.openUrl(QUrl.fromLocalFile(str(path))):
        error_dialog.show_error(parent, "Documentation not found",
                                "This copy of Folio carries no README, or no program here "
                                "opens it. The documentation is the README.md and the docs "
                                "folder of Folio's source.")
        return False
    return True


class AboutDialog(QDialog):
    def __init__(self, facts: AboutFacts, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("aboutDialog")
        self.setWindowTitle("About Folio")
        logo = QLabel()
        logo.setObjectName("aboutLogo")
        logo.setPixmap(theme.app_icon().pixmap(64, 64))
        logo.setAlignment(Qt.AlignmentFlag.AlignTop)
        self.text = QLabel(about_html(facts))
        self.text.setObjectName("aboutText")
        self.text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.text.setWordWrap(True)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        row = QHBoxLayout()
        row.addWidget(logo)
        row.addWidget(self.text, 1)
        layout = QVBoxLayout(self)
        layout.addLayout(row)
        layout.addWidget(buttons)
