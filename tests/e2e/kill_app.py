"""The real app, offscreen, driven to stream a long reply until the test SIGKILLs it.

Run as a subprocess by test_app_e2e.py with FOLIO_DATA_DIR / FOLIO_CONFIG_DIR set to tmp
dirs. It loads the starter model through the normal bridge, finishes one short turn, then
starts a long one. It prints one JSON line per milestone (flushed) so the test knows what
was finished before the kill.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from desktop_app.__main__ import build_window, create_app  # noqa: E402
from desktop_app.data.settings import AppSettings, ChatSettings  # noqa: E402
from engine import EngineConfig  # noqa: E402

SHORT = "Say hello in three words."
LONG = "Count from 1 to 300, writing each number in words."


def report(**fields) -> None:
    print(json.dumps(fields), flush=True)


def main() -> int:
    app = create_app()
    from desktop_app.services.engine_bridge import EngineBridge

    bridge = EngineBridge(engine_config=EngineConfig(num_gpu_blocks=256, max_model_len=2048))
    settings = AppSettings(chat_defaults=ChatSettings(temperature=0.0, max_tokens=4))
    window = build_window(settings=settings, bridge=bridge)
    window._persist = lambda s: None  # keep the test's config dir untouched
    window.show()
    controller = window.controller
    turns = iter([(SHORT, 4), (LONG, 1500)])

    def next_turn() -> None:
        text, max_tokens = next(turns)
        if controller.chat_id is not None:
            chat = window.store.get_chat(controller.chat_id)
            chat.settings.max_tokens = max_tokens
            window.store.update_chat_settings(chat.id, chat.settings)
        else:
            settings.chat_defaults.max_tokens = max_tokens
        controller.send(text)
        report(event="sent", text=text)

    def on_finished(chat_id: int) -> None:
        leaf = window.store.get_message(window.store.active_leaf(chat_id))
        report(event="finished", message_id=leaf.id, content=leaf.content)
        next_turn()

    controller.turnFinished.connect(on_finished)
    bridge.modelLoaded.connect(lambda name: (report(event="loaded", model=name), next_turn()))
    bridge.modelLoadFailed.connect(lambda src, msg: (report(event="load_failed", message=msg),
                                                     app.exit(1)))
    window.load_model("starter")
    return app.exec()


if __name__ == "__main__":
    sys.exit(main())
