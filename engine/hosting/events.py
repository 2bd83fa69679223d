"""What a ModelHost tells its listener, on the thread that loaded or unloaded the model
(a GUI re-emits them as queued signals)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class ModelLoaded:
    name: str
    total_bytes: int  # weights and KV pool, as measured once loaded


@dataclass(slots=True, frozen=True)
class ModelUnloaded:
    name: str
    reason: str  # "idle" (past its keep-alive), "room" (another needed the memory),
    # "keep_alive 0" (its request ended), "asked" (unload), "shutdown"


HostEvent = ModelLoaded | ModelUnloaded
