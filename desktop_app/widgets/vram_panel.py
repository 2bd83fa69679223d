"""The VRAM panel: device memory, the KV block pool, a live block map and a usage chart.

It reads the bridge's `kv_stats()` / `memory_stats()` (cheap snapshots taken under the
worker's lock) on the GUI thread, so the panel never sits on the generation path: a few
times a second while the engine runs requests and the panel is visible, once when a run
ends, a model loads or the panel is shown, and never while idle (widgets.refresh_schedule).
For a model on a remote server the source's `remote_status()` (a snapshot its own thread
refreshes) replaces them, shown by widgets.remote_view.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QFormLayout,
    QLabel,
    QPushButton,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from desktop_app.widgets.block_map import BlockMap, Legend
from desktop_app.widgets.hosted_models import HostedModels
from desktop_app.widgets.kv_rows import (
    blocks_per_chat,
    disk_row,
    group_rows,
    headroom_text,
    headroom_tokens,
    kv_rows,
    precision_rows,
)
from desktop_app.widgets.memory_rows import TOOLTIPS, format_bytes, memory_rows
from desktop_app.widgets.refresh_schedule import RefreshSchedule
from desktop_app.widgets.remote_view import RemoteView
from desktop_app.widgets.sparkline import Sparkline

# What other modules and the tests import from here, from before the rows had modules.
__all__ = ["MemorySource", "Sparkline", "VramPanel", "blocks_per_chat", "disk_row",
           "format_bytes", "group_rows", "headroom_tokens", "kv_rows"]

API_PREFIX = "api-"  # requests that came through the app's own API (the serve switch)
# Rows whose text wraps at the dock's width, with the lines kept for them so that the
# "–" shown without a model takes as much room as the text that replaces it.
WRAPPED_LINES = {"hit_rate": 2, "headroom": 2, "disk": 3}


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
    open chat holds as of its last reply, ``in_open_chat(owner)``: whether a block's
    owner is a request of the open chat (a turn in flight holds more than its last reply
    counted; its headroom is what the context and the pool leave).

    The layout stays as it is when a model loads or unloads: every row is there from the
    start ("–" without a model), the block map's height is fixed, and the rows that wrap
    keep room for their lines; only rows a model has or lacks (experts, a state pool,
    several KV groups, a GPU's figures) come and go with it."""

    def __init__(self, source: MemorySource,
                 chat_of_owner: Callable[[str], str | None] = lambda owner: None,
                 chat_tokens: Callable[[], int] = lambda: 0,
                 in_open_chat: Callable[[str], bool] = lambda owner: False,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("vramPanel")
        self.setAccessibleName("Memory panel")
        self.setWidgetResizable(True)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.source = source
        self._chat_of_owner, self._chat_tokens = chat_of_owner, chat_tokens
        self._in_open_chat = in_open_chat
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
        # Several local models loaded: each listed, and the one whose figures show below.
        self.models = HostedModels()
        self.models.chosen.connect(lambda _source: self.refresh())
        layout.addWidget(self.models)
        self._owner_tag = ""
        self._memory_form = self._section(layout, "Device memory", [
            ("device", "Device"), ("total", "Total"), ("used", "Used"), ("free", "Free"),
            ("rss", "Process RSS"), ("weights", "Weights"), ("experts", "of which experts"),
            ("kv_pool", "KV pool reserved"),
            ("kv_resident", "KV pool resident"), ("state_pool", "State pool (linear layers)"),
            ("encoder_cache", "Encoded images"), ("other", "Everything else")])
        for key, tip in TOOLTIPS.items():
            self._values[key].setToolTip(tip)
        # Until a model says otherwise, the rows of a dense model on the CPU.
        for key in ("total", "used", "free", "experts", "state_pool", "encoder_cache"):
            self._memory_form.setRowVisible(self._values[key], False)
        self._section(layout, "KV cache pool", [
            ("kv_precision", "Precision"), ("kv_per_token", "Per token"),
            ("blocks_used", "Blocks used"), ("blocks_shared", "Shared"),
            ("blocks_cached", "Cached"), ("blocks_free", "Free"), ("block_size", "Block"),
            ("saved_by_sharing", "Saved by sharing"), ("waste", "Internal waste"),
            ("hit_rate", "Prefix-cache hits"), ("rolled_back", "Drafts rolled back"),
            ("headroom", "")])
        self._values["rolled_back"].setToolTip(
            "Speculative decoding (Settings ▸ Engine ▸ Speed) checks drafted tokens in one "
            "step; the blocks it took for drafts the model rejected go straight back to the "
            "pool.")
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
        for key, lines in WRAPPED_LINES.items():
            label = self._values[key]
            label.setMinimumHeight(lines * label.fontMetrics().lineSpacing())
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
        chat = self._chat_of_owner(self._owner_tag + owner)
        if chat is None and owner.startswith(API_PREFIX):
            return "API request"
        return chat

    def _open_chat_blocks(self, kv) -> int:
        """Blocks the open chat's requests hold in the first KV group (every token)."""
        in_open = self._in_open_chat
        return sum(1 for block in kv.blocks
                   if block.group == 0 and any(in_open(self._owner_tag + owner)
                                               for owner in block.owners))

    def refresh(self) -> None:
        status = self.source.remote_status()
        self.schedule.set_remote(status is not None)
        self.remote_view.setVisible(status is not None)
        self.local_view.setVisible(status is None)
        if status is not None:
            self.last_kv = self.last_memory = None
            self.remote_view.show_status(status)
            return
        figures = self.models.show_models(self.source)
        self._owner_tag = self.models.owner_tag(self.source)
        kv = figures.kv_stats()
        mem = figures.memory_stats()
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
        self._memory_form.setRowVisible(self._values["encoder_cache"],
                                        "encoder_cache" in texts)
        held = max(self._chat_tokens(), self._open_chat_blocks(kv) * kv.block_size)
        texts["headroom"] = headroom_text(
            held, headroom_tokens(kv, figures.max_model_len, held))
        texts["disk"] = disk_row(kv)
        # The engine's format name ("" where the figures do not say: the bytes alone).
        texts.update(precision_rows(kv, mem.kv_dtype or None))
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
