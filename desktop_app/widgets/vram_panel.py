"""The VRAM panel: device memory, the KV block pool, a live block map and a usage chart.

It reads the bridge's `kv_stats()` / `memory_stats()` (cheap snapshots taken under the
worker's lock) on the GUI thread, so the panel never sits on the generation path: a few
times a second while the engine runs requests and the panel is visible, once when a run
ends, a model loads or the panel is shown, and never while idle (widgets.refresh_schedule).
For a model on a remote server the source's `remote_status()` (a snapshot its own thread
refreshes) replaces them, shown by widgets.remote_view.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

from PySide6.QtCore import QPointF, QSize, Qt
from PySide6.QtGui import QColor, QPainter, QPainterPath, QPen
from PySide6.QtWidgets import (
    QFormLayout,
    QLabel,
    QPushButton,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from desktop_app.widgets import theme
from desktop_app.widgets.block_map import BlockMap, Legend
from desktop_app.widgets.memory_rows import TOOLTIPS, format_bytes, format_percent, memory_rows
from desktop_app.widgets.refresh_schedule import BUSY_INTERVAL_MS, RefreshSchedule
from desktop_app.widgets.remote_view import RemoteView

HISTORY_SECONDS = 300.0
API_PREFIX = "api-"  # requests that came through the app's own API (the serve switch)


def kv_rows(kv) -> dict[str, str]:
    """Label texts for a KVStats snapshot, keyed by row name."""
    return {
        "blocks_used": f"{kv.num_used} / {kv.num_blocks}",
        "blocks_shared": str(kv.num_shared),
        "blocks_cached": str(kv.num_cached),
        "blocks_free": str(kv.num_free),
        "block_size": f"{kv.block_size} tokens, {format_bytes(kv.bytes_per_block)}",
        "saved_by_sharing": format_bytes(kv.bytes_saved_by_sharing),
        "waste": format_percent(kv.waste_fraction),
        "hit_rate": (f"{format_percent(kv.hit_rate)} "
                     f"({kv.prefix_hit_tokens} / {kv.prefix_query_tokens} tokens)"),
    }


def disk_row(kv) -> str:
    """The KV cache's disk tier: its blocks, bytes and hits (or why there are none)."""
    disk = kv.disk
    if disk is None:
        return "Off (Settings ▸ Engine ▸ Keep chats warm on disk)"
    if not disk.enabled:
        return "Turned off: the folder could not be written (see the log)"
    return (f"{disk.num_blocks} blocks, {format_bytes(disk.num_bytes)} of "
            f"{format_bytes(disk.max_bytes)}; {disk.hit_blocks} blocks loaded "
            f"({disk.hit_tokens} tokens) since start")


def group_rows(kv) -> list[str]:
    """A line per KV group (global, sliding) when the model has several, else none."""
    groups = kv.groups
    if len(groups) < 2:
        return []
    return [f"{g.name}: {g.num_layers} layer{'s' if g.num_layers != 1 else ''}, "
            f"{g.num_used} / {g.num_blocks} blocks used ({g.num_cached} cached, "
            f"{g.num_free} free), {format_bytes(g.used_bytes)} of {format_bytes(g.pool_bytes)}"
            for g in groups]


def blocks_per_chat(kv, chat_of_owner: Callable[[str], str | None]) -> dict[str, int]:
    """Distinct blocks each chat holds now (a block shared by candidates counts once)."""
    counts: dict[str, int] = {}
    for block in kv.blocks:
        chats = {chat_of_owner(owner) for owner in block.owners} - {None}
        for chat in chats:
            counts[chat] = counts.get(chat, 0) + 1
    return counts


def headroom_tokens(kv, max_model_len: int | None, chat_tokens: int) -> int:
    """About how many more tokens the current chat can take: the free pool (cached blocks
    can be evicted) bounded by what is left of the context window."""
    room = kv.headroom_tokens()
    if max_model_len is not None:
        room = min(room, max(0, max_model_len - chat_tokens))
    return room


