"""The Memory dock's cost on the GUI thread while a reply streams: the real window
offscreen on the starter model, a reply of up to --tokens tokens streamed with the dock
open and with it closed (alternating), the GUI thread's CPU seconds per wall second.

Runs the checkout it is started from (its desktop_app and engine come first on the path),
so the same script measures another checkout's code too:

    cd <checkout> && QT_QPA_PLATFORM=offscreen .venv/bin/python \\
        <this checkout>/scripts/bench_dock_cost.py --runs 3 --tokens 300

The window, the store and the settings are temporary (FOLIO_DATA_DIR, FOLIO_CONFIG_DIR
point to a temporary folder). The dock's cost is the open runs' figure less the closed
runs': both stream and draw the same reply.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

PROMPT = "Write a long story about a dragon who learns to cook, with many details."


def _wait(app, done, timeout_s: float) -> None:
    """Run the event loop, as the app does, until `done()` (checked every 50 ms)."""
    from PySide6.QtCore import QEventLoop, QTimer

    end = time.monotonic() + timeout_s
    loop, timer = QEventLoop(), QTimer()
    timer.timeout.connect(lambda: loop.quit() if done() or time.monotonic() > end else None)
    timer.start(50)
    loop.exec()
    timer.stop()
    if not done():
        raise TimeoutError("the reply did not finish in time")


def _turn(app, window, dock_open: bool) -> tuple[float, float, int]:
    """One reply in a new chat: (GUI thread CPU seconds, wall seconds, tokens)."""
    window.new_chat()
    window.vram_dock.setVisible(dock_open)
    settle = time.monotonic() + 0.3
    _wait(app, lambda: time.monotonic() > settle, 5)
    finished: list[int] = []
    window.controller.turnFinished.connect(finished.append)
    window.conversation.composer.setPlainText(PROMPT)
    cpu0, wall0 = time.thread_time(), time.perf_counter()
    window.conversation.send_button.click()
    _wait(app, lambda: bool(finished) and not window.bridge.active, 300)
    cpu, wall = time.thread_time() - cpu0, time.perf_counter() - wall0
    window.controller.turnFinished.disconnect(finished.append)
    store = window.store
    reply = store.get_message(store.active_leaf(window.controller.chat_id))
    return cpu, wall, int(reply.metrics.get("num_generated_tokens") or 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="replies per side")
    parser.add_argument("--tokens", type=int, default=300, help="max tokens of a reply")
    parser.add_argument("--screenshot", help="save the first screen (a first run's window, "
                        "the model loaded, no chat) to this PNG file first")
    args = parser.parse_args()
    sys.path.insert(0, os.getcwd())
    tmp = tempfile.mkdtemp(prefix="folio-dock-bench-")
    os.environ.update(FOLIO_DATA_DIR=os.path.join(tmp, "data"),
                      FOLIO_CONFIG_DIR=os.path.join(tmp, "config"), FOLIO_THEME="light")
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

    from PySide6.QtWidgets import QApplication

    from desktop_app.data.chat_store import ChatStore
    from desktop_app.data.settings import AppSettings, ChatSettings
    from desktop_app.main_window import MainWindow
    from desktop_app.services.engine_bridge import EngineBridge
    from desktop_app.widgets import theme
    from engine import LLM

    app = QApplication.instance() or QApplication([])
    theme.apply_theme(app)
    settings = AppSettings(chat_defaults=ChatSettings(
        max_tokens=args.tokens, temperature=0.7, top_p=1.0, top_k=0, min_p=0.0, seed=3,
        repetition_penalty=1.1))
    llm = LLM("starter", config=settings.engine.to_engine_config())
    bridge = EngineBridge(llm_factory=lambda source, config=None, progress=None: llm)
    loaded: list[str] = []
    bridge.modelLoaded.connect(loaded.append)
    bridge.load_model("starter")
    _wait(app, lambda: bool(loaded), 120)
    window = MainWindow(ChatStore(), bridge, settings, persist=lambda _settings: None)
    window.resize(1600, 1000)
    window.show()
    settle = time.monotonic() + 0.5
    _wait(app, lambda: time.monotonic() > settle, 5)
    if args.screenshot:
        window.grab().save(args.screenshot)
        print(f"first screen saved to {args.screenshot}", flush=True)
    if args.runs < 1:
        window.close()
        return
    print(f"checkout: {os.getcwd()}  model: {bridge.model_name}  "
          f"pool: {bridge.kv_stats().num_blocks} blocks", flush=True)
    _turn(app, window, False)  # warm: the first reply pays for first-time work
    results: dict[bool, list[tuple[float, float, int]]] = {True: [], False: []}
    for _ in range(args.runs):
        for dock_open in (True, False):
            cpu, wall, tokens = _turn(app, window, dock_open)
            results[dock_open].append((cpu, wall, tokens))
            print(f"dock {'open  ' if dock_open else 'closed'}: {tokens} tokens in "
                  f"{wall:.2f} s, GUI thread {cpu:.3f} s CPU = "
                  f"{100 * cpu / wall:.1f}% of a core", flush=True)
    share = {side: statistics.median(cpu / wall for cpu, wall, _ in runs)
             for side, runs in results.items()}
    # Per token too: a GUI thread that holds the GIL longer also slows the engine's
    # thread, which stretches the wall time a share is taken of.
    per_token = {side: statistics.median(1000 * cpu / max(1, n) for cpu, _, n in runs)
                 for side, runs in results.items()}
    print(f"median GUI-thread CPU per wall second: dock open {100 * share[True]:.1f}%, "
          f"closed {100 * share[False]:.1f}%; the dock costs "
          f"{100 * (share[True] - share[False]):.1f}% of one core; per token "
          f"{per_token[True]:.2f} ms open, {per_token[False]:.2f} ms closed", flush=True)
    window.close()


if __name__ == "__main__":
    main()
