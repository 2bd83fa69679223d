"""A model's load in plain words: the engine's stage names mapped to steps a person reads,
with one percentage for the whole load.

The loaders and the engine report stages ("config", "open", "tokenizer", "index",
"cache", "weights", "building the model", "warming up", "ready"; a remote model
"connecting to <host>", "connected"), each from 0.0 to 1.0 (engine/loaders/__init__.py).
This table is the only place their names are read: the toolbar's bar, the status bar and
the welcome screen show what `LoadSteps.update` returns.
"""

from __future__ import annotations

from dataclasses import dataclass

# stage -> (plain words, where the stage starts and ends in the whole load, in percent).
# The weights are most of a local load; warming up runs the model once.
STEPS: dict[str, tuple[str, int, int]] = {
    "config": ("Reading the model file…", 0, 4),
    "open": ("Reading the model file…", 0, 4),
    "tokenizer": ("Reading the model's vocabulary…", 4, 8),
    "index": ("Reading the model file…", 8, 12),
    "cache": ("Reading the model file…", 8, 12),
    "weights": ("Loading the model into memory…", 12, 85),
    "building the model": ("Preparing…", 85, 90),
    "warming up": ("Warming up…", 90, 99),
    "ready": ("Almost ready…", 100, 100),
    "connecting": ("Connecting to the server…", 0, 90),
    "connected": ("Almost ready…", 100, 100),
}
UNKNOWN_STEP = "Loading…"


def plain_step(stage: str, fraction: float) -> tuple[str, int]:
    """The words and the whole load's percentage for `stage` at `fraction` of it."""
    key = "connecting" if stage.startswith("connecting to ") else stage
    words, start, end = STEPS.get(key, (UNKNOWN_STEP, 0, 100))
    if key == "connecting":
        words = f"Connecting to {stage.removeprefix('connecting to ')}…"
    fraction = min(1.0, max(0.0, fraction))
    return words, round(start + fraction * (end - start))


@dataclass(slots=True)
class LoadSteps:
    """One load's progress as shown: the step now and a percentage that never goes back
    (a GGUF file reads its cache before the vocabulary, whose share starts lower)."""

    words: str = UNKNOWN_STEP
    percent: int = 0

    def reset(self) -> None:
        self.words, self.percent = "Reading the model file…", 0

    def update(self, stage: str, fraction: float) -> tuple[str, int]:
        self.words, percent = plain_step(stage, fraction)
        self.percent = max(self.percent, percent)
        return self.words, self.percent

    def text(self) -> str:
        """"Loading the model into memory… 42%"."""
        return f"{self.words} {self.percent}%"
