"""Settings ▸ Engine ▸ KV cache precision: the picker, each choice showing the tokens of
context it holds for the loaded model in the memory for chats (data.kv_precision), kept
up to date as the device and the memory change, before the user picks."""

from __future__ import annotations

from PySide6.QtWidgets import QComboBox, QWidget

from desktop_app.data.engine_settings import EngineSettings
from desktop_app.data.kv_precision import (
    AUTO,
    LABELS,
    ModelShape,
    default_format_name,
    describe_format,
    fit,
    fit_text,
    precision_choices,
)


class KVPrecisionBox(QComboBox):
    """The choices for a device (`set_device`), each labelled with what it holds for
    `shape` (None: no local model loaded, the labels alone) under a budget
    (`set_budget`, MiB; 0: automatic). `value()` is the stored choice."""

    def __init__(self, value: str, shape: ModelShape | None, cuda: bool,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("kvPrecisionSetting")
        # Wide enough for every choice's tokens: they are the point of the picker.
        self.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.setAccessibleName("KV cache precision")
        self.setToolTip("How precisely the KV cache keeps what the model remembers of your "
                        "chats. 8-bit holds about twice the context of 16-bit in the same "
                        "memory, 4-bit about four times; replies may differ slightly.")
        self._shape, self._cuda = shape, cuda
        self._device, self._budget_mib = AUTO, 0
        self._wanted = value  # kept while a device that cannot use it is chosen
        self.currentIndexChanged.connect(lambda _i: setattr(self, "_wanted", self.currentData()))
        self._fill()

    def value(self) -> str:
        return self.currentData()

    def set_device(self, device: str) -> None:
        if device != self._device:
            self._device = device
            self._fill()

    def set_budget(self, mib: int) -> None:
        if mib != self._budget_mib:
            self._budget_mib = mib
            self._fill()

    def texts(self) -> list[str]:
        """The choices as shown (tests read them)."""
        return [self.itemText(i) for i in range(self.count())]

    def _fill(self) -> None:
        choices = precision_choices(self._device, self._cuda)
        self.blockSignals(True)
        self.clear()
        for name in choices:
            self.addItem(self._label(name), name)
        self.setCurrentIndex(max(0, self.findData(self._wanted)))
        self.blockSignals(False)

    def _label(self, name: str) -> str:
        fmt = name
        if name == AUTO:
            config = EngineSettings(device=self._device).to_engine_config()
            fmt = default_format_name(config)
            words = f"{LABELS[AUTO]}: {describe_format(fmt)}"
        else:
            words = describe_format(name)
        if self._shape is None:
            return words
        budget = self._budget_mib << 20 if self._budget_mib else None
        return f"{words}: {fit_text(fit(self._shape, fmt, budget))}"