class Sparkline(QWidget):
    """KV usage (fraction of the pool in use) over the last few minutes.

    Samples come only while the engine runs (the panel does not poll an idle one), and
    usage does not change while it is idle: after a gap the line steps instead of sloping
    across it, and the last value runs on to the right edge, which is now."""

    GAP_S = 2 * BUSY_INTERVAL_MS / 1000  # longer without a sample: the engine was idle

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("kvSparkline")
        self.samples: deque[tuple[float, float]] = deque()
        self.clock = time.monotonic
        self.setMinimumHeight(48)

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt override
        return QSize(240, 56)

    def add(self, fraction: float, now: float | None = None) -> None:
        now = self.clock() if now is None else now
        if self.samples and now - self.samples[-1][0] > self.GAP_S:
            self.samples.append((now, self.samples[-1][1]))
        self.samples.append((now, fraction))
        while self.samples and now - self.samples[0][0] > HISTORY_SECONDS:
            self.samples.popleft()
        self.update()

    def scale(self) -> float:
        """The fraction at the top of the chart: small usage still shows a shape."""
        peak = max((frac for _, frac in self.samples), default=0.0)
        return min(1.0, max(0.05, peak * 1.25))

    def paintEvent(self, _event) -> None:  # noqa: N802 - Qt override
        c = theme.current()
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        w, h = self.width(), self.height()
        painter.fillRect(0, 0, w, h, QColor(c.base))
        painter.setPen(QPen(QColor(c.border), 1))
        painter.drawRect(0, 0, w - 1, h - 1)
        top = self.scale()
        if self.samples:
            newest = max(self.samples[-1][0], self.clock())
            path = QPainterPath()
            for i, (t, frac) in enumerate([*self.samples, (newest, self.samples[-1][1])]):
                x = (w - 2) * (1 - (newest - t) / HISTORY_SECONDS) + 1
                y = (h - 3) * (1 - min(1.0, max(0.0, frac / top))) + 1
                path.moveTo(x, y) if i == 0 else path.lineTo(x, y)
            fill = QPainterPath(path)
            fill.lineTo(QPointF(w - 1, h - 1))
            fill.lineTo(QPointF(path.elementAt(0).x, h - 1))
            area = QColor(c.accent)
            area.setAlpha(50)
            painter.fillPath(fill, area)
            painter.setPen(QPen(QColor(c.accent), 1.5))
            painter.drawPath(path)
        if self.samples:
            painter.setPen(QColor(c.muted))
            painter.drawText(6, 14, f"now {format_percent(self.samples[-1][1])} · "
                                    f"scale {format_percent(top)}")
        painter.end()


class MemorySource(Protocol):
    """What the panel reads: the bridge in the app (its worker's figures; a remote model
    has server figures instead of KV and memory ones, a local one none)."""

    @property
    def max_model_len(self) -> int | None: ...

    def kv_stats(self): ...

    def memory_stats(self): ...

    def remote_status(self): ...

    def clear_disk(self) -> None: ...


