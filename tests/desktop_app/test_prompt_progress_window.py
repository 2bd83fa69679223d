"""The reply's "Reading your message…" line in the real window: fed chunk by chunk by a
tiny real model that reads a long prompt in many steps, gone at the first token; from a
model that reports no progress (as a remote server), the words and the time only."""

from __future__ import annotations

import re
import time

import pytest
from PySide6.QtCore import Qt

from desktop_app.data.settings import AppSettings, ChatSettings
from desktop_app.services.engine_bridge import EngineBridge
from desktop_app.widgets.candidates import CandidateColumn
from desktop_app.widgets.prompt_progress import PromptProgressLine

CHUNK = 32
LONG = " ".join(f"line {i}: the quick brown fox jumps over the lazy dog." for i in range(16))
READING = re.compile(r"^Reading your message… (\d+)% · ([\d,]+) of ([\d,]+) tokens")


def settings(**chat) -> AppSettings:
    base = dict(max_tokens=4, temperature=0.0, top_p=1.0, top_k=0, min_p=0.0,
                repetition_penalty=1.0)
    return AppSettings(chat_defaults=ChatSettings(**{**base, **chat}))


@pytest.fixture
def chunked_bridge(qtbot, tiny_model_path):
    """A tiny real model that reads a prompt CHUNK tokens a step."""
    from engine import LLM

    bridge = EngineBridge(llm_factory=lambda source, config=None, progress=None: LLM(
        str(tiny_model_path), num_gpu_blocks=128, max_model_len=1024,
        max_num_batched_tokens=CHUNK))
    with qtbot.waitSignal(bridge.modelLoaded, timeout=60000):
        bridge.load_model("tiny")
    yield bridge
    bridge.shutdown()


def lines_shown(window) -> list[PromptProgressLine]:
    return [line for line in window.findChildren(PromptProgressLine)
            if not line.isHidden()]


def test_a_long_prompt_shows_its_reading_until_the_first_token(qtbot, chunked_bridge,
                                                               make_window):
    window = make_window(chunked_bridge, settings())
    seen: list[tuple[str, str]] = []  # (what happened, the reply's lines then)

    def note(kind: str) -> None:
        seen.append((kind, " | ".join(line.text() for line in lines_shown(window))))

    # Connected after the window's controller: each note sees what it made of the event.
    chunked_bridge.promptProgress.connect(lambda *_: note("progress"))
    chunked_bridge.tokenArrived.connect(lambda *_: note("token"))
    window.conversation.composer.setPlainText(LONG)
    with qtbot.waitSignal(window.controller.turnFinished, timeout=60_000):
        qtbot.mouseClick(window.conversation.send_button, Qt.MouseButton.LeftButton)

    first_token = next(i for i, (kind, _) in enumerate(seen) if kind == "token")
    progress = seen[:first_token]
    assert len(progress) >= len(LONG) // CHUNK  # a line per chunk of the prompt
    assert all(kind == "progress" for kind, _ in progress)
    shares, dones = [], []
    for _, text in progress:
        match = READING.match(text)
        assert match, text
        shares.append(int(match[1]))
        dones.append(int(match[2].replace(",", "")))
        assert int(match[3].replace(",", "")) > len(LONG)  # the whole prompt, template too
    assert dones == sorted(dones) and len(set(dones)) == len(dones)
    assert shares[0] < 50 and shares[-1] == 100
    # The first token takes the line away; nothing shows it once the reply is in.
    assert all(text == "" for kind, text in seen[first_token:])
    assert lines_shown(window) == []
    reply = window.conversation.rows()[-1]
    assert reply.text() and reply.prompt_progress.isHidden()


def test_without_progress_events_the_line_shows_the_time_and_survives_a_redraw(
        qtbot, fake_bridge, make_window):
    """The fake engine, as a remote server, says nothing while it reads: the line has
    words and a clock; three candidates show it in each column; opening another chat and
    coming back draws it again."""
    worker = fake_bridge.fake_workers[0]
    worker.gate.clear()  # no token until the test says so
    window = make_window(fake_bridge, settings(num_candidates=3))
    window.conversation.composer.setPlainText("Hello there")
    qtbot.mouseClick(window.conversation.send_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: len(lines_shown(window)) == 3, timeout=5000)
    assert all(isinstance(line.parentWidget(), CandidateColumn) for line in lines_shown(window))
    assert {line.text() for line in lines_shown(window)} == {"Reading your message…"}
    chat_id = window.controller.chat_id
    stream = next(iter(window.controller.current.streams.values()))
    stream.sent_at = time.monotonic() - 174  # as if the server had read for minutes
    window.controller.new_chat()
    assert lines_shown(window) == []
    window.controller.open_chat(chat_id)
    assert [line.text() for line in lines_shown(window)] == [
        "Reading your message… · 2 min 54 s"] * 3
    with qtbot.waitSignal(window.controller.turnFinished, timeout=10_000):
        worker.gate.set()
    assert lines_shown(window) == []
    assert all(c.text() for c in window.findChildren(CandidateColumn))
