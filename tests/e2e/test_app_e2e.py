"""The app process killed with SIGKILL mid-stream: the chat database survives intact."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from desktop_app.data.chat_store import ChatStore

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
STARTUP_TIMEOUT_S = 300  # generous: a loaded 2-core machine loads and decodes slowly


def _streaming_text(db: Path) -> str:
    """The text of the long reply while it streams, '' before (read while the app writes)."""
    if not db.exists():
        return ""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        row = conn.execute(
            "SELECT m.content FROM messages m JOIN messages p ON m.parent_id = p.id"
            " WHERE m.status = 'streaming' AND length(m.content) > 0"
            " AND p.content LIKE 'Count from 1 to 300%'").fetchone()
    except sqlite3.OperationalError:  # tables not created yet
        return ""
    finally:
        conn.close()
    return row[0] if row else ""


@pytest.mark.slow
def test_sigkill_while_streaming_leaves_a_sound_database(tmp_path):
    data, config = tmp_path / "data", tmp_path / "config"
    env = {**os.environ, "FOLIO_DATA_DIR": str(data), "FOLIO_CONFIG_DIR": str(config),
           "QT_QPA_PLATFORM": "offscreen", "PYTHONUNBUFFERED": "1"}
    log = (tmp_path / "app.log").open("w+")
    proc = subprocess.Popen([sys.executable, str(HERE / "kill_app.py")], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=log, text=True)
    db = data / "chats.sqlite3"
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        partial = ""
        while time.monotonic() < deadline and proc.poll() is None:
            partial = _streaming_text(db)
            if len(partial) > 20:
                break
            time.sleep(0.05)
        assert proc.poll() is None, f"the app exited early; stderr: {_tail(log)}"
        assert len(partial) > 20, f"no streaming message appeared; stderr: {_tail(log)}"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    events = [json.loads(line) for line in proc.stdout.read().splitlines()
              if line.startswith("{")]
    finished = [e for e in events if e["event"] == "finished"]
    assert [e["event"] for e in events] == ["loaded", "sent", "finished", "sent"]

    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    conn.close()
    store = ChatStore(db)  # reopening marks streams cut short as interrupted
    try:
        [chat] = store.list_chats()
        path = store.path_to(store.active_leaf(chat.id))
        assert [m.role for m in path] == ["user", "assistant", "user", "assistant"]
        short_reply = store.get_message(finished[0]["message_id"])
        assert short_reply.status == "complete"
        assert short_reply.content == finished[0]["content"] and short_reply.content
        assert short_reply.token_ids
        cut = path[3]
        assert cut.status == "interrupted"
        assert cut.content.startswith(partial)  # at least what the test saw
        assert path[2].content.startswith("Count from 1 to 300")
    finally:
        store.close()


def _tail(log) -> str:
    log.flush()
    log.seek(0)
    return log.read()[-3000:]
