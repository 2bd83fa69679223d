"""The main window end to end on the real engine and the starter model (loaded once)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from PySide6.QtCore import QElapsedTimer, Qt, QTimer

from desktop_app.data.chat_store import ChatStore
from desktop_app.data.settings import AppSettings, ChatSettings
from desktop_app.widgets.candidates import CandidateColumn
from desktop_app.widgets.memory_rows import memory_rows
from desktop_app.widgets.vram_panel import kv_rows

REPO = Path(__file__).resolve().parents[2]
TURN_TIMEOUT_MS = 90_000


def settings(**chat) -> AppSettings:
    defaults = dict(max_tokens=16, temperature=0.0, top_p=1.0, top_k=0, min_p=0.0,
                    repetition_penalty=1.0)
    defaults.update(chat)
    return AppSettings(chat_defaults=ChatSettings(**defaults))


def send(qtbot, window, text: str) -> None:
    """A turn, until the reply is stored and the engine has fallen idle (the memory panel
    reads its last figures then, so a test may close the store after this)."""
    window.conversation.composer.setPlainText(text)
    with qtbot.waitSignal(window.controller.turnFinished, timeout=TURN_TIMEOUT_MS):
        qtbot.mouseClick(window.conversation.send_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not window.bridge.active, timeout=10_000)


def active_branch(store, chat_id):
    return store.path_to(store.active_leaf(chat_id))


def test_reply_streams_into_the_view_and_the_store(qtbot, make_starter_bridge, make_window,
                                                   store, folio_dirs):
    bridge = make_starter_bridge()
    window = make_window(bridge, settings())
    deltas = []
    bridge.tokenArrived.connect(
        lambda rid, i, parts: deltas.append("".join(part.text for part in parts)))
    send(qtbot, window, "What is the capital of France?")
    user, reply = active_branch(store, window.controller.chat_id)
    assert (user.role, user.content) == ("user", "What is the capital of France?")
    assert reply.role == "assistant" and reply.status == "complete"
    assert len(deltas) > 1 and "".join(deltas) == reply.content  # it streamed, piece by piece
    assert "Paris" in reply.content
    assert 0 < len(reply.token_ids) <= 16
    assert reply.metrics["num_prompt_tokens"] > 0
    assert reply.model == bridge.model_name
    assert window.conversation.rows()[1].text() == reply.content
    reopened = ChatStore(folio_dirs[0] / "chats.sqlite3")
    try:
        [chat] = reopened.list_chats()
        assert chat.title == "What is the capital of France?"
        assert [m.content for m in active_branch(reopened, chat.id)] == [user.content,
                                                                         reply.content]
    finally:
        reopened.close()


def test_three_candidates_keep_the_second_across_a_restart(qtbot, make_starter_bridge,
                                                          make_window, store, folio_dirs):
    window = make_window(make_starter_bridge(),
                         settings(temperature=1.0, seed=7, max_tokens=12, num_candidates=3))
    send(qtbot, window, "Tell me a fun fact about cats.")
    columns = window.findChildren(CandidateColumn, "candidateColumn")
    texts = [c.text() for c in columns]
    assert len(columns) == 3 and all(texts)
    assert len(set(texts)) == 3  # sampling gives three different replies
    qtbot.mouseClick(columns[1].keep_button, Qt.MouseButton.LeftButton)
    kept = store.get_message(store.active_leaf(window.controller.chat_id))
    assert kept.content == texts[1] and kept.candidate_index == 1
    window.close()

    reopened = ChatStore(folio_dirs[0] / "chats.sqlite3")
    try:
        second = make_window(make_starter_bridge(), settings(max_tokens=12), store_=reopened)
        rows = second.conversation.rows()
        assert rows[-1].text() == texts[1] and rows[-1].branch_label.text() == "2/3"
        second.candidates_spin.setValue(1)
        send(qtbot, second, "And one about dogs?")
        path = active_branch(reopened, second.controller.chat_id)
        assert [m.content for m in path[:3]] == ["Tell me a fun fact about cats.", texts[1],
                                                 "And one about dogs?"]
        earlier = kept.metrics["num_prompt_tokens"] + len(kept.token_ids)
        cached = path[3].metrics["num_cached_tokens"]
        block = second.bridge.kv_stats().block_size
        # The earlier turns (prompt and the kept reply) came from the prefix cache, all
        # but the partly filled last block.
        assert cached > 0 and cached >= earlier - block
        assert path[3].metrics["num_prompt_tokens"] > earlier
    finally:
        reopened.close()


def test_regenerate_adds_alternates_and_switching_shows_that_branch(qtbot, make_starter_bridge,
                                                                    make_window, store):
    window = make_window(make_starter_bridge(), settings(temperature=0.9, seed=3,
                                                         max_tokens=10))
    send(qtbot, window, "Name a color.")
    send(qtbot, window, "Name an animal.")
    first_reply = window.conversation.rows()[1]
    original = first_reply.text()
    with qtbot.waitSignal(window.controller.turnFinished, timeout=TURN_TIMEOUT_MS):
        first_reply.regen_button.click()
    chat_id = window.controller.chat_id
    path = active_branch(store, chat_id)
    assert [m.role for m in path] == ["user", "assistant"]
    regenerated = path[1]
    # The same prompt again: found in the prefix cache but for its last token, computed
    # again for its logits.
    prompt = regenerated.metrics["num_prompt_tokens"]
    assert regenerated.metrics["num_cached_tokens"] == prompt - 1 > 0
    row = window.conversation.rows()[1]
    assert row.branch_label.text() == "2/2"
    row.prev_button.click()
    rows = window.conversation.rows()
    assert [r.text() for r in rows[:3]] == ["Name a color.", original, "Name an animal."]
    assert rows[1].branch_label.text() == "1/2" and len(rows) == 4
    rows[1].next_button.click()
    assert [r.text() for r in window.conversation.rows()] == ["Name a color.",
                                                             regenerated.content]


def test_stop_keeps_the_partial_reply_and_frees_its_blocks(qtbot, make_starter_bridge,
                                                           make_window, store):
    bridge = make_starter_bridge()
    window = make_window(bridge, settings(max_tokens=400))
    qtbot.waitUntil(lambda: bridge.kv_stats().num_used == 0, timeout=5000)
    window.conversation.composer.setPlainText("Write a long story about a lighthouse keeper.")
    window.conversation.send_button.click()
    [stream] = window.controller.current.streams.values()
    qtbot.waitUntil(lambda: len(stream.texts[0]) > 20, timeout=TURN_TIMEOUT_MS)
    # The worker refreshes its KV figures every STATS_INTERVAL_S: the first tokens can
    # arrive before a snapshot that shows the reply's blocks.
    qtbot.waitUntil(lambda: bridge.kv_stats().num_used > 0, timeout=5000)
    with qtbot.waitSignal(window.controller.turnFinished, timeout=TURN_TIMEOUT_MS):
        qtbot.keyClick(window, Qt.Key.Key_Escape)
    reply = store.get_message(stream.message_ids[0])
    assert reply.metrics["finish_reason"] == "abort"
    assert reply.content and reply.content.startswith(stream.texts[0][:20])
    assert 0 < len(reply.token_ids) < 400
    assert window.conversation.rows()[-1].text() == reply.content
    qtbot.waitUntil(lambda: bridge.kv_stats().num_used == 0, timeout=5000)


def test_vram_panel_shows_the_snapshot(qtbot, make_starter_bridge, make_window):
    bridge = make_starter_bridge()
    window = make_window(bridge, settings(max_tokens=8))
    send(qtbot, window, "Hello!")
    qtbot.waitUntil(lambda: bridge.kv_stats().num_used == 0, timeout=5000)
    window.vram_panel.refresh()
    kv, mem = bridge.kv_stats(), bridge.memory_stats()  # idle: the same snapshot
    panel = window.vram_panel
    assert panel.value("blocks_used") == f"0 / {kv.num_blocks}" == "0 / 384"
    assert panel.value("blocks_cached") == str(kv.num_cached) and kv.num_cached > 0
    assert panel.value("blocks_free") == str(kv.num_free) == "384"
    for key, text in {**kv_rows(kv), **memory_rows(mem)}.items():
        assert panel.value(key) == text
    # The resolved label and the kernel path (engine/runner/device.py, status_line).
    assert panel.value("device") == mem.device and mem.device.startswith("CPU, ")
    assert len(panel.block_map.blocks) == kv.num_blocks
    assert sum(b.state == "cached" for b in panel.block_map.blocks) == kv.num_cached


def test_corrupt_model_folder_shows_error_and_keeps_the_model(qtbot, make_starter_bridge,
                                                              make_window, tmp_path,
                                                              captured_errors, store):
    bridge = make_starter_bridge()
    window = make_window(bridge, settings(max_tokens=6))
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "llama", "hidden_size": ')
    with qtbot.waitSignal(bridge.modelLoadFailed, timeout=30000):
        window.load_model(str(broken))
    [(title, text)] = captured_errors
    assert title == "Could not load the model"
    assert text.startswith("broken-model did not load:")
    assert "Folio keeps using" in text
    assert bridge.is_loaded and bridge.source == "starter"
    assert window.model_picker.currentData() == "starter"
    send(qtbot, window, "Still there?")
    assert active_branch(store, window.controller.chat_id)[-1].content


def test_event_loop_stays_responsive_while_streaming(qtbot, make_starter_bridge, make_window):
    # A reply that outlasts many of the timer's periods: the starter on the native kernels
    # streams 24 tokens in about 200 ms, and its greedy count to twenty ends after 18; its
    # dragon story runs to the 96-token cap.
    window = make_window(make_starter_bridge(), settings(max_tokens=96))
    ticks: list[int] = []
    clock = QElapsedTimer()
    clock.start()
    timer = QTimer()
    timer.setTimerType(Qt.TimerType.PreciseTimer)
    timer.timeout.connect(lambda: ticks.append(clock.elapsed()))
    timer.start(50)
    send(qtbot, window, "Write a long story about a dragon.")
    timer.stop()
    gaps = [b - a for a, b in zip(ticks, ticks[1:], strict=False)]
    assert len(gaps) >= 5
    assert max(gaps) <= 150, f"a 50 ms timer fired {max(gaps) - 50} ms late"


def test_screenshot_of_three_candidates_and_the_vram_panel(qtbot, make_starter_bridge,
                                                           make_window):
    """Saves main_window_streaming.png (mid-stream: shared prompt blocks in the block map)
    and main_window_3_candidates.png (finished) for people to look at."""
    bridge = make_starter_bridge()
    window = make_window(bridge, settings(temperature=0.8, seed=11, max_tokens=24,
                                          num_candidates=3))
    window.resize(1400, 860)
    window.vram_action.trigger()  # the dock starts closed on a first run
    out = Path(os.environ.get("FOLIO_SCREENSHOT_DIR") or REPO / "test-artifacts")
    out.mkdir(parents=True, exist_ok=True)
    window.conversation.composer.setPlainText(
        "Suggest a name for a **paged** KV cache, with a `code` example.")
    with qtbot.waitSignal(window.controller.turnFinished, timeout=TURN_TIMEOUT_MS):
        window.conversation.send_button.click()
        [stream] = window.controller.current.streams.values()
        qtbot.waitUntil(lambda: all(len(t) >= 8 for t in stream.texts),
                        timeout=TURN_TIMEOUT_MS)
        window.vram_panel.refresh()
        streaming_kv = window.vram_panel.last_kv
        shots = {"main_window_streaming.png": _grab(window)}
    window.vram_panel.refresh()
    shots["main_window_3_candidates.png"] = _grab(window)
    if streaming_kv.num_used:  # caught before the three finished
        assert window.vram_panel.block_map.blocks != streaming_kv.blocks
    for name, image in shots.items():
        path = out / name
        assert image.save(str(path))
        assert path.stat().st_size > 10_000
        assert path.stat().st_mtime > time.time() - 120
    assert len(window.findChildren(CandidateColumn, "candidateColumn")) == 3


def _grab(window):
    for column in window.findChildren(CandidateColumn, "candidateColumn"):
        column.body.flush()
    return window.grab()


def test_prompt_longer_than_the_context_is_explained_and_the_chat_kept(
        qtbot, make_starter_bridge, make_window, store, captured_errors):
    window = make_window(make_starter_bridge(), settings(max_tokens=6))
    long_text = "word " * 2100  # more tokens than the 2048-token context
    window.conversation.composer.setPlainText(long_text)
    submitted = []
    real_submit = window.bridge.worker.submit
    window.bridge.worker.submit = lambda *a: submitted.append(a) or real_submit(*a)
    window.conversation.send_button.click()
    qtbot.waitUntil(lambda: captured_errors != [], timeout=TURN_TIMEOUT_MS)
    [(title, text)] = captured_errors
    # Measured before sending: refused up front, nothing stored, the draft kept to shorten.
    assert title == "Context full"
    assert "context holds 2,048" in text and "Shorten the message" in text
    assert submitted == []
    assert store.active_leaf(window.controller.chat_id) is None
    assert window.conversation.composer.toPlainText() == long_text
    assert not window.controller.generating
    window.conversation.composer.setPlainText("Short one.")
    with qtbot.waitSignal(window.controller.turnFinished, timeout=TURN_TIMEOUT_MS):
        window.conversation.send_button.click()
    path = active_branch(store, window.controller.chat_id)
    assert [m.role for m in path] == ["user", "assistant"]
    assert path[0].content == "Short one." and path[1].content