class VramPanel(QScrollArea):
    """The dock's content. ``chat_of_owner(owner)``: the title of the chat whose request
    owns a block ("request_id:index"), None for none; ``chat_tokens()``: the tokens the
    open chat holds (its headroom is what the context and the pool leave)."""

    def __init__(self, source: MemorySource,
                 chat_of_owner: Callable[[str], str | None] = lambda owner: None,
                 chat_tokens: Callable[[], int] = lambda: 0,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("vramPanel")
        self.setAccessibleName("Memory panel")
        self.setWidgetResizable(True)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.source = source
        self._chat_of_owner, self._chat_tokens = chat_of_owner, chat_tokens
        self._values: dict[str, QLabel] = {}

        body = QWidget()
        body.setObjectName("vramPanel")
        outer = QVBoxLayout(body)
        outer.setContentsMargins(12, 8, 12, 12)
        self.remote_view = RemoteView()
        self.remote_view.setVisible(False)
        outer.addWidget(self.remote_view)
        self.local_view = QWidget()
        self.local_view.setObjectName("localView")
        outer.addWidget(self.local_view)
        outer.addStretch(1)
        layout = QVBoxLayout(self.local_view)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(4)
        self._memory_form = self._section(layout, "Device memory", [
            ("device", "Device"), ("total", "Total"), ("used", "Used"), ("free", "Free"),
            ("rss", "Process RSS"), ("weights", "Weights"), ("experts", "of which experts"),
            ("kv_pool", "KV pool reserved"),
            ("kv_resident", "KV pool resident"), ("state_pool", "State pool (linear layers)"),
            ("other", "Everything else")])
        for key, tip in TOOLTIPS.items():
            self._values[key].setToolTip(tip)
        self._section(layout, "KV cache pool", [
            ("blocks_used", "Blocks used"), ("blocks_shared", "Shared"),
            ("blocks_cached", "Cached"), ("blocks_free", "Free"), ("block_size", "Block"),
            ("saved_by_sharing", "Saved by sharing"), ("waste", "Internal waste"),
            ("hit_rate", "Prefix-cache hits"), ("headroom", "Headroom")])
        # A line per KV group, shown only for a model with several (Gemma's global and
        # sliding layers); labels are made as the group count asks.
        self._groups_heading = self._heading("KV groups")
        layout.addWidget(self._groups_heading)
        self._groups_box = QWidget()
        self._groups_box.setObjectName("vramGroups")
        self._groups_layout = QVBoxLayout(self._groups_box)
        self._groups_layout.setContentsMargins(0, 0, 0, 0)
        self._group_labels: list[QLabel] = []
        layout.addWidget(self._groups_box)
        self._show_groups([])
        self._section(layout, "Chats on disk", [("disk", "")])
        self.clear_disk = QPushButton("Clear")
        self.clear_disk.setObjectName("clearDiskButton")
        self.clear_disk.setToolTip("Remove the chats' KV cache kept on disk; chats recompute "
                                   "their history next time")
        self.clear_disk.clicked.connect(lambda: self.source.clear_disk())
        layout.addWidget(self.clear_disk, 0, Qt.AlignmentFlag.AlignLeft)
        self._section(layout, "Blocks per chat", [("per_chat", "")])
        layout.addWidget(self._heading("Block map"))
        self.block_map = BlockMap()
        self.block_map.describe_owner = self._describe_owner
        layout.addWidget(self.block_map)
        layout.addWidget(Legend())
        layout.addWidget(self._heading("KV usage, last 5 minutes"))
        self.sparkline = Sparkline()
        layout.addWidget(self.sparkline)
        self.setWidget(body)

        self.schedule = RefreshSchedule(self.refresh, self)
        self.timer = self.schedule.timer
        self.last_kv = None
        self.last_memory = None

    def _heading(self, text: str) -> QLabel:
        label = QLabel(text)
        label.setObjectName("vramSection")
        return label

    def _section(self, layout: QVBoxLayout, title: str, rows) -> QFormLayout:
        layout.addWidget(self._heading(title))
        form = QFormLayout()
        form.setHorizontalSpacing(12)
        form.setVerticalSpacing(3)
        for key, caption in rows:
            value = QLabel("–")
            value.setObjectName(f"vram_{key}")
            value.setWordWrap(True)
            value.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            self._values[key] = value
            if caption:
                muted = QLabel(caption)
                muted.setObjectName("mutedLabel")
                form.addRow(muted, value)
            else:
                form.addRow(value)
        layout.addLayout(form)
        return form

    def _show_groups(self, lines: list[str]) -> None:
        while len(self._group_labels) < len(lines):
            label = QLabel()
            label.setObjectName(f"vram_group_{len(self._group_labels)}")
            label.setWordWrap(True)
            label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            self._groups_layout.addWidget(label)
            self._group_labels.append(label)
        for i, label in enumerate(self._group_labels):
            label.setVisible(i < len(lines))
            label.setText(lines[i] if i < len(lines) else "")
        self._groups_heading.setVisible(bool(lines))
        self._groups_box.setVisible(bool(lines))

    def group_lines(self) -> list[str]:
        """The KV group lines shown (tests read them)."""
        return [label.text() for label in self._group_labels if not label.isHidden()]

    def value(self, key: str) -> str:
        """The text shown for a row (tests and accessibility read it)."""
        return self._values[key].text()

    def set_busy(self, busy: bool) -> None:
        """The engine started or stopped running requests (the bridge's activityChanged):
        poll while it runs, and read the figures it ended with."""
        self.schedule.set_active(busy)
        if self.isVisible():
            self.refresh()

    def showEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().showEvent(event)
        self.schedule.set_visible(True)
        self.refresh()  # what changed while hidden

    def hideEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().hideEvent(event)
        self.schedule.set_visible(False)

    def _describe_owner(self, owner: str) -> str:
        chat = self._owner_name(owner)
        return f"{chat} ({owner})" if chat else owner

    def _owner_name(self, owner: str) -> str | None:
        """A chat's title, "API request" for the app's API, None for anything else."""
        chat = self._chat_of_owner(owner)
        if chat is None and owner.startswith(API_PREFIX):
            return "API request"
        return chat

    def refresh(self) -> None:
        status = self.source.remote_status()
        self.schedule.set_remote(status is not None)
        self.remote_view.setVisible(status is not None)
        self.local_view.setVisible(status is None)
        if status is not None:
            self.last_kv = self.last_memory = None
            self.remote_view.show_status(status)
            return
        kv = self.source.kv_stats()
        mem = self.source.memory_stats()
        self.last_kv, self.last_memory = kv, mem
        if kv is None or mem is None:
            for label in self._values.values():
                label.setText("–")
            self.block_map.set_blocks([])
            self._show_groups([])
            return
        texts = {**memory_rows(mem), **kv_rows(kv)}
        cuda = mem.device_total_bytes is not None
        for key in ("total", "used", "free"):
            self._memory_form.setRowVisible(self._values[key], cuda)
        self._memory_form.setRowVisible(self._values["rss"], not cuda)
        self._memory_form.setRowVisible(self._values["experts"], "experts" in texts)
        self._memory_form.setRowVisible(self._values["state_pool"], "state_pool" in texts)
        room = headroom_tokens(kv, self.source.max_model_len, self._chat_tokens())
        texts["headroom"] = f"This chat can grow about {room} more tokens"
        texts["disk"] = disk_row(kv)
        self.clear_disk.setEnabled(kv.disk is not None)
        per_chat = blocks_per_chat(kv, self._owner_name)
        texts["per_chat"] = "\n".join(
            f"{chat}: {n} block{'s' if n != 1 else ''}" for chat, n in sorted(
                per_chat.items(), key=lambda item: -item[1])) or "No chat holds blocks now"
        for key, label in self._values.items():
            label.setText(texts.get(key, "–"))
        self._show_groups(group_rows(kv))
        self.block_map.set_blocks(kv.blocks)
        self.sparkline.add(kv.num_used / kv.num_blocks if kv.num_blocks else 0.0)
