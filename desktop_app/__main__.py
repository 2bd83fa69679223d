"""`folio-app` / `python -m desktop_app`: open the main window and load the last model.

The model loads in the background (the window shows its progress); the last model the
user loaded comes back, or the starter model on a first run. FOLIO_DATA_DIR and
FOLIO_CONFIG_DIR move the chat database and the settings file (tests use tmp dirs).

Other modes: ``--install-desktop-entry`` puts Folio in the Linux desktop's application menu
(the XDG desktop entry and icon, for the current user) and exits; ``--check-assets``
prints where each icon was read from and exits 1 if one is missing or does not render;
``--quit-after-ms N`` closes the window N ms after it shows and the model has loaded
(smoke tests; the exit code is 1 if the model failed to load).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

# Qt is imported where it is used, so that main() can import the engine first: once
# PySide6 is imported, its import hook reads the source of every module imported after
# it (to see whether the module uses PySide), which made importing torch and the engine
# about 0.15 s slower (docs/BENCHMARKS.md, "Starting the app and `folio chat`").
if TYPE_CHECKING:
    from PySide6.QtWidgets import QApplication


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="folio-app", description="Folio: chat with local LLMs")
    parser.add_argument("--model", help="model to load instead of the last one: 'starter', "
                        "a model folder, a .gguf file or a Hugging Face repo id in the cache")
    parser.add_argument("--no-model", action="store_true", help="start without loading a model")
    parser.add_argument("--install-desktop-entry", action="store_true",
                        help="add Folio to the desktop's application menu for this user "
                        "(Linux, XDG: $XDG_DATA_HOME/applications) and exit")
    parser.add_argument("--check-assets", action="store_true",
                        help="print where each icon is read from and exit (1 if one is "
                        "missing or does not render)")
    parser.add_argument("--quit-after-ms", type=int, metavar="N",
                        help="smoke test: close the window N milliseconds after it shows "
                        "and the model has loaded; exit 1 if the model failed to load")
    return parser.parse_args(argv)


def xdg_data_home() -> Path:
    value = os.environ.get("XDG_DATA_HOME", "")
    # The spec: a relative path is invalid and is ignored.
    return Path(value) if value and os.path.isabs(value) else Path.home() / ".local/share"


def launcher_command() -> str:
    """The Exec line's command: this folio-app script when that is what runs, else this
    Python with -m desktop_app (quoted as the desktop entry spec asks)."""
    script = Path(sys.argv[0])
    if script.name == "folio-app" and script.is_file():
        parts = [str(script.absolute())]
    elif shutil.which("folio-app"):
        parts = [str(Path(shutil.which("folio-app")).absolute())]
    else:
        parts = [sys.executable, "-m", "desktop_app"]

    def quote(arg: str) -> str:
        if not any(c in arg for c in ' \t\n"\'\\><~|&;$*?#()`'):
            return arg
        escaped = "".join("\\" + c if c in '"`$\\' else c for c in arg)
        return f'"{escaped}"'

    return " ".join(quote(p) for p in parts)


def install_desktop_entry(data_home: Path | None = None) -> list[Path]:
    """Write folio.desktop and the scalable app icon under data_home (default:
    $XDG_DATA_HOME or ~/.local/share); returns the two paths."""
    from desktop_app.widgets import theme

    data_home = data_home if data_home is not None else xdg_data_home()
    entry = data_home / "applications" / "folio.desktop"
    icon = data_home / "icons" / "hicolor" / "scalable" / "apps" / "folio.svg"
    lines = theme.asset_text("folio.desktop").splitlines()
    lines = [f"Exec={launcher_command()}" if line.startswith("Exec=") else line
             for line in lines]
    for path, text in ((entry, "\n".join(lines) + "\n"), (icon, theme.asset_text("folio.svg"))):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    return [entry, icon]


def create_app(argv: list[str] | None = None, theme_choice: str = "system") -> QApplication:
    from PySide6.QtWidgets import QApplication

    from desktop_app.widgets import theme

    app = QApplication.instance() or QApplication(sys.argv[:1] + list(argv or []))
    app.setApplicationName("Folio")
    app.setOrganizationName("Folio")
    app.setDesktopFileName("folio")
    app.setWindowIcon(theme.app_icon())
    theme.apply_theme(app, theme_choice)
    return app


def build_window(store=None, settings=None, bridge=None):
    """The main window on the default store and settings (tests pass their own)."""
    from desktop_app.data.chat_store import ChatStore
    from desktop_app.data.settings import load_settings
    from desktop_app.main_window import MainWindow
    from desktop_app.services.engine_bridge import EngineBridge

    store = store if store is not None else ChatStore()
    settings = settings if settings is not None else load_settings()
    if bridge is None:
        from desktop_app.services.devices import engine_config_for
        from desktop_app.services.machine_memory import models_budget

        bridge = EngineBridge(engine_config=engine_config_for(settings.engine),
                              budget_bytes=models_budget)
    return MainWindow(store, bridge, settings)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.install_desktop_entry:
        try:
            paths = install_desktop_entry()
        except OSError as err:
            print(f"folio-app: could not install the desktop entry: {err}", file=sys.stderr)
            return 1
        for path in paths:
            print(f"installed {path}")
        return 0
    if args.check_assets:
        from desktop_app.widgets import theme

        create_app()
        results = theme.check_assets()
        try:
            for name, where, ok in results:
                print(f"{'ok' if ok else 'BROKEN'} {name} {where}", flush=True)
        except BrokenPipeError:  # `folio-app --check-assets | head`
            sys.stdout = open(os.devnull, "w")  # quiet the flush at exit
        missing = not results or not all(ok for *_, ok in results)
        return 1 if missing else 0
    from engine.startup import freeze_imports, pause_collection, resume_collection

    pause_collection()  # until the first model has loaded or failed to (engine/startup.py)
    import engine.llm  # noqa: F401, I001 - torch and the engine before Qt (see the imports)
    from PySide6.QtCore import QTimer

    from desktop_app.data.settings import load_settings
    from desktop_app.services.signal_wakeup import SignalWakeup
    from desktop_app.widgets import theme

    settings = load_settings()
    app = create_app(theme_choice=settings.theme)
    window = build_window(settings=settings)
    theme.follow_system_scheme(app, window.retheme)
    window.show()
    window.bridge.modelLoaded.connect(lambda *_: resume_collection())
    window.bridge.modelLoadFailed.connect(lambda *_: resume_collection())
    if args.no_model:
        resume_collection()
    freeze_imports()  # the window and what it imported; the model's load is not frozen
    # Ctrl+C in the terminal closes the window properly (settings saved, worker stopped).
    signal.signal(signal.SIGINT, lambda *_: window.close())
    wakeup = SignalWakeup(app)
    failed: list[str] = []
    if args.quit_after_ms is not None:
        delay = max(0, args.quit_after_ms)
        if args.no_model:
            QTimer.singleShot(delay, window.close)
        else:
            def loaded(name: str) -> None:
                logging.getLogger(__name__).info("model %s loaded: closing in %d ms", name,
                                                 delay)
                QTimer.singleShot(delay, window.close)

            def load_failed(source: str, message: str) -> None:
                failed.append(f"{source}: {message}")
                QTimer.singleShot(delay, window.close)

            window.bridge.modelLoaded.connect(loaded)
            window.bridge.modelLoadFailed.connect(load_failed)
    if not args.no_model:
        window.load_model(args.model or window.settings.last_model or "starter")
    code = app.exec()
    resume_collection()  # a window closed before its model loaded
    wakeup.close()
    window.store.close()
    if failed:
        print(f"folio-app: the model failed to load: {failed[0]}", file=sys.stderr)
        return code or 1
    return code


if __name__ == "__main__":
    sys.exit(main())
