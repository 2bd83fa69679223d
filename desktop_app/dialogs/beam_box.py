"""The chat settings' "Beam search" rows: the switch, the width (the beams, each a column
of the reply) and the length penalty, greyed out with the reason where the loaded model
runs no beam search (data.beam_choice)."""

from __future__ import annotations

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QCheckBox, QDoubleSpinBox, QSpinBox, QWidget

from desktop_app.data.settings import MAX_BEAM_WIDTH, MAX_LENGTH_PENALTY, MIN_BEAM_WIDTH

SWITCH_TIP = ("Each reply is a beam search: the model keeps the most likely replies as it "
              "writes and shows the best of them side by side, best first. Nothing streams: "
              "the replies appear when the search ends")
WIDTH_TIP = "How many beams the search keeps, and how many replies it shows"
PENALTY_TIP = ("A finished beam's score is its summed log-probability divided by its length "
               "to this power: 1 ranks by the average per token; higher favours longer "
               "replies, lower (negative too) shorter ones")


class BeamBox(QObject):
    """Its three widgets go into the form as rows (``rows``); ``toggled`` says when the
    switch changes (the form greys the sampling settings)."""

    toggled = Signal(bool)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.enabled = QCheckBox("Beam search")
        self.enabled.setObjectName("beamSearchSetting")
        self.enabled.setToolTip(SWITCH_TIP)
        self.refusal: str | None = None
        self.beam_width = QSpinBox()
        self.beam_width.setObjectName("beamWidthSetting")
        self.beam_width.setAccessibleName("Beam width")
        self.beam_width.setRange(MIN_BEAM_WIDTH, MAX_BEAM_WIDTH)
        self.beam_width.setToolTip(WIDTH_TIP)
        self.length_penalty = QDoubleSpinBox()
        self.length_penalty.setObjectName("lengthPenaltySetting")
        self.length_penalty.setAccessibleName("Length penalty")
        self.length_penalty.setRange(-MAX_LENGTH_PENALTY, MAX_LENGTH_PENALTY)
        self.length_penalty.setSingleStep(0.1)
        self.length_penalty.setDecimals(2)
        self.length_penalty.setToolTip(PENALTY_TIP)
        self.enabled.toggled.connect(self._follow)
        self._follow(False)

    def rows(self) -> list[tuple[str, QWidget]]:
        """(label, widget) of each form row, the switch's label its own text."""
        return [("", self.enabled), ("Beam width", self.beam_width),
                ("Length penalty", self.length_penalty)]

    def set_values(self, on: bool, width: int, length_penalty: float) -> None:
        self.enabled.setChecked(on)
        self.beam_width.setValue(width)
        self.length_penalty.setValue(length_penalty)
        self._follow(on)

    def set_refusal(self, reason: str | None) -> None:
        """Why the loaded model runs no beam search (None: it does): the switch greyed
        out, its tooltip saying why. A chat that has it on (chosen for another model)
        may still turn it off: the switch greys out once it is off."""
        self.refusal = reason
        self.enabled.setToolTip(SWITCH_TIP if reason is None else
                                f"Not with the loaded model: {reason}")
        self._grey_switch()

    def _grey_switch(self) -> None:
        self.enabled.setEnabled(self.refusal is None or self.enabled.isChecked())

    def value(self) -> tuple[bool, int, float]:
        return (self.enabled.isChecked(), self.beam_width.value(),
                round(self.length_penalty.value(), 4))

    def _follow(self, on: bool) -> None:
        self._grey_switch()
        self.beam_width.setEnabled(on)
        self.length_penalty.setEnabled(on)
        self.toggled.emit(on)
