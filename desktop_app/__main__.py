"""`folio-app` / `python -m desktop_app`: open the main window and load the last model.

The model loads in the background (the window shows its progress); the last model the
user loaded comes back, or the starter model on a first run. FOLIO_DATA_DIR and
FOLIO_CONFIG_DIR move the chat database and the settings file (tests use tmp dirs).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

from desktop_app.widgets import theme


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="folio-app", description="Folio: chat with local LLMs")
    parser.add_argument("--model", help="model to load instead of the last one: 'starter', "
                        "a model folder, a .gguf file or a Hugging Face repo id in the cache")
    parser.add_argument("--no-model", action="store_true", help="start without loading a model")
    return parser.parse_args(argv)


def create_app(argv: list[str] | None = None) -> QApplication:
    app = QApplication.instance() or QApplication(sys.argv[:1] + list(argv or []))
    app.setApplicationName("Folio")
    app.setOrganizationName("Folio")
    app.setDesktopFileName("folio")
    app.setWindowIcon(theme.app_icon())
    theme.apply_theme(app)
    return app


def build_window(store=None, settings=None, bridge=None):
    """The main window on the default store and settings (tests pass their own)."""
    from desktop_app.data.chat_store import ChatStore
    from desktop_app.data.settings import load_settings
    from desktop_app.main_window import MainWindow
    from desktop_app.services.engine_bridge import EngineBridge

    store = store if store is not None else ChatStore()
    settings = settings if settings is not None else load_settings()
    bridge = bridge if bridge is not None else EngineBridge()
    return MainWindow(store, bridge, settings)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    app = create_app()
    window = build_window()
    theme.follow_system_scheme(app, window.retheme)
    window.show()
    # Ctrl+C in the terminal closes the window properly (settings saved, worker stopped).
    # Python runs signal handlers only between bytecodes, so wake it up now and then.
    signal.signal(signal.SIGINT, lambda *_: window.close())
    wake = QTimer()
    wake.timeout.connect(lambda: None)
    wake.start(250)
    if not args.no_model:
        window.load_model(args.model or window.settings.last_model or "starter")
    code = app.exec()
    window.store.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
