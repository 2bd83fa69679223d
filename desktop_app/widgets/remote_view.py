"""The memory panel for a model that runs on a remote server: where it runs, and the
server's own KV-cache figures when its ``/metrics`` page has them (Folio's, vLLM's or
SGLang's names), or a line saying there are none.

It shows a snapshot object it is handed (services.remote_metrics.RemoteStatus: host,
base_url, model, metrics, note, checked) and never touches the network itself.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFormLayout, QLabel, QVBoxLayout, QWidget

ROWS = (("model", "Model"), ("kv_blocks", "KV blocks"), ("kv_usage", "KV cache in use"),
        ("hit_rate", "Prefix-cache hits"), ("requests", "Requests"))


def _percent(fraction: float) -> str:
    return f"{100 * fraction:.1f}%"


def remote_rows(status) -> dict[str, str]:
    """Label texts for a RemoteStatus, keyed by row name; rows without a figure are absent."""
    rows = {"where": f"The model runs remotely on {status.host}",
            "model": status.model}
    m = status.metrics
    if m is None:
        rows["note"] = status.note or "Asking the server for its metrics…"
        return rows
    if m.blocks_used is not None and m.blocks_total is not None:
        rows["kv_blocks"] = (f"{m.blocks_used} / {m.blocks_total} used · "
                             f"{m.blocks_cached or 0} cached · {m.blocks_free or 0} free")
    if m.usage is not None:
        rows["kv_usage"] = _percent(m.usage)
    if m.hit_rate is not None:
        rows["hit_rate"] = _percent(m.hit_rate)
    if m.running is not None or m.waiting is not None:
        rows["requests"] = f"{m.running or 0} running, {m.waiting or 0} waiting"
    rows["note"] = f"Figures from the server's /metrics ({m.flavor} names), every 2 s."
    return rows


class RemoteView(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("remoteView")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        heading = QLabel("Remote server")
        heading.setObjectName("vramSection")
        layout.addWidget(heading)
        self._labels: dict[str, QLabel] = {}
        self.where = self._label("where")
        self.where.setAccessibleName("Where the model runs")
        layout.addWidget(self.where)
        self._form = QFormLayout()
        self._form.setHorizontalSpacing(12)
        self._form.setVerticalSpacing(3)
        for key, caption in ROWS:
            muted = QLabel(caption)
            muted.setObjectName("mutedLabel")
            value = self._label(key)
            value.setAccessibleName(caption)
            self._form.addRow(muted, value)
        layout.addLayout(self._form)
        self.note = self._label("note")
        layout.addWidget(self.note)

    def _label(self, key: str) -> QLabel:
        label = QLabel("–")
        label.setObjectName(f"remote_{key}")
        label.setWordWrap(True)
        label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self._labels[key] = label
        return label

    def value(self, key: str) -> str:
        return self._labels[key].text()

    def show_status(self, status) -> None:
        rows = remote_rows(status)
        for key, label in self._labels.items():
            label.setText(rows.get(key, "–"))
        for key, _caption in ROWS:
            self._form.setRowVisible(self._labels[key], key in rows)
