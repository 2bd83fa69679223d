"""The main window with three candidates, one holding a highlighted code block, saved as
test-artifacts/main_window_3_candidates_code[_dark].png for people to look at."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from pygments.styles import get_style_by_name
from pygments.token import Keyword
from PySide6.QtGui import QColor

from desktop_app.data.settings import AppSettings, ChatSettings
from desktop_app.widgets import theme
from desktop_app.widgets.candidates import CandidateColumn
from desktop_app.widgets.code_block import style_name
from tests.desktop_app.widgets.test_candidates import _assert_whole, _settle

REPO = Path(__file__).resolve().parents[3]

REPLIES = [
    "A **paged** KV cache splits each sequence's keys and values into fixed-size blocks, "
    "like pages of virtual memory. Candidates share the prompt's blocks and copy only "
    "the last one when they write to it.",
    "Call it `PagedKVCache`:\n\n```python\nclass PagedKVCache:\n    \"\"\"Keys and values in "
    "blocks of 16 tokens, shared copy-on-write.\"\"\"\n\n    def __init__(self, num_blocks: int,"
    " block_size: int = 16) -> None:\n        self.free = list(range(num_blocks))\n"
    "        self.block_size = block_size\n\n    def allocate(self) -> int:\n"
    "        return self.free.pop()  # the caller maps it in its block table\n```\n\n"
    "Each `allocate()` hands out one block.",
    "Some names:\n\n1. *BlockPool*\n2. *PageTable*\n3. *KVPager*\n\nI would pick "
    "`BlockPool`: it says what it holds.",
]


def _has_color(image, color: str, tolerance: int = 40) -> bool:
    want = QColor(color)
    for y in range(0, image.height(), 1):
        for x in range(0, image.width(), 2):
            c = image.pixelColor(x, y)
            if (abs(c.red() - want.red()) + abs(c.green() - want.green())
                    + abs(c.blue() - want.blue())) <= tolerance:
                return True
    return False


@pytest.mark.parametrize("look", ["light", "dark"])
def test_screenshot_of_three_candidates_with_a_code_block(qtbot, qapp, fake_bridge,
                                                          make_window, store, monkeypatch,
                                                          look):
    monkeypatch.setenv("FOLIO_THEME", look)
    theme.apply_theme(qapp)
    try:
        window = make_window(fake_bridge, AppSettings(chat_defaults=ChatSettings(
            num_candidates=3, max_tokens=6, temperature=0.8)))
        window.resize(1400, 860)
        view = window.conversation
        view.composer.setPlainText("Suggest a name for a **paged** KV cache, with a "
                                   "`code` example.")
        with qtbot.waitSignal(window.controller.turnFinished, timeout=10_000):
            view.send_button.click()
        columns = window.findChildren(CandidateColumn, "candidateColumn")
        assert len(columns) == 3
        # The fake engine streams canned words; give the three candidates real replies.
        for column, text in zip(columns, REPLIES, strict=True):
            message = store.get_message(column.message_id)
            store.finish_message(message.id, text, message.token_ids, message.metrics)
            view.finish_message(store.get_message(message.id))
        view.composer.setPlainText("Thanks! And how")  # a draft: the context gauge counts it
        _settle(qapp)
        for column in columns:
            _assert_whole(column)
        [block] = columns[1].body.code_blocks()
        assert block.language() == "python" and block.code().startswith("class PagedKVCache")
        assert block.view.horizontalScrollBar().maximum() > 0  # the long line scrolls
        keyword = "#" + get_style_by_name(style_name()).style_for_token(Keyword)["color"]
        assert f"color:{keyword.lower()}" in block.html().lower()
        assert _has_color(block.grab().toImage(), keyword)  # drawn, not only in the HTML

        out = Path(os.environ.get("FOLIO_SCREENSHOT_DIR") or REPO / "test-artifacts")
        out.mkdir(parents=True, exist_ok=True)
        suffix = "" if look == "light" else "_dark"
        path = out / f"main_window_3_candidates_code{suffix}.png"
        assert window.grab().save(str(path))
        assert path.stat().st_size > 10_000
        assert path.stat().st_mtime > time.time() - 120
    finally:
        monkeypatch.setenv("FOLIO_THEME", "light")
        theme.apply_theme(qapp)
