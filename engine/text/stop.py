"""Stop strings on streamed text: generation must end where a stop string starts, and no
part of one may reach the user, however the text is split into deltas.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopChecker:
    """Streams text deltas through stop strings.

    ``check(delta) -> (stopped, text_to_emit)``: the emitted text never contains a stop
    string, and a tail that could still grow into one is held back until it cannot (then
    it is emitted) or it does (then the text is cut where the stop string starts). Text
    stops at the first character that completes any stop string.
    ``flush()`` returns the held-back tail once generation ends for another reason.
    """

    def __init__(self, stop: Sequence[str]) -> None:
        if isinstance(stop, str):
            stop = [stop]
        if not all(isinstance(s, str) and s for s in stop):
            raise ValueError(f"stop must be a list of non-empty strings, got {stop!r}")
        self.stop = tuple(stop)
        self.stopped = False
        self._held = ""
        self._longest = max((len(s) for s in self.stop), default=0)

    def check(self, delta: str) -> tuple[bool, str]:
        if self.stopped:
            return True, ""
        if not self.stop:
            return False, delta
        text = self._held + delta
        # Generation stops at the first character that completes a stop string, however
        # the text was split into deltas: the earliest end wins, then the longest.
        hits = [(i + len(s), i) for s in self.stop if (i := text.find(s)) >= 0]
        if hits:
            self.stopped, self._held = True, ""
            return True, text[:min(hits)[1]]
        keep = self._partial_match(text)
        self._held = text[len(text) - keep:]
        return False, text[:len(text) - keep]

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held

    def _partial_match(self, text: str) -> int:
        """Length of the longest tail of `text` that starts some stop string."""
        for length in range(min(len(text), self._longest - 1), 0, -1):
            tail = text[-length:]
            if any(s.startswith(tail) for s in self.stop):
                return length
        return 0
